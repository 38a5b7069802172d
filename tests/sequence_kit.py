"""Two-batch sequences of a job against one real ledger, for ``accounting.verification.audit.audit_sequences``.

:class:`SequenceJob` runs a job the way an operator runs it (``module.run(request)``, a real
ledger and key store in a fresh folder): batch 1, then batch 2 (or, ``single_release``, one
release over both report batches: a local-DP collection, which is released once). The keys the
ledger draws come from a seeded sequence (:func:`seeded_keys`), so the two worlds of a pair --
with and without a unit -- get the same keys, and a batch that removed the unit's replayed rows
must release exactly the bytes of the world that never had them. Each world runs in an
``accounting.keys.audit_world``: the same seeded keys drive both worlds, as they would in two
processes, while within a world every key is claimed once as in production. A refused batch is returned as
``accounting.verification.audit.Refused`` with everything it left behind: the ledger document, key store,
consumed-id records and published files are snapshotted before and compared after.
"""
from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import shutil
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional

from accounting.verification.audit import Dataset, Refused, ReportRule
from audit_kit import read_released

#: Marker fields that differ between the two worlds of a pair whatever the job does: each world
#: has its own ledger (ledger_id, and the random id of each charge) and input files (the keyed
#: binding to the input digest).
MARKER_PER_WORLD = ("ledger_id", "ledger_charge", "input_binding")


def marker_rule(noisy: tuple = ()) -> dict:
    return {"*RELEASE.json": ReportRule(noisy_fields=MARKER_PER_WORLD + tuple(noisy))}


@contextlib.contextmanager
def seeded_keys(seed: int):
    """``ReleaseKey.generate`` draws from a public, seeded sequence for the duration (tests
    only: both worlds of a pair get the same keys; the keys are otherwise real release keys,
    ``ReleaseKey.from_public_seed``)."""
    from accounting.keys import ReleaseKey

    counter = itertools.count()
    original = ReleaseKey.__dict__["generate"]

    def generate(cls):
        return cls.from_public_seed(f"audit-sequence/{seed}/{next(counter)}")

    ReleaseKey.generate = classmethod(generate)
    try:
        yield
    finally:
        ReleaseKey.generate = original


def _state(root: str) -> dict:
    """Every file under ``root`` but the operator's reports and lock files: name -> bytes."""
    out = {}
    for folder, dirs, names in os.walk(root):
        dirs[:] = [d for d in dirs if d != "reports"]
        for name in names:
            if name.endswith(".lock"):
                continue
            path = os.path.join(folder, name)
            with open(path, "rb") as handle:
                out[os.path.relpath(path, root)] = handle.read()
    return out


@dataclass(frozen=True, kw_only=True)
class SequenceJob:
    """module: the job's module (``run``). write(dataset, folder, batch) -> {input: [paths]}.
    request(files, options, batch_id, skip) -> the job's request. skip: ``--skip_consumed``.
    single_release: one release over both batches' files (``first`` and ``second`` are two
    report batches of one collection)."""

    module: Any
    write: Callable[[Dataset, str, int], Mapping]
    request: Callable[[Mapping, Any, str, bool], Any]
    skip: bool = False
    single_release: bool = False
    seed: int = 7
    adapt: Optional[Callable] = None     # (table name, Table) -> Table, as audit_kit.AdaptedJob

    def __call__(self, first: Dataset, second: Dataset):
        from accounting.keys import audit_world
        from pipelines.release import ReleaseOptions

        folder = tempfile.mkdtemp(prefix="audit-sequence-")
        private = os.path.join(folder, "private")
        options = ReleaseOptions(output=os.path.join(folder, "out"),
                                 ledger=os.path.join(private, "ledger.json"),
                                 key_store=os.path.join(private, "keys"))
        try:
            with seeded_keys(self.seed), audit_world():
                if self.single_release:
                    files = {}
                    for i, batch in enumerate((first, second)):
                        for name, paths in self.write(batch, folder, i).items():
                            files.setdefault(name, []).extend(paths)
                    return None, self._run(files, options, "b1", folder)
                one = self._run(self.write(first, folder, 0), options, "b1", folder)
                two = self._run(self.write(second, folder, 1), options, "b2", folder)
                return one, two
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _run(self, files, options, batch: str, folder: str):
        from pipelines.release import ReleaseRefused

        before = _state(folder)
        try:
            result = self.module.run(self.request(files, options, batch, self.skip))
        except ReleaseRefused as err:
            after = _state(folder)
            changed = sorted(n for n in set(before) | set(after) if before.get(n) != after.get(n))
            return Refused(reason=str(err), left_behind=tuple(changed))
        (outcome,) = result.releases
        release = read_released(outcome.folder)
        if self.adapt is None:
            return release
        return dataclasses.replace(release, tables={n: self.adapt(n, t)
                                                    for n, t in release.tables.items()})
