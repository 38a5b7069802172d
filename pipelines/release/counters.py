"""Row counters: raw-data facts for the operator, kept out of every released file.

Jobs count what happens to input rows with Beam counters in the job's namespace, named
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

The release layer reads the counters from the pipeline result into the CLI summary and the
operator's ``report.json``, never into a released file; so do the alerts made from them.
"""
from __future__ import annotations

from typing import Mapping, Optional, Sequence

from apache_beam.metrics import Metrics

EVENTS = ("read", "dropped", "skipped", "excluded")


def namespace(job: str, release_id: Optional[str] = None) -> str:
    """Run-level counters live in the job's namespace, a release's own in ``job/release id``."""
    return job if release_id is None else f"{job}/{release_id}"


class RowCounters:
    """Beam counters of one input of one job, run-level or of one release (a run may make
    several releases from the same rows: what each release skips or drops is its own)."""

    def __init__(self, job: str, input_name: str, release_id: Optional[str] = None):
        self._namespace, self._input = namespace(job, release_id), input_name
        self._counters = {}

    def __getstate__(self):
        return {"_namespace": self._namespace, "_input": self._input, "_counters": {}}

    def _inc(self, name: str, amount) -> None:
        amount = int(amount)
        if amount:
            if name not in self._counters:
                self._counters[name] = Metrics.counter(self._namespace, f"{self._input}.{name}")
            self._counters[name].inc(amount)

    def read(self, amount) -> None:
        self._inc("read", amount)

    def dropped(self, reason: str, amount) -> None:
        self._inc(f"dropped.{reason}", amount)

    def skipped(self, reason: str, amount) -> None:
        self._inc(f"skipped.{reason}", amount)

    def excluded(self, reason: str, amount) -> None:
        self._inc(f"excluded.{reason}", amount)

    def other(self, name: str, amount) -> None:
        self._inc(name, amount)


def query(result, job: str, library: Sequence[str] = ()) -> dict[str, dict[str, int]] | None:
    """{namespace: {counter: value}} of the job's run-level and release-level namespaces
    (committed values, or attempted where a runner has no committed ones). Counters of the
    ``library`` namespaces (transforms the job uses that count in a namespace of their own, e.g.
    ``ara``) are run-level counters named ``<namespace>.<name>``.

    None when the runner's result has no metrics at all (its ``metrics()`` raises
    NotImplementedError): "no counters" must not read as "nothing dropped" (the release layer
    alerts the operator that the row rules could not be checked)."""
    out: dict[str, dict[str, int]] = {}
    try:
        counters = result.metrics().query()["counters"]
    except (NotImplementedError, AttributeError, KeyError):
        return None
    for counter in counters:
        ns, name = counter.key.metric.namespace, counter.key.metric.name
        if ns in library and ns != job:
            ns, name = job, f"{ns}.{name}"
        elif ns != job and not ns.startswith(job + "/"):
            continue
        value = counter.committed if counter.committed is not None else counter.attempted
        bucket = out.setdefault(ns, {})
        bucket[name] = bucket.get(name, 0) + int(value or 0)
    return {ns: dict(sorted(values.items())) for ns, values in sorted(out.items())}


def of_release(counts: Mapping[str, Mapping[str, int]], job: str, release_id: str) -> dict[str, int]:
    """The run-level counters plus one release's own."""
    merged = dict(counts.get(job, {}))
    for name, value in counts.get(namespace(job, release_id), {}).items():
        merged[name] = merged.get(name, 0) + value
    return dict(sorted(merged.items()))


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


#: The alert of a run whose runner reported no counters at all.
NO_COUNTERS = ("the runner reported no counters, so the row rules (dropped rows, inputs without "
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
