"""A command-line entry's console: libraries quiet, no Beam ``apitools not found`` warning.

``python -m pipelines.NAME`` sets its console up front (:func:`console_logging`: Beam is imported
later, by the job modules that need it, so a Beam-free command such as the catalog never pays
for it), the runners' and libraries' loggers at WARNING (:func:`runners.seam.library_logging`);
``python -m runners.NAME`` and the Beam benchmarks import Beam quietly
(:func:`quiet_beam_import`). It lives in runners/ because runners/ imports no job
(tests/test_layout.py); ``pipelines`` re-exports it.
"""
import importlib.util
import logging
import os
import sys


class _ApitoolsNotice(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("apitools not found")


def quiet_beam_import() -> None:
    """Import Beam without its ``apitools not found`` WARNING.

    Beam logs it through the root logger when google-apitools is absent: only Beam's BigQuery IO
    needs apitools, and neither the base install nor the tests install it (the worker container
    does, through ``apache-beam[gcp]``). Logged through ``logging.warning`` with no handler set,
    it would also configure the root logger, so that the CLI's ``LOGLEVEL`` had no effect. A
    temporary handler and filter keep both away; every other message passes.
    """
    if "apache_beam" in sys.modules or importlib.util.find_spec("apitools") is not None:
        return
    root, handler, notice = logging.getLogger(), logging.NullHandler(), _ApitoolsNotice()
    root.addHandler(handler)
    root.addFilter(notice)
    try:
        import apache_beam  # noqa: F401
    finally:
        root.removeFilter(notice)
        root.removeHandler(handler)


def console_logging() -> None:
    """The console of ``python -m pipelines.NAME``, set before anything imports Beam: the root
    logger's one handler, on stderr at ``LOGLEVEL`` (default WARNING), that drops Beam's
    ``apitools not found`` notice (whichever module imports Beam, whenever). A no-op when
    logging is already configured."""
    root = logging.getLogger()
    if root.handlers:
        return
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "WARNING"))
    for handler in root.handlers:
        handler.addFilter(_ApitoolsNotice())
    from runners.seam import library_logging

    library_logging()


def module_run() -> str:
    """The module ``python -m`` runs (from ``sys.orig_argv``), or "" when none is run."""
    argv = list(getattr(sys, "orig_argv", ()))
    return argv[argv.index("-m") + 1] if "-m" in argv[:-1] else ""
