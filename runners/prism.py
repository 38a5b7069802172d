"""Prism: what a run on Beam's Go runner needs on this machine, checked before it starts.

Beam's PrismRunner starts a Prism job server from a binary it finds when the pipeline is
submitted (``PrismJobServer``: ``--prism_location`` -- a local file, a URL or a release page --
or a release binary for the installed Beam, downloaded into Beam's cache). A binary that is
missing then fails the run only after everything before it was done. :class:`PrismExecution`
finds it the same way, through Beam's own resolution, without starting a job server: a
``--prism_location`` that names no file is refused with Beam's message, and a binary that must
be downloaded is downloaded into Beam's cache now (Beam's message if it cannot be). A run given
``--job_endpoint`` uses a running job server and needs no binary.
"""
from __future__ import annotations

import os

from runners.execution import Execution, RunnerUnavailable


def check_binary(options) -> str:
    """The local Prism binary a run on ``options`` would start (downloaded into Beam's cache if
    it must be); raises :class:`RunnerUnavailable` with Beam's message."""
    from apache_beam.runners.portability.prism_runner import PrismJobServer

    server = PrismJobServer(options)
    try:
        source = server.path_to_binary()  # --prism_location resolved, or the release's URL
        if os.path.isfile(source):
            return source
        return PrismJobServer.local_bin(source)  # the cached copy, else downloaded now
    except (ValueError, RuntimeError, OSError, AssertionError) as err:
        raise RunnerUnavailable(f"PrismRunner: {err}") from None


class PrismExecution(Execution):
    """How a run goes on Prism: Beam's own run, its binary checked first (:func:`check_binary`)."""

    def check(self, options, runner) -> None:
        from apache_beam.options.pipeline_options import PortableOptions

        if not options.view_as(PortableOptions).job_endpoint:
            check_binary(options)
