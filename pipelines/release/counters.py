"""Row counters: raw-data facts for the operator, kept out of every released file.

Jobs count what happens to input rows in the job's namespace, named
``<input>.<event>[.<reason>]``:

* ``read``: rows read (counted by the release layer's reader; ``read_files_without_rows``:
  files of the input that had none, header-only or empty);
* ``dropped.<reason>``: faulty rows removed by a documented rule (a value that does not parse,
  a missing id, a key outside the public keyset, a malformed CSV line) -- these count towards the
  dropped-rows rule: an input whose eligible rows were all dropped, or more than
  ``--max_dropped_fraction`` of them, raises an operator alert (:func:`alerts`; the release is
  published: see pipelines/release/__init__.py, "Publication decisions");
* ``skipped.<reason>``: rows that belong to other releases (another campaign or day in a shared
  file): not faults, and not eligible;
* ``excluded.<reason>``: rows removed by policy (a protected country): not faults.

Counters are pipeline output (:mod:`transforms.counting`), the same on every runner whether or not
it returns Beam metrics: each counting DoFn emits its bundle's partial counts, the pipeline sums
them before the shuffle, and :class:`StageCounters` writes each release's (:func:`select`) as a
small JSON file, ``FILE`` (:data:`pipelines.release.publish.COUNTERS`), into the release's
private staging folder. The release layer reads that file back (:func:`read_staged`: lifecycle
``collect``, in the process that ran the pipeline or in another) into the CLI summary and the
operator's ``report.json``; publication leaves it behind (:mod:`pipelines.release.publish`), so
counters never reach a released file or the public marker.
"""
from __future__ import annotations

import json
from typing import Mapping, Optional, Sequence

import apache_beam as beam

from pipelines.release import storage
from pipelines.release.publish import COUNTERS as FILE
from transforms.counting import Counters

EVENTS = ("read", "dropped", "skipped", "excluded")
FORMAT = "beam-dp-release/counters/v1"


def namespace(job: str, release_id: Optional[str] = None) -> str:
    """Run-level counters live in the job's namespace, a release's own in ``job/release id``."""
    return job if release_id is None else f"{job}/{release_id}"


class RowCounters(Counters):
    """Row counters of one input of one job, run-level or of one release (a run may make
    several releases from the same rows: what each release skips or drops is its own). Held by
    a :class:`~transforms.counting.CountingDoFn` applied with
    :class:`~transforms.counting.Counted`."""

    def __init__(self, job: str, input_name: str, release_id: Optional[str] = None):
        super().__init__(namespace(job, release_id), prefix=f"{input_name}.")

    def read(self, amount) -> None:
        self.inc("read", amount)

    def dropped(self, reason: str, amount) -> None:
        self.inc(f"dropped.{reason}", amount)

    def skipped(self, reason: str, amount) -> None:
        self.inc(f"skipped.{reason}", amount)

    def excluded(self, reason: str, amount) -> None:
        self.inc(f"excluded.{reason}", amount)

    def other(self, name: str, amount) -> None:
        self.inc(name, amount)


def select(counts: Mapping[str, Mapping[str, int]], job: str, release_id: str,
           library: Sequence[str] = ()) -> dict[str, int]:
    """One release's counters from every count of the run (``{namespace: {name: amount}}``,
    as :class:`transforms.counting.AllCounts` gives them): the job's run-level ones, the
    release's own (namespace ``job/release id``), and those of the ``library`` namespaces
    (transforms the job uses that count in a namespace of their own, e.g. ``ara``), named
    ``<namespace>.<name>``."""
    merged: dict[str, int] = {}
    for ns, values in counts.items():
        if ns in (job, namespace(job, release_id)):
            prefix = ""
        elif ns in library:
            prefix = f"{ns}."
        else:
            continue
        for name, value in values.items():
            merged[prefix + name] = merged.get(prefix + name, 0) + int(value)
    return dict(sorted(merged.items()))


class StageCounters(beam.PTransform):
    """The run's counts (one element, :class:`transforms.counting.AllCounts`) -> one release's
    counters (:func:`select`) written to ``folder``/:data:`FILE` (private staging)."""

    def __init__(self, folder: str, job: str, release_id: str, library: Sequence[str] = ()):
        super().__init__()
        self._folder, self._job, self._release_id = folder, job, release_id
        self._library = tuple(library)

    def expand(self, counts):
        return (counts
                | "Select" >> beam.Map(select, self._job, self._release_id, self._library)
                | "Write" >> beam.Map(_write, self._folder, self._job, self._release_id))


def _write(counters: Mapping[str, int], folder: str, job: str, release_id: str) -> str:
    body = {"format": FORMAT, "job": job, "release_id": release_id, "counters": dict(counters)}
    path = storage.join(folder, FILE)
    storage.write_bytes(path, (json.dumps(body, indent=1, sort_keys=True) + "\n").encode("utf-8"))
    return path


def read_staged(folder: str) -> Optional[dict[str, int]]:
    """A release's staged counters (None when its staging holds none: the pipeline wrote no
    counters, so the row rules cannot be read)."""
    data = storage.read_bytes(storage.join(folder, FILE))
    if data is None:
        return None
    body = json.loads(data.decode("utf-8"))
    if body.get("format") != FORMAT:
        raise ValueError(f"{storage.join(folder, FILE)} is not a counters file ({FORMAT})")
    return {str(k): int(v) for k, v in body["counters"].items()}


def dropped_share(counters: Mapping[str, int]) -> dict[str, dict]:
    """Per input: eligible rows, dropped rows, the share dropped and the counters that dropped
    them (``reasons``; see the module docstring)."""
    inputs = sorted({name.split(".", 1)[0] for name in counters
                     if name.split(".", 2)[1:2] and name.split(".", 2)[1] in EVENTS})
    out = {}
    for name in inputs:
        read = counters.get(f"{name}.read", 0)
        dropped = sum(v for k, v in counters.items() if k.startswith(f"{name}.dropped."))
        skipped = sum(v for k, v in counters.items() if k.startswith(f"{name}.skipped."))
        eligible = read - skipped
        # A malformed CSV line is never "read" as a row: count it as eligible and dropped.
        malformed = counters.get(f"{name}.dropped.malformed_csv_line", 0)
        eligible += malformed
        out[name] = {"eligible": eligible, "dropped": dropped,
                     "share": (dropped / eligible) if eligible > 0 else 0.0,
                     "reasons": {k: v for k, v in counters.items()
                                 if k.startswith(f"{name}.dropped.") and v}}
    return out


#: The alert of a release whose staging holds no counters (the pipeline wrote none).
NO_COUNTERS = ("the run staged no row counters, so the row rules (dropped rows, inputs without "
               "eligible rows) could not be checked")


def alerts(shares: Mapping[str, Mapping], inputs: Sequence[str],
           max_dropped_fraction: float) -> list[str]:
    """The operator-only alerts of one release, from its dropped-rows ``shares`` (per input, as
    ``Job.dropped_rows`` returns them) over the ``inputs`` it reads: an input with no eligible
    row (empty, header-only, or holding other releases' rows only), one whose eligible rows
    were all dropped, and one that lost more than ``max_dropped_fraction`` of them. Raw-data
    facts: for the operator report and stderr, never for a publication decision."""
    out = []
    for name in sorted(set(inputs) | set(shares)):
        share = shares.get(name) or {"eligible": 0, "dropped": 0, "share": 0.0}
        eligible, dropped = share["eligible"], share["dropped"]
        if eligible <= 0:
            out.append(f"{name}: no eligible rows (an empty or header-only input, or rows of "
                       "other releases only)")
        elif dropped >= eligible:
            out.append(f"{name}: all {eligible} eligible rows dropped{_by(share)}")
        elif share["share"] > max_dropped_fraction:
            out.append(f"{name}: {dropped} of {eligible} eligible rows dropped (more than "
                       f"{max_dropped_fraction:.0%}){_by(share)}")
    return out


def _by(share: Mapping) -> str:
    reasons = {k: v for k, v in share.get("reasons", {}).items() if v}
    return "; by " + ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())) if reasons else ""
