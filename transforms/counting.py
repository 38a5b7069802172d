"""Counters as pipeline output: what a DoFn counts reaches the pipeline as a small PCollection.

Beam's metrics are the runner's to collect, and not every runner returns them (a result whose
``metrics()`` is not implemented), nor do they say exactly what the data held when a runner
retries work. Raw-data facts the operator relies on (rows read, dropped and why) are therefore
computed by the pipeline itself:

* a DoFn that counts mixes in :class:`CountingDoFn` and counts on the :class:`Counters` it holds
  (``counters.inc(name, amount)``, or a :class:`Counter` handle's ``inc(amount)``, Beam's metric
  API). Amounts accumulate in the DoFn instance for the bundle in progress; ``finish_bundle``
  emits them as one element ``{(namespace, name): amount}`` to the output tagged
  :data:`COUNTS` -- one element per bundle, never one per row, and a retried bundle's counts
  are those of the attempt whose outputs the runner kept;
* :class:`Counted` applies such a DoFn (``ParDo(fn).with_outputs(COUNTS)``), returns its main
  output and records the counts PCollection with the pipeline;
* :class:`AllCounts` flattens every recorded counts PCollection of a pipeline and combines them
  with :class:`SumCounts` (partial sums per worker before the shuffle): one element
  ``{namespace: {name: amount}}``.

Every amount is also added to a Beam metric of the same namespace and name (the runner's UI, and
library users reading ``result.metrics()``); nothing of this layer reads them back.
"""
from __future__ import annotations

import weakref
from typing import Iterable, Mapping

import apache_beam as beam
from apache_beam.metrics import Metrics
from apache_beam.pvalue import TaggedOutput
from apache_beam.transforms.window import GlobalWindow, GlobalWindows, IntervalWindow
from apache_beam.utils.timestamp import MAX_TIMESTAMP, MIN_TIMESTAMP
from apache_beam.utils.windowed_value import WindowedValue

#: The output tag of a counting DoFn's counts (its main output is untagged).
COUNTS = "counts"
MAIN = "main"


class Counters:
    """The counters of one namespace held by a DoFn, each name optionally under ``prefix``
    (e.g. an input's name). Pickled without amounts: each DoFn instance counts its own.

    A copy unpickled by a runner counts only once a :class:`CountingDoFn` holding it has started
    a bundle: counted anywhere else (a ``beam.Map`` function, a helper object the DoFn does not
    hold as an attribute) its amounts would never reach the pipeline, so ``inc`` raises instead
    of losing them. A group made in the process that uses it (a DoFn's ``setup``, a test) counts
    at once."""

    def __init__(self, namespace: str, prefix: str = ""):
        self._namespace, self._prefix = namespace, prefix
        self._reset()
        self._adopted = True

    def _reset(self) -> None:
        self._pending: dict[tuple[str, str], int] = {}
        self._metrics: dict[str, object] = {}

    def __getstate__(self):
        return {"_namespace": self._namespace, "_prefix": self._prefix}

    def __setstate__(self, state):
        self.__dict__.update(state)
        self._reset()
        self._adopted = False  # until a CountingDoFn holding it starts a bundle

    @property
    def namespace(self) -> str:
        return self._namespace

    def inc(self, name: str, amount=1) -> None:
        """Add ``amount`` (an int, a numpy integer or a bool) to counter ``prefix + name``."""
        amount = int(amount)
        if not amount:
            return
        if not self._adopted:
            raise RuntimeError(
                f"counter {self._namespace}/{self._prefix}{name} counted outside a CountingDoFn "
                "that holds it: its amount would never reach the pipeline's counters (count in "
                "a transforms.counting.CountingDoFn applied with Counted)")
        name = self._prefix + name
        key = (self._namespace, name)
        self._pending[key] = self._pending.get(key, 0) + amount
        if name not in self._metrics:
            self._metrics[name] = Metrics.counter(self._namespace, name)
        self._metrics[name].inc(amount)

    def counter(self, name: str) -> "Counter":
        """A handle on one counter of this group, with Beam's ``inc(amount=1)``."""
        return Counter(self, name)

    def drain(self) -> dict[tuple[str, str], int]:
        """The amounts counted since the last drain, cleared."""
        pending, self._pending = self._pending, {}
        return pending


class Counter:
    """One counter of a :class:`Counters` group (drained with its group)."""

    def __init__(self, group: Counters, name: str):
        self.group, self.name = group, name

    def inc(self, amount=1) -> None:
        self.group.inc(self.name, amount)


def _groups(dofn) -> list[Counters]:
    """The Counters groups a DoFn holds: attributes that are groups or counters, or dicts,
    lists and tuples of them (each group once)."""
    found = {}

    def add(value):
        group = value.group if isinstance(value, Counter) else value
        if isinstance(group, Counters):
            found.setdefault(id(group), group)

    for value in vars(dofn).values():
        add(value)
        if isinstance(value, dict):
            value = value.values()
        if isinstance(value, (list, tuple, type({}.values()))):
            for item in value:
                add(item)
    return list(found.values())


def merge(partials: Iterable[Mapping[tuple[str, str], int]]) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    for partial in partials:
        for key, amount in partial.items():
            out[key] = out.get(key, 0) + amount
    return out


class CountingDoFn(beam.DoFn):
    """A DoFn whose :class:`Counters` (attributes, see :func:`_groups`) reach the pipeline: a
    bundle's amounts are emitted, tagged :data:`COUNTS`, when it finishes (module docstring).
    Mix it in first (``class F(CountingDoFn, OtherMixin, beam.DoFn)``): its ``start_bundle``
    and ``finish_bundle`` hand on to the next class's."""

    #: Whether a bundle's counts are emitted: set by :class:`Counted`, which declares their
    #: tag (applied by a plain ``ParDo``, the DoFn counts in Beam metrics only).
    _emits_counts = False
    #: The window a bundle's counts are emitted in (set by :class:`Counted` for a windowed
    #: input: one window of the input's kind spanning all time; counts belong to no window).
    _counts_window = None

    def start_bundle(self):
        for group in _groups(self):
            group.drain()  # a failed bundle's amounts are never emitted
            group._adopted = True
        parent = getattr(super(), "start_bundle", None)
        if parent is not None:
            parent()

    def finish_bundle(self):
        parent = getattr(super(), "finish_bundle", None)
        outputs = parent() if parent is not None else None
        if outputs is not None:
            yield from outputs
        partial = merge(group.drain() for group in _groups(self))
        if partial and self._emits_counts:
            window = self._counts_window or GlobalWindow()
            yield TaggedOutput(COUNTS, WindowedValue(partial, MIN_TIMESTAMP, (window,)))


_RECORDED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def counts_of(pipeline) -> list:
    """The counts PCollections :class:`Counted` recorded for ``pipeline``, in application order."""
    return list(_RECORDED.get(pipeline, ()))


class Counted(beam.PTransform):
    """``ParDo(fn, *args, **kwargs)`` of a :class:`CountingDoFn`: its main output (typed
    ``output_type`` when given); its counts recorded for :class:`AllCounts`, in the global
    window whatever the input's windowing (counts are the run's, not a window's). ``tagged``:
    further outputs the fn emits as ``TaggedOutput(tag, ...)``; then the result is a dict
    {:data:`MAIN`: main output, tag: that output, ...}."""

    def __init__(self, fn: CountingDoFn, *args, output_type=None, tagged=(), **kwargs):
        super().__init__()
        if not isinstance(fn, CountingDoFn):
            raise TypeError(f"Counted needs a CountingDoFn, got {type(fn).__name__}")
        self._fn, self._args, self._kwargs, self._type = fn, args, kwargs, output_type
        self._tagged = tuple(tagged)

    def expand(self, pcoll):
        windowed = not isinstance(pcoll.windowing.windowfn, GlobalWindows)
        # An interval window is what the windowed inputs here hold (fixed, sliding, sessions);
        # the fn is copied by ParDo, so it is set before.
        self._fn._emits_counts = True
        self._fn._counts_window = IntervalWindow(MIN_TIMESTAMP, MAX_TIMESTAMP) if windowed else None
        par_do = beam.ParDo(self._fn, *self._args, **self._kwargs)
        if self._type is not None:
            par_do = par_do.with_output_types(self._type)
        outputs = pcoll | f"ParDo({type(self._fn).__name__})" >> par_do.with_outputs(
            COUNTS, *self._tagged, main=MAIN)
        counts = outputs[COUNTS]
        if windowed:
            counts = counts | "CountsInTheGlobalWindow" >> beam.WindowInto(GlobalWindows())
        _RECORDED.setdefault(pcoll.pipeline, []).append(counts)
        if self._tagged:
            return {MAIN: outputs[MAIN], **{tag: outputs[tag] for tag in self._tagged}}
        return outputs[MAIN]


class SumCounts(beam.CombineFn):
    """Partial counts ``{(namespace, name): amount}`` -> ``{namespace: {name: amount}}``,
    sorted (counters that sum to zero kept: they were counted)."""

    def create_accumulator(self):
        return {}

    def add_input(self, accumulator, partial):
        for key, amount in partial.items():
            accumulator[key] = accumulator.get(key, 0) + amount
        return accumulator

    def merge_accumulators(self, accumulators):
        return merge(accumulators)

    def extract_output(self, accumulator):
        out: dict[str, dict[str, int]] = {}
        for (namespace, name), amount in sorted(accumulator.items()):
            out.setdefault(namespace, {})[name] = amount
        return out


class AllCounts(beam.PTransform):
    """PBegin -> one element: every count of the pipeline so far, ``{namespace: {name:
    amount}}`` (empty without counts). Apply it after every counting transform."""

    def expand(self, pbegin):
        recorded = counts_of(pbegin.pipeline)
        if not recorded:
            return pbegin | "NoCounts" >> beam.Create([{}])
        return (tuple(recorded) | "Flatten" >> beam.Flatten()
                | "Sum" >> beam.CombineGlobally(SumCounts()))

