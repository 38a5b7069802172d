"""Beam PTransforms of the DP release toolkit (see README.md).

Importing the package makes Arrow tables pickle compactly (see :mod:`transforms.arrow_pickle`).
"""
from transforms import arrow_pickle  # noqa: F401  (registers the compact Arrow reducers)
