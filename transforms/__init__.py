"""Beam PTransforms of the DP release toolkit (see README.md).

Arrow tables move between stages through a registered Beam coder
(:mod:`transforms.arrow_coder`), declared by the transforms' output types.
"""
