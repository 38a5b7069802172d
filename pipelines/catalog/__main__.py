"""``python -m pipelines.catalog``: the release catalog."""
import sys

from pipelines.catalog.cli import main

sys.exit(main())
