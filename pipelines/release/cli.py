"""One command-line convention for every job, derived from its typed request.

Each field of a job's request dataclass (and of :class:`ReleaseOptions`) is a flag in Beam's
underscore style (``--key_store``, ``--testing_seed``, ``--new_release``), declared as Beam
pipeline options (:mod:`pipelines.release.flags`: a ``PipelineOptions`` subclass per job). The
command line is checked whole before anything is read or charged: every flag is the job's, the
release layer's or one of Beam's registered pipeline options (runner-specific ones included),
spelled out exactly -- an unknown or abbreviated flag is refused (exit 2) naming the closest
known flag. The dashed spelling (``--key-store``) is an alias of every flag; a switch also takes
``--switch=true|false`` (Dataflow Flex Templates). Beam's options go to the runner profile
(``runners/profiles.py``). ``--help`` shows the job's flags, the release layer's and Beam's.
So the CLI is a thin layer over the Python API: ``main(argv)`` parses a request and calls the
same ``run(request)`` a Python caller would.
"""
from __future__ import annotations

import argparse
import logging
import os
import sys
from typing import Optional, Sequence

from pipelines.release import flags as release_flags
from pipelines.release import lifecycle, report
from pipelines.release.errors import (EXIT_INTERNAL, EXIT_RELEASED, ReleaseFailed,
                                      ReleaseRefused, root_cause)
from pipelines.release.flags import FlagError, add_arguments
from pipelines.release.job import Job, ReleaseOptions
from runners.seam import library_logging

_LOG = logging.getLogger(__name__)

_EPILOG = ("Every flag has one alias, its dashed spelling (--key-store); no other spelling and "
           "no abbreviation is accepted. The Beam groups are Beam's pipeline options (e.g. "
           "--runner PrismRunner; default: the in-process engine); see runners/README.md. Exit "
           "codes: 0 released (or an identical re-run; with --submit_only: submitted), 2 refused "
           "before any charge (--finalize: no submitted release for these flags), 3 failed "
           "after the reservation (nothing published; a corrected re-run takes the reservation "
           "over), --alert_exit_code N: released with an operator alert (a data-dependent signal "
           "for the scheduler only).")


def _usage(job: Job) -> str:
    """The usage line: the job's and the release layer's flags, then Beam's options."""
    short = release_flags.Parser(prog=f"python -m {job.command}")
    add_arguments(short, job.request_type)
    add_arguments(short, ReleaseOptions)
    line = short.format_usage().strip()
    return line[len("usage: "):] + " [BEAM_PIPELINE_OPTION ...]"


def build_parser(job: Job) -> tuple[argparse.ArgumentParser, list[str]]:
    """The whole command line of ``job``: its flags, the release layer's and Beam's (one help
    group per options class); returns the parser and the job's and release layer's flags."""
    parser = release_flags.Parser(
        prog=f"python -m {job.command}", usage=_usage(job), description=job.description,
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=_EPILOG,
        conflict_handler="resolve")
    own = parser.add_argument_group(f"{job.name}")
    release = parser.add_argument_group("release (every job)")
    beam = {cls: release_flags.beam_group(parser, cls)
            for cls in release_flags.beam_options_classes()}
    # Beam's first: where a job's flag has the name of one of Beam's (label_dp's --labels,
    # Dataflow's --labels), the job's replaces it on the job's command line.
    release_flags.add_beam_arguments(parser, beam)
    flags = add_arguments(own, job.request_type)
    flags += add_arguments(release, ReleaseOptions)
    return parser, flags


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
    """The request of a command line (raises :class:`FlagError`, exit 2, on any flag that is not
    known, spelled out; ``--help`` prints the help and exits 0)."""
    _refuse_removed(argv)
    parser, _ = build_parser(job)
    known = {o for a in parser._actions for o in a.option_strings if o.startswith("--")}
    argv = release_flags.normalise(argv, known, release_flags.switches(job))
    _, unknown = parser.parse_known_args(argv)
    release_flags.refuse_unknown(unknown, known, parser.format_usage().strip())
    return release_flags.options_class(job)(argv).request()


def _explain(job: Job, request) -> int:
    """``--explain``: the plan of every release the request would make. The request is prepared
    (its configuration read) once and planned; no input is read (``Job.check`` is the run's),
    and no ledger, key store or output is opened."""
    prepared = job.prepare(request)
    for planned in job.plan(prepared):
        print(f"{job.name} release {planned.release_id}")
        print("\n".join(f"  {line}" if line else "" for line in planned.explain().splitlines()))
    return EXIT_RELEASED


def _submitted(submitted) -> int:
    """``--submit_only``: what was submitted, and how to finish it."""
    handle = submitted.handle
    job = f"{handle.runner} job {handle.job_id}" if handle.job_id else f"{handle.runner}"
    for versioned_id in submitted.releases:
        print(f"{submitted.job}: submitted {versioned_id} ({job}, {handle.state}); finish it "
              "with the same flags and --finalize")
    return submitted.exit_code


def main(job: Job, argv: Optional[Sequence[str]] = None) -> int:
    """Parse, run, print the summary; the exit code says what happened (see errors). The
    console: the summary on stdout; on stderr the progress lines (pipelines.release.progress),
    warnings, alerts and errors, runner and library logs at WARNING unless ``--log_level``
    (or ``LOGLEVEL``) asks for more."""
    logging.basicConfig(level=os.environ.get("LOGLEVEL", "WARNING"))
    library_logging()
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        request = parse_request(job, argv)
        if request.options.log_level:
            logging.getLogger().setLevel(request.options.log_level)
            library_logging(request.options.log_level)
        if request.options.explain:
            return _explain(job, request)
        if request.options.submit_only:
            return _submitted(lifecycle.submit(job, request))
        result = (lifecycle.finalize if request.options.finalize else lifecycle.run)(job, request)
    except (ReleaseRefused, ReleaseFailed) as err:
        if isinstance(err, FlagError) and err.usage:
            print(err.usage, file=sys.stderr)
        print(f"{job.name}: error: {err}", file=sys.stderr)
        return err.exit_code
    except ValueError as err:  # invalid parameters found while building the request
        print(f"{job.name}: error: {err}", file=sys.stderr)
        return ReleaseRefused.exit_code
    except OSError as err:  # the environment, before the charge (after it: ReleaseFailed)
        print(f"{job.name}: error: refused before the charge ({root_cause(err)}); nothing was "
              "charged", file=sys.stderr)
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
