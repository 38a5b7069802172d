"""A DoFn's per-element work on a few threads, its outputs in input order.

The in-process engine (FnApiRunner with one worker) runs a job on one core. A DoFn whose work per
element is a pure function of the element, and mostly Arrow, numpy or AES (which release the
GIL), can run several elements' work at once on threads of its instance. Other runners run
bundles on every core already, so their DoFns keep one thread (no pool: the work runs inline).

How many threads, and how many rows a DoFn gathers into one batch, the DoFns read from the
pipeline's :class:`ExecutionOptions` (``--dofn_threads``, ``--dofn_batch_rows``). Without
``--dofn_threads`` (a user's plain ``beam.Pipeline()``, a notebook, a job's in-process run alike)
:func:`default_threads` chooses: the machine's cores, at most :data:`MAX_THREADS`, on Beam's
in-process engine with one worker, which otherwise runs every bundle on one core; one thread on
every other runner, whose workers run bundles on every core already (a runner profile may state
it: :mod:`runners.profiles`). Threads change no output: each element's
work is a pure function of the element, and random choices depend on row content and the
release key only.

:class:`OrderedThreads` keeps at most ``2 x threads`` elements in flight (the thread that feeds
them may be busy reading the next input while the threads finish theirs), so memory stays
bounded; results come back in submission order with the timestamp and window of their element
(a DoFn wraps them in ``WindowedValue``). The DoFn hands back what is left in ``finish_bundle``
(so a runner that drops what ``finish_bundle`` emits needs one thread). Beam's metrics are per
thread: the work returns what it would count, and the DoFn counts it when the result
comes back, on the bundle's thread (:class:`ThreadedDoFn`).
"""
from __future__ import annotations

import collections
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Optional, Tuple

from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.utils.windowed_value import WindowedValue

#: Rows a DoFn gathers from row elements (dicts, Rows) into one Arrow batch, unless the
#: pipeline's :class:`ExecutionOptions` say otherwise.
BATCH_ROWS = 20_000
#: The most threads a DoFn gets by default on the in-process engine (:func:`default_threads`).
MAX_THREADS = 4


class ExecutionOptions(PipelineOptions):
    """How this project's DoFns work on the pipeline's runner (module docstring). Given on the
    command line (or by a runner profile: :func:`runners.profiles.pipeline_options_for`), they
    win over the defaults chosen for the runner."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument(
            "--dofn_threads", type=int, default=None,
            help="the most threads a DoFn of this project runs its per-element work on (and how "
                 "many it uses when the transform asks for none); default: the cores, at most "
                 f"{MAX_THREADS}, on the in-process engine with one worker, else 1")
        parser.add_argument(
            "--dofn_batch_rows", type=int, default=None,
            help=f"rows a DoFn gathers from row elements (dicts, Rows) into one Arrow batch "
                 f"(default {BATCH_ROWS:,}); a batch not full at the end of a bundle is emitted from "
                 "finish_bundle, so a runner that drops what finish_bundle emits needs 1")

    def validate(self, validator=None):
        errors = []
        for name in ("dofn_threads", "dofn_batch_rows"):
            value = getattr(self, name)
            if value is not None and value < 1:
                errors.append(f"--{name} must be at least 1, got {value}")
        return errors


def execution_options(pipeline) -> ExecutionOptions:
    """The :class:`ExecutionOptions` view of ``pipeline``'s options (defaults without options)."""
    options = getattr(pipeline, "options", None)
    view = (options if options is not None else PipelineOptions([])).view_as(ExecutionOptions)
    for error in view.validate():
        raise ValueError(error)
    return view


def check_threads(threads: Optional[int]) -> Optional[int]:
    """``threads`` (None: chosen for the runner), refused below 1."""
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return threads


#: Beam's runners that run a pipeline's bundles one at a time in this process (the embedded
#: FnApiRunner; Beam's DirectRunner, which runs the pipeline on it or on Prism's loopback worker,
#: also one process).
IN_PROCESS_RUNNERS = ("DirectRunner", "SwitchingDirectRunner", "FnApiRunner",
                      "BundleBasedDirectRunner")


def cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def _runner_name(pipeline) -> str:
    """The short class name of ``pipeline``'s runner (its options' ``--runner`` for an object
    without one)."""
    from apache_beam.options.pipeline_options import StandardOptions

    runner = getattr(pipeline, "runner", None)
    if runner is None:
        options = getattr(pipeline, "options", None) or PipelineOptions([])
        runner = options.view_as(StandardOptions).runner or "DirectRunner"
    name = runner if isinstance(runner, str) else type(runner).__name__
    return name.rsplit(".", 1)[-1]


def default_threads(pipeline) -> Optional[int]:
    """Threads for a DoFn's work when ``pipeline`` has no ``--dofn_threads``: the cores, at most
    :data:`MAX_THREADS`, on the in-process engine with one worker (``--direct_num_workers=1``,
    Beam's default); None (one thread, no cap on a transform's own request) on any other runner
    and with several workers (module docstring)."""
    from apache_beam.options.pipeline_options import DirectOptions

    options = getattr(pipeline, "options", None) or PipelineOptions([])
    if _runner_name(pipeline) not in IN_PROCESS_RUNNERS or \
            options.view_as(DirectOptions).direct_num_workers not in (None, 1):
        return None
    return max(1, min(MAX_THREADS, cores()))


def threads_for(pipeline, requested: Optional[int] = None) -> int:
    """Threads for a DoFn's per-element work in ``pipeline``: ``requested`` (None: the
    pipeline's ``--dofn_threads``, else :func:`default_threads`, else 1), never more than
    ``--dofn_threads`` or the in-process default (a runner that drops what finish_bundle emits,
    where threaded DoFns hand back their last results, sets ``--dofn_threads=1``)."""
    check_threads(requested)
    most = execution_options(pipeline).dofn_threads or default_threads(pipeline)
    if requested is None:
        return most or 1
    return int(requested) if most is None else min(int(requested), most)


def batch_rows(pipeline) -> int:
    """Rows a DoFn of ``pipeline`` gathers into one batch (``--dofn_batch_rows``, default
    :data:`BATCH_ROWS`)."""
    return execution_options(pipeline).dofn_batch_rows or BATCH_ROWS


class OrderedThreads:
    """Work submitted element by element, run on ``threads`` threads (inline for 1), results
    returned in submission order as ``(result, timestamp, window)``."""

    def __init__(self, threads: int, name: str = "dofn"):
        self.threads = int(check_threads(threads))
        self._name = name
        self._pool = None
        self._pending = collections.deque()

    def __getstate__(self):  # a DoFn is pickled before setup: no pool, nothing pending
        return {"threads": self.threads, "_name": self._name}

    def __setstate__(self, state):
        self.__init__(state["threads"], state["_name"])

    @property
    def threaded(self) -> bool:
        return self.threads > 1

    def start(self) -> None:
        """Create the threads (DoFn.setup)."""
        if self.threaded and self._pool is None:
            self._pool = ThreadPoolExecutor(self.threads, thread_name_prefix=self._name)

    def reset(self) -> None:
        """Forget what a failed bundle left in flight (DoFn.start_bundle)."""
        for future, _, _ in self._pending:
            future.cancel()
        self._pending = collections.deque()

    def stop(self) -> None:
        """Stop the threads (DoFn.teardown)."""
        self.reset()
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def submit(self, work: Callable[..., Any], args: tuple, timestamp, window
               ) -> Iterator[Tuple[Any, Any, Any]]:
        """Start ``work(*args)``; yield the results now due (the oldest, while more than
        ``2 x threads`` are in flight). Inline without threads: yields this element's result."""
        if not self.threaded:
            yield work(*args), timestamp, window
            return
        if self._pool is None:
            self.start()
        self._pending.append((self._pool.submit(work, *args), timestamp, window))
        while len(self._pending) > 2 * self.threads:
            yield self._oldest()

    def drain(self) -> Iterator[Tuple[Any, Any, Any]]:
        """Yield every result still in flight, in submission order (DoFn.finish_bundle)."""
        while self._pending:
            yield self._oldest()

    def in_flight(self) -> int:
        return len(self._pending)

    def _oldest(self):
        future, timestamp, window = self._pending.popleft()
        return future.result(), timestamp, window  # raises what the work raised


class ThreadedDoFn:
    """What a DoFn running its per-element work on :class:`OrderedThreads` shares (mixed into a
    ``beam.DoFn``): the threads' life (setup, teardown, a fresh start per bundle), handing back
    each result ``(outputs, counts)`` in order (outputs as they are when inline, else wrapped
    with their element's timestamp and window; ``counts``: ``(counter, amount)`` pairs passed to
    :meth:`count` on the bundle's thread) and the last results in ``finish_bundle``."""

    def _threads(self, threads: int, name: str) -> None:
        self._work = OrderedThreads(threads, name)

    def setup(self):
        self._work.start()

    def teardown(self):
        self._work.stop()

    def start_bundle(self):
        self._work.reset()

    def finish_bundle(self):
        for result, timestamp, window in self._work.drain():
            yield from self._hand_back(result, timestamp, window)

    def _submit(self, work: Callable, args: tuple, timestamp, window):
        """Run ``work(*args)`` (a pure function of the element returning ``(outputs, counts)``);
        yield the outputs now due."""
        for result, ts, win in self._work.submit(work, args, timestamp, window):
            yield from self._hand_back(result, ts, win)

    def count(self, name: str, amount: int) -> None:
        raise NotImplementedError

    def _hand_back(self, result, timestamp, window):
        outputs, counts = result
        for name, amount in counts:
            self.count(name, amount)
        if not self._work.threaded:  # inline: outputs take the element's window as usual
            yield from outputs
            return
        for output in outputs:
            yield WindowedValue(output, timestamp, [window])
