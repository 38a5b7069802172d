"""Dataflow Flex Template metadata for every job, generated from the job's CLI.

    python -m runners.deploy.flex_template --output DIR        # DIR/<job>.metadata.json per job

A Flex Template launches a job by running a program in a launcher container; here that program is
the job's release with ``--submit_only`` (runners/deploy/flex_launcher.py, in the launcher image
of runners/deploy/launcher.Dockerfile): the launcher reserves the release's key from the ledger
at launch time, stages, submits the job and exits -- it never waits for the job, as a launcher
must not. Nothing secret is staged with the template (a classic ``--template_location`` template
would hold one release's key, which the release layer refuses). A second task with the same
parameters and ``--finalize`` waits for the job and publishes (runners/README.md).

The metadata lists every flag of the job's own request and of the release layer
(pipelines.release.cli, which derives them from the typed request dataclass) with its help text,
whether it is optional, and a regex for its type -- except ``--submit_only`` and ``--finalize``,
which the launcher decides (:data:`LAUNCHER_FLAGS`). Beam's own options (``--runner``,
``--project``, ...) are Dataflow's template parameters and are not listed. Dataflow passes
parameters as ``--name=value``: a switch is passed as ``--name=true`` / ``--name=false``, which
the job CLI accepts (pipelines.release.flags.normalise). ``tests/runners/test_flex_template.py`` checks the
metadata against each job's parser, the launcher image statically and the documented ``gcloud``
commands against gcloud's groups of flags.
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
from typing import Sequence

def _jobs() -> dict[str, str]:
    """{job name: command} of every ``pipelines`` module that defines a release-layer job (a
    top-level ``JOB = ``), read without importing it (the name from its ``NAME = "..."`` line).
    The command is the ``python -m`` module: a product package's ``job`` module is run as the
    package (``pipelines.centralnotice``)."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    found = {}
    for folder, dirs, files in os.walk(os.path.join(root, "pipelines")):
        dirs[:] = sorted(d for d in dirs if d not in ("__pycache__", "sample_data"))
        for name in sorted(files):
            if name.endswith(".py"):
                with open(os.path.join(folder, name), encoding="utf-8") as handle:
                    lines = handle.read().splitlines()
                if any(line.startswith("JOB = ") for line in lines):
                    job = next(line.split("=", 1)[1].strip().strip('"') for line in lines
                               if line.startswith("NAME = "))
                    module = os.path.relpath(os.path.join(folder, name[:-3]), root).replace(os.sep, ".")
                    found[job] = module[:-len(".job")] if module.endswith(".job") else module
    return dict(sorted(found.items()))


#: {job name (the ledger's, and the launcher's BEAM_DP_JOB): its ``python -m`` module}.
JOBS = _jobs()
JOB_MODULES = tuple(JOBS.values())
#: Flags of every job that are not template parameters: the launcher only submits.
LAUNCHER_FLAGS = ("--submit_only", "--finalize")

_INT = r"^-?[0-9]+$"
_FLOAT = r"^[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?$"
_BOOL = r"^(true|false)$"


def _regex(action: argparse.Action) -> list[str]:
    if action.choices:
        return ["^(" + "|".join(str(c) for c in action.choices) + ")$"]
    if action.nargs == 0:  # a switch
        return [_BOOL]
    if action.type is int:
        return [_INT]
    if action.type is float:
        return [_FLOAT]
    return []


def metadata(module: str) -> dict:
    """The Flex Template metadata of the job in ``module`` (a pipelines module with ``JOB``)."""
    from pipelines.release.cli import build_parser

    job = importlib.import_module(module).JOB
    parser, flags = build_parser(job)
    by_flag = {a.option_strings[0]: a for a in parser._actions if a.option_strings}
    parameters = []
    for flag in (f for f in flags if f not in LAUNCHER_FLAGS):
        action = by_flag[flag]
        entry = {"name": action.dest,
                 "label": action.dest.replace("_", " ").capitalize(),
                 "helpText": action.help or action.dest,
                 "isOptional": not action.required}
        regexes = _regex(action)
        if regexes:
            entry["regexes"] = regexes
        parameters.append(entry)
    return {"name": f"beam-dp-release {job.name}",
            "description": (job.description or job.name).strip().splitlines()[0],
            "parameters": parameters}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.flex_template",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="folder for <job>.metadata.json")
    args = parser.parse_args(argv)
    os.makedirs(args.output, exist_ok=True)
    for name, module in JOBS.items():
        data = metadata(module)
        path = os.path.join(args.output, f"{name}.metadata.json")
        with open(path, "w", encoding="utf-8") as handle:
            json.dump(data, handle, indent=1)
            handle.write("\n")
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
