"""File patterns as every reader of the project takes them: one normalisation, no Beam.

Beam's file systems need an absolute local path; a user gives ``rows-*.parquet`` from where they
stand. :func:`normalize_glob` makes the two meet, for the library readers
(:mod:`transforms.tables`) and the release layer's files (:mod:`pipelines.release.storage`) --
the catalog among them, which imports no Beam.
"""
from __future__ import annotations

import os


def normalize_glob(pattern: str) -> str:
    """A local path or glob made absolute (``rows-*.parquet`` -> ``/cwd/rows-*.parquet``, ``~``
    expanded), so it works with every runner; URLs (``gs://...``) are returned unchanged."""
    if not isinstance(pattern, str) or not pattern:
        raise TypeError(f"a file pattern must be a non-empty string, got {pattern!r}")
    if "://" in pattern:
        return pattern
    return os.path.abspath(os.path.expanduser(pattern))
