"""``python -m pipelines.centralnotice``: one scheduled CentralNotice release."""
import sys

from pipelines.centralnotice.job import main

sys.exit(main())
