"""Example Airflow DAG: the daily CentralNotice run, releasing what each campaign's schedule has due.

Copy this file into Airflow's ``dags/`` folder on a machine where this project is installed
(``pip install /path/to/repo`` into the interpreter named by the ``python`` param; Airflow with
the ``airflow`` extra of setup.py).

**Which day.** Each run covers its data interval's day. The timetable is explicit,
``CronDataIntervalTimetable("30 2 * * *", UTC)``: the run at 02:30 UTC on day D covers the
interval [D-1 02:30, D 02:30), day D-1 (``{{ data_interval_start | ds }}``), whose input folder
is complete since midnight. (Airflow 3 turns a bare cron ``schedule`` into a trigger timetable
whose interval is the run's own instant, so ``{{ ds }}`` would be D: today's incomplete folder.)
With ``catchup``, days missed while the scheduler was down are run when it is back, oldest first
(``max_active_runs=1``), from :data:`START_DATE`.

**What is due.** The ``due`` task asks ``python -m runners.deploy.schedule --json`` (the module
the cron script runs too, reading the same schedule file) which releases the campaigns'
schedules have due on the day: a daily campaign's release of that day, a multi-day or
whole-campaign release on its last day, nothing for a campaign with nothing due. ``submit``
(``--submit_only``: reserved, charged once, staged, job submitted) and ``finalize``
(``--finalize``: waits for the job, publishes, commits) are mapped over those releases, one task
instance each, both safe to retry. ``catalog_check`` ends the run: ``python -m pipelines.catalog
--check`` names every earlier slot still unpublished (it runs when nothing was due too). Exit 2
(refused, nothing charged) and 3 (failed after the charge, nothing published) fail a task; see
runners/README.md.

Configuration: the run's params (set in the trigger form, or left at their defaults):
``schedule``, the schedule file (runners/deploy/schedule.py documents it), and ``python``, the
interpreter with this project installed. Nothing is read from the environment.
"""
from __future__ import annotations

import json
import subprocess

import pendulum
from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, CronDataIntervalTimetable, Param, task

#: 02:30 UTC: the day before is complete (its data interval ends then).
SCHEDULE = "30 2 * * *"
#: The first data interval's day (catchup runs every day from there; days with nothing due
#: only run the check).
START_DATE = "2026-11-01"
#: The day a run covers: the first day of its data interval (templated).
DAY = "{{ data_interval_start | ds }}"


def due_plan(schedule: str, python: str, day: str) -> dict:
    """The run of ``day`` as ``runners.deploy.schedule`` plans it from the schedule file: the
    due release ids and the ``submit``, ``finalize`` and ``check`` command lines. A bad schedule
    file or configuration fails the task, naming it."""
    done = subprocess.run([python, "-m", "runners.deploy.schedule", f"--schedule={schedule}",
                           f"--day={day}", "--json"], capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"runners.deploy.schedule exited {done.returncode}: "
                           f"{done.stderr.strip()}")
    return json.loads(done.stdout)


def due(schedule: str, python: str, day: str) -> list:
    """The ``due`` task: one entry per due release (its id and its two commands), mapped over by
    ``submit`` and ``finalize``; the check's command goes to the XCom key ``check``."""
    from airflow.sdk import get_current_context

    planned = due_plan(schedule, python, day)
    get_current_context()["ti"].xcom_push(key="check", value=planned["check"])
    return [{"release": r, "submit": s, "finalize": f}
            for r, s, f in zip(planned["releases"], planned["submit"], planned["finalize"])]


def submit_command(entry: dict) -> str:
    return entry["submit"]


def finalize_command(entry: dict) -> str:
    return entry["finalize"]


with DAG(
    dag_id="centralnotice_daily_release",
    description="Differentially private CentralNotice banner statistics: what each campaign's "
                "schedule has due on the day before the run, then the catalog's schedule check",
    schedule=CronDataIntervalTimetable(SCHEDULE, timezone="UTC"),
    start_date=pendulum.parse(START_DATE, tz="UTC"),
    catchup=True,  # a missed day is released late, never skipped
    max_active_runs=1,  # releases of one campaign are charged to its budget in order
    default_args={"retries": 2, "retry_delay": pendulum.duration(minutes=15)},
    params={"schedule": Param("/srv/centralnotice/schedule.json", type="string",
                              description="the schedule file (runners/deploy/schedule.py)"),
            "python": Param("python3", type="string",
                            description="the interpreter with this project installed")},
    tags=["beam", "differential-privacy", "centralnotice"],
) as dag:
    releases = task(task_id="due", retries=0)(due)(
        schedule="{{ params.schedule }}", python="{{ params.python }}", day=DAY)
    submit = BashOperator.partial(task_id="submit").expand(
        bash_command=releases.map(submit_command))
    finalize = BashOperator.partial(task_id="finalize").expand(
        bash_command=releases.map(finalize_command))
    check = BashOperator(task_id="catalog_check",
                         bash_command="{{ ti.xcom_pull(task_ids='due', key='check') }}",
                         trigger_rule="none_failed", retries=0)
    submit >> finalize >> check
