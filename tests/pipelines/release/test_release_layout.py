"""The release layer's shape (static checks over pipelines/release/, as in tests/test_layout.py):
short functions, and a run that is the composition of its named phases.
"""
from __future__ import annotations

import ast
import os

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
RELEASE = os.path.join(ROOT, "pipelines", "release")
#: Longest function (``def`` to its last line, docstring included) in pipelines/release/.
MAX_LINES = 60
PHASES = ("preflight", "reserve", "compute", "rule", "publish", "commit")


def _modules():
    for name in sorted(os.listdir(RELEASE)):
        if name.endswith(".py"):
            with open(os.path.join(RELEASE, name), encoding="utf-8") as handle:
                yield name, ast.parse(handle.read())


def _functions(tree):
    return [n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_no_function_of_the_release_layer_is_longer_than_sixty_lines():
    long = [f"pipelines/release/{name}: {f.name} ({f.end_lineno - f.lineno + 1} lines)"
            for name, tree in _modules() for f in _functions(tree)
            if f.end_lineno - f.lineno + 1 > MAX_LINES]
    assert long == []


def test_a_run_is_the_six_phases_in_order_each_stating_its_failure_policy():
    (tree,) = [t for name, t in _modules() if name == "lifecycle.py"]
    functions = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    for phase in PHASES:
        assert phase in functions, f"lifecycle.py has no phase function {phase}()"
        assert "Failure policy" in (ast.get_docstring(functions[phase]) or ""), phase
    calls = [n.func.id for n in ast.walk(functions["run"])
             if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in PHASES]
    assert sorted(calls) == sorted(PHASES), "run() calls each phase once"
    assert len(functions["run"].body) <= 8, "run() composes the phases; the work is in them"
    # Each phase takes the state the one before returns.
    for before, after in zip(PHASES, PHASES[1:]):
        returned = ast.unparse(functions[before].returns)
        taken = ast.unparse(functions[after].args.args[0].annotation)
        assert returned == taken, f"{before}() returns {returned}, {after}() takes {taken}"


def test_the_length_rule_catches_a_long_function():
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (f,) = _functions(ast.parse(f"def long():\n{body}\n"))
    assert f.end_lineno - f.lineno + 1 > MAX_LINES
