"""Cross-publisher reach and frequency with LiquidLegions sketches
(``python -m pipelines.reach_frequency``).

Modules:

* :mod:`pipelines.reach_frequency.job` -- the release job.
"""


def __getattr__(name: str):
    """``main`` and ``JOB`` of the job module, loaded on first use (PEP 562): importing the package
    (for its configuration, say) does not import Beam."""
    if name in ("main", "JOB"):
        from pipelines.reach_frequency import job
        return getattr(job, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
