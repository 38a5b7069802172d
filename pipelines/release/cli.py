"""One command-line convention for every job, derived from its typed request.

Each field of a job's request dataclass (and of :class:`ReleaseOptions`) is a flag in Beam's
underscore style (``--key_store``, ``--testing_seed``, ``--new_release``); the dashed spelling
(``--key-store``) is accepted as an alias. ``help`` comes from the field's metadata, the type
from its annotation (``bool`` is a switch; ``tuple`` a comma-separated list). Arguments the job
does not know are Beam pipeline options and go to the runner profile (``runners/profiles.py``).
So the CLI is a thin layer over the Python API: ``main(argv)`` parses a request and calls the
same ``run(request)`` a Python caller would.
"""
from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
import typing
from typing import Optional, Sequence

from pipelines.release import lifecycle, report
from pipelines.release.errors import EXIT_INTERNAL, EXIT_RELEASED, ReleaseFailed, ReleaseRefused
from pipelines.release.job import Job, ReleaseOptions

_LOG = logging.getLogger(__name__)


def _base_type(annotation):
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _base_type(args[0])
    return origin or annotation


def _fields(cls):
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        if f.name == "options" or not f.metadata.get("cli", True):
            continue
        yield f, _base_type(hints[f.name])


def _csv(text: str) -> tuple:
    return tuple(v.strip() for v in text.split(",") if v.strip())


def add_arguments(group, cls) -> list[str]:
    """Flags for every field of ``cls``; returns the flag names."""
    flags = []
    for f, typ in _fields(cls):
        flag = f"--{f.name}"
        kwargs = {"help": f.metadata.get("help", ""), "dest": f.name}
        if "choices" in f.metadata:
            kwargs["choices"] = f.metadata["choices"]
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if typ is bool:
            kwargs["action"] = "store_true"
        else:
            kwargs["type"] = _csv if typ is tuple else typ
            kwargs["metavar"] = f.metadata.get("metavar", f.name.upper())
        if required:
            kwargs["required"] = True
        else:
            default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
            kwargs["default"] = default
            if typ is not bool and default not in (None, (), ""):
                kwargs["help"] += f" (default: {','.join(default) if typ is tuple else default})"
        group.add_argument(flag, **kwargs)
        flags.append(flag)
    return flags


def build_parser(job: Job) -> tuple[argparse.ArgumentParser, list[str]]:
    parser = argparse.ArgumentParser(
        prog=f"python -m pipelines.{job.name}", description=job.description,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Other arguments are Beam pipeline options (e.g. --runner PrismRunner; default: "
               "the in-process engine); see runners/README.md. Exit codes: 0 released (or an "
               "identical re-run), 2 refused before any charge, 3 failed after the reservation "
               "(nothing published; a corrected re-run takes the reservation over), "
               "--alert_exit_code N: released with an operator alert (a data-dependent signal "
               "for the scheduler only).")
    flags = add_arguments(parser.add_argument_group(f"{job.name}"), job.request_type)
    flags += add_arguments(parser.add_argument_group("release (every job)"), ReleaseOptions)
    return parser, flags


def normalise(argv: Sequence[str], flags: Sequence[str],
              switches: Sequence[str] = ()) -> list[str]:
    """Dashed spellings of the job's own flags become the underscore ones; a switch given as
    ``--switch=true`` / ``--switch=false`` (how Dataflow Flex Templates pass parameters, see
    runners/deploy/flex_template.py) becomes ``--switch`` / nothing."""
    known = {f.replace("_", "-"): f for f in flags}
    out = []
    for token in argv:
        name, eq, value = token.partition("=")
        if name in known:
            name = known[name]
            token = name + (eq + value if eq else "")
        if eq and name in switches and value.lower() in ("true", "false"):
            if value.lower() == "true":
                out.append(name)
            continue  # any other value is left for argparse to refuse
        out.append(token)
    return out


#: Flags that were removed, and why (given one, a run is refused naming it: never silently passed
#: on to Beam as an unknown option).
REMOVED_FLAGS = {
    "--allow_dropped_rows": "no release is refused for dropped rows any more: it is published "
                            "and the operator alerted (--alert_exit_code N makes the alert an "
                            "exit code for the scheduler)",
}


def _refuse_removed(argv: Sequence[str]) -> None:
    for token in argv:
        flag = "--" + token.split("=", 1)[0][2:].replace("-", "_")
        if token.startswith("--") and flag in REMOVED_FLAGS:
            raise ReleaseRefused(f"{flag} was removed: {REMOVED_FLAGS[flag]}")


def parse_request(job: Job, argv: Sequence[str]):
    _refuse_removed(argv)
    parser, flags = build_parser(job)
    switches = [a.option_strings[0] for a in parser._actions
                if a.option_strings and a.nargs == 0 and a.option_strings[0] in flags]
    args, beam_args = parser.parse_known_args(normalise(argv, flags, switches))
    values = vars(args)
    release = {f.name: values[f.name] for f, _ in _fields(ReleaseOptions)}
    options = ReleaseOptions(**release, pipeline_args=tuple(beam_args))
    own = {f.name: values[f.name] for f, _ in _fields(job.request_type)}
    return job.request_type(**own, options=options)


def _explain(job: Job, request) -> int:
    """``--explain``: the plan of every release the request would make. The request is prepared
    (its configuration read) once and planned; no input is read (``Job.check`` is the run's),
    and no ledger, key store or output is opened."""
    prepared = job.prepare(request)
    for planned in job.plan(prepared):
        print(f"{job.name} release {planned.release_id}")
        print("\n".join(f"  {line}" if line else "" for line in planned.explain().splitlines()))
    return EXIT_RELEASED


def main(job: Job, argv: Optional[Sequence[str]] = None) -> int:
    """Parse, run, print the summary; the exit code says what happened (see errors)."""
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "WARNING"))
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        request = parse_request(job, argv)
        if request.options.explain:
            return _explain(job, request)
        result = lifecycle.run(job, request)
    except (ReleaseRefused, ReleaseFailed) as err:
        print(f"{job.name}: error: {err}", file=sys.stderr)
        return err.exit_code
    except ValueError as err:  # invalid parameters found while building the request
        print(f"{job.name}: error: {err}", file=sys.stderr)
        return ReleaseRefused.exit_code
    except Exception as err:  # noqa: BLE001 -- the scheduler must see a failure
        _LOG.debug("internal error", exc_info=True)
        print(f"{job.name}: internal error ({type(err).__name__}); nothing new was published. "
              "Re-run with LOGLEVEL=DEBUG for the traceback", file=sys.stderr)
        return EXIT_INTERNAL
    for outcome in result.releases:
        if outcome.report is not None:
            print(report.text(job, outcome.report), end="")
        else:
            print(f"{job.name}: {outcome.status} {outcome.versioned_id} -> {outcome.folder}")
        if outcome.report_path:
            print(f"  operator report: {outcome.report_path}")
    for warning in result.warnings:
        print(f"{job.name}: warning: {warning}", file=sys.stderr)
    for alert in result.alerts:
        print(f"{job.name}: alert (operator only; published): {alert}", file=sys.stderr)
    return result.exit_code
