"""What a scheduled run releases: each campaign's own schedule, for one data interval's day.

One Beam-free module both schedulers call, so that the Airflow DAG (``airflow_dag.py``) and the
cron script (``daily_release.sh``) can never disagree: they read the same **schedule file**
(JSON, below) and ask this module which releases are due on the day a run covers, and with
which command lines.

**Due.** A scheduled release (:meth:`pipelines.centralnotice.config.CampaignConfig.releases`:
one per day for ``"schedule": "daily"``, one for the whole campaign for ``"campaign"``) is due on
the last day it covers: a daily release on its day, a multi-day release on its period's last
day, when its input is complete. A run for any other day releases nothing of it, so a campaign
whose release spans days is never refused for asking a day it does not schedule. Its input is
every covered day's folder: ``<data>/<day>/impressions/`` and ``<data>/<day>/clicks/``.

**Then the check.** After the releases, ``python -m pipelines.catalog --check`` (as of the day
after the data interval, ``grace`` days late allowed) names every earlier slot of the
configuration that is still not published: a failed, refused or never-run day is seen the next
morning, not at the end of the campaign. On the first run nothing may have been charged yet
(the first release is not due, or was refused before its charge): with no ledger and no release
the check says so and exits 0, or 1 naming a slot already due and never run.

Schedule file (all fields required unless marked optional; unknown fields are errors; local
paths relative to the file's folder, since a scheduler's task runs in a folder of its own)::

    {
      "config": "/srv/centralnotice/campaigns.json",   # pipelines.centralnotice.config
      "data": "/srv/centralnotice/input",      # <data>/<day>/impressions/ and .../clicks/
      "output": "/srv/centralnotice/releases", # the job's --output (and the catalog's --releases)
      "ledger": "/srv/centralnotice/ledger.json",
      "key_store": "/srv/centralnotice/keys",
      "runner": "DirectRunner",                # optional (default DirectRunner)
      "runner_options": {"flink_master": "jm:8081"},   # optional: extra Beam options
      "campaigns": ["C2026_000_fr"],           # optional: only these campaigns (default: all)
      "grace": 1                               # optional: the check's --grace (default 1)
    }

Every command runs the interpreter this module runs under (the one with this project installed:
the cron script's ``BEAM_DP_PYTHON``, the DAG's ``python`` param).

CLI: ``python -m runners.deploy.schedule --schedule FILE --day YYYY-MM-DD`` runs the due
releases (a failed one does not stop the others), then the check; ``--dry_run`` prints the
command lines instead; ``--json`` prints the due releases and their commands as one JSON object
(what the Airflow DAG's ``due`` task reads). Exit 0 when every release and the check succeeded,
2 for a bad schedule file, day or configuration; else the first failing command's exit code.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

from pipelines.centralnotice.config import ConfigError, ScheduledRelease, load_config

EXIT_BAD_INPUT = 2
_REQUIRED = ("config", "data", "output", "ledger", "key_store")
_OPTIONAL = ("runner", "runner_options", "campaigns", "grace")


class ScheduleError(ValueError):
    """A schedule file, a day or the configuration it names is not valid."""


@dataclass(frozen=True, kw_only=True)
class ScheduleFile:
    """The schedule file: where a scheduled run reads, writes and charges, and on what runner."""

    source: str
    config: str
    data: str
    output: str
    ledger: str
    key_store: str
    runner: str = "DirectRunner"
    runner_options: dict = field(default_factory=dict)
    campaigns: Optional[tuple[str, ...]] = None
    grace: int = 1


def read_schedule(path: str) -> ScheduleFile:
    """The schedule file at ``path``, every field checked; errors name the file and field."""
    try:
        with open(path, encoding="utf-8") as handle:
            data = json.load(handle)
    except OSError as err:
        raise ScheduleError(f"{path}: cannot read the schedule file ({err.strerror})") from None
    except json.JSONDecodeError as err:
        raise ScheduleError(f"{path}: not JSON (line {err.lineno})") from None
    if not isinstance(data, dict):
        raise ScheduleError(f"{path}: must be a JSON object")
    unknown = sorted(set(data) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise ScheduleError(f"{path}: unknown field(s) {unknown}")
    missing = [name for name in _REQUIRED if name not in data]
    if missing:
        raise ScheduleError(f"{path}: missing field(s) {missing}")
    for name in (*_REQUIRED, "runner"):
        if name in data and not (isinstance(data[name], str) and data[name]):
            raise ScheduleError(f"{path}: {name}: must be a non-empty string")
    options = data.get("runner_options", {})
    if not (isinstance(options, dict) and all(re.fullmatch(r"[a-z][a-z0-9_]*", k) for k in options)
            and all(isinstance(v, (str, int, float, bool)) for v in options.values())):
        raise ScheduleError(f"{path}: runner_options: must map option names (lowercase, '_') "
                            "to strings, numbers or booleans")
    campaigns = data.get("campaigns")
    if campaigns is not None and not (isinstance(campaigns, list) and campaigns
                                      and all(isinstance(c, str) and c for c in campaigns)):
        raise ScheduleError(f"{path}: campaigns: must be a non-empty list of campaign ids")
    grace = data.get("grace", 1)
    if not (isinstance(grace, int) and not isinstance(grace, bool) and grace >= 0):
        raise ScheduleError(f"{path}: grace: must be a whole number of days >= 0")
    base = os.path.dirname(os.path.abspath(path))
    paths = {name: data[name] if "://" in data[name] else os.path.join(base, data[name])
             for name in _REQUIRED}  # relative to the file: a task's working directory is not
    return ScheduleFile(source=path, **{**data, **paths, "runner_options": dict(options),
                                        "grace": grace,
                                        "campaigns": tuple(campaigns) if campaigns else None})


def parse_day(text: str) -> _dt.date:
    try:
        if not re.fullmatch(r"\d{4}-\d{2}-\d{2}", text):
            raise ValueError
        return _dt.date.fromisoformat(text)
    except ValueError:
        raise ScheduleError(f"day must be YYYY-MM-DD, got {text!r}") from None


def due_releases(schedule: ScheduleFile, day: _dt.date) -> list[ScheduledRelease]:
    """The releases each campaign's schedule has due on ``day``: those whose last covered day it
    is (a daily release on its day, a multi-day or whole-campaign release on its last day)."""
    try:
        config = load_config(schedule.config)
    except ConfigError as err:
        raise ScheduleError(f"{schedule.source}: config: {err}") from None
    known = [c.campaign_id for c in config.campaigns]
    for campaign in schedule.campaigns or ():
        if campaign not in known:
            raise ScheduleError(f"{schedule.source}: campaigns: no campaign {campaign!r} in "
                                f"{schedule.config}")
    return [release for campaign in config.campaigns
            if schedule.campaigns is None or campaign.campaign_id in schedule.campaigns
            for release in campaign.releases() if max(release.dates) == day]


def dataflow_job_name(release: ScheduledRelease) -> str:
    """A Dataflow job name for one release: lowercase letters, digits and dashes, starting with
    a letter, at most 63 characters, ending with the release's last day, e.g.
    ``C2026_000_fr/2026-11-27`` -> ``centralnotice-c2026-000-fr-20261127``."""
    slug = re.sub(r"[^a-z0-9]+", "-", release.campaign_id.lower()).strip("-")
    name = f"centralnotice-{slug}"[:63 - 9].rstrip("-")
    return f"{name}-{max(release.dates).strftime('%Y%m%d')}"


def release_command(schedule: ScheduleFile, release: ScheduledRelease,
                    step: Optional[str] = None) -> list[str]:
    """``python -m pipelines.centralnotice`` for one due release, with ``--submit_only`` or
    ``--finalize`` (``step``; both tasks get the same flags) or neither (one run)."""
    days = [d.isoformat() for d in release.dates]
    options = {"config": schedule.config, "release": release.release_id,
               "impressions": ",".join(f"{schedule.data}/{d}/impressions/" for d in days),
               "clicks": ",".join(f"{schedule.data}/{d}/clicks/" for d in days),
               "output": schedule.output, "ledger": schedule.ledger,
               "key_store": schedule.key_store, "runner": schedule.runner,
               **schedule.runner_options}
    if schedule.runner.lower().startswith("dataflow"):
        options.setdefault("job_name", dataflow_job_name(release))
    flags = [f"--{name}={value}" for name, value in options.items()]
    return [sys.executable, "-m", "pipelines.centralnotice", *flags,
            *([f"--{step}"] if step else [])]


def check_command(schedule: ScheduleFile, day: _dt.date) -> list[str]:
    """``python -m pipelines.catalog --check`` as of the morning after ``day``."""
    return [sys.executable, "-m", "pipelines.catalog", f"--ledger={schedule.ledger}",
            f"--releases={schedule.output}", f"--config={schedule.config}", "--check",
            f"--as_of={day + _dt.timedelta(days=1)}", f"--grace={schedule.grace}"]


def plan(schedule: ScheduleFile, day: _dt.date) -> dict:
    """The run of ``day`` as data: the due release ids, their commands and the check's."""
    due = due_releases(schedule, day)
    return {"day": day.isoformat(), "releases": [r.release_id for r in due],
            "run": [shlex.join(release_command(schedule, r)) for r in due],
            "submit": [shlex.join(release_command(schedule, r, "submit_only")) for r in due],
            "finalize": [shlex.join(release_command(schedule, r, "finalize")) for r in due],
            "check": shlex.join(check_command(schedule, day))}


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m runners.deploy.schedule", allow_abbrev=False,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedule", required=True, metavar="FILE", help="the schedule file")
    parser.add_argument("--day", required=True, metavar="YYYY-MM-DD",
                        help="the data interval's day")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
    mode.add_argument("--json", action="store_true", help="print the plan as JSON, run nothing")
    try:
        args = parser.parse_args(argv)
    except SystemExit as done:
        return EXIT_BAD_INPUT if done.code else 0
    try:
        planned = plan(read_schedule(args.schedule), parse_day(args.day))
    except ScheduleError as err:
        print(f"schedule: error: {err}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.json:
        print(json.dumps(planned))
        return 0
    commands = [*planned["run"], planned["check"]]
    if args.dry_run:
        print("\n".join(commands))
        return 0
    print(f"schedule: {planned['day']}: due {', '.join(planned['releases']) or 'nothing'}",
          flush=True)
    status = 0
    for command in commands:  # a failed release does not stop the others, nor the check
        code = subprocess.run(shlex.split(command)).returncode
        if code:
            print(f"schedule: FAILED (exit {code}): {command}", file=sys.stderr, flush=True)
        status = status or code
    return status


if __name__ == "__main__":
    sys.exit(main())
