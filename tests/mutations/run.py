"""The mutation suite: each mutant of mutants.py applied to a scratch copy of the tree, its
privacy tests run there; prints per mutant the test that caught it (``make test-mutations``).

    python tests/mutations/run.py                 # every mutant, 2 at a time
    python tests/mutations/run.py --only NAME     # one mutant (repeatable)
    python tests/mutations/run.py --list          # the mutants and their selections
    python tests/mutations/run.py --only NAME --tests tests/accounting/verification/test_audits.py   # another selection

Exit 0 when every mutant is caught (its first failing test is an assertion of a privacy test)
and every catching test passes on an unmutated scratch copy (the baseline: a test that fails
anyway catches nothing); 1 when a mutant survives, crashes the code instead of being caught,
or no longer applies (its snippet is not found exactly once: the code moved).

Each mutant runs in its own scratch copy (the files git knows of, tracked or not ignored: the
working tree as it is, without .venv or outputs), with ``PYTHONPATH`` set to that copy and the
plugin catch_plugin.py checking that the mutated module is imported from there. pytest runs
with ``-x`` (stop at the first failure) and ``-m "not runners"`` (slow tests may be selected;
``--markers`` changes it).
"""
from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)

from mutants import BYTE_PINS, MUTANTS, PLANNED, PRIVACY_TESTS, Mutant  # noqa: E402

_SKIP = {".git", ".venv", ".venv-airflow", "out", "build", "dist", "__pycache__", ".pytest_cache",
         ".hypothesis", ".agents"}


class SpecError(Exception):
    """A mutant that cannot be run as specified (the message says why)."""


@dataclass
class Outcome:
    mutant: Mutant
    status: str                 # caught, SURVIVED, CRASHED, NO LONGER APPLIES, BAD SPEC
    test: str = ""
    detail: str = ""
    seconds: float = 0.0


# ------------------------------------------------------------------------------ the specs

def check_spec(mutant: Mutant, root: str = ROOT, tests: Optional[tuple] = None) -> str:
    """The mutated text of ``mutant.file``; SpecError when the spec cannot run: its snippet not
    found exactly once, or a selection outside the privacy tests."""
    for test in tests if tests is not None else mutant.tests:
        path = mutant.file_of(test)
        if path in BYTE_PINS or path not in PRIVACY_TESTS:
            raise SpecError(f"selection {test!r} is not a privacy test (allowed: mutants.PRIVACY_TESTS; "
                            f"byte pins never count)")
        if not os.path.isfile(os.path.join(root, path)):
            raise SpecError(f"selection {test!r}: {path} does not exist")
    if mutant.snippet == mutant.replacement:
        raise SpecError("the replacement equals the snippet")
    path = os.path.join(root, mutant.file)
    if not os.path.isfile(path):
        raise SpecError(f"{mutant.file} does not exist (code moved? retarget the spec)")
    with open(path, encoding="utf-8") as handle:
        text = handle.read()
    found = text.count(mutant.snippet)
    if found != 1:
        raise SpecError(f"snippet found {found} times in {mutant.file}, expected once "
                        f"(code moved? retarget the spec): {mutant.snippet!r}")
    return text.replace(mutant.snippet, mutant.replacement)


def module_of(path: str) -> Optional[str]:
    """``transforms/noise/mechanisms.py`` -> ``transforms.noise.mechanisms`` (None outside a package)."""
    if not path.endswith(".py"):
        return None
    parts = path[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


# ------------------------------------------------------------------------------ scratch copies

def tree_files(root: str) -> list[str]:
    """The working tree's files as git sees them (tracked, and untracked but not ignored); every
    file outside the skipped folders where git is not available."""
    try:
        out = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
                             cwd=root, capture_output=True, check=True).stdout
        return sorted({f for f in out.decode().split("\0") if f and os.path.isfile(os.path.join(root, f))})
    except (OSError, subprocess.CalledProcessError):
        files = []
        for folder, dirs, names in os.walk(root):
            dirs[:] = [d for d in dirs if d not in _SKIP and not d.endswith(".egg-info")]
            files += [os.path.relpath(os.path.join(folder, n), root) for n in names]
        return sorted(files)


def scratch_copy(files: list[str], root: str, target: str) -> None:
    for rel in files:
        destination = os.path.join(target, rel)
        os.makedirs(os.path.dirname(destination), exist_ok=True)
        shutil.copy2(os.path.join(root, rel), destination)


def run_pytest(copy: str, tests: tuple, *, module: Optional[str], timeout: float,
               markers: str = "not runners") -> tuple[int, dict, str]:
    """pytest on ``tests`` in ``copy``: (exit code, first failure record or {}, output tail)."""
    report = os.path.join(copy, ".mutation-report.json")
    if os.path.exists(report):
        os.remove(report)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([copy, HERE]), PYTHONDONTWRITEBYTECODE="1",
               MUTATION_REPORT=report, MUTATION_ROOT=copy)
    if module:
        env["MUTATION_MODULE"] = module
    else:
        env.pop("MUTATION_MODULE", None)
    command = [sys.executable, "-m", "pytest", "-x", "-q", "-p", "catch_plugin", "-p", "no:cacheprovider",
               "-m", markers, "--tb=line", "-o", "console_output_style=classic", *tests]
    try:
        done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True, timeout=timeout)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired as error:
        out = error.stdout or b""
        out = out.decode() if isinstance(out, bytes) else out
        return -1, {}, out[-2000:] + f"\ntimed out after {timeout:.0f} s"
    record = {}
    if os.path.exists(report):
        with open(report) as handle:
            record = json.load(handle)
    return code, record, output[-2000:]


def run_mutant(mutant: Mutant, files: list[str], workdir: str, *, tests: Optional[tuple] = None,
               timeout: float = 900.0, keep: bool = False, markers: str = "not runners") -> Outcome:
    start = time.monotonic()
    tests = tests if tests is not None else mutant.tests
    try:
        mutated = check_spec(mutant, tests=tests)
    except SpecError as error:
        status = "NO LONGER APPLIES" if "retarget" in str(error) else "BAD SPEC"
        return Outcome(mutant=mutant, status=status, detail=str(error))
    copy = tempfile.mkdtemp(prefix=f"{mutant.name}-", dir=workdir)
    try:
        scratch_copy(files, ROOT, copy)
        with open(os.path.join(copy, mutant.file), "w", encoding="utf-8") as handle:
            handle.write(mutated)
        code, record, output = run_pytest(copy, tests, module=module_of(mutant.file), timeout=timeout,
                                          markers=markers)
    finally:
        if not keep:
            shutil.rmtree(copy, ignore_errors=True)
    seconds = time.monotonic() - start
    if code == 0:
        return Outcome(mutant=mutant, status="SURVIVED", detail="every selected test passed", seconds=seconds)
    if record.get("assertion"):
        return Outcome(mutant=mutant, status="caught", test=record["test"], seconds=seconds)
    if record:
        detail = f"{record['test']} ({record['phase']}): {record['exception']}, not an assertion"
    else:
        detail = f"pytest exit {code}: {output.strip().splitlines()[-1] if output.strip() else ''}"
    return Outcome(mutant=mutant, status="CRASHED", test=record.get("test", ""), detail=detail,
                   seconds=seconds)


def baseline(tests: list[str], files: list[str], workdir: str, timeout: float) -> tuple[bool, str]:
    """The catching tests on an unmutated scratch copy: they must pass."""
    copy = tempfile.mkdtemp(prefix="baseline-", dir=workdir)
    try:
        scratch_copy(files, ROOT, copy)
        code, record, output = run_pytest(copy, tuple(tests), module=None, timeout=timeout)
    finally:
        shutil.rmtree(copy, ignore_errors=True)
    if code == 0:
        return True, f"{len(tests)} catching tests pass on the unmutated tree"
    return False, (f"{record.get('test', '?')} fails on the unmutated tree: it catches nothing\n"
                   f"{output}")


# ------------------------------------------------------------------------------ output

def table(outcomes: list[Outcome]) -> str:
    rows = [("mutant", "result", "caught by", "seconds")]
    for o in outcomes:
        rows.append((o.mutant.name, o.status, o.test or o.detail, f"{o.seconds:.0f}"))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for i, r in enumerate(rows):
        lines.append("  ".join(c.ljust(w) for c, w in zip(r[:3], widths)) + "  " + r[3].rjust(7))
        if i == 0:
            lines.append("-" * (sum(widths) + 2 * 3 + 7))
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", default=[], metavar="NAME",
                        help="run this mutant only (repeatable)")
    parser.add_argument("--tests", nargs="+", default=None, metavar="TEST",
                        help="run this selection instead of each mutant's own (privacy tests only)")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run in parallel (default 2)")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run")
    parser.add_argument("--markers", default="not runners",
                        help='pytest marker expression (default "not runners": slow tests may run)')
    parser.add_argument("--list", action="store_true", help="list the mutants and exit")
    parser.add_argument("--keep", action="store_true", help="keep the scratch copies")
    parser.add_argument("--no_baseline", action="store_true",
                        help="skip running the catching tests on the unmutated tree")
    args = parser.parse_args(argv)

    names = {m.name for m in MUTANTS}
    unknown = sorted(set(args.only) - names)
    if unknown:
        parser.error(f"unknown mutant(s) {unknown}; known: {sorted(names)}")
    mutants = [m for m in MUTANTS if not args.only or m.name in args.only]
    if args.list:
        for m in mutants:
            print(f"{m.name}: {m.leak}\n    {m.file}: {m.snippet!r}\n    -> {m.replacement!r}\n"
                  f"    tests: {' '.join(m.tests)}")
        for name, leak, where, tests in PLANNED:
            print(f"{name} (planned): {leak}\n    {where}\n    tests: {tests}")
        return 0

    start = time.monotonic()
    files = tree_files(ROOT)
    workdir = tempfile.mkdtemp(prefix="mutations-")
    tests = tuple(args.tests) if args.tests else None
    print(f"mutation suite: {len(mutants)} mutants, {args.jobs} at a time, scratch copies of "
          f"{len(files)} files under {workdir}", flush=True)
    try:
        with concurrent.futures.ThreadPoolExecutor(max_workers=max(args.jobs, 1)) as pool:
            futures = {pool.submit(run_mutant, m, files, workdir, tests=tests, timeout=args.timeout,
                                   keep=args.keep, markers=args.markers): m for m in mutants}
            outcomes = {}
            for future in concurrent.futures.as_completed(futures):
                o = future.result()
                outcomes[o.mutant.name] = o
                print(f"  {o.mutant.name}: {o.status} {o.test or o.detail} ({o.seconds:.0f} s)", flush=True)
        ordered = [outcomes[m.name] for m in mutants]
        ok = all(o.status == "caught" for o in ordered)
        base_line = ""
        catching = sorted({o.test for o in ordered if o.status == "caught"})
        if catching and not args.no_baseline:
            passed, base_line = baseline(catching, files, workdir, args.timeout)
            ok &= passed
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    print()
    print(table(ordered))
    for o in ordered:
        if o.status != "caught":
            print(f"\n{o.mutant.name}: {o.status}: {o.detail}\n  leak: {o.mutant.leak}")
    if base_line:
        print(f"\nbaseline: {base_line}")
    if PLANNED and not args.only:
        print("\nnot yet in the suite (they wait for other branches' fixes): "
              + ", ".join(name for name, *_ in PLANNED))
    counts = {s: sum(o.status == s for o in ordered) for s in ("caught", "SURVIVED", "CRASHED",
                                                               "NO LONGER APPLIES", "BAD SPEC")}
    tally = ", ".join(f"{v} {k.lower()}" for k, v in counts.items() if v)
    print(f"\nmutation suite: {len(ordered)} mutants: {tally}; {time.monotonic() - start:.0f} s in all")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
