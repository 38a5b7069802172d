"""What a Dataflow Flex Template launcher runs: one job's release, submitted only.

The launcher image (``runners/deploy/launcher.Dockerfile``) names this file in
``FLEX_TEMPLATE_PYTHON_PY_FILE`` and the job in ``BEAM_DP_JOB``. Dataflow's launcher runs it as
``python flex_launcher.py --<parameter>=<value> ... --runner=DataflowRunner
--template_location=gs://.../template_launches/<job id>/job_object ...``; this runs the job's
``main`` with ``--submit_only``: the release is reserved, its staging attempt made, the job
object written (the launcher creates the job from it) and the job handle recorded with the
reservation -- and the launcher exits, as a launcher must (it never waits for the job). The
release is finished by a second task with the same parameters and ``--finalize`` (an Airflow
task, a cron step: runners/README.md, "Flex Templates").

``--submit_only`` and ``--finalize`` are not template parameters: a launcher only submits, so
either one given to it is refused (exit 2).
"""
from __future__ import annotations

import importlib
import os
import sys
from typing import Optional, Sequence

#: The environment variable naming the job (a module of ``pipelines/`` with a ``JOB``).
JOB_ENV = "BEAM_DP_JOB"
#: The switches the launcher decides itself.
OWN_FLAGS = ("--submit_only", "--finalize")


def _flag(token: str) -> str:
    return "--" + token.split("=", 1)[0][2:].replace("-", "_") if token.startswith("--") else ""


def launcher_argv(argv: Sequence[str]) -> list[str]:
    """The job's command line for a launch: the launcher's arguments and ``--submit_only``
    (raises ValueError if the launch names ``--submit_only`` or ``--finalize`` itself)."""
    given = [t for t in argv if _flag(t) in OWN_FLAGS]
    if given:
        raise ValueError(f"{given[0]} is not a template parameter: a Flex Template launcher only "
                         "submits (--finalize runs as a second task)")
    return [*argv, "--submit_only"]


USAGE = (f"usage: {JOB_ENV}=JOB python -m runners.deploy.flex_launcher [JOB FLAG ...]\n\n"
         "What a Dataflow Flex Template launcher runs (FLEX_TEMPLATE_PYTHON_PY_FILE of "
         "runners/deploy/launcher.Dockerfile): python -m pipelines.JOB with the flags given and "
         "--submit_only. --help with BEAM_DP_JOB set shows the job's flags.")


def main(argv: Optional[Sequence[str]] = None) -> int:
    from runners.deploy.flex_template import JOBS

    argv = list(sys.argv[1:] if argv is None else argv)
    job = os.environ.get(JOB_ENV, "")
    modules = JOBS
    if not job and any(a in ("-h", "--help") for a in argv):
        print(USAGE)
        return 0
    if job not in modules:
        print(f"flex_launcher: {JOB_ENV}={job!r} is not a job (one of {', '.join(modules)})",
              file=sys.stderr)
        return 2
    try:
        job_argv = launcher_argv(argv)
    except ValueError as err:
        print(f"flex_launcher: error: {err}", file=sys.stderr)
        return 2
    return importlib.import_module(modules[job]).main(job_argv)


if __name__ == "__main__":
    sys.exit(main())
