"""A DoFn's per-element work on a few threads, its outputs in input order.

The in-process engine (FnApiRunner with one worker) runs a job on one core. A DoFn whose work per
element is a pure function of the element, and mostly Arrow, numpy or AES (which release the
GIL), can run several elements' work at once on threads of its instance: two threads do the
bounding and noise of this project's jobs about 1.7x as fast as one on two cores. Other runners
run bundles on every core already, so their DoFns keep one thread (no pool: the work runs inline).

:class:`OrderedThreads` keeps at most ``2 x threads`` elements in flight (the thread that feeds
them may be busy reading the next input while the threads finish theirs), so memory stays
bounded; results come back in submission order with the timestamp and window of their element
(a DoFn wraps them in ``WindowedValue``). The DoFn hands back what is left in ``finish_bundle``
(Beam's DaskRunner drops what ``finish_bundle`` emits: there, use one thread). Beam's metrics
are per thread: the work returns what it would count, and the DoFn counts it when the result
comes back, on the bundle's thread (:class:`ThreadedDoFn`).
"""
from __future__ import annotations

import collections
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterator, Optional, Tuple

from apache_beam.utils.windowed_value import WindowedValue

#: The most threads :func:`dofn_threads` gives the in-process engine.
MAX_THREADS = 4
_IN_PROCESS_RUNNERS = ("", "DirectRunner", "SwitchingDirectRunner", "FnApiRunner",
                       "BundleBasedDirectRunner")


def _runner_name(pipeline) -> Optional[str]:
    """The last dotted part of the pipeline's ``--runner`` ("" for the default), None without
    options."""
    from apache_beam.options.pipeline_options import StandardOptions

    options = getattr(pipeline, "_options", None)
    if options is None:
        return None
    runner = options.view_as(StandardOptions).runner or ""
    name = runner if isinstance(runner, str) else type(runner).__name__
    return name.rsplit(".", 1)[-1]


def dofn_threads(pipeline) -> int:
    """Threads for a DoFn's per-element work (:class:`OrderedThreads`) in ``pipeline``: the
    machine's cores (at most :data:`MAX_THREADS`) on the in-process engine run with one worker,
    which otherwise uses a single core; 1 on every other runner (Dataflow, Flink, Spark, Prism
    and Dask run bundles on every core already: more threads would oversubscribe them) and on
    the in-process engine run with ``--direct_num_workers`` other than 1."""
    from apache_beam.options.pipeline_options import DirectOptions

    if _runner_name(pipeline) not in _IN_PROCESS_RUNNERS:
        return 1
    if pipeline._options.view_as(DirectOptions).direct_num_workers != 1:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, min(MAX_THREADS, cores))


def runs_on_dask(pipeline) -> bool:
    return _runner_name(pipeline) == "DaskRunner"


def check_threads(threads: Optional[int]) -> Optional[int]:
    """``threads`` (None: chosen for the runner), refused below 1."""
    if threads is not None and threads < 1:
        raise ValueError(f"threads must be >= 1, got {threads}")
    return threads


def threads_for(pipeline, requested: Optional[int] = None) -> int:
    """``requested`` threads (None: :func:`dofn_threads`), and 1 on Dask whatever was requested
    (its runner drops what finish_bundle emits, where threaded DoFns hand back their last
    results)."""
    check_threads(requested)
    if runs_on_dask(pipeline):
        return 1
    return dofn_threads(pipeline) if requested is None else int(requested)


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
