"""``python -m pipelines.reach_frequency``: one reach and frequency release."""
import sys

from pipelines.reach_frequency.job import main

sys.exit(main())
