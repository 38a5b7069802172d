"""Progress of a run on the operator's console: one line per phase change and per tick.

A long release must not be silent: a scheduler's log shows, for every job, the lifecycle phase it
is in (:data:`PHASES`, :mod:`pipelines.release.lifecycle`), the rows read so far and the time
elapsed, one line each on stderr::

    centralnotice: progress: phase=compute rows_read=- elapsed=10.0s

at each phase change and, while the Beam run is waited for (:meth:`Progress.ticking`), every
``interval`` seconds (10 by default) from a background thread stopped when the wait ends,
whatever its outcome. ``rows_read`` is ``-`` until the rows read are known: from the release's
staged row counters (:mod:`pipelines.release.counters`, the ``<input>.read`` counters, read
back by ``collect``), the same on every runner. The last line says ``phase=done``. The lines also
go into each operator report's timing (``progress``). They hold no raw-data fact beyond the row
count the operator's summary already shows: stderr and the operator report are the operator's.
"""
from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from typing import Callable, Iterator, Mapping, Optional, TextIO

#: The lifecycle's phases, in order (pipelines.release.lifecycle), then the end of the run.
PHASES = ("preflight", "reserve", "compute", "rule", "publish", "commit", "done")

#: Seconds between two lines while the pipeline runs.
INTERVAL = 10.0


def rows_read(counters: Mapping[str, Optional[Mapping[str, int]]], inputs) -> Optional[int]:
    """The rows read by the run from its releases' staged counters (release id -> counters, None
    for a release whose staging holds none): the run-level ``<input>.read`` counters of the
    ``inputs``, the same in every release's counters (the most any release holds); None when no
    release staged counters."""
    found = [sum(int(c.get(f"{name}.read", 0)) for name in inputs)
             for c in counters.values() if c is not None]
    return max(found) if found else None


class Progress:
    """The progress lines of one run of ``job`` (written to ``stream``, stderr by default, and
    kept in :attr:`lines`). Thread-safe: the ticking thread and the run write through one lock."""

    def __init__(self, job: str, *, stream: Optional[TextIO] = None, interval: float = INTERVAL,
                 clock: Callable[[], float] = time.monotonic):
        if not interval > 0:
            raise ValueError("the progress interval must be positive")
        self._job, self._stream, self._interval, self._clock = job, stream, interval, clock
        self._started = clock()
        self._phase: Optional[str] = None
        self._rows: Optional[int] = None
        self._lines: list[str] = []
        self._lock = threading.Lock()

    @property
    def lines(self) -> tuple:
        with self._lock:
            return tuple(self._lines)

    def phase(self, name: str) -> None:
        """The run enters phase ``name`` (one of :data:`PHASES`): a line."""
        if name not in PHASES:
            raise ValueError(f"unknown phase {name!r}; phases: {PHASES}")
        with self._lock:
            self._phase = name
        self._line()

    def rows(self, count: Optional[int]) -> None:
        """The rows read so far (None: not known); shown from the next line on."""
        with self._lock:
            self._rows = count

    def _line(self) -> None:
        with self._lock:
            rows = "-" if self._rows is None else str(self._rows)
            line = (f"{self._job}: progress: phase={self._phase} rows_read={rows} "
                    f"elapsed={self._clock() - self._started:.1f}s")
            self._lines.append(line)
            stream = self._stream if self._stream is not None else sys.stderr
            try:
                print(line, file=stream, flush=True)
            except (OSError, ValueError):  # a closed console never fails the release
                pass

    @contextmanager
    def ticking(self) -> Iterator[None]:
        """A line every ``interval`` seconds while the body runs (the Beam run waited for); the
        thread is stopped and joined when the body ends, however it ends."""
        stop = threading.Event()

        def tick():
            while not stop.wait(self._interval):
                self._line()

        thread = threading.Thread(target=tick, name=f"{self._job}-progress", daemon=True)
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
