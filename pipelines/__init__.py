"""The runnable jobs (``python -m pipelines.NAME --help``) and the release layer they stand on."""
from runners.beam_import import module_run, quiet_beam_import

__all__ = ["quiet_beam_import"]

#: Commands that import Beam only when a run needs it (and call quiet_beam_import first):
#: importing it up front would cost them a second for nothing (the catalog's public site).
LAZY_BEAM = ("pipelines.catalog",)

if module_run().startswith("pipelines.") and module_run() not in LAZY_BEAM:
    quiet_beam_import()  # ``python -m pipelines.NAME``: a CLI entry that imports Beam
