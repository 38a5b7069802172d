"""The runnable jobs (``python -m pipelines.NAME --help``) and the release layer they stand on."""
import sys

from runners.beam_import import quiet_beam_import

__all__ = ["quiet_beam_import"]

if sys.argv[:1] == ["-m"]:  # ``python -m pipelines.NAME``: the CLI entry (runpy sets "-m" here)
    quiet_beam_import()
