"""The docs are tested: every shell and Python block of the guides runs as written.

Guides: README.md, runners/README.md and the walkthroughs under pipelines/sample_data/. Each
guide's fenced blocks run in order in a fresh folder that looks like a clone of the repository
(its top-level entries linked in), so a guide's later blocks see what its earlier ones wrote
(the demo's output, a ledger), and nothing lands in the work tree.

* ``sh`` / ``bash`` blocks run with ``bash -e -o pipefail``; ``python`` blocks run as a script.
  ``python`` on PATH, and ``.venv`` in the folder, are the environment running the tests;
  ``make`` runs the Makefile's targets with it and never installs into it.
* Data and output blocks (``text``, ``json``, ``csv``, ...) are shown, not run.
* An HTML comment right before a block (blank lines allowed) tells the test about it:

  ``<!-- docs-test: skip REASON -->``  not run here, for the reason given (gs:// paths, Dataflow,
  ``make test`` itself); a skip without a reason is an error;
  ``<!-- docs-test: exit N -->``  the block's exit code is N (a refusal the guide shows);
  ``<!-- docs-test: expect TEXT -->``  its output (stdout and stderr) contains TEXT.

A block with no language, an unknown one or an indented code block fails the test: it would
otherwise be silently left out. A guide's blocks run in one test (they depend on each other).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
GUIDES = ["README.md", "runners/README.md",
          *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "pipelines" / "sample_data").glob("*/README.md"))]
SHELL = {"sh", "bash", "shell"}
PYTHON = {"python", "py"}
SHOWN = {"text", "json", "csv", "yaml", "toml", "ini", "crontab", "dockerfile"}
# Top-level entries of the repository that are not linked into a guide's folder.
NOT_LINKED = {".git", ".venv", ".venv-airflow", "out", "build", "dist", ".pytest_cache",
              ".hypothesis", "__pycache__"}
DIRECTIVE = re.compile(r"<!--\s*docs-test:\s*(.*?)\s*-->", re.S)


@dataclass
class Block:
    guide: str
    line: int
    language: str
    code: str
    skip: str | None = None
    exit_code: int = 0
    expect: list[str] = field(default_factory=list)

    def where(self) -> str:
        return f"{self.guide}:{self.line}"


def parse(guide: str) -> tuple[list[Block], list[str]]:
    """The guide's fenced blocks with their directives, and the errors found while reading."""
    lines = (ROOT / guide).read_text().splitlines()
    blocks, errors, pending = [], [], []
    i = 0
    while i < len(lines):
        line = lines[i]
        fence = re.match(r"^(\s*)(```+|~~~+)\s*([\w+-]*)\s*$", line)
        comments = DIRECTIVE.findall(line)
        if comments:
            pending += comments
        elif fence:
            indent, marks, language = fence.groups()
            end = i + 1
            while end < len(lines) and not lines[end].strip().startswith(marks):
                end += 1
            code = "\n".join(l[len(indent):] if l.startswith(indent) else l
                             for l in lines[i + 1:end]) + "\n"
            block = Block(guide, i + 1, language.lower(), code)
            for directive in pending:
                name, _, argument = directive.partition(" ")
                if name == "skip":
                    block.skip = argument.strip()
                    if not block.skip:
                        errors.append(f"{block.where()}: a skip needs its reason")
                elif name == "exit" and argument.strip().isdigit():
                    block.exit_code = int(argument)
                elif name == "expect" and argument.strip():
                    block.expect.append(argument.strip())
                else:
                    errors.append(f"{block.where()}: unknown directive {directive!r}")
            pending = []
            if block.language not in SHELL | PYTHON | SHOWN and not block.skip:
                errors.append(f"{block.where()}: a block in {block.language or 'no language'!r} "
                              f"is neither run nor marked (name its language, or mark it "
                              f"<!-- docs-test: skip REASON -->)")
            elif block.language in SHOWN and (block.expect or block.exit_code):
                errors.append(f"{block.where()}: a {block.language} block is not run")
            blocks.append(block)
            i = end
        elif line.strip() and pending:
            errors.append(f"{guide}:{i + 1}: a docs-test directive not followed by a block")
            pending = []
        elif (re.match(r"^( {4}|\t)\S", line) and i > 0 and not lines[i - 1].strip()
              and _previous_paragraph_is_text(lines, i)):
            errors.append(f"{guide}:{i + 1}: an indented code block (use a fenced block with "
                          f"its language, so the docs test runs it)")
        i += 1
    return blocks, errors


def _previous_paragraph_is_text(lines: list[str], i: int) -> bool:
    """An indented line after a blank line is a code block unless it continues a list item."""
    j = i - 1
    while j >= 0 and not lines[j].strip():
        j -= 1
    while j >= 0 and lines[j].strip():
        if re.match(r"^\s*([-*+]|\d+\.)\s", lines[j]):
            return False
        if not lines[j].startswith(" "):
            return True
        j -= 1
    return True


@pytest.mark.parametrize("guide", GUIDES)
def test_every_block_is_run_or_marked_with_a_reason(guide):
    blocks, errors = parse(guide)
    assert not errors, "\n".join(errors)
    assert any(b.language in SHELL | PYTHON for b in blocks), f"{guide} has no command to test"


def test_guides_are_short_and_their_lines_readable():
    for guide in GUIDES:
        for number, line in enumerate((ROOT / guide).read_text().splitlines(), 1):
            assert len(line) <= 300, f"{guide}:{number}: {len(line)} characters (at most 300)"
    assert len((ROOT / "runners" / "README.md").read_text().splitlines()) <= 400


def test_a_block_that_is_neither_run_nor_marked_fails(tmp_path, monkeypatch):
    guide = tmp_path / "guide.md"
    guide.write_text("Text\n\n```\nls\n```\n\nMore\n\n    indented code\n\n"
                     "<!-- docs-test: skip -->\n```sh\nls\n```\n")
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    _, errors = parse("guide.md")
    assert len(errors) == 3, errors
    assert "neither run nor marked" in errors[0] and "indented" in errors[1]
    assert "reason" in errors[2]


def _clone(folder: Path) -> Path:
    """A folder that looks like a fresh clone after ``make demo``: the repository's top-level
    entries linked in, and ``.venv`` the environment running the tests."""
    folder.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in NOT_LINKED:
            (folder / entry.name).symlink_to(entry)
    (folder / ".venv").symlink_to(Path(sys.prefix))
    return folder


def _environment(folder: Path) -> dict:
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONPATH"] = str(folder)
    return env


def _shell_preamble() -> str:
    # make's targets run with .venv (the tests' environment) as it is: installing nothing.
    stamps = " ".join(f"-o .venv/{name}" for name in
                      (".installed-demo-stamp", ".installed-stamp", ".installed-dataframes-stamp"))
    return f'make() {{ command make VENV=.venv {stamps} "$@"; }}\nset -e -o pipefail\n'


def _run(block: Block, folder: Path, number: int) -> subprocess.CompletedProcess:
    if block.language in PYTHON:
        script = folder / f"docs_block_{number}.py"
        script.write_text(block.code)
        command = [sys.executable, script.name]
    else:
        command = ["bash", "-c", _shell_preamble() + block.code]
    return subprocess.run(command, cwd=folder, env=_environment(folder), capture_output=True,
                          text=True, timeout=600)


@pytest.mark.parametrize("guide", GUIDES)
def test_guide_runs_as_written(guide, tmp_path):
    blocks, errors = parse(guide)
    assert not errors, "\n".join(errors)
    folder = _clone(tmp_path / "clone")
    for number, block in enumerate(blocks):
        if block.skip or block.language in SHOWN:
            continue
        done = _run(block, folder, number)
        output = done.stdout + done.stderr
        assert done.returncode == block.exit_code, (
            f"{block.where()} exited {done.returncode}, not {block.exit_code}:\n{block.code}\n"
            f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-3000:]}")
        for text in block.expect:
            assert text in output, f"{block.where()}: no {text!r} in\n{output[-3000:]}"
