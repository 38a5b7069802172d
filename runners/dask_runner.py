"""Beam's DaskRunner, translated for a cluster: every DoFn output kept (``finish_bundle``'s and
tagged outputs apart), side inputs as graph dependencies, combines lifted before the shuffle, even
partitions, element sizes the scheduler can see, and root stages spread over the workers.

Beam's Dask translation (``apache_beam.runners.dask``, Beam 2.77) turns each transform into Dask
bag operations. :class:`DaskRunner` here keeps that translation except where a job at scale lost
time to it (Dask's task streams of benchmarks/scale.py; the runs are in benchmarks/RESULTS.md)
or got a result wrong:

* **Every output of a DoFn** (:func:`par_do`, :func:`run_dofn`). Beam runs a partition through
  the DoFn with receivers made once for the whole graph and collects their values *before*
  calling ``finish_bundle``: what ``finish_bundle`` emits is lost (``BatchElements``' last batch,
  the partial counts of :mod:`transforms.counting`), and every tag's values reach every consumer
  of the ParDo. Here each partition gets its own receivers, its outputs are collected after
  ``finish_bundle``, and each declared tag's outputs are their own bag (:func:`main_outputs`,
  :func:`tagged_outputs`); the DoFn is torn down even when it fails.
* **Side inputs** (:func:`par_do`). Beam hands a ParDo its side input as a bag
  that each task computes when its DoFn first reads it (``list(bag)`` through a worker client):
  the side input's chain starts only once a partition has read its files, runs again for each
  partition unless its results are still held, and its upstream shared with the main graph (the
  keyset, read for the release and for its filter) runs twice. Here each side input is one
  ``dask.delayed`` task over the side input bag's partitions (computed once, a dependency of
  every partition of the ParDo), from whose value each partition builds the same
  :class:`~apache_beam.transforms.sideinputs.SideInputMap` Beam builds from the bag. (The
  partitions are passed one by one, ``bag.to_delayed(optimize_graph=False)``: with the bag passed
  whole, one of event-level reports' two ``ToList`` side inputs came out empty in one partition.)
* **Combines** (:func:`combine_per_key`). Beam expands ``CombinePerKey`` into a GroupByKey and a
  ParDo: every value crosses the shuffle and the combine runs after it, so a ``CombineGlobally``
  is one task (the keyset filter's adds ran on one worker while the other idled). Here a
  ``CombinePerKey`` of a ``CombineFn`` over the global window is lifted as the in-process engine
  and Dataflow lift it: each partition adds its own values per key and compacts the
  accumulators (``CombineFn.compact``; a staged filter is written as a file), only accumulators
  cross the shuffle, and each key's are merged and extracted after it.
* **Shuffles** (:func:`shuffled`). Dask places a key on a partition by an MD5 of its token; the
  jobs' keys are shard numbers 0..S-1, and 120 key shards fell 22 to 36 per partition of 4.
  Here an ``int`` key is placed by its Fibonacci hash (29-31 per partition); other keys as Dask
  does.
* **Create** (:func:`create`). Dask's ``from_sequence`` made 3 partitions of 125 file names when
  asked for 2 (62, 62, 1), and the odd partition's steps made 5 release tasks for 2 workers.
  Here a ``Create`` is split into exactly ``--dask_npartitions`` partitions.
* **Element sizes** (:func:`register_element_sizes`, :class:`ElementSizes`). Beam holds every
  element in a ``WindowedValue``, which Dask sized at 80 bytes whatever it held: partitions of
  100 files' Arrow batches looked empty to the scheduler, which ran both bounding tasks on one
  worker after copying the other's rows to it, while that worker idled. Every worker of the
  run's cluster now sizes an element by what it holds.
* **Root stages** (:func:`spread_roots`). Dask hands a stage of few tasks out at once, each to the
  worker it expects to be free first; with every task guessed at 0.5 s, ties follow the order the
  tasks arrive in, which follows the graph's random tokens: in some runs one of 2 workers read
  both halves of the rows and the other both halves of the keyset, both bounding tasks then
  followed the rows, and the other worker idled. The runner now submits the graph itself
  (Beam's ``run_pipeline`` otherwise) and deals each small root stage's partitions round the
  worker threads, as a loose restriction (another worker may still run them).

The DoFns see the same values; released bytes are the in-process ones for every job
(tests/runners/test_dask_runner.py). The profile names this runner for ``--runner DaskRunner``
(:data:`runners.dask_cluster.DASK_RUNNER`); Beam's own stays available by its full name.
What each step gained, run by run, is in benchmarks/RESULTS.md.
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence

import apache_beam as beam
import dask
import distributed
from apache_beam.runners.dask.dask_runner import (DaskOptions, DaskRunner as BeamDaskRunner,
                                                  DaskRunnerResult)
from apache_beam.pvalue import TaggedOutput
from apache_beam.runners.dask.transform_evaluator import (OneReceiver, defenestrate,
                                                          get_windowed_value)
from apache_beam.transforms.core import DoFn
from apache_beam.transforms.sideinputs import SideInputMap
from apache_beam.transforms.window import GlobalWindows
from apache_beam.utils.windowed_value import WindowedValue
from dask import bag as db
from dask.bag.core import Bag, groupby_tasks
from dask.base import tokenize
from dask.highlevelgraph import HighLevelGraph, MaterializedLayer
from dask.sizeof import sizeof
from distributed.diagnostics.plugin import WorkerPlugin

#: The Beam releases (major.minor) this runner was written against and tested on. It replaces
#: six steps of Beam's Dask translation and reuses seven of Beam's private names
#: (``apache_beam.runners.common._OutputHandler``, ``overrides._Create``, ``overrides._Flatten``,
#: ``overrides._GroupByKeyOnly``, ``DaskOptions._extract_bag_kwargs``, and a side input's
#: ``_view_options()`` and ``_window_mapping_fn``), which any Beam release may change: a release
#: is added here once this module was read against it and ``make test-runners`` passed on it
#: (the lock, requirements.lock, pins the Beam that suite runs on).
BEAM_VERSIONS = ("2.77",)


def check_beam_version(version: str) -> None:
    """Refuse a Beam release this runner was not written against (:data:`BEAM_VERSIONS`)."""
    if ".".join(version.split(".")[:2]) not in BEAM_VERSIONS:
        raise ImportError(
            f"runners.dask_runner was written against Apache Beam {', '.join(BEAM_VERSIONS)} "
            f"and relies on private Beam names; Beam {version} is installed. Install the locked "
            "Beam (pip install --constraint requirements.lock -e .), or run Beam's own Dask runner "
            "by its full name: --runner=apache_beam.runners.dask.dask_runner.DaskRunner")


check_beam_version(beam.__version__)

# Beam's private names, imported once the version is known to have them.
from apache_beam.runners.common import (DoFnContext, DoFnInvoker, DoFnSignature,  # noqa: E402
                                        _OutputHandler)
from apache_beam.runners.dask.overrides import (_Create, _Flatten, _GroupByKeyOnly,  # noqa: E402
                                                dask_overrides)
from apache_beam.runners.dask.transform_evaluator import TRANSLATIONS  # noqa: E402

#: What ``--runner`` names to run on this module's runner.
RUNNER = "runners.dask_runner.DaskRunner"


def _values(*partitions):
    """The side input's elements: its bag's partitions, computed as dependencies, in order."""
    return [element for partition in partitions for element in partition]


def _side_inputs(views, values) -> list:
    """The side inputs rebuilt from their computed values, as Beam's ``DaskBagWindowedIterator``
    yields them (each element in its window)."""
    return [SideInputMap(view_class, options, [get_windowed_value(v, window_fn) for v in vals])
            for (view_class, options, window_fn), vals in zip(views, values)]


def run_dofn(items, fn, label, window_fn, args, kwargs, tags, views, *values) -> list:
    """One partition through a ParDo's DoFn, as one bundle: setup, start_bundle, every element,
    finish_bundle, teardown. Returns the main outputs as elements and each output of a declared
    tag in ``tags`` as a ``TaggedOutput(tag, element)``, what ``finish_bundle`` emits included
    (Beam's ``apply_dofn_to_bundle`` collects the outputs before ``finish_bundle``, and keeps
    every tag's values together). A tag not declared is an error, as on Beam's other runners."""
    receivers = OneReceiver()  # this partition's own (Beam's is made once per graph)
    handler = _OutputHandler(window_fn=window_fn, main_receivers=receivers[None],
                             tagged_receivers=receivers, per_element_output_counter=None,
                             output_batch_converter=None, process_yields_batches=False,
                             process_batch_yields_elements=False)
    invoker = DoFnInvoker.create_invoker(
        DoFnSignature(fn), handler, context=DoFnContext(label, state=None),
        side_inputs=_side_inputs(views, values) or None, input_args=list(args),
        input_kwargs=kwargs, user_state_context=None,
        bundle_finalizer_param=DoFn.BundleFinalizerParam())
    invoker.invoke_setup()
    try:
        invoker.invoke_start_bundle()
        for item in items:
            invoker.invoke_process(get_windowed_value(item, window_fn))
        invoker.invoke_finish_bundle()
    finally:
        invoker.invoke_teardown()
    out = []
    for value in receivers.values:
        if not isinstance(value, TaggedOutput):
            out.append(value.value)
        elif value.tag in tags:
            out.append(TaggedOutput(value.tag, value.value.value))
        else:
            raise ValueError(f"{label}: output tagged {value.tag!r}, which the ParDo does not "
                             f"declare (with_outputs: {sorted(tags)})")
    return out


def par_do(node, input_bag, side_bags):
    """The bag of ParDo ``node`` over ``input_bag`` (:func:`run_dofn` per partition): its main
    outputs, and each declared tag's outputs as ``TaggedOutput`` (split by :func:`main_outputs`
    and :func:`tagged_outputs`). The side inputs' bags ``side_bags`` are delayed dependencies of
    every partition (module docstring)."""
    transform = node.transform
    args, kwargs = transform.args, transform.kwargs  # side inputs as placeholders, in order
    main_input = next(iter(node.main_inputs.values()))
    window_fn = main_input.windowing.windowfn if hasattr(main_input, "windowing") else None
    tags = frozenset(tag for tag in node.outputs if tag is not None)
    views = [(type(si), si._view_options(), si._window_mapping_fn) for si in node.side_inputs]
    values = [dask.delayed(_values, pure=True)(*bag.to_delayed(optimize_graph=False)) for bag in side_bags]
    return input_bag.map_partitions(run_dofn, transform.fn, transform.label, window_fn,
                                    list(args), kwargs, tags, views, *values)


def main_outputs(partition) -> list:
    return [value for value in partition if not isinstance(value, TaggedOutput)]


def tagged_outputs(partition, tag: str) -> list:
    return [value.value for value in partition if isinstance(value, TaggedOutput) and value.tag == tag]


#: Fibonacci hashing's multiplier (2**64 over the golden ratio, odd).
_FIBONACCI = 0x9E3779B97F4A7C15
_MASK64 = (1 << 64) - 1


def _key(pair):
    return pair[0]


def partition_hash(key) -> int:
    """Which shuffle partition a key goes to (its value modulo the partitions): for an ``int``
    (the jobs' shard numbers 0..S-1), the high bits of its Fibonacci hash, which spread
    consecutive integers almost evenly (120 key shards over 4 partitions: 29-31 each, against
    22-36 by Dask's default token hash); anything else by Dask's token, as Dask does."""
    if type(key) is int:
        return ((key * _FIBONACCI) & _MASK64) >> 32

    return int(tokenize(key), 16)


def shuffled(bag):
    """``bag`` of ``(key, value)`` grouped by key: Dask's ``Bag.groupby``, partitioned by
    :func:`partition_hash` when it shuffles through tasks (the method a distributed client uses;
    ``dataframe.shuffle.method: disk`` in Dask's config keeps Dask's disk shuffle). Choosing it
    here also spares importing ``dask.dataframe``, which Dask's own choice does (a heavy
    import)."""
    if dask.config.get("dataframe.shuffle.method", None) == "disk":
        return bag.groupby(_key, shuffle="disk")
    return groupby_tasks(bag, _key, hash=partition_hash)


def _grouped_values(group):
    """Beam's GroupByKey output for one shuffled group: the key and its values, out of their
    windows (as Beam's Dask translation gives them)."""
    key, items = group
    return key, [defenestrate(item[1]) for item in items]


def _combine_partition(items, fn):
    """One partition's ``(key, value)`` elements -> ``(key, accumulator)`` per key, compacted,
    keys in the order they were first met."""
    fn.setup()
    try:
        accumulators = {}
        for item in items:
            key, value = defenestrate(item)
            accumulator = accumulators[key] if key in accumulators else fn.create_accumulator()
            accumulators[key] = fn.add_input(accumulator, value)
        return [(key, fn.compact(accumulator)) for key, accumulator in accumulators.items()]
    finally:
        fn.teardown()


def _merge_partition(groups, fn):
    """One partition of grouped ``(key, [(key, accumulator), ...])`` -> ``(key, output)``."""
    fn.setup()
    try:
        return [(key, fn.extract_output(fn.merge_accumulators([a for _, a in pairs])))
                for key, pairs in groups]
    finally:
        fn.teardown()


def create(node, bag_kwargs):
    """The bag of a ``Create`` in exactly ``npartitions`` partitions (as many as it has elements
    if fewer), their sizes differing by at most one element. Dask's ``from_sequence``, which
    Beam's translation calls, derives a partition size from ``npartitions`` and can make one
    more: 125 files in 2 partitions gave 62, 62 and 1, and the third partition's steps made an
    uneven number of partitions downstream (5 release tasks on 2 workers). With
    ``partition_size`` (or neither) it is Beam's translation."""
    items = list(node.transform.values)
    parts = max(1, min(int(bag_kwargs["npartitions"]), len(items)))
    name = "create-" + tokenize(node.full_label, items, parts)
    bounds = [len(items) * i // parts for i in range(parts + 1)]
    graph = {(name, i): items[bounds[i]:bounds[i + 1]] for i in range(parts)}
    return Bag(graph, name, parts)


def lifts(node) -> bool:
    """Whether :func:`combine_per_key` translates composite ``node``: a ``CombinePerKey`` of a
    :class:`~apache_beam.transforms.core.CombineFn` without extra arguments or side inputs, over
    the global window (anything else keeps Beam's expansion: a GroupByKey, then the combine)."""
    transform = node.transform
    if type(transform) is not beam.CombinePerKey or transform.args or transform.kwargs \
            or node.side_inputs or not isinstance(transform.fn, beam.CombineFn):
        return False
    mains = list(node.main_inputs.values())
    return (len(mains) == 1 and len(node.outputs) == 1
            and isinstance(mains[0].windowing.windowfn, GlobalWindows))


def combine_per_key(node, input_bag):
    """The bag of ``CombinePerKey`` ``node`` (:func:`lifts`) over ``input_bag``, lifted: each
    partition combines its own elements per key and compacts the accumulators
    (``CombineFn.compact``), only accumulators cross the shuffle, and each key's are merged and
    extracted after it (module docstring)."""
    fn = node.transform.fn
    return shuffled(input_bag.map_partitions(_combine_partition, fn)).map_partitions(_merge_partition, fn)


def _windowed_value_size(windowed) -> int:
    return 64 + sizeof(windowed.value)


def register_element_sizes() -> None:
    """Teach this process's ``dask.sizeof`` the bytes of a Beam element: Beam's translation holds
    every element in a ``WindowedValue``, which Dask sized at 80 bytes whatever it holds (a
    partition of 100 files' Arrow batches looked like a few kilobytes). The scheduler places a
    task where the bytes of its inputs are and weighs moving them by their size; misled, it ran
    both bounding tasks on the worker holding the side input, after copying the other worker's
    rows to it, while that worker idled (benchmarks/scale.py's task stream)."""
    sizeof.register(WindowedValue, _windowed_value_size)


class ElementSizes(WorkerPlugin):
    """A Dask worker plugin that calls :func:`register_element_sizes` in every worker process
    (sizes are measured where results are held); registered by :class:`DaskRunner` before the
    graph is submitted, and kept by workers that join later."""

    name = "beam-dp-element-sizes"
    idempotent = True

    def setup(self, worker) -> None:
        register_element_sizes()


def worker_slots(nthreads: Mapping[str, int]) -> list[str]:
    """The cluster's threads as worker addresses, dealt round the workers (``{a: 2, b: 1}`` ->
    ``[a, b, a]``), workers in address order; ``nthreads`` as ``Client.nthreads()`` gives it."""
    workers = sorted(nthreads)
    return [worker for turn in range(max(nthreads.values(), default=0))
            for worker in workers if nthreads[worker] > turn]


def spread_roots(graph: Mapping, slots: Sequence[str]) -> dict:
    """Where the partitions of each small root stage go: the tasks of a stage (one key name)
    that have no dependencies after fusion (a ``Create``'s partitions and what was fused onto
    them: reading files, a combine's first half), taken in partition order, are dealt round
    ``slots``, for stages of at most twice as many partitions as slots. Dask assigns such a
    stage's tasks at once, each to the worker with the least work it expects; with every task of
    a stage guessed at 0.5 s, ties go by the order the tasks arrive, which follows the graph's
    random tokens: in some runs one of 2 workers read both halves of the rows, the other both
    halves of the keyset, and both bounding tasks then followed the rows (module docstring).
    Larger stages are left to Dask, which queues them and hands them out as threads free up."""
    if len(slots) < 2:
        return {}
    stages = defaultdict(list)
    for key, task in graph.items():
        if type(key) is tuple and len(key) > 1 and not task.dependencies:
            stages[key[0]].append(key)
    return {key: slots[i % len(slots)]
            for keys in stages.values() if len(keys) <= 2 * len(slots)
            for i, key in enumerate(sorted(keys, key=_partition))}


def _partition(key: tuple) -> tuple:
    return key[1:]


def placed(bag: Bag, placement: Mapping) -> Bag:
    """``bag`` (already optimized) with the tasks of ``placement`` asked to run on the worker it
    names (loosely: another worker may run them if that one is gone or busy, and work stealing
    may still move them); computed with ``optimize_graph=False``, which keeps the annotation."""
    if not placement:
        return bag
    graph = dict(bag.__dask_graph__())
    roots = {key: graph.pop(key) for key in placement}
    name = "placed-roots-" + bag.name
    layers = {name: MaterializedLayer(roots, annotations={"workers": placement.__getitem__,
                                                          "allow_other_workers": True}),
              bag.name: MaterializedLayer(graph)}
    return Bag(HighLevelGraph(layers, {name: set(), bag.name: {name}}), bag.name, bag.npartitions)


class DaskRunner(BeamDaskRunner):
    """Beam's DaskRunner with :func:`par_do` for every ParDo (side inputs as graph dependencies,
    ``finish_bundle`` outputs kept, tagged outputs kept apart),
    :func:`combine_per_key` for combines, and root stages spread over the workers (module
    docstring)."""

    def run_pipeline(self, pipeline, options):
        """Beam's ``DaskRunner.run_pipeline``, with :class:`ElementSizes` registered on the cluster
        before the graph is submitted and the graph's small root stages placed by
        :func:`spread_roots`."""
        dask_options = options.view_as(DaskOptions).get_all_options(drop_default=True,
                                                                    current_only=True)
        bag_kwargs = DaskOptions._extract_bag_kwargs(dask_options)
        client = distributed.Client(**dask_options)
        client.register_plugin(ElementSizes(), name=ElementSizes.name)
        optimized = self.translate(pipeline, bag_kwargs)
        bag = placed(optimized, spread_roots(optimized.__dask_graph__(), worker_slots(client.nthreads())))
        return DaskRunnerResult(client, [client.compute(bag, optimize_graph=False)])

    @classmethod
    def translate(cls, pipeline, bag_kwargs=None) -> Bag:
        """``pipeline`` as the optimized Dask bag this runner submits (before placement): Beam's
        Dask overrides applied, every transform translated, the last one's graph culled and
        fused."""
        pipeline.replace_all(dask_overrides())
        visitor = cls.to_dask_bag_visitor(bag_kwargs)
        pipeline.visit(visitor)
        (optimized,) = dask.optimize(list(visitor.bags.values())[-1])
        return optimized

    @staticmethod
    def to_dask_bag_visitor(bag_kwargs=None):
        kwargs = bag_kwargs or {}
        exact = bool(kwargs.get("npartitions")) and not kwargs.get("partition_size")
        base = type(BeamDaskRunner.to_dask_bag_visitor(bag_kwargs))

        class Visitor(base):
            lifting = None  # the CombinePerKey whose parts are being skipped

            def bag_of(self, pcoll):
                """The bag of ``pcoll``: its producer's, or one tagged output's of a ParDo."""
                if pcoll.tag is None:
                    return self.bags[pcoll.producer]
                return self.__dict__.setdefault("tagged", {})[(pcoll.producer, pcoll.tag)]

            def main_bag(self, node):
                """The bag of ``node``'s one main input."""
                [main] = [self.bag_of(pcoll) for pcoll in node.main_inputs.values()]
                return main

            def par_do(self, node) -> None:
                """A ParDo's main outputs as the node's bag, each tagged output's apart."""
                sides = [self.bag_of(si.pvalue) for si in node.side_inputs]
                bag = par_do(node, self.main_bag(node), sides)
                tags = [tag for tag in node.outputs if tag is not None]
                for tag in tags:
                    self.__dict__.setdefault("tagged", {})[(node, tag)] = \
                        bag.map_partitions(tagged_outputs, tag)
                self.bags[node] = bag.map_partitions(main_outputs) if tags else bag

            def enter_composite_transform(self, node) -> None:
                if self.lifting is None and lifts(node):
                    main = self.main_bag(node)
                    [output] = node.outputs.values()
                    self.bags[output.producer] = combine_per_key(node, main)
                    self.lifting = node

            def leave_composite_transform(self, node) -> None:
                if node is self.lifting:
                    self.lifting = None

            def visit_transform(self, node) -> None:
                if self.lifting is not None:  # translated whole by combine_per_key
                    return
                if exact and type(node.transform) is _Create:
                    self.bags[node] = create(node, bag_kwargs)
                    return
                if type(node.transform) is _GroupByKeyOnly:
                    self.bags[node] = shuffled(self.main_bag(node)).map(_grouped_values)
                elif type(node.transform) is beam.ParDo:
                    self.par_do(node)
                elif type(node.transform) is _Flatten:
                    self.bags[node] = db.concat([self.bag_of(p) for p in node.inputs])
                elif any(getattr(p, "tag", None) is not None for p in node.inputs):
                    # Beam's translation looks inputs up by producer: only a NoOp passes one on
                    if TRANSLATIONS.get(type(node.transform)) is not None or len(node.inputs) != 1:
                        raise NotImplementedError(f"{node.full_label}: a tagged output as input")
                    self.bags[node] = self.bag_of(node.inputs[0])
                else:
                    super().visit_transform(node)

        return Visitor()
