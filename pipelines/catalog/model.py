"""The release catalog's model: the ledger, the published markers and the operator reports, read
into frozen value objects (no Beam, no rendering).

Three sources, and who may see what comes from each:

* **Published markers** (``OUTPUT/<release id>/v<N>/RELEASE.json``, :mod:`pipelines.release.publish`)
  and the released files beside them (names, sizes, sha256): public. Everything the public site
  says comes from here (:class:`PublishedRelease`), and only the marker fields that describe the
  release: id, version, job, guarantee, measures, public parameters, outputs, public summary.
  The marker's key fingerprints and keyed input binding are kept for the operator view only.
* **The budget ledger** (:mod:`accounting.ledger.records`): operator-only. It holds reservations
  that were never published, take-overs, run counts, key references and the spend of unpublished
  reservations (:class:`LedgerRecord`). The public site uses it for one thing: a marker counts as
  a release of this ledger only if the ledger holds it with the same key fingerprints (a marker
  of another ledger, or of none, is left out and reported to the operator).
* **Operator reports** (``reports/<release id>/v<N>/report.json`` or ``failure.json``, beside
  the ledger by default): operator-only row counters, dropped-row shares and failures.

Reading is tolerant of fields other parts of the project add (consumed-id references, chain
digests, ...): unknown fields are ignored, but the ledger's and each marker's ``format`` is
checked. Faults are :class:`CatalogInputError`, naming the file and never quoting its content.

The catalog stands on its own: it imports no Beam, by construction. It reads the release layout
and files through the release layer's Beam-free modules (:mod:`pipelines.release.layout` for the
names, :mod:`pipelines.release.storage` for local and ``gs://`` reads), which the release layer
writes them with; ``tests/test_layout.py`` holds the catalog to those imports.
"""
from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import cached_property, lru_cache
from typing import Iterable, Mapping, Optional, Sequence

from accounting.budget import PrivacyBudget
from accounting.composition import EpsDelta
from accounting.ledger import records as ledger_records
from accounting.ledger.records import Scope
from accounting.measures import Measure
from pipelines.release import storage
from pipelines.release.layout import FAILURE, MARKER, MARKER_FORMAT, REPORT, TESTING_PREFIX

_VERSION_FOLDER = re.compile(r"v([1-9][0-9]*)")
_DATE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


class CatalogInputError(ValueError):
    """An input the catalog cannot use (exit 2): the message names the file, never its content."""


# --------------------------------------------------------------------------- value objects

@dataclass(frozen=True, kw_only=True)
class MeasureFacts:
    """One released measure as its marker states it: the :class:`Measure` (mechanism, cost,
    neighbouring relation, sensitivities) and its noise's public error figures."""

    measure: Measure
    noise_scale: Optional[float] = None
    std: Optional[float] = None
    ci95_halfwidth: Optional[float] = None
    granularity: Optional[float] = None


@dataclass(frozen=True, kw_only=True)
class OutputTable:
    """One released file's table as the marker declares it."""

    name: str
    columns: tuple          # ((column, Arrow type name), ...)
    sorted_by: tuple
    noisy_columns: tuple
    description: str
    rows: Optional[int]
    #: ((value column, its error statement), ...): the marker's ``errors`` (OutputSpec.errors)
    errors: tuple = ()


@dataclass(frozen=True, kw_only=True)
class PublishedFile:
    """A published file: its name, size on the output root and sha256 (the marker's digest; the
    marker's own digest is computed when it is read)."""

    name: str
    size: Optional[int]
    sha256: str


@dataclass(frozen=True, kw_only=True)
class ReleaseGuarantee:
    """A release's own guarantee: composed by ``accountant``; ``covers`` says what it bounds;
    ``figure_accountant`` which accountant the figure comes from (accounting.guarantee.stated;
    a marker written before it was recorded: ``accountant`` itself)."""

    accountant: str
    guarantee: EpsDelta
    covers: str
    rho: Optional[float] = None
    spends_nothing: str = ""
    figure_accountant: str = ""

    def __post_init__(self):
        if not self.figure_accountant:
            object.__setattr__(self, "figure_accountant", self.accountant)


@dataclass(frozen=True, kw_only=True)
class PublishedRelease:
    """One published release version, public facts only (see the module docstring).

    ``period``: the (first, last) ISO day of the data it covers when the marker's parameters
    state one (``dates``), else None. ``folder``: its folder relative to the output root.
    """

    release_id: str
    version: int
    versioned_id: str
    job: str
    dataset_id: str
    folder: str
    testing: bool
    period: Optional[tuple]
    guarantee: ReleaseGuarantee
    measures: tuple           # MeasureFacts
    scopes: tuple             # accounting.ledger.Scope: the budgets the release was charged to
    outputs: tuple            # OutputTable
    files: tuple              # PublishedFile, RELEASE.json last
    parameters: Mapping = field(default_factory=dict, compare=False)
    summary: Mapping = field(default_factory=dict, compare=False)

    @cached_property
    def order_key(self) -> tuple:
        """Public order within a dataset: by period, then release id (numbers by value), then
        version (computed once: a build sorts every release more than once)."""
        return (self.period or ("",), natural_key(self.release_id), self.version)


@dataclass(frozen=True, kw_only=True)
class MarkerFacts:
    """Operator-only facts a marker carries besides its public ones."""

    versioned_id: str
    path: str
    ledger_id: Optional[str]
    key_fingerprints: Mapping
    #: The random id of the ledger charge the release was published under (markers of older
    #: versions carry none): the catalog's cross-check of the ledger against its releases.
    ledger_charge: Optional[str] = None


@dataclass(frozen=True, kw_only=True)
class Takeover:
    at: str
    key_fingerprints: Mapping
    measures_changed: bool


@dataclass(frozen=True, kw_only=True)
class LedgerRecord:
    """One ledger record (operator-only): state, charges, history, key references."""

    release_id: str
    version: int
    versioned_id: str
    state: str
    job: str
    measures: tuple           # Measure
    scope_names: tuple
    charged_at: Optional[str]
    publishing_at: Optional[str]
    committed_at: Optional[str]
    last_run_at: Optional[str]
    runs: int
    takeovers: tuple          # Takeover
    key_fingerprints: Mapping
    files: Mapping
    supersedes: Optional[str]
    charged_under: Optional[Mapping] = None


@dataclass(frozen=True, kw_only=True)
class Ledger:
    """The budget ledger as the catalog reads it (operator-only)."""

    path: str
    ledger_id: str
    accountant: str
    budgets: Mapping          # scope name -> PrivacyBudget (as recorded)
    records: tuple            # LedgerRecord
    latest: Mapping           # release id -> versioned id

    by_versioned_id: Mapping = field(init=False, repr=False, compare=False)
    by_scope: Mapping = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        by_scope: dict = {}
        for record in self.records:
            for name in record.scope_names:
                by_scope.setdefault(name, []).extend(record.measures)
        object.__setattr__(self, "by_versioned_id", {r.versioned_id: r for r in self.records})
        object.__setattr__(self, "by_scope", {k: tuple(v) for k, v in by_scope.items()})

    def record(self, versioned_id: str) -> Optional[LedgerRecord]:
        return self.by_versioned_id.get(versioned_id)

    def latest_record(self, release_id: str) -> Optional[LedgerRecord]:
        vid = self.latest.get(release_id)
        return None if vid is None else self.record(vid)

    def measures_of_scope(self, scope: str) -> list:
        """Every measure charged to ``scope``, reserved records included (as the ledger counts)."""
        return list(self.by_scope.get(scope, ()))


@dataclass(frozen=True, kw_only=True)
class OperatorReport:
    """A release attempt's operator report: ``report.json`` (published) or ``failure.json``."""

    release_id: str
    version: int
    kind: str                 # "report" or "failure"
    status: str
    counters: Mapping
    dropped_rows: Mapping
    detail: str = ""
    dropped_rule_overridden: bool = False
    earlier_failure: bool = False


@dataclass(frozen=True, kw_only=True)
class Dataset:
    """A series of releases a reader thinks of as one dataset (see :func:`dataset_of`)."""

    dataset_id: str
    title: str
    kind: str
    jobs: tuple
    releases: tuple           # PublishedRelease, in public order


@dataclass(frozen=True, kw_only=True)
class CatalogInputs:
    """Everything one catalog build reads: the public releases grouped into datasets, the
    ledger, operator-only marker facts, reports, and what was left out of the public site."""

    datasets: tuple
    ledger: Optional[Ledger]
    markers: Mapping          # versioned id -> MarkerFacts
    reports: Mapping          # versioned id -> OperatorReport (report.json, else failure.json)
    excluded: tuple           # (marker path, reason): markers not in the public site
    missing_files: tuple      # (versioned id, file name): files a marker lists but are absent
    testing: bool = False

    def releases(self) -> list:
        return [r for d in self.datasets for r in d.releases]


# --------------------------------------------------------------------------- datasets

#: Jobs whose releases form one series whatever their batch id, and the series' title.
SERIES = {
    "summary_reports": ("ara-summary-reports", "ARA summary reports", "ARA batch series"),
    "event_level_reports": ("ara-event-level-reports", "ARA event-level reports",
                            "ARA batch series"),
    "ldp_frequencies": ("ldp-frequencies", "LDP frequency estimates", "LDP collection"),
    "ldp_heavy_hitters": ("ldp-heavy-hitters", "LDP heavy hitters", "LDP collection"),
    "shuffle_sum": ("shuffle-sum", "Shuffle-model sums", "LDP collection"),
    "masked_lark_share": ("masked-lark", "Masked LARk gradients", "Masked LARk batch series"),
    "masked_lark_helper": ("masked-lark", "Masked LARk gradients", "Masked LARk batch series"),
    "masked_lark_combine": ("masked-lark", "Masked LARk gradients", "Masked LARk batch series"),
    "masked_lark_train": ("masked-lark-training", "Masked LARk model training",
                          "Masked LARk batch series"),
    "label_dp": ("label-dp", "Label-DP training sets", "label-DP dataset"),
}


def dataset_of(job: str, release_id: str, parameters: Mapping) -> tuple[str, str, str]:
    """``(dataset id, title, kind)`` of a release: a CentralNotice or reach & frequency campaign
    (its campaign id, from the public parameters), a job's batch series, or -- for any other job
    on the release layer (e.g. a DPAggregate job of one's own) -- the job's series of releases
    sharing the release id's first segment."""
    if job == "centralnotice" and isinstance(parameters.get("campaign_id"), str):
        campaign = parameters["campaign_id"]
        return f"centralnotice/{campaign}", f"CentralNotice campaign {campaign}", \
            "CentralNotice campaign"
    if job == "reach_frequency" and isinstance(parameters.get("campaign"), str):
        campaign = parameters["campaign"]
        return f"reach_frequency/{campaign}", f"Reach & frequency, campaign {campaign}", \
            "reach & frequency campaign"
    if job in SERIES:
        slug, title, kind = SERIES[job]
        return slug, title, kind
    head = release_id.split("/", 1)[0]
    series = job if head == job else f"{job}/{head}"
    return series, f"{job} releases" + ("" if head == job else f" ({head})"), \
        "release-layer job"


_DIGIT_RUNS = re.compile(r"(\d+)")


def natural_key(text: str) -> tuple:
    """Sort key that orders digit runs by value (batch-9 before batch-10)."""
    return tuple(int(part) if part.isdigit() else part for part in _DIGIT_RUNS.split(text))


# --------------------------------------------------------------------------- reading files

def _read_json(path: str, what: str):
    data = _read(path)
    if data is None:
        raise CatalogInputError(f"{what} {path} does not exist")
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise CatalogInputError(f"{what} {path} is not valid JSON") from None


def _read(path: str) -> Optional[bytes]:
    """:func:`pipelines.release.storage.read_bytes`, its faults as input errors naming the path."""
    try:
        return storage.read_bytes(path)
    except IsADirectoryError:
        raise CatalogInputError(f"{path} is a folder, not a file") from None
    except OSError as err:
        raise CatalogInputError(f"cannot read {path} ({err.strerror})") from None


def _walk(root: str) -> Iterable[tuple[str, Optional[int]]]:
    """(path, size) of every file under ``root`` outside staging, testing and dot folders; a
    local file's size is None here (:func:`_size` stats only the files a marker lists)."""
    if root.startswith("gs://"):
        from accounting import gcs

        bucket, prefix = gcs.split_gcs_uri(root.rstrip("/") + "/")
        for blob in gcs.client().list_blobs(bucket, prefix=prefix):
            yield f"gs://{bucket}/{blob.name}", blob.size
        return
    # os.scandir directly: os.walk stats every folder once more (islink) and joins twice.
    stack = [root]
    while stack:
        folder = stack.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue  # as os.walk: a folder that cannot be listed is skipped
        below = []
        for entry in entries:
            if entry.is_dir():
                if not entry.name.startswith(".") and not entry.is_symlink():
                    below.append(entry.path)  # as os.walk: a linked folder is not entered
            else:
                yield entry.path, None
        stack.extend(reversed(below))


def _size(path: str, listed: Optional[int]) -> Optional[int]:
    if listed is not None or path.startswith("gs://"):
        return listed
    try:
        return os.stat(path).st_size
    except OSError:
        return None


def _number(value, path: str, what: str, *, optional=False):
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise CatalogInputError(f"{path}: {what} is not a number")
    return value


def read_ledger(path: str) -> Ledger:
    """The ledger at ``path``; unknown fields of the ledger and its records are ignored.

    A chained ledger (the current format) is verified first -- its structure and its record
    chain, without the key store, which the catalog does not hold (accounting.ledger.chain) --
    so a hand-edited ledger is refused naming the record, not shown. A ledger of an older
    version (v1 upgraded as the ledger does, v2, v3) has no chain to verify and is read as
    it is; the jobs refuse it until it is migrated."""
    state = _read_json(path, "ledger")
    if isinstance(state, dict) and state.get("format") == ledger_records.FORMAT_V1:
        state = ledger_records.upgrade_v1(state)
        state["format"] = ledger_records.FORMAT_V2
    formats = (ledger_records.FORMAT,) + ledger_records.UNCHAINED
    if not isinstance(state, dict) or state.get("format") not in formats:
        raise CatalogInputError(f"ledger {path} is not a {ledger_records.FORMAT} file (nor one "
                                "of an older version)")
    if state["format"] == ledger_records.FORMAT:
        from accounting.ledger import chain

        try:
            ledger_records.check_structure(state)
            chain.verify(state, None)
            ledger_records.check_indexes(state)
        except ValueError as err:
            raise CatalogInputError(f"ledger {path} does not verify: {err}") from None
    try:
        budgets = {name: budget(b["epsilon"], b["delta"])
                   for name, b in state.get("scopes", {}).items()}
        records = tuple(_ledger_record(vid, r) for vid, r in state.get("releases", {}).items())
        ledger = Ledger(path=path, ledger_id=str(state["ledger_id"]),
                        accountant=str(state.get("accountant", "basic")), budgets=budgets,
                        records=records, latest=dict(state.get("latest", {})))
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        where = f" ({type(err).__name__} in field {err})" if isinstance(err, KeyError) else ""
        raise CatalogInputError(f"ledger {path} has a malformed record or scope{where}") from None
    return ledger


def _ledger_record(vid: str, record: Mapping) -> LedgerRecord:
    keys = record.get("keys") or {}
    return LedgerRecord(
        release_id=record["release_id"], version=int(record["version"]), versioned_id=vid,
        state=record["state"], job=str((record.get("metadata") or {}).get("job", "")),
        measures=tuple(measure(m) for m in record.get("measures", [])),
        scope_names=tuple(record.get("scopes", [])), charged_at=record.get("charged_at"),
        publishing_at=record.get("publishing_at"), committed_at=record.get("committed_at"),
        last_run_at=record.get("last_run_at"), runs=int(record.get("runs", 1)),
        takeovers=tuple(Takeover(at=str(t.get("at")), key_fingerprints=dict(
            t.get("key_fingerprints") or {}), measures_changed=bool(t.get("measures_changed")))
            for t in record.get("takeovers", [])),
        key_fingerprints={n: k.get("fingerprint") for n, k in sorted(keys.items())},
        files=dict(record.get("files") or {}), supersedes=record.get("supersedes"),
        charged_under=dict(record["charged_under"]) if record.get("charged_under") else None)


def _key(value: Mapping):
    """The memo key of a measure's parsed JSON: its items in the file's order, nested objects
    as items (cheaper than canonical JSON text, whose float formatting dominates at 100,000
    measures, and than sorting them: one writer writes a measure's fields in one order, and
    two orders of one measure only miss the memo, never confuse it); the canonical text when
    something nested is not hashable."""
    try:
        key = tuple([(k, ("{}", tuple(v.items())) if type(v) is dict else v)
                     for k, v in value.items()])
        hash(key)
        return key
    except TypeError:
        return json.dumps(value, sort_keys=True)


def _unkey(key) -> dict:
    if isinstance(key, str):
        return json.loads(key)
    return {k: dict(v[1]) if isinstance(v, tuple) else v for k, v in key}


def _measure_facts(data: Mapping) -> MeasureFacts:
    """The marker's measure (memoised on its content: the releases of a series repeat a few
    plans, and building a Measure validates every field)."""
    return _measure_facts_of(_key(data))


@lru_cache(maxsize=4096)
def _measure_facts_of(key) -> MeasureFacts:
    data = _unkey(key)

    def number(name):
        value = data.get(name)
        return value if isinstance(value, (int, float)) and not isinstance(value, bool) else None

    return MeasureFacts(measure=_measure_of(key), noise_scale=number("noise_scale"),
                        std=number("std"), ci95_halfwidth=number("ci95_halfwidth"),
                        granularity=number("granularity"))


@lru_cache(maxsize=4096)
def _measure_of(key) -> Measure:
    return Measure.from_json(_unkey(key))


def measure(data: Mapping) -> Measure:
    """A Measure from its JSON (ledger record or marker), memoised like :func:`_measure_facts`."""
    return _measure_of(_key(data))


@lru_cache(maxsize=4096)
def budget(epsilon, delta) -> PrivacyBudget:
    """A PrivacyBudget, memoised (a ledger repeats a few budgets over thousands of scopes)."""
    return PrivacyBudget(epsilon=epsilon, delta=delta)


def _period(parameters: Mapping) -> Optional[tuple]:
    dates = parameters.get("dates")
    if isinstance(dates, list) and dates and all(isinstance(d, str) and _DATE.match(d)
                                                 for d in dates):
        return (min(dates), max(dates))
    for name in ("date", "day"):
        value = parameters.get(name)
        if isinstance(value, str) and _DATE.match(value):
            return (value, value)
    return None


def parse_marker(marker, path: str, rel_folder: str, sizes: Mapping[str, Optional[int]],
                 marker_bytes: bytes) -> tuple[PublishedRelease, MarkerFacts]:
    """A marker's public facts and its operator-only ones. ``sizes``: {file name: size} of the
    release folder; ``marker_bytes``: the marker itself (its size and digest are listed too)."""
    import hashlib

    if not isinstance(marker, dict) or marker.get("format") != MARKER_FORMAT:
        raise CatalogInputError(f"{path} is not a {MARKER_FORMAT} release marker")
    try:
        release_id, version = str(marker["release_id"]), int(marker["version"])
        job = str(marker["job"])
        g = marker["guarantee"]
        parameters = marker.get("parameters") or {}
        guarantee = ReleaseGuarantee(
            accountant=str(g["accountant"]),
            figure_accountant=str(g.get("figure_accountant", "")),
            guarantee=EpsDelta(float(_number(g["epsilon"], path, "guarantee.epsilon")),
                               float(_number(g["delta"], path, "guarantee.delta"))),
            covers=str(g.get("covers", "")),
            rho=_number(g.get("rho_of_zcdp_measures"), path, "guarantee.rho", optional=True),
            spends_nothing=str(g.get("spends_nothing", "")))
        scopes = tuple(Scope(name=s["name"], budget=budget(s["epsilon"], s["delta"]),
                             description=str(s.get("description", "")))
                       for s in g.get("ledger_scopes", []))
        outputs, files = [], []
        for name, out in sorted((marker.get("outputs") or {}).items()):
            outputs.append(OutputTable(
                name=name, columns=tuple((str(c), str(t)) for c, t in (out.get("columns") or {}).items()),
                sorted_by=tuple(out.get("sorted_by") or ()),
                noisy_columns=tuple(out.get("noisy_columns") or ()),
                description=str(out.get("description", "")),
                rows=out.get("rows") if isinstance(out.get("rows"), int) else None,
                errors=tuple(sorted((str(c), str(t)) for c, t in (out.get("errors") or {}).items()))))
            files.append(PublishedFile(name=name, size=sizes.get(name), sha256=str(out["sha256"])))
        files.append(PublishedFile(name=MARKER, size=len(marker_bytes),
                                   sha256="sha256:" + hashlib.sha256(marker_bytes).hexdigest()))
        dataset_id = dataset_of(job, release_id, parameters)[0]
        release = PublishedRelease(
            release_id=release_id, version=version,
            versioned_id=str(marker.get("versioned_id") or ledger_records.versioned_id(
                release_id, version)),
            job=job, dataset_id=dataset_id, folder=rel_folder,
            testing=bool(marker.get("testing")), period=_period(parameters),
            guarantee=guarantee,
            measures=tuple(_measure_facts(m) for m in marker.get("measures", [])),
            scopes=scopes, outputs=tuple(outputs), files=tuple(files),
            parameters=parameters, summary=marker.get("summary") or {})
    except CatalogInputError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as err:
        where = f" (field {err})" if isinstance(err, KeyError) else ""
        raise CatalogInputError(f"{path} is a malformed release marker{where}") from None
    facts = MarkerFacts(versioned_id=release.versioned_id, path=path,
                        ledger_id=marker.get("ledger_id"),
                        key_fingerprints=dict(marker.get("key_fingerprints") or {}),
                        ledger_charge=marker.get("ledger_charge")
                        if isinstance(marker.get("ledger_charge"), str) else None)
    return release, facts


def read_reports(root: Optional[str], ledger: Optional[Ledger] = None) -> dict:
    """{versioned id: OperatorReport} under a report folder (``report.json`` wins over a
    ``failure.json`` of the same version). With a ledger, only its records' report folders are
    read (``<root>/<release id>/v<N>/``: no walk of the whole tree); an unreadable report is an
    input error."""
    out: dict = {}
    if not root or (not root.startswith("gs://") and not os.path.isdir(root)):
        return out
    if ledger is not None:
        candidates = [(r.release_id, r.version, storage.join(root, *r.release_id.split("/"),
                                                     f"v{r.version}", name))
                      for r in ledger.records for name in (REPORT, FAILURE)]
    else:
        prefix = root.rstrip("/") + "/"
        candidates = []
        for path, _ in _walk(root):
            rel = path[len(prefix):].rsplit("/", 2)
            if len(rel) == 3 and rel[2] in (REPORT, FAILURE) and _VERSION_FOLDER.fullmatch(rel[1]):
                candidates.append((rel[0], int(rel[1][1:]), path))
        candidates.sort(key=lambda c: c[2].endswith(FAILURE))
    for release_id, version, path in candidates:
        vid = ledger_records.versioned_id(release_id, version)
        if vid in out:
            continue
        data = _read(path)
        if data is None:
            continue
        try:
            body = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise CatalogInputError(f"operator report {path} is not valid JSON") from None
        if not isinstance(body, dict):
            raise CatalogInputError(f"operator report {path} is not a JSON object")
        counters = body.get("counters") or {}
        if counters and all(isinstance(v, dict) for v in counters.values()):
            # a failure before the counters were split per release: {namespace: {name: n}}
            merged: dict = {}
            for values in counters.values():
                for k, v in values.items():
                    merged[k] = merged.get(k, 0) + v
            counters = merged
        out[vid] = OperatorReport(
            release_id=release_id, version=version,
            kind="report" if path.endswith(REPORT) else "failure",
            status=str(body.get("status", "")),
            counters={k: v for k, v in counters.items() if isinstance(v, int)},
            dropped_rows=dict(body.get("dropped_rows") or {}),
            detail=str(body.get("detail", "")),
            dropped_rule_overridden=bool(body.get("dropped_rule_overridden")),
            earlier_failure="earlier_failure" in body)
    return out


def read_catalog(releases_root: str, ledger: Optional[Ledger], *,
                 reports_root: Optional[str] = None, testing: bool = False) -> CatalogInputs:
    """Read every published release under ``releases_root`` and group them into datasets.

    A release is listed when its marker is a release of ``ledger`` (its ledger id, and a record
    with the same key fingerprints). ``testing``: read the testing releases under
    ``testing-not-a-release/`` instead, with no ledger (the privacy audits build the site of a
    testing run this way; every page then says it is not a release).
    """
    if not releases_root.startswith("gs://") and not os.path.isdir(releases_root):
        raise CatalogInputError(f"--releases {releases_root} is not a folder")
    if testing == (ledger is not None):
        raise ValueError("a catalog reads real releases with their ledger, or testing ones without")
    root = storage.join(releases_root, TESTING_PREFIX) if testing else releases_root
    folders: dict = {}
    testing_folder = storage.join(releases_root, TESTING_PREFIX).rstrip("/") + "/"
    for path, size in _walk(root):
        if not testing and path.startswith(testing_folder):
            continue  # testing output lies apart by design: neither a release nor a stray marker
        folder, name = path.rsplit("/", 1) if "/" in path else ("", path)
        folders.setdefault(folder, {})[name] = size
    prefix = root.rstrip("/") + "/"
    releases, markers, excluded, missing = [], {}, [], []
    for folder in sorted(folders):
        files = folders[folder]
        if MARKER not in files:
            continue
        rel_folder = folder[len(prefix):] if folder.startswith(prefix) else ""
        path = storage.join(folder, MARKER)
        data = _read(path)
        try:
            marker = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            raise CatalogInputError(f"release marker {path} is not valid JSON") from None
        sizes = {n: _size(storage.join(folder, n), size) for n, size in files.items() if n != MARKER}
        release, facts = parse_marker(marker, path, rel_folder, sizes, data)
        if not testing:
            check_charge(facts, ledger)
        reason = _exclusion(release, facts, rel_folder, ledger, testing)
        if reason:
            excluded.append((path, reason))
            continue
        releases.append(release)
        markers[release.versioned_id] = facts
        missing.extend((release.versioned_id, f.name) for f in release.files if f.size is None)
    groups: dict = {}
    for release in releases:
        groups.setdefault(release.dataset_id, []).append(release)
    datasets = []
    for dataset_id in sorted(groups, key=natural_key):
        members = sorted(groups[dataset_id], key=lambda r: r.order_key)
        first = members[0]
        _, title, kind = dataset_of(first.job, first.release_id, first.parameters)
        datasets.append(Dataset(dataset_id=dataset_id, title=title, kind=kind,
                                jobs=tuple(sorted({r.job for r in members})),
                                releases=tuple(members)))
    return CatalogInputs(datasets=tuple(datasets), ledger=ledger, markers=markers,
                         reports=read_reports(reports_root, ledger), excluded=tuple(excluded),
                         missing_files=tuple(missing), testing=testing)


def ledger_exists(path: str) -> bool:
    """Whether anything is at the ledger's path (a folder there is read, and refused, as one)."""
    try:
        return storage.exists(path)
    except OSError as err:
        raise CatalogInputError(f"cannot read {path} ({err.strerror})") from None


def before_first_charge(releases_root: str, ledger_path: str) -> CatalogInputs:
    """What a schedule check reads before its first charge: no ledger yet, so no release.

    A scheduled run's ``--check`` follows its releases; on the first day nothing may have been
    charged yet (the first release is not due, or it was refused before the charge, which leaves
    no ledger behind by design). That is not a fault of the input: every slot is then assessed
    against an empty ledger (pending, or missing when overdue: "late"). It is only so while no
    release exists: a release marker under ``--releases`` without its ledger is the missing
    ledger the release layer refuses ("a missing ledger next to existing releases")."""
    if releases_root.startswith("gs://") or os.path.isdir(releases_root):
        testing_folder = storage.join(releases_root, TESTING_PREFIX).rstrip("/") + "/"
        for path, _ in _walk(releases_root):
            if path.rsplit("/", 1)[-1] == MARKER and not path.startswith(testing_folder):
                raise CatalogInputError(
                    f"ledger {ledger_path} does not exist, yet --releases {releases_root} holds "
                    "release markers: a ledger missing next to its releases is refused (restore "
                    "it; python -m accounting.ledger verify checks it against its witness)")
    elif os.path.exists(releases_root):
        raise CatalogInputError(f"--releases {releases_root} is not a folder")
    return CatalogInputs(datasets=(), ledger=None, markers={}, reports={}, excluded=(),
                         missing_files=())


def check_charge(facts: MarkerFacts, ledger: Ledger) -> None:
    """Refuse a ledger that does not hold a release as it was charged: the marker carries the
    id of the ledger charge it was published under (``ledger_charge``). A ledger of the same id without the
    release is older than it (an older copy put back: its budgets and consumed ids no longer
    count the release); one holding it under another charge charged it again. What the catalog
    cannot check without the key store -- the head's MAC, the witness of the ledger's latest
    write -- ``python -m accounting.ledger verify --key_store`` does."""
    if not facts.ledger_charge or facts.ledger_id != ledger.ledger_id:
        return
    record = ledger.record(facts.versioned_id)
    if record is None:
        raise CatalogInputError(
            f"ledger {ledger.path} does not hold release {facts.versioned_id} ({facts.path}), "
            "which it charged: the ledger is older than its releases (rolled back?). Refusing "
            "to vouch for it")
    charged = (record.charged_under or {}).get("charge")
    if charged is not None and charged != facts.ledger_charge:
        raise CatalogInputError(
            f"ledger {ledger.path} holds release {facts.versioned_id} under another charge than "
            f"the one it was published under ({facts.path}): rolled back and charged again? "
            "Refusing to vouch for it")


def _exclusion(release: PublishedRelease, facts: MarkerFacts, rel_folder: str,
               ledger: Optional[Ledger], testing: bool) -> str:
    """Why a marker is not a release of this catalog ("" if it is)."""
    if testing:
        return "" if release.testing else "not a testing marker"
    if release.testing:
        return "a testing marker outside testing-not-a-release/"
    expected = "/".join([*release.release_id.split("/"), f"v{release.version}"])
    if rel_folder != expected:
        return f"its folder is not {expected}"
    if facts.ledger_id != ledger.ledger_id:
        return "charged by another ledger"
    record = ledger.record(release.versioned_id)
    if record is None:
        return "not in the ledger"
    if record.key_fingerprints != facts.key_fingerprints:
        return "the ledger holds it with other keys"
    return ""


def scope_families(names: Sequence[str]) -> dict:
    """Group scope names that differ only in a final ISO-date segment (``period:C1:2026-11-01``,
    ...): {family name with ``*`` for the date: [names]}; other names are their own family."""
    out: dict = {}
    for name in names:
        head, _, last = name.rpartition(":")
        family = f"{head}:*" if head and _DATE.match(last) else name
        out.setdefault(family, []).append(name)
    return out
