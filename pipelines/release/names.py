"""One pattern for every name that becomes part of a path: release, campaign and batch ids.

A name is one or more segments joined by ``/``; a segment starts with a letter or digit and then
holds letters, digits, ``.``, ``_`` and ``-`` (at most 128 characters). So no name is empty,
absolute, or ``.``/``..``, and a release's folder is always inside ``--output``. Messages quote
the offending name only after it was checked not to be file content (names come from the
command line or the configuration, never from data files).
"""
from __future__ import annotations

import re

_SEGMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
MAX_SEGMENTS = 8


def check_segment(value, what: str) -> str:
    """A single path segment (e.g. a campaign id)."""
    if not isinstance(value, str) or not _SEGMENT.fullmatch(value) or set(value) == {"."}:
        raise ValueError(f"{what} {value!r} is not a valid name: use letters, digits, '.', '_' "
                         "and '-', starting with a letter or digit (at most 128 characters)")
    return value


def check_release_id(value, what: str = "release id") -> str:
    """A release id: segments joined by '/' (e.g. ``C2026_en/2026-11-26``)."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string")
    parts = value.split("/")
    if len(parts) > MAX_SEGMENTS:
        raise ValueError(f"{what} {value!r} has more than {MAX_SEGMENTS} segments")
    for part in parts:
        check_segment(part, f"{what} {value!r}: segment")
    return value


def release_path(release_id: str) -> list[str]:
    """The folder segments of a release id (checked)."""
    return check_release_id(release_id).split("/")
