"""The release catalog (``python -m pipelines.catalog``): a public static site of what was
published, an operator view and schedule health. It imports no Beam.

Modules:

* :mod:`pipelines.catalog.cli` -- the command line;
* :mod:`pipelines.catalog.model` -- what the ledger and the published files say;
* :mod:`pipelines.catalog.facts` -- one release's public facts;
* :mod:`pipelines.catalog.budget` -- budget spent and left;
* :mod:`pipelines.catalog.site` -- the public site;
* :mod:`pipelines.catalog.html` -- page building blocks;
* :mod:`pipelines.catalog.charts` -- SVG charts;
* :mod:`pipelines.catalog.export` -- machine-readable exports;
* :mod:`pipelines.catalog.schedule` -- schedule health;
* :mod:`pipelines.catalog.coverage` -- scheduled days against published ones;
* :mod:`pipelines.catalog.operator` -- the operator view.
"""


def __getattr__(name: str):
    """``main`` and ``JOB`` of the job module, loaded on first use (PEP 562): importing the package
    (for its configuration, say) does not import Beam."""
    if name in ("main", "JOB"):
        from pipelines.catalog import cli
        return getattr(cli, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
