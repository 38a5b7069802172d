"""Example Airflow DAG: the daily CentralNotice release, submitted then finalized, per campaign.

Copy this file into Airflow's ``dags/`` folder on a machine where this project is installed
(``pip install /path/to/repo`` into the interpreter named by ``BEAM_DP_PYTHON``; Airflow with the
``airflow`` extra of setup.py).

**Which day.** Each run releases its data interval's day. The timetable is explicit,
``CronDataIntervalTimetable("30 2 * * *", UTC)``: the run at 02:30 UTC on day D covers the
interval [D-1 02:30, D 02:30) and releases day D-1 (``{{ data_interval_start | ds }}``), whose
input folder is complete since midnight. (Airflow 3 turns a bare cron ``schedule`` into a trigger
timetable whose interval is the run's own instant, so ``{{ ds }}`` would be D: today's incomplete
folder.) With ``catchup``, days missed while the scheduler was down are released when it is back,
oldest first (``max_active_runs=1``); ``BEAM_DP_START_DATE`` is the first day to release.

**Two tasks per campaign.** ``submit_<campaign>`` runs ``python -m pipelines.centralnotice ...
--submit_only``: the release is reserved (charged once) and staged, its job submitted and the job
handle recorded with the reservation (on Dataflow it returns as soon as the job exists; a local
runner runs the job). ``finalize_<campaign>`` runs the same command with ``--finalize``: it waits
for the job, applies the row rules, publishes and commits. Both are safe to retry: the ledger
charges a release id once, a retried submit takes its own reservation over, and a retried (or
concurrent) finalize reproduces what is published. Exit 2 (refused, nothing charged) and 3
(failed after the charge, nothing published) fail the task; see runners/README.md.

Configuration (environment of the Airflow scheduler and workers; read when the DAG is parsed):

``BEAM_DP_CAMPAIGNS``    comma-separated campaign ids (two tasks each)
``BEAM_DP_DATA``         input root: ``<root>/<day>/impressions/`` and ``<root>/<day>/clicks/``
                         (directories, globs or files, local or gs://)
``BEAM_DP_OUTPUT``       output root; a release goes to ``<root>/<campaign>/<day>/``
``BEAM_DP_CONFIG``       campaign configuration JSON (``pipelines.centralnotice.config``)
``BEAM_DP_LEDGER``, ``BEAM_DP_KEY_STORE``   budget ledger file and key store (local or gs://)
``BEAM_DP_RUNNER``       DirectRunner (default), PrismRunner, DaskRunner, FlinkRunner,
                         SparkRunner or DataflowRunner; the runner profiles supply the rest
``BEAM_DP_RUNNER_OPTIONS``  extra Beam options as JSON, e.g. ``{"flink_master": "host:8081"}``
                         or for Dataflow ``{"project": "p", "region": "europe-west1",
                         "temp_location": "gs://b/tmp"}``
``BEAM_DP_PYTHON``       the interpreter with this project installed (default ``python3``)
``BEAM_DP_START_DATE``   the first day to release (default 2026-11-01)
"""
from __future__ import annotations

import json
import os
import re
import shlex

import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, CronDataIntervalTimetable

PIPELINE_MODULE = "pipelines.centralnotice"
CAMPAIGNS = [c.strip() for c in os.environ.get("BEAM_DP_CAMPAIGNS", "example_campaign").split(",")
             if c.strip()]
DATA_ROOT = os.environ.get("BEAM_DP_DATA", "/srv/centralnotice/input")
OUTPUT_ROOT = os.environ.get("BEAM_DP_OUTPUT", "/srv/centralnotice/releases")
CONFIG = os.environ.get("BEAM_DP_CONFIG", "/srv/centralnotice/campaigns.json")
LEDGER = os.environ.get("BEAM_DP_LEDGER", "/srv/centralnotice/ledger.json")
KEY_STORE = os.environ.get("BEAM_DP_KEY_STORE", "/srv/centralnotice/keys")
RUNNER = os.environ.get("BEAM_DP_RUNNER", "DirectRunner")
RUNNER_OPTIONS = json.loads(os.environ.get("BEAM_DP_RUNNER_OPTIONS", "{}"))
PYTHON = os.environ.get("BEAM_DP_PYTHON", "python3")
START_DATE = os.environ.get("BEAM_DP_START_DATE", "2026-11-01")

#: 02:30 UTC: the day before is complete (its data interval ends then).
SCHEDULE = "30 2 * * *"
#: The day a run releases: the first day of its data interval (templated).
DAY = "{{ data_interval_start | ds }}"
DAY_NODASH = "{{ data_interval_start | ds_nodash }}"


def release_id(campaign: str) -> str:
    """The ledger's name for one campaign's release of the run's day (templated)."""
    return f"{campaign}/{DAY}"


DATAFLOW_JOB_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


def dataflow_job_name(campaign: str) -> str:
    """The job name of one campaign's daily release, as Dataflow accepts it: lowercase letters,
    digits and dashes, starting with a letter, ending with a letter or digit, at most 63
    characters, e.g. ``C2026_000_fr`` -> ``centralnotice-c2026-000-fr-<day, 8 digits>``. Campaign
    ids are checked names (letters, digits, '.', '_', '-')."""
    slug = re.sub(r"[^a-z0-9]+", "-", campaign.lower()).strip("-")
    name = f"centralnotice-{slug}"[:63 - 9].rstrip("-")
    return f"{name}-{DAY_NODASH}"


def centralnotice_options(campaign: str) -> dict:
    """Options of ``python -m pipelines.centralnotice`` for one campaign's release of the run's
    day (templated), the same for both tasks."""
    options = {
        "config": CONFIG,
        "release": release_id(campaign),
        "impressions": f"{DATA_ROOT}/{DAY}/impressions/",
        "clicks": f"{DATA_ROOT}/{DAY}/clicks/",
        "output": OUTPUT_ROOT,
        "ledger": LEDGER,
        "key_store": KEY_STORE,
        "runner": RUNNER,
        **RUNNER_OPTIONS,
    }
    if RUNNER.lower().startswith("dataflow"):
        options.setdefault("job_name", dataflow_job_name(campaign))
    return options


def command(campaign: str, step: str) -> str:
    """The shell command of one task: the job with its options and ``--submit_only`` or
    ``--finalize`` (``step``), every argument quoted."""
    flags = [f"--{name}={value}" for name, value in centralnotice_options(campaign).items()]
    return shlex.join([PYTHON, "-m", PIPELINE_MODULE, *flags, f"--{step}"])


with DAG(
    dag_id="centralnotice_daily_release",
    description="Differentially private CentralNotice banner statistics, one release per "
                "campaign and day (the day before the run)",
    schedule=CronDataIntervalTimetable(SCHEDULE, timezone="UTC"),
    start_date=pendulum.parse(START_DATE, tz="UTC"),
    catchup=True,  # a missed day is released late, never skipped
    max_active_runs=1,  # releases of one campaign are charged to its budget in order
    default_args={"retries": 2, "retry_delay": pendulum.duration(minutes=15)},
    tags=["beam", "differential-privacy", "centralnotice"],
) as dag:
    for campaign in CAMPAIGNS:
        submit = BashOperator(task_id=f"submit_{campaign}",
                              bash_command=command(campaign, "submit_only"))
        finalize = BashOperator(task_id=f"finalize_{campaign}",
                                bash_command=command(campaign, "finalize"))
        submit >> finalize
