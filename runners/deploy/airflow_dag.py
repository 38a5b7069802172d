"""Example Airflow DAG: the daily CentralNotice release, one task per campaign.

Copy this file into Airflow's ``dags/`` folder on a machine where this project is installed
(``pip install /path/to/repo`` into the interpreter named by ``BEAM_DP_PYTHON``) and
``apache-airflow-providers-apache-beam`` is installed next to Airflow. Each run releases the
previous day's data (``{{ ds }}``) of every campaign as release ``<campaign>/<ds>`` (the
campaigns' ``schedule`` must be ``daily``); the release id is what the budget ledger charges, so a
retried task re-runs the same release (same key, same noise) instead of spending the budget twice.

Configuration (environment of the Airflow scheduler and workers; read when the DAG is parsed):

``BEAM_DP_CAMPAIGNS``    comma-separated campaign ids (one task each)
``BEAM_DP_DATA``         input root: ``<root>/<ds>/impressions/`` and ``<root>/<ds>/clicks/``
                         (directories, globs or files, local or gs://)
``BEAM_DP_OUTPUT``       output root; a release goes to ``<root>/<campaign>/<ds>/``
``BEAM_DP_CONFIG``       campaign configuration JSON (``pipelines.centralnotice_config``)
``BEAM_DP_LEDGER``, ``BEAM_DP_KEY_STORE``   budget ledger file and key store (local or gs://)
``BEAM_DP_RUNNER``       DirectRunner (default), PrismRunner, FlinkRunner, SparkRunner or
                         DataflowRunner; the runner profiles (runners/profiles.py) supply the rest
``BEAM_DP_RUNNER_OPTIONS``  extra Beam options as JSON, e.g. ``{"flink_master": "host:8081"}``
                         or for Dataflow ``{"project": "p", "region": "europe-west1",
                         "temp_location": "gs://b/tmp"}``
``BEAM_DP_PYTHON``       the interpreter with this project installed (default ``python3``)
"""
from __future__ import annotations

import json
import os
import re

import pendulum
from airflow import DAG
from airflow.providers.apache.beam.operators.beam import BeamRunPythonPipelineOperator

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


def release_id(campaign: str) -> str:
    """The ledger's name for one campaign's release of one day (templated on ``ds``)."""
    return f"{campaign}/{{{{ ds }}}}"


DATAFLOW_JOB_NAME = re.compile(r"[a-z]([-a-z0-9]{0,61}[a-z0-9])?")


def dataflow_job_name(campaign: str) -> str:
    """The job name of one campaign's daily release, as Dataflow accepts it: lowercase letters,
    digits and dashes, starting with a letter, ending with a letter or digit (at most 63
    characters here, leaving room for the unique suffix the Beam provider appends), e.g.
    ``C2026_000_fr`` -> ``centralnotice-c2026-000-fr-{{ ds_nodash }}`` (8 digits once
    rendered). Campaign ids are checked names (letters, digits, '.', '_', '-')."""
    slug = re.sub(r"[^a-z0-9]+", "-", campaign.lower()).strip("-")
    name = f"centralnotice-{slug}"[:63 - 9].rstrip("-")
    return name + "-{{ ds_nodash }}"


def centralnotice_options(campaign: str) -> dict:
    """Options of ``python -m pipelines.centralnotice`` for one campaign's daily release."""
    return {
        "config": CONFIG,
        "release": release_id(campaign),
        "impressions": f"{DATA_ROOT}/{{{{ ds }}}}/impressions/",
        "clicks": f"{DATA_ROOT}/{{{{ ds }}}}/clicks/",
        "output": OUTPUT_ROOT,
        "ledger": LEDGER,
        "key_store": KEY_STORE,
        **RUNNER_OPTIONS,
    }


with DAG(
    dag_id="centralnotice_daily_release",
    description="Differentially private CentralNotice banner statistics, one release per "
                "campaign and day",
    schedule="30 2 * * *",  # 02:30 UTC: yesterday's logs are complete
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,  # releases of one campaign are charged to its budget in order
    default_args={"retries": 2, "retry_delay": pendulum.duration(minutes=15)},
    tags=["beam", "differential-privacy", "centralnotice"],
) as dag:
    for campaign in CAMPAIGNS:
        BeamRunPythonPipelineOperator(
            task_id=f"release_{campaign}",
            runner=RUNNER,
            py_interpreter=PYTHON,
            py_options=["-m"],  # run the installed module: python -m pipelines.centralnotice
            py_file=PIPELINE_MODULE,
            pipeline_options=centralnotice_options(campaign),
            # The provider names a Dataflow job after dataflow_config["job_name"] (default: the
            # task id, whose underscores and capitals Dataflow rejects).
            dataflow_config={"job_name": dataflow_job_name(campaign)},
        )
