"""Beam's DaskRunner, with a ParDo's side inputs computed once, as dependencies in the graph.

Beam's Dask translation (``apache_beam.runners.dask``, Beam 2.77) hands a ParDo its side inputs
as the side input's dask bag, which each task of the ParDo computes when its DoFn first reads
the side input (``list(bag)`` inside the task, through a worker client). So the side input's
chain starts only once a main-input partition has reached its first element (after everything
fused before it in the same task: reading the partition's files), it is computed again for each
partition that reads it unless the results happen to be still held, and its upstream shared with
the main graph (a keyset read for the release and for its filter) runs twice. At 30M keys on 2
workers the keyset filter's chain started 0.9 s and 2.9 s into the run, while its tasks waited
for workers busy reading rows, and bounding could not start before 7.4 s (runners/README.md,
"Scale benchmark").

:class:`DaskRunner` here is Beam's runner with one change: a ParDo with side inputs gets each side
input as one ``dask.delayed`` task over the side input bag's partitions (computed once, a
dependency of every partition of the ParDo, scheduled with the rest of the graph, and sharing
its upstream tasks with it), and each partition builds from its value the same
:class:`~apache_beam.transforms.sideinputs.SideInputMap` Beam's translation builds from the bag.
The DoFn sees the same values in the same order; every other transform is translated by Beam.
(The partitions are passed one by one, ``bag.to_delayed(optimize_graph=False)``: with the bag
passed whole to ``dask.delayed``, one of event-level reports' two ``ToList`` side inputs came out
empty in one of the two partitions reading it; the cause was not pinned down, partition by
partition every job releases the in-process bytes.)

Measured (benchmarks/scale.py, runners/README.md): 125M keys / 200M rows, 1 worker 118.5 s
against 178.6 s with Beam's translation, 2 workers 83.8 s against 90.6 s; at 30M keys 1 worker
30.0-32.8 s against 31.9-39.2 s, 2 workers 21.9-25.6 s against 23.3-26.4 s. The profile names it
for ``--runner DaskRunner`` (:data:`runners.dask_cluster.DASK_RUNNER`); Beam's own runner stays
available by its full name. Released bytes are the same on both and in process
(tests/test_dask_runner.py).
"""
from __future__ import annotations

from apache_beam.runners.dask.dask_runner import DaskRunner as BeamDaskRunner

#: What ``--runner`` names to run on this module's runner.
RUNNER = "runners.dask_runner.DaskRunner"


def _values(*partitions):
    """The side input's elements: its bag's partitions, computed as dependencies, in order."""
    return [element for partition in partitions for element in partition]


def _apply_with_side_inputs(items, invoker_args, invoker_kwargs, receivers, views, *values):
    """Beam's ``apply_dofn_to_bundle`` with the side inputs rebuilt from their computed values,
    as Beam's ``DaskBagWindowedIterator`` yields them (each element in its window)."""
    from apache_beam.runners.dask.transform_evaluator import apply_dofn_to_bundle, get_windowed_value
    from apache_beam.transforms.sideinputs import SideInputMap

    side_inputs = [SideInputMap(view_class, options, [get_windowed_value(v, window_fn) for v in vals])
                   for (view_class, options, window_fn), vals in zip(views, values)]
    return apply_dofn_to_bundle(items, invoker_args, {**invoker_kwargs, "side_inputs": side_inputs},
                                receivers)


def par_do_with_side_inputs(node, input_bag, side_bags):
    """The bag of ParDo ``node`` over ``input_bag``, its side inputs' bags ``side_bags`` passed as
    delayed dependencies (module docstring). Beam's ``transform_evaluator.ParDo.apply`` otherwise."""
    import dask
    from apache_beam.runners.common import DoFnContext, DoFnSignature, _OutputHandler
    from apache_beam.runners.dask.transform_evaluator import OneReceiver, get_windowed_value
    from apache_beam.transforms.core import DoFn

    transform = node.transform
    args, kwargs = transform.raw_side_inputs
    main_input = next(iter(node.main_inputs.values()))
    window_fn = main_input.windowing.windowfn if hasattr(main_input, "windowing") else None
    receivers = OneReceiver()
    invoker_args = [
        DoFnSignature(transform.fn),
        _OutputHandler(window_fn=window_fn, main_receivers=receivers[None],
                       tagged_receivers=receivers, per_element_output_counter=None,
                       output_batch_converter=None, process_yields_batches=False,
                       process_batch_yields_elements=False),
    ]
    invoker_kwargs = dict(context=DoFnContext(transform.label, state=None), input_args=list(args),
                          input_kwargs=kwargs, user_state_context=None,
                          bundle_finalizer_param=DoFn.BundleFinalizerParam())
    views = [(type(si), si._view_options(), si._window_mapping_fn) for si in node.side_inputs]
    values = [dask.delayed(_values, pure=True)(*bag.to_delayed(optimize_graph=False)) for bag in side_bags]
    return input_bag.map(get_windowed_value, window_fn).map_partitions(
        _apply_with_side_inputs, invoker_args, invoker_kwargs, receivers, views, *values)


class DaskRunner(BeamDaskRunner):
    """Beam's DaskRunner with :func:`par_do_with_side_inputs` for ParDos that have side inputs
    (module docstring)."""

    @staticmethod
    def to_dask_bag_visitor(bag_kwargs=None):
        import apache_beam as beam

        base = type(BeamDaskRunner.to_dask_bag_visitor(bag_kwargs))

        class Visitor(base):
            def visit_transform(self, node) -> None:
                if not (type(node.transform) is beam.ParDo and node.side_inputs):
                    super().visit_transform(node)
                    return
                [main] = [self.bags[pcoll.producer] for pcoll in node.main_inputs.values()]
                sides = [self.bags[si.pvalue.producer] for si in node.side_inputs]
                self.bags[node] = par_do_with_side_inputs(node, main, sides)

        return Visitor()
