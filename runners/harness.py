"""Running a pipeline main on a chosen runner and reading back what it wrote.

Used by ``tests/runners/test_runners.py`` (same outputs on every runner) and ``benchmarks/runner_engines.py``
(time per runner). A pipeline main here is any module with ``main(argv)`` that builds its options
with :func:`runners.profiles.pipeline_options_for` — ``runners.demo_release`` and the
``pipelines.*`` mains alike — so one call covers every pipeline on every runner.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import importlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Iterator, Sequence

from runners import profiles

REPO_ROOT = Path(__file__).resolve().parent.parent


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunnerCase:
    """A runner and the extra arguments that put a job on it (profile defaults do the rest)."""
    label: str
    runner: str
    args: tuple[str, ...] = ()
    # EXTERNAL: the run needs a worker pool; its address is appended as --environment_config.
    needs_worker_pool: bool = False

    def argv(self, worker_pool: str | None = None) -> list[str]:
        argv = [f"--runner={self.runner}", *self.args]
        if self.needs_worker_pool:
            if worker_pool is None:
                raise ValueError(f"{self.label} needs a worker pool address")
            argv += ["--environment_type=EXTERNAL", f"--environment_config={worker_pool}"]
        # Resolved here too, so that a main which builds plain PipelineOptions gets the profile.
        return profiles.resolve(argv).argv


def project_env(extra: dict | None = None) -> dict:
    """The environment for a child process that imports this project from the work tree."""
    env = dict(os.environ)
    path = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO_ROOT) + (os.pathsep + path if path else "")
    # Beam's worker pool starts SDK workers as plain `python`: make that this interpreter.
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.update(extra or {})
    return env


def run_pipeline_main(module: str, args: Sequence[str], runner_args: Sequence[str] = (), *,
                      in_process: bool = True, timeout: float = 600, env: dict | None = None):
    """Run ``python -m <module> <args> <runner_args>``.

    In process, the module's ``main(argv)`` is called (LOOPBACK workers then run in this
    process); otherwise a child interpreter runs it with the work tree on PYTHONPATH and a
    failure raises ``subprocess.CalledProcessError`` carrying the child's output.
    """
    argv = [*args, *runner_args]
    if in_process:
        result = importlib.import_module(module).main(argv)
        if isinstance(result, int) and not isinstance(result, bool) and result != 0:
            raise RuntimeError(f"{module}.main returned exit status {result}")
        return result
    done = subprocess.run([sys.executable, "-m", module, *argv], cwd=REPO_ROOT,
                          env=project_env(env), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise subprocess.CalledProcessError(done.returncode, done.args, done.stdout, done.stderr)
    return done


def read_outputs(pattern: str) -> list:
    """All records of the files matching ``pattern``, sorted, so that runs that shard or order
    their output differently compare equal. Parquet files give row tuples; others text lines
    (a CSV header line is kept once per file, which is the same on every runner)."""
    paths = sorted(glob.glob(pattern, recursive=True))
    if not paths:
        raise FileNotFoundError(f"no output matches {pattern}")
    records = []
    for path in paths:
        if path.endswith(".parquet"):
            from transforms import parquet_files
            table = parquet_files.read_table(path)
            records += [tuple(row.values()) for row in table.to_pylist()]
        else:
            with open(path, encoding="utf-8") as handle:
                records += handle.read().splitlines()
    return sorted(records, key=repr)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("localhost", 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, process: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"worker pool exited with code {process.returncode}")
        with contextlib.suppress(OSError), socket.create_connection(("localhost", port), 0.5):
            return
        time.sleep(0.2)
    raise TimeoutError(f"worker pool did not listen on port {port} within {timeout} s")


@contextlib.contextmanager
def worker_pool(port: int | None = None, timeout: float = 60) -> Iterator[str]:
    """A Beam Python worker pool (``worker_pool_main``) for ``--environment_type=EXTERNAL``.

    Yields its address (``localhost:PORT``). The pool and the SDK workers it forks run in their
    own process group with this project on PYTHONPATH, and are stopped on exit. Their output goes
    to a log file whose last lines are attached to any error raised inside the block.
    """
    port = port or free_port()
    log = tempfile.NamedTemporaryFile(prefix="beam-worker-pool-", suffix=".log", delete=False)
    process = subprocess.Popen(
        [sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
         f"--service_port={port}"],
        cwd=REPO_ROOT, env=project_env(), start_new_session=True,
        stdout=log, stderr=subprocess.STDOUT)
    try:
        _wait_for_port(port, process, timeout)
        yield f"localhost:{port}"
    except BaseException as exc:
        log.flush()
        tail = Path(log.name).read_text(errors="replace").splitlines()[-20:]
        exc.add_note(f"worker pool log {log.name}:\n" + "\n".join(tail))
        raise
    else:
        os.unlink(log.name)
    finally:
        log.close()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
