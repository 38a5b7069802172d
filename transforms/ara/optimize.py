"""Moved to :mod:`pipelines.ara_optimize` (the optimizer is the ad tech's tooling, not a transform).

Compatibility alias only, kept while branches written against the old path are merged; import
``pipelines.ara_optimize`` in new code. Remove once no caller imports this path.
"""
import sys

from pipelines import ara_optimize as _moved

sys.modules[__name__] = _moved
