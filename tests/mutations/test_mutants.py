"""The mutation suite's specs stay runnable (default suite; the suite itself: make
test-mutations): every mutant still applies to the tree, selects only privacy tests that exist,
and the runner tells an assertion (a catch) from a crash."""
from __future__ import annotations

import dataclasses
import os
import re
import sys

import pytest

import run
from mutants import AUDIT, BYTE_PINS, MUTANTS, PLANNED, PRIVACY_TESTS

ROOT = run.ROOT


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as handle:
        return handle.read()


def parameters(test):
    """The parameter ids a selected test can take: the registered audits' names for the audit
    test (parametrized over tests/audit_kit.py's REGISTRY), else the string literals of its file."""
    if test.startswith(AUDIT + "["):
        sys.path.insert(0, os.path.join(ROOT, "tests"))
        try:
            from audit_kit import REGISTRY
        finally:
            sys.path.pop(0)
        return set(REGISTRY)
    return set(re.findall(r'"([^"\n]+)"', read(test.partition("::")[0])))


@pytest.mark.parametrize("mutant", MUTANTS, ids=lambda m: m.name)
def test_every_mutant_applies_to_the_tree_and_selects_existing_privacy_tests(mutant):
    mutated = run.check_spec(mutant)          # the snippet is found exactly once
    assert mutated != read(mutant.file) and mutant.replacement in mutated
    assert mutant.tests and mutant.leak
    for test in mutant.tests:
        path, _, node = test.partition("::")
        assert path in PRIVACY_TESTS and path not in BYTE_PINS
        if node:
            function, _, param = node.partition("[")
            assert re.search(rf"^def {re.escape(function)}\(", read(path), re.M), test
            if param:
                assert param[:-1] in parameters(test), f"{test}: no parameter {param[:-1]!r}"


def test_mutant_names_are_unique_and_the_planned_ones_are_not_faked():
    names = [m.name for m in MUTANTS] + [p[0] for p in PLANNED]
    assert len(names) == len(set(names))
    assert AUDIT.startswith("tests/accounting/verification/test_audits.py::")
    assert not set(BYTE_PINS) & set(PRIVACY_TESTS)


def test_a_moved_snippet_or_a_byte_pin_is_refused():
    mutant = MUTANTS[0]
    with pytest.raises(run.SpecError, match="found 0 times.*retarget"):
        run.check_spec(dataclasses.replace(mutant, snippet=mutant.snippet + "  # moved"))
    with pytest.raises(run.SpecError, match="not a privacy test"):
        run.check_spec(dataclasses.replace(mutant, tests=(BYTE_PINS[0],)))
    with pytest.raises(run.SpecError, match="does not exist"):
        run.check_spec(dataclasses.replace(mutant, file="gone/moved_away.py"))


def test_the_runner_counts_assertions_only(tmp_path):
    """An assertion of a selected test catches; an exception of another type is a crash."""
    (tmp_path / "scratch").mkdir()
    (tmp_path / "scratch" / "test_x.py").write_text(
        "def test_ok():\n    pass\n\n"
        "def test_assert():\n    assert 1 == 2\n\n"
        "def test_crash():\n    raise TypeError('broken code')\n\n"
        "def test_asserts():\n    raise ExceptionGroup('two examples', [AssertionError(1), AssertionError(2)])\n\n"
        "def test_mixed():\n    raise ExceptionGroup('two examples', [AssertionError(1), TypeError(2)])\n")
    code, record, _ = run.run_pytest(str(tmp_path), ("scratch/test_x.py::test_ok",
                                                     "scratch/test_x.py::test_assert"),
                                     module=None, timeout=120)
    assert code == 1 and record == {"test": "scratch/test_x.py::test_assert", "phase": "call",
                                    "exception": "builtins.AssertionError", "assertion": True}
    code, record, _ = run.run_pytest(str(tmp_path), ("scratch/test_x.py::test_crash",),
                                     module=None, timeout=120)
    assert code == 1 and record["assertion"] is False and record["exception"] == "builtins.TypeError"
    # a property test's several failing examples (Hypothesis: a group of assertions) catch
    code, record, _ = run.run_pytest(str(tmp_path), ("scratch/test_x.py::test_asserts",),
                                     module=None, timeout=120)
    assert code == 1 and record["assertion"] is True
    code, record, _ = run.run_pytest(str(tmp_path), ("scratch/test_x.py::test_mixed",),
                                     module=None, timeout=120)
    assert code == 1 and record["assertion"] is False
    code, record, _ = run.run_pytest(str(tmp_path), ("scratch/test_x.py::test_ok",), module=None, timeout=120)
    assert code == 0 and record == {}
    # the mutated module must come from the scratch copy
    code, _, output = run.run_pytest(str(tmp_path), ("scratch/test_x.py::test_ok",), module="json",
                                     timeout=120)
    assert code != 0 and "not from the scratch copy" in output


def test_the_documented_list_command(capsys):
    assert run.main(["--list"]) == 0
    out = capsys.readouterr().out
    assert all(m.name in out for m in MUTANTS) and all(f"{p[0]} (planned)" in out for p in PLANNED)
    with pytest.raises(SystemExit):
        run.main(["--only", "no-such-mutant"])
