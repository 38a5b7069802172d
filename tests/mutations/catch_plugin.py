"""pytest plugin of the mutation runner (loaded with ``-p catch_plugin`` in a scratch copy).

At session start it checks that the code under test is the scratch copy's (``MUTATION_ROOT``),
not an installed or other checkout. It records the first failing test phase as JSON in
``MUTATION_REPORT``: the test's node id, the phase, the exception type and whether it is an
assertion (``AssertionError`` or a subclass, e.g. ``accounting.verification.audit.AuditFailure``, or a group
of assertions only, as Hypothesis raises for several failing examples): only assertions count as
catching a mutant. Collection errors are recorded the same way (never
assertions).
"""
from __future__ import annotations

import importlib
import json
import os

import pytest

_reported = False


def _record(nodeid, phase, excinfo):
    global _reported
    if _reported:
        return
    _reported = True
    path = os.environ.get("MUTATION_REPORT")
    if not path:
        return
    typ = excinfo.type if excinfo is not None else None
    with open(path, "w") as handle:
        json.dump({"test": nodeid, "phase": phase,
                   "exception": f"{typ.__module__}.{typ.__qualname__}" if typ else None,
                   "assertion": phase == "call" and excinfo is not None
                   and _assertions_only(excinfo.value)}, handle)


def _assertions_only(error: BaseException) -> bool:
    """An AssertionError, or a group of them only: Hypothesis reports several distinct failing
    examples of one property test as an ExceptionGroup of their assertions."""
    if isinstance(error, BaseExceptionGroup):
        return all(_assertions_only(e) for e in error.exceptions)
    return isinstance(error, AssertionError)


def pytest_sessionstart(session):
    root = os.environ.get("MUTATION_ROOT")
    module = os.environ.get("MUTATION_MODULE")
    if root and module:
        loaded = importlib.import_module(module)
        where = os.path.realpath(loaded.__file__)
        if not where.startswith(os.path.realpath(root) + os.sep):
            raise pytest.UsageError(f"{module} is imported from {where}, not from the scratch copy "
                                    f"{root}: PYTHONPATH does not reach the mutated code")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed:
        _record(item.nodeid, call.when, call.excinfo)


def pytest_collectreport(report):
    if report.failed:
        _record(report.nodeid or "<collection>", "collect", None)
