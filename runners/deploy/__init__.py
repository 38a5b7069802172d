"""Deploying the project's jobs: what schedules and submits them, outside the runner profiles.

* ``flex_template.py`` — Dataflow Flex Template metadata for every job
  (``python -m runners.deploy.flex_template --output DIR``), derived from each job's CLI;
  ``launcher.Dockerfile`` and ``flex_launcher.py`` — the launcher image and the program it runs
  (the job with ``--submit_only``; finalize is a second task);
* ``schedule.py`` — what a scheduled run releases: each campaign's own schedule for the data
  interval's day, from the schedule file both schedulers read, then the catalog's check;
* ``airflow_dag.py`` — an example Airflow DAG of the daily CentralNotice run (the due
  releases, submitted then finalized, then ``catalog --check``);
* ``daily_release.sh`` and ``cron.example`` — the same run from cron.

These name the jobs under ``pipelines/``; the rest of ``runners/`` (profiles, the runner seam,
Dask) knows no job.
"""
