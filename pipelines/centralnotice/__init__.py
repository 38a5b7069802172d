"""CentralNotice banner statistics: the release job, its configuration, synthetic data and tuning.

Modules:

* :mod:`pipelines.centralnotice.job` -- ``python -m pipelines.centralnotice``: one scheduled release of a campaign;
* :mod:`pipelines.centralnotice.config` -- the campaigns' configuration (schedule, keys, budgets);
* :mod:`pipelines.centralnotice.impressions` -- impressions and clicks joined into the released key columns;
* :mod:`pipelines.centralnotice.data` -- ``python -m pipelines.centralnotice.data``: synthetic impressions and clicks;
* :mod:`pipelines.centralnotice.tuning` -- ``python -m pipelines.centralnotice.tuning``: noise and threshold tuning on synthetic data.
"""


def __getattr__(name: str):
    """``main`` and ``JOB`` of the job module, loaded on first use (PEP 562): importing the package
    (for its configuration, say) does not import Beam."""
    if name in ("main", "JOB"):
        from pipelines.centralnotice import job
        return getattr(job, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
