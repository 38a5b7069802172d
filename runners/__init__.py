"""Putting the project's pipelines on a runner: DirectRunner, Prism, Flink, Spark, Dask, Dataflow.

* :mod:`runners.profiles` — ``pipeline_options_for(argv)``: ``--runner`` plus Beam's options with
  per-runner defaults, including the threads and batch sizes DoFns take
  (:class:`transforms.parallel.ExecutionOptions`); every pipeline main builds its options with it;
* :mod:`runners.seam` — ``run(options, build)``, ``submit``, ``wait``, ``options_for``: the one
  seam through which every run goes (the release layer imports nothing else of ``runners/`` but
  the interface's value types); the profile's execution (:mod:`runners.execution`, the interface,
  which imports no profile) owns what differs between runners (a cluster for the run, checks of
  the built pipeline, one final leaf where the runner needs it, clients to close);
* :mod:`runners.dask_cluster` and :mod:`runners.dask_runner` — Dask: the run's cluster and
  execution, and Beam's Dask runner translated for a cluster;
* :mod:`runners.dataflow_jobs` — Dataflow jobs submitted by one process and awaited by another
  (``execution.submit`` / ``execution.wait``), a Flex Template launch's job id;
* :mod:`runners.cache` and :mod:`runners.fetch` — the Flink/Spark job server jars and the Prism
  binary, fetched once (``python -m runners.fetch all``) and found by the profiles;
* :mod:`runners.harness` — run a pipeline main on a runner and read back its output (tests and
  benchmarks), and a worker pool for ``--environment_type=EXTERNAL``;
* :mod:`runners.demo_release` — a runner check (noisy counts from a public testing seed; never a
  release: releases go through the jobs on the release layer);
* :mod:`runners.beam_import` — command-line entries import Beam without its ``apitools`` warning;
* :mod:`runners.deploy` — deployment that names the jobs: Dataflow Flex Template metadata,
  scheduling examples (Airflow DAG, cron). The rest of ``runners/`` imports no job.

See runners/README.md.
"""
from runners.beam_import import module_run, quiet_beam_import

__all__ = ["describe_profiles", "pipeline_options_for"]

if module_run().startswith("runners."):  # ``python -m runners.NAME``: a CLI entry
    quiet_beam_import()


def __getattr__(name):
    # Imported on use: ``python -m runners.profiles`` must not find the module already imported.
    if name in __all__:
        from runners import profiles
        return getattr(profiles, name)
    raise AttributeError(f"module 'runners' has no attribute {name!r}")
