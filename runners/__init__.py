"""Putting the project's pipelines on a runner: DirectRunner, Prism, Flink, Spark, Dataflow.

* :mod:`runners.profiles` — ``pipeline_options_for(argv)``: ``--runner`` plus Beam's options with
  per-runner defaults (every pipeline main builds its options with it);
* :mod:`runners.cache` and :mod:`runners.fetch` — the Flink/Spark job server jars and the Prism
  binary, fetched once (``python -m runners.fetch all``) and found by the profiles;
* :mod:`runners.harness` — run a pipeline main on a runner and read back its output (tests and
  benchmarks), and a worker pool for ``--environment_type=EXTERNAL``;
* :mod:`runners.demo_release` — a runner check (noisy counts from a public testing seed; never a
  release: releases go through the jobs on the release layer);
* ``airflow_dag.py``, ``cron.example``, ``daily_release.sh`` — scheduling examples.

See runners/README.md.
"""
import sys

from pipelines import quiet_beam_import

__all__ = ["build_options", "describe_profiles", "pipeline_options_for"]

if sys.argv[:1] == ["-m"]:  # ``python -m runners.NAME``: the CLI entry (runpy sets "-m" here)
    quiet_beam_import()


def __getattr__(name):
    # Imported on use: ``python -m runners.profiles`` must not find the module already imported.
    if name in __all__:
        from runners import profiles
        return getattr(profiles, name)
    raise AttributeError(f"module 'runners' has no attribute {name!r}")
