"""Deploying the project's jobs: what schedules and submits them, outside the runner profiles.

* ``flex_template.py`` — Dataflow Flex Template metadata for every job
  (``python -m runners.deploy.flex_template --output DIR``), derived from each job's CLI;
  ``launcher.Dockerfile`` and ``flex_launcher.py`` — the launcher image and the program it runs
  (the job with ``--submit_only``; finalize is a second task);
* ``airflow_dag.py`` — an example Airflow DAG of the daily CentralNotice release (its data
  interval's day, submitted then finalized);
* ``daily_release.sh`` and ``cron.example`` — the same release from cron.

These name the jobs under ``pipelines/``; the rest of ``runners/`` (profiles, the runner seam,
Dask) knows no job.
"""
