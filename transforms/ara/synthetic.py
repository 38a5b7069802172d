"""Moved to :mod:`pipelines.ara_synthetic` (synthetic data is tooling, not a transform).

Compatibility alias only, kept while branches written against the old path are merged; import
``pipelines.ara_synthetic`` in new code. Remove once no caller imports this path.
"""
import sys

from pipelines import ara_synthetic as _moved

sys.modules[__name__] = _moved
