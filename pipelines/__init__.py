"""The runnable jobs (``python -m pipelines.NAME --help``) and the release layer they stand on."""
from runners.beam_import import console_logging, module_run, quiet_beam_import

__all__ = ["quiet_beam_import"]

if module_run().startswith("pipelines."):
    # ``python -m pipelines.NAME``: the command's console, set before any module imports Beam
    # (the jobs import it where they need it; a Beam-free command never does).
    console_logging()
