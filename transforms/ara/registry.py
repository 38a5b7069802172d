"""``BatchRegistry``: a report batch is aggregated at most once.

The aggregation service lets each batch of reports (shared id) be aggregated once; a second
summary of the same reports would spend the sources' privacy budget again. This guard records a
batch id by exclusively creating ``<directory>/<sha256(batch id)>.json`` (``os.O_CREAT |
os.O_EXCL``), which is atomic on a local (POSIX) file system, so of two concurrent runs with the
same batch id exactly one gets the claim. The claim is taken *before* the pipeline runs and is
never released: a run that fails afterwards still consumes the batch (the safe direction for
privacy; an operator who is sure nothing was released may delete the file by hand).

Interim mechanism: the project's budget ledger (``accounting/ledger.py``) may take this role
later; the record format is a small JSON object so it can be imported there.
"""
from __future__ import annotations

import datetime
import hashlib
import json
import os


class BatchAlreadyAggregated(RuntimeError):
    """The batch id was claimed by an earlier aggregation."""


class BatchRegistry:
    def __init__(self, directory: str):
        if not directory:
            raise ValueError("batch registry directory is required")
        if "://" in directory:
            raise ValueError("the batch registry needs a local directory (exclusive create is "
                             f"only atomic on a local file system), got {directory!r}")
        self.directory = directory

    def _path(self, batch_id: str) -> str:
        digest = hashlib.sha256(batch_id.encode("utf-8")).hexdigest()
        return os.path.join(self.directory, f"{digest}.json")

    def is_aggregated(self, batch_id: str) -> bool:
        return os.path.exists(self._path(batch_id))

    def claim(self, batch_id: str, **details) -> str:
        """Record ``batch_id`` as aggregated; raise ``BatchAlreadyAggregated`` if it already is.

        ``details`` (JSON-serialisable: epsilon, output path, ...) are stored with the claim.
        Returns the record's path.
        """
        if not isinstance(batch_id, str) or not batch_id.strip():
            raise ValueError("batch_id must be a non-empty string")
        os.makedirs(self.directory, exist_ok=True)
        path = self._path(batch_id)
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            raise BatchAlreadyAggregated(
                f"batch {batch_id!r} was already aggregated (record {path}); a second summary "
                "report of the same reports is refused") from None
        record = {"batch_id": batch_id,
                  "claimed_at": datetime.datetime.now(datetime.timezone.utc).isoformat(),
                  **details}
        with os.fdopen(fd, "w") as f:
            json.dump(record, f, indent=2, sort_keys=True)
        return path

    def record(self, batch_id: str) -> dict:
        with open(self._path(batch_id)) as f:
            return json.load(f)
