"""Neighbouring-pair audits: run a job on a dataset and on adversarial neighbours of it, with the
same release key, and check what must not differ.

A DP release may let noisy values, and nothing else that depends on the data, differ between
neighbouring datasets. An audit runs a job on a dataset D and on each of a list of adversarial
neighbours D' (one privacy unit added, removed or replaced, built to hit known weak spots), with
the *same* public testing seed, and checks

* **structure**, in every mode: the same outcome (a run that fails on D' only is an observable
  difference), the same table names, file names and file count; per table the same schema; the
  released keys in the declared public order (ascending key columns, or the public keyset's
  order), no key twice, exactly the public keyset when the keys are public, and no key outside
  the declared candidate keys; every released column that is neither a key nor declared noisy
  equal for every key released by both runs; each report equal once its declared noisy fields
  are masked;
* **sensitivity**, in the exact (testing, noise-free) mode: per declared column, the values of
  the keys released by both runs differ by at most ``linf`` each, by at most ``l1`` in total and
  in at most ``l0`` keys; with keys released by one run only (private key selection, release
  thresholds), at most ``changed_keys`` keys differ in presence or value altogether.

* **released/suppressed indicators**, sampled (``indicator_changes``): a release threshold (or
  private key selection) decides from a *noisy* value whether a key, or a value, is released, so
  these decisions may differ between neighbours -- the structural and exact checks allow it --
  but, like any output event, only within the release's (epsilon, delta). For each listed
  neighbour the job runs in the noisy testing mode under many seeds on D and on D', and every
  indicator (the run released; per candidate key, released; per key and thresholded column, the
  value released) is checked with :func:`accounting.verification.dp_tester.indicator_test` against the
  table's ``indicator_claim``. When the change moves several keys at once (a unit in L0 > 1 keys),
  the joint events "every moved key released" and "no moved key released" are indicators too:
  a decision calibrated for one changed key passes each key's own event and carries up to L0
  times its loss on the joint one. A threshold compared against the *exact* value makes an
  indicator deterministic -- released on every seed of D, on none of D' -- which the testing
  mode's exact-equals-noisy runs cannot see; the number of seeds defaults to the least with
  which such an indicator fails for certain (:func:`accounting.verification.dp_tester.indicator_runs_needed`),
  and a sound job fails the indicator checks of one audit with probability at most
  ``1 - confidence`` (union bound over the checks).

``REPLACE_VALUES`` keeps every unit, id and key and replaces one unit's values (relations that
fix the units: one example's label, one report's values). A ``REBATCH`` "neighbour" holds D's rows in other batches and another order: nothing at all may
change (bounding and noise must depend on row content and the key only, never on batching).

The job is any callable ``job(dataset, seed, exact) -> Release``; the harness never runs Beam
itself, so jobs, transforms and whole pipelines (through their CLI and output files) are audited
alike. A job's exact mode runs under a noise-free testing key
(:meth:`accounting.keys.ReleaseKey.for_exact_testing`; for release-layer jobs
``ReleaseOptions(testing_seed=..., exact_testing=True)``), which no real release accepts. Table and
report rules are looked up by name, or by fnmatch pattern (``"*/summary.csv"``: release folders
carry ids). A job that releases no table a rule declares is not audited (an error, never a pass).

Key reuse -- one key driving the same noise on two inputs -- is not a neighbouring-pair property
(the audit itself reuses one public testing key on D and D' on purpose, to see exact
differences); :func:`repeated_noise` checks it from two releases on different inputs and their
exact answers. Neighbours are built from a row model of the privacy unit (:class:`Units`); jobs whose
inputs are not "rows owned by a unit" pass their own ``neighbours`` builder.

Pure Python and numpy (no Beam, no job-specific code). The statistical side, whether the noise
covers the differences the audit bounds, is :mod:`accounting.verification.dp_tester`.
"""
from __future__ import annotations

import enum
import fnmatch
import math
import numbers
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence

import numpy as np

from accounting.composition import EpsDelta

Row = Mapping[str, Any]
Key = tuple

NOISY = "<noisy>"


# --------------------------------------------------------------------------------------------
# What a job released
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Table:
    """One released table: column names, optional type names, rows in released order."""

    columns: tuple
    rows: tuple
    types: Optional[tuple] = None

    def __post_init__(self):
        object.__setattr__(self, "columns", tuple(self.columns))
        object.__setattr__(self, "rows", tuple(tuple(r) for r in self.rows))
        if self.types is not None:
            object.__setattr__(self, "types", tuple(str(t) for t in self.types))
        if any(len(r) != len(self.columns) for r in self.rows):
            raise ValueError("every row needs one value per column")

    @classmethod
    def from_arrow(cls, table) -> "Table":
        """From a pyarrow Table or RecordBatch (duck-typed: no pyarrow import here)."""
        names = list(table.schema.names)
        columns = [table.column(i).to_pylist() for i in range(len(names))]
        return cls(columns=names, rows=list(zip(*columns)) if names else [],
                   types=[str(f.type) for f in table.schema])

    @classmethod
    def from_records(cls, records: Sequence[Row], columns: Sequence[str] = None,
                     types: Sequence[str] = None) -> "Table":
        """From dicts (a CSV file read with csv.DictReader, JSON lines, ...), in their order."""
        records = list(records)
        columns = list(columns) if columns is not None else (list(records[0]) if records else [])
        return cls(columns=columns, rows=[tuple(r.get(c) for c in columns) for r in records],
                   types=types)

    def records(self) -> list[dict]:
        return [dict(zip(self.columns, r)) for r in self.rows]

    def index(self, column: str) -> int:
        try:
            return self.columns.index(column)
        except ValueError:
            raise KeyError(f"released table has no column {column!r} (columns: {list(self.columns)})")


@dataclass(frozen=True, kw_only=True)
class Release:
    """What one run released: named tables, file names (relative to the output), reports (text,
    or JSON-like values)."""

    tables: Mapping[str, Table] = field(default_factory=dict)
    files: tuple = ()
    reports: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self):
        object.__setattr__(self, "files", tuple(self.files))


@dataclass(frozen=True, kw_only=True)
class _Failed:
    """A run that raised: its exception type (the outcome an observer sees)."""

    error: str


# --------------------------------------------------------------------------------------------
# What may differ: the job's declarations
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Bound:
    """Declared sensitivity of one released column, for one neighbouring change: at most ``l0``
    keys change, each by at most ``linf``, by at most ``l1`` in total (default l0 * linf)."""

    l0: int
    linf: float
    l1: Optional[float] = None

    @property
    def total(self) -> float:
        return self.l0 * self.linf if self.l1 is None else self.l1

    @classmethod
    def of(cls, sensitivities) -> "Bound":
        """From anything with ``l0``, ``linf`` and ``l1`` (accounting.sensitivity.Sensitivities)."""
        return cls(l0=int(sensitivities.l0), linf=float(sensitivities.linf), l1=float(sensitivities.l1))


class Order(str, enum.Enum):
    SORTED = "ascending by the key columns"
    PUBLIC = "the public keyset's order"


@dataclass(frozen=True, kw_only=True)
class TableRule:
    """How one released table may differ between neighbouring runs.

    keys: the key columns. noisy: columns holding noisy values (masked by structural checks;
    every other non-key column must not differ). bounds: exact-mode sensitivity per column.
    public_keys: the public keyset (released exactly, unless ``keys_private``). keys_private:
    the released key set is itself a noisy output (private selection, release thresholds).
    candidate_keys: no key outside these may ever be released (defaults to ``public_keys``).
    changed_keys: keys that may differ in presence or bounded value (default: the largest l0).
    order: the public order of released rows. tolerance: absolute slack of numeric comparisons
    (floating-point sums). thresholded: noisy columns a release threshold may null (a suppressed
    value). indicator_claim: the (epsilon, delta) the released/suppressed indicators of this
    table must satisfy (key present when ``keys_private``, each thresholded value not null;
    each is post-processing of the table, so the release's own guarantee is a valid claim),
    sampled for the spec's ``indicator_changes``; indicators are taken over ``candidate_keys``
    (else ``public_keys``, else the keys of the rows of D and D').
    """

    keys: tuple
    noisy: tuple = ()
    bounds: Mapping[str, Bound] = field(default_factory=dict)
    public_keys: Optional[Sequence[Key]] = None
    keys_private: bool = False
    candidate_keys: Optional[Sequence[Key]] = None
    changed_keys: Optional[int] = None
    order: Order = Order.SORTED
    tolerance: float = 1e-9
    thresholded: tuple = ()
    indicator_claim: Optional[EpsDelta] = None

    def __post_init__(self):
        object.__setattr__(self, "keys", _names(self.keys))
        object.__setattr__(self, "noisy", _names(self.noisy))
        object.__setattr__(self, "thresholded", _names(self.thresholded))
        unknown = set(self.thresholded) - set(self.noisy)
        if unknown:
            raise ValueError(f"thresholded columns must be declared noisy: {sorted(unknown)}")
        if self.indicator_claim is not None:   # an EpsDelta, a PrivacyBudget, an (epsilon, delta) pair
            claim = self.indicator_claim
            epsilon, delta = (claim.epsilon, claim.delta) if hasattr(claim, "epsilon") else claim
            object.__setattr__(self, "indicator_claim", EpsDelta(float(epsilon), float(delta)))
        object.__setattr__(self, "order", Order(self.order))
        for attr in ("public_keys", "candidate_keys"):
            keys = getattr(self, attr)
            if keys is not None:
                object.__setattr__(self, attr, tuple(_as_key(k) for k in keys))
        unknown = set(self.bounds) - set(self.noisy)
        if unknown:
            raise ValueError(f"bounded columns must be declared noisy: {sorted(unknown)}")
        if self.order is Order.PUBLIC and self.public_keys is None:
            raise ValueError("order=PUBLIC needs public_keys")

    @property
    def max_changed_keys(self) -> int:
        if self.changed_keys is not None:
            return self.changed_keys
        return max((b.l0 for b in self.bounds.values()), default=0)


@dataclass(frozen=True, kw_only=True)
class ReportRule:
    """How a report may differ: JSON-like fields whose dotted path matches one of
    ``noisy_fields`` (fnmatch patterns, e.g. ``"keys.*.count"``) and text matching one of
    ``noisy_patterns`` (regular expressions) are masked; everything else must be equal."""

    noisy_fields: tuple = ()
    noisy_patterns: tuple = ()

    def mask(self, report):
        patterns = [re.compile(p) for p in self.noisy_patterns]
        return _mask(report, "", tuple(self.noisy_fields), patterns)


def _mask(value, path, fields, patterns):
    if path and any(fnmatch.fnmatchcase(path, f) for f in fields):
        return NOISY
    if isinstance(value, Mapping):
        return {k: _mask(v, f"{path}.{k}" if path else str(k), fields, patterns) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_mask(v, f"{path}.{i}" if path else str(i), fields, patterns) for i, v in enumerate(value)]
    if isinstance(value, str):
        for pattern in patterns:
            value = pattern.sub(NOISY, value)
    return value


# --------------------------------------------------------------------------------------------
# Datasets and neighbours
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class Dataset:
    """Rows (dicts) in batches, in the order a job reads them (files, record batches, bundles);
    ``extra`` is passed through unchanged (other inputs, side data)."""

    batches: tuple
    name: str = "D"
    extra: Any = None

    def __post_init__(self):
        object.__setattr__(self, "batches", tuple(tuple(dict(r) for r in b) for b in self.batches))

    def rows(self) -> list[dict]:
        return [r for b in self.batches for r in b]


class Change(str, enum.Enum):
    """Adversarial neighbouring changes (the value says what the neighbour is)."""

    ADD_EMPTY_KEY = "add a unit with heavy rows in public keys without rows"
    ADD_ALONE = "add a unit alone in keys of its own (outside the data and the keyset)"
    ADD_HEAVY = "add a unit beyond every bound in the busiest keys"
    ADD_MIXED_IDS = "add a unit whose id has mixed types (7, 7.0, '7') across batches"
    ADD_SPREAD = "add a unit whose rows are spread across every batch"
    REMOVE_HEAVY = "remove the unit with the most rows"
    REMOVE_LONE = "remove a unit alone in a key"
    SUBSTITUTE_EMPTY_KEY = "replace the heaviest unit by a heavy unit in keys without rows"
    SUBSTITUTE_ALONE = "replace a lone unit by a unit alone in keys of its own"
    SUBSTITUTE_MIXED_IDS = "replace the heaviest unit by one with mixed id types across batches"
    SUBSTITUTE_SPREAD = "replace a lone unit by a heavy unit spread across every batch"
    REPLACE_VALUES = ("keep every unit, id and key; replace the heaviest unit's values by other "
                      "choices of Units.values (relations that fix the units: one example's "
                      "label, one report's values)")
    REBATCH = "the same rows in other batches and another order (nothing may change)"


ADD_REMOVE_CHANGES = (Change.ADD_EMPTY_KEY, Change.ADD_ALONE, Change.ADD_HEAVY,
                      Change.ADD_MIXED_IDS, Change.ADD_SPREAD, Change.REMOVE_HEAVY,
                      Change.REMOVE_LONE, Change.REBATCH)
SUBSTITUTE_CHANGES = (Change.SUBSTITUTE_EMPTY_KEY, Change.SUBSTITUTE_ALONE,
                      Change.SUBSTITUTE_MIXED_IDS, Change.SUBSTITUTE_SPREAD, Change.REBATCH)


def default_id_variants(unit_id) -> list:
    """The same unit under other id types: 7 -> [7, 7.0, "7"]; "a7" -> ["a7", " A7", "a7 "]."""
    if isinstance(unit_id, numbers.Integral) and not isinstance(unit_id, bool):
        return [int(unit_id), float(unit_id), str(int(unit_id))]
    text = str(unit_id)
    return [text, f" {text.upper()}", f"{text} "]


def _id_text(value) -> Optional[str]:
    """A loose canonical id (only to find a unit's rows in a generated dataset)."""
    if value is None:
        return None
    if isinstance(value, numbers.Real) and not isinstance(value, bool):
        if isinstance(value, float) and (math.isnan(value) or not value.is_integer()):
            return repr(value)
        return str(int(value))
    return str(value).strip().lower()


@dataclass(frozen=True, kw_only=True)
class Units:
    """The row model of a privacy unit, to build neighbours.

    column: the privacy-unit column; keys: the key columns of a row. public_keys: the public
    keyset (empty ones are found in each dataset); fresh_keys: keys in no dataset and no keyset
    (a unit alone in a key of its own; dropped in keyset mode, candidates for private selection).
    values: per value column, the values a new unit's rows cycle through (put extremes beyond
    the clamping range here). heavy_keys / heavy_rows: keys of a new heavy unit and rows per key
    (make them exceed L0 and Linf). row: optional ``row(base_row) -> row`` completing a new row
    (job-specific columns). id_variants: the same id under other types.
    """

    column: str
    keys: tuple
    public_keys: Sequence[Key] = ()
    fresh_keys: Sequence[Key] = ()
    values: Mapping[str, Sequence] = field(default_factory=dict)
    heavy_keys: int = 3
    heavy_rows: int = 4
    row: Optional[Callable[[dict], dict]] = None
    id_variants: Callable[[Any], list] = default_id_variants

    def __post_init__(self):
        object.__setattr__(self, "keys", _names(self.keys))
        object.__setattr__(self, "public_keys", tuple(_as_key(k) for k in self.public_keys))
        object.__setattr__(self, "fresh_keys", tuple(_as_key(k) for k in self.fresh_keys))

    def key_of(self, row: Row) -> Key:
        return tuple(row.get(k) for k in self.keys)

    def new_rows(self, unit_id, keys: Sequence[Key], rows_per_key: int) -> list[dict]:
        """A new unit's rows: ``rows_per_key`` rows in each key, values cycling."""
        out = []
        for key in keys:
            for i in range(rows_per_key):
                row = {self.column: unit_id, **dict(zip(self.keys, key))}
                for column, choices in self.values.items():
                    row[column] = choices[(len(out) + i) % len(choices)]
                out.append(self.row(row) if self.row else row)
        return out


@dataclass(frozen=True, kw_only=True)
class Neighbour:
    change: Change
    dataset: Dataset
    note: str = ""


def _without_unit(dataset: Dataset, units: Units, unit_text: str) -> list[list[dict]]:
    return [[r for r in b if _id_text(r.get(units.column)) != unit_text] for b in dataset.batches]


def _unit_stats(dataset: Dataset, units: Units):
    rows_of, keys_of, units_in = {}, {}, {}
    for r in dataset.rows():
        unit = _id_text(r.get(units.column))
        if unit is None:
            continue
        key = units.key_of(r)
        rows_of[unit] = rows_of.get(unit, 0) + 1
        keys_of.setdefault(unit, set()).add(key)
        units_in.setdefault(key, set()).add(unit)
    return rows_of, keys_of, units_in


def _new_unit_id(dataset: Dataset, units: Units):
    ids = [r.get(units.column) for r in dataset.rows()]
    ints = [int(i) for i in ids if isinstance(i, numbers.Integral) and not isinstance(i, bool)]
    if ints or not ids:
        return max(ints, default=0) + 1000
    return f"audit-new-unit-{len(ids)}"


def _replaced_values(row: dict, units: Units) -> dict:
    """``row`` with each of ``units.values``' columns set to another choice: the farthest number
    from the current value, or the first other choice."""
    out = dict(row)
    for column, choices in units.values.items():
        current = row.get(column)
        others = [c for c in choices if not _same(c, current) and c != current]
        if not others:
            continue
        numeric = isinstance(current, numbers.Real) and not isinstance(current, bool) and \
            all(isinstance(c, numbers.Real) for c in others)
        out[column] = max(others, key=lambda c: abs(float(c) - float(current))) if numeric else others[0]
    return out


def _spread(batches: list[list[dict]], rows: list[dict]) -> list[list[dict]]:
    """Insert ``rows`` one per batch (round robin), each in the middle of its batch."""
    batches = [list(b) for b in batches] or [[]]
    for i, row in enumerate(rows):
        batch = batches[i % len(batches)]
        batch.insert(len(batch) // 2, row)
    return batches


def build_neighbours(dataset: Dataset, units: Units, changes: Sequence[Change],
                     seed: int = 0) -> list[Neighbour]:
    """The requested adversarial neighbours of ``dataset`` that it admits (a change needing, say,
    an empty public key is skipped for a dataset without one)."""
    rng = np.random.default_rng(seed)
    rows_of, keys_of, units_in = _unit_stats(dataset, units)
    busiest = sorted(units_in, key=lambda k: (-sum(rows_of[u] for u in units_in[k]), _order_key(k)))
    empty = [k for k in units.public_keys if k not in units_in]
    heaviest = max(sorted(rows_of), key=lambda u: rows_of[u]) if rows_of else None
    lone_keys = [k for k in sorted(units_in, key=_order_key) if len(units_in[k]) == 1]
    lone = next(iter(units_in[lone_keys[0]])) if lone_keys else None
    new_id = _new_unit_id(dataset, units)
    h_keys, h_rows = units.heavy_keys, units.heavy_rows
    batches = [list(b) for b in dataset.batches]

    def added(rows, base=batches):
        return [*map(list, base), rows]

    def mixed(base):
        variants = units.id_variants(new_id)
        return [*map(list, base), *[units.new_rows(v, busiest[:h_keys], h_rows) for v in variants]]

    out = []
    for change in changes:
        change = Change(change)
        new = None
        if change is Change.ADD_EMPTY_KEY and empty:
            new = added(units.new_rows(new_id, empty[:h_keys], h_rows))
        elif change is Change.ADD_ALONE and units.fresh_keys:
            new = added(units.new_rows(new_id, units.fresh_keys[:h_keys], h_rows))
        elif change is Change.ADD_HEAVY and busiest:
            new = added(units.new_rows(new_id, busiest[:h_keys + 1], h_rows + 1))
        elif change is Change.ADD_MIXED_IDS and busiest:
            new = mixed(batches)
        elif change is Change.ADD_SPREAD and busiest:
            new = _spread(batches, units.new_rows(new_id, busiest[:h_keys], h_rows))
        elif change is Change.REMOVE_HEAVY and heaviest is not None:
            new = _without_unit(dataset, units, heaviest)
        elif change is Change.REMOVE_LONE and lone is not None:
            new = _without_unit(dataset, units, lone)
        elif change is Change.SUBSTITUTE_EMPTY_KEY and heaviest is not None and empty:
            new = added(units.new_rows(new_id, empty[:h_keys], h_rows),
                        _without_unit(dataset, units, heaviest))
        elif change is Change.SUBSTITUTE_ALONE and lone is not None and units.fresh_keys:
            new = added(units.new_rows(new_id, units.fresh_keys[:h_keys], h_rows),
                        _without_unit(dataset, units, lone))
        elif change is Change.SUBSTITUTE_MIXED_IDS and heaviest is not None and busiest:
            new = mixed(_without_unit(dataset, units, heaviest))
        elif change is Change.SUBSTITUTE_SPREAD and lone is not None and busiest:
            new = _spread(_without_unit(dataset, units, lone), units.new_rows(new_id, busiest[:h_keys], h_rows))
        elif change is Change.REPLACE_VALUES and heaviest is not None and units.values:
            new = [[_replaced_values(r, units) if _id_text(r.get(units.column)) == heaviest else r
                    for r in b] for b in batches]
        elif change is Change.REBATCH and dataset.rows():
            rows = dataset.rows()
            order = rng.permutation(len(rows))
            cuts = np.sort(rng.choice(np.arange(1, len(rows)), size=min(len(dataset.batches), len(rows) - 1),
                                      replace=False)) if len(rows) > 1 else []
            new = [[rows[i] for i in part] for part in np.split(order, cuts)]
        if new is not None:
            out.append(Neighbour(change=change, dataset=Dataset(batches=[b for b in new if b],
                                                                name=f"{dataset.name}'", extra=dataset.extra)))
    return out


def synthetic_dataset(units: Units, *, seed: int, n_units: int = 10, batches: int = 3,
                      keys: Sequence[Key] = None, empty_keys: int = 1, max_keys: int = None,
                      max_rows: int = None) -> Dataset:
    """A small random dataset with what audits need: units beyond the bounds (many keys, many
    rows per key, values from ``units.values``), keys with a single unit, public keys without
    rows (the last ``empty_keys`` of ``keys``), and each unit's rows spread over the batches."""
    rng = np.random.default_rng(seed)
    keys = [_as_key(k) for k in (keys if keys is not None else units.public_keys)]
    used = keys[:len(keys) - empty_keys] if empty_keys else keys
    if not used:
        raise ValueError("synthetic_dataset needs at least one key with rows")
    max_keys = max_keys or units.heavy_keys + 1
    max_rows = max_rows or units.heavy_rows + 1
    rows = []
    for unit in range(1, n_units + 1):
        if unit == n_units:   # the last unit is alone in a key of its own (the last used key)
            chosen = [used[-1]]
        else:
            pool = used[:-1] or used
            chosen = [pool[i] for i in rng.choice(len(pool), size=min(int(rng.integers(1, max_keys + 1)), len(pool)),
                                                  replace=False)]
        for key in chosen:
            for row in units.new_rows(unit, [key], int(rng.integers(1, max_rows + 1))):
                for column, choices in units.values.items():
                    row[column] = choices[int(rng.integers(len(choices)))]
                rows.append(row)
    order = rng.permutation(len(rows))
    parts = np.array_split(order, batches)
    return Dataset(batches=[[rows[i] for i in p] for p in parts if len(p)], name=f"synthetic(seed={seed})")


# --------------------------------------------------------------------------------------------
# The audit
# --------------------------------------------------------------------------------------------

Job = Callable[[Dataset, int, bool], Release]


@dataclass(frozen=True, kw_only=True)
class AuditSpec:
    """A job and what it declares.

    job(dataset, seed, exact): one run with the public testing key of ``seed``; ``exact`` is
    the testing (noise-free) mode. units: the row model for neighbours (or give
    ``neighbours(dataset, changes, seed) -> [Neighbour]``). tables / reports: the rules per
    released table and report (a released table or report without a rule is a violation).
    relation: "add_remove" or "substitute" (picks the default changes). modes: which of
    "exact", "noisy" and "indicators" to run. indicator_changes: the neighbours whose
    released/suppressed indicators are sampled (the tables' ``indicator_claim``);
    indicator_runs: seeds per side (default: :func:`accounting.verification.dp_tester.indicator_runs_needed`);
    confidence: a job meeting its claims passes all indicator checks of the audit with at least
    this probability.
    """

    job: Job
    tables: Mapping[str, TableRule]
    units: Optional[Units] = None
    neighbours: Optional[Callable[[Dataset, Sequence[Change], int], list]] = None
    reports: Mapping[str, ReportRule] = field(default_factory=dict)
    relation: str = "add_remove"
    modes: tuple = ("exact", "noisy", "indicators")
    changes: Optional[tuple] = None
    indicator_changes: tuple = ()
    indicator_runs: Optional[int] = None
    confidence: float = 0.999

    def __post_init__(self):
        if self.relation not in ("add_remove", "substitute"):
            raise ValueError(f"relation must be 'add_remove' or 'substitute', got {self.relation!r}")
        if (self.units is None) == (self.neighbours is None):
            raise ValueError("give exactly one of units (row model) and neighbours (builder)")
        if not self.modes or set(self.modes) - {"exact", "noisy", "indicators"}:
            raise ValueError(f"modes must be a non-empty subset of ('exact', 'noisy', 'indicators'), "
                             f"got {self.modes}")
        object.__setattr__(self, "indicator_changes", tuple(Change(c) for c in self.indicator_changes))
        if self.indicator_changes and not any(r.indicator_claim for r in self.tables.values()):
            raise ValueError("indicator_changes need a TableRule with an indicator_claim")
        if self.indicator_runs is not None and self.indicator_runs < 1:
            raise ValueError(f"indicator_runs must be positive, got {self.indicator_runs}")
        if not 0 < self.confidence < 1:
            raise ValueError(f"confidence must be in (0, 1), got {self.confidence}")

    def table_rule(self, name: str) -> Optional[TableRule]:
        """The rule of released table ``name``: the rule of that exact name, or of the first
        fnmatch pattern matching it (release folders carry ids: ``"*/summary.csv"``)."""
        return _rule(self.tables, name)

    def report_rule(self, name: str) -> Optional[ReportRule]:
        return _rule(self.reports, name)

    @property
    def default_changes(self) -> tuple:
        if self.changes is not None:
            return tuple(Change(c) for c in self.changes)
        return ADD_REMOVE_CHANGES if self.relation == "add_remove" else SUBSTITUTE_CHANGES


@dataclass(frozen=True, kw_only=True)
class Violation:
    dataset: str
    change: Change
    mode: str
    check: str
    detail: str

    def __str__(self):
        return f"[{self.mode}] {self.dataset} / {self.change.name}: {self.check}: {self.detail}"


class AuditFailure(AssertionError):
    """Neighbouring runs differ in something that must not differ."""


@dataclass(frozen=True, kw_only=True)
class AuditResult:
    violations: tuple
    runs: int
    pairs: tuple    # (dataset name, change) audited

    @property
    def passed(self) -> bool:
        return not self.violations

    def checks_failed(self) -> set:
        return {v.check for v in self.violations}

    def __str__(self):
        head = (f"neighbouring-pair audit: {'PASSED' if self.passed else 'FAILED'} "
                f"({len(self.pairs)} pairs, {self.runs} runs, {len(self.violations)} violations)")
        return "\n".join([head, *(f"  {v}" for v in self.violations[:40])] +
                         ([f"  ... {len(self.violations) - 40} more"] if len(self.violations) > 40 else []))

    def assert_ok(self) -> "AuditResult":
        if not self.passed:
            raise AuditFailure(str(self))
        return self


def audit(spec: AuditSpec, datasets: Iterable[Dataset], *, changes: Sequence[Change] = None,
          seed: int = 1) -> AuditResult:
    """Run ``spec.job`` on each dataset and each of its neighbours (same seed) and check them."""
    changes = tuple(Change(c) for c in changes) if changes is not None else spec.default_changes
    datasets = list(datasets)
    violations, pairs, runs = [], [], 0
    compared = [m for m in spec.modes if m in ("exact", "noisy")]
    for dataset in datasets if compared else ():
        neighbours = _neighbours(spec, dataset, changes, seed)
        for mode in compared:
            exact = mode == "exact"
            base = _run(spec.job, dataset, seed, exact)
            runs += 1
            if isinstance(base, _Failed):
                raise RuntimeError(f"the job failed on {dataset.name} itself ({base.error}): nothing to audit")
            missing = [p for p in spec.tables if not any(_rule({p: 0}, t) is not None for t in base.tables)]
            if missing:
                raise RuntimeError(f"the job released no table matching {missing} on {dataset.name}: "
                                   f"nothing to audit (released: {sorted(base.tables)})")
            for neighbour in neighbours:
                other = _run(spec.job, neighbour.dataset, seed, exact)
                runs += 1
                found = compare(spec, base, other, exact=exact,
                                unchanged=neighbour.change is Change.REBATCH)
                violations.extend(Violation(dataset=dataset.name, change=neighbour.change, mode=mode,
                                            check=check, detail=detail) for check, detail in found)
        pairs.extend((dataset.name, n.change) for n in neighbours)
    if "indicators" in spec.modes and spec.indicator_changes:
        found, indicator_runs, checked = _indicator_audit(spec, datasets, seed)
        violations.extend(found)
        runs += indicator_runs
        pairs.extend(checked)
    return AuditResult(violations=tuple(violations), runs=runs, pairs=tuple(pairs))


def _neighbours(spec: AuditSpec, dataset: Dataset, changes, seed) -> list:
    if spec.neighbours is not None:
        return list(spec.neighbours(dataset, changes, seed))
    return build_neighbours(dataset, spec.units, changes, seed=seed)


# --------------------------------------------------------------------------------------------
# Released/suppressed indicators, sampled
# --------------------------------------------------------------------------------------------

def _suppressed(value) -> bool:
    """A released cell that holds no value: null, NaN, or empty CSV text."""
    return value is None or value == "" or (isinstance(value, float) and math.isnan(value))


def _candidates(rule: TableRule, spec: AuditSpec, pair: Sequence[Dataset]) -> list:
    keys = rule.candidate_keys if rule.candidate_keys is not None else rule.public_keys
    if keys is not None:
        return list(keys)
    if spec.units is None:
        raise ValueError("a table without candidate_keys or public_keys needs the spec's units to "
                         "list its candidate keys for the indicator check")
    found = {spec.units.key_of(r) for d in pair for r in d.rows()}
    return sorted(found, key=_order_key)


def _moved_keys(spec: AuditSpec, dataset: Dataset, neighbour: Dataset, candidates: list) -> list:
    """The candidate keys whose set of units differs between D and D' (the keys one change
    moves at once: up to L0 of them when a unit is added or removed). Keys are matched by their
    text (a released date and the input's ISO date text are one key)."""
    if spec.units is None:
        return []
    before, after = _unit_stats(dataset, spec.units)[2], _unit_stats(neighbour, spec.units)[2]
    text = lambda key: tuple(str(v) for v in key)  # noqa: E731
    moved = {text(k) for k in set(before) | set(after) if before.get(k, set()) != after.get(k, set())}
    return [k for k in candidates if text(k) in moved]


def _indicator_names(rule: TableRule, candidates: list, moved: Sequence = ()) -> list[str]:
    names = ["run released"]
    for key in candidates:
        label = ",".join(map(str, key))
        if rule.keys_private:
            names.append(f"released[{label}]")
        names.extend(f"{column}[{label}] released" for column in rule.thresholded)
    if len(moved) > 1:   # joint events of the moved keys (module docstring)
        if rule.keys_private:
            names += ["released[every moved key]", "released[no moved key]"]
        for column in rule.thresholded:
            names += [f"{column}[every moved key] released", f"{column}[no moved key] released"]
    return names


def _indicators(release, table_name: str, rule: TableRule, candidates: list,
                moved: Sequence = ()) -> tuple[list, list]:
    """One run's indicators of one table (as :func:`_indicator_names` lists them), and the
    released keys outside the candidates."""
    width = len(rule.thresholded) + (1 if rule.keys_private else 0)
    joint = 2 * width if len(moved) > 1 else 0
    if isinstance(release, _Failed) or table_name not in release.tables:
        return [0 if isinstance(release, _Failed) else 1] + [0] * (width * len(candidates) + joint), []
    table = release.tables[table_name]
    key_index = [table.index(k) for k in rule.keys]
    rows = {tuple(r[i] for i in key_index): r for r in table.rows}
    value_index = [table.index(c) for c in rule.thresholded]
    out = [1]
    for key in candidates:
        row = rows.get(key)
        if rule.keys_private:
            out.append(int(row is not None))
        out.extend(int(row is not None and not _suppressed(row[i])) for i in value_index)
    if joint:
        present = [rows.get(key) is not None for key in moved]
        if rule.keys_private:
            out += [int(all(present)), int(not any(present))]
        for i in value_index:
            shown = [rows.get(key) is not None and not _suppressed(rows[key][i]) for key in moved]
            out += [int(all(shown)), int(not any(shown))]
    return out, sorted(set(rows) - set(candidates), key=_order_key)


def _indicator_audit(spec: AuditSpec, datasets: Sequence[Dataset], seed: int):
    """(violations, runs, pairs) of the sampled indicator check (module docstring)."""
    from accounting.verification.dp_tester import indicator_runs_needed, indicator_test

    tests = [(d, n) for d in datasets for n in _neighbours(spec, d, spec.indicator_changes, seed)]
    claimed = {pattern: rule for pattern, rule in spec.tables.items() if rule.indicator_claim}
    if not tests:
        raise RuntimeError(f"no dataset admits the indicator changes "
                           f"{[c.name for c in spec.indicator_changes]}: nothing to sample")
    # Each (pair, claimed rule) gets an equal share of the audit's false-failure budget.
    share = (1.0 - spec.confidence) / (len(tests) * len(claimed))
    violations, runs, pairs = [], 0, []
    for dataset, neighbour in tests:
        candidates = {p: _candidates(r, spec, (dataset, neighbour.dataset)) for p, r in claimed.items()}
        moved = {p: _moved_keys(spec, dataset, neighbour.dataset, c) for p, c in candidates.items()}
        n = spec.indicator_runs or max(
            indicator_runs_needed(epsilon=r.indicator_claim.epsilon, delta=r.indicator_claim.delta,
                                  indicators=len(_indicator_names(r, candidates[p], moved[p])),
                                  confidence=1.0 - share)
            for p, r in claimed.items())
        sides = [[_run(spec.job, d, seed + i, False) for i in range(n)]
                 for d in (dataset, neighbour.dataset)]
        runs += 2 * n
        pairs.append((dataset.name, neighbour.change))
        for pattern, rule in claimed.items():
            names = sorted({t for side in sides for r in side if not isinstance(r, _Failed)
                            for t in r.tables if _rule({pattern: 0}, t) is not None})
            if not names:
                violations.append(Violation(dataset=dataset.name, change=neighbour.change,
                                            mode="indicators", check="released indicator",
                                            detail=f"no run released a table matching {pattern!r}"))
                continue
            labels = _indicator_names(rule, candidates[pattern], moved[pattern])
            for name in names:
                matrices, outside = [], set()
                for side in sides:
                    rows = []
                    for release in side:
                        row, extra = _indicators(release, name, rule, candidates[pattern],
                                                 moved[pattern])
                        rows.append(row)
                        outside.update(extra)
                    matrices.append(np.asarray(rows, dtype=np.int64))
                if outside:
                    violations.append(Violation(
                        dataset=dataset.name, change=neighbour.change, mode="indicators",
                        check="indicator keys", detail=f"{name}: released keys outside the "
                                                       f"candidates: {_few(outside)}"))
                claim = rule.indicator_claim
                result = indicator_test(*matrices, names=labels, epsilon=claim.epsilon,
                                        delta=claim.delta, confidence=1.0 - share / len(names))
                if not result.passed:
                    violations.append(Violation(
                        dataset=dataset.name, change=neighbour.change, mode="indicators",
                        check="released indicator",
                        detail=f"{name}: {result.worst} -- beyond the claimed ({claim.epsilon:g}, "
                               f"{claim.delta:g}) over {n} seeds per side"))
    return violations, runs, pairs


def assert_audit(spec: AuditSpec, datasets: Iterable[Dataset], **kwargs) -> AuditResult:
    return audit(spec, datasets, **kwargs).assert_ok()


def _run(job, dataset, seed, exact):
    try:
        release = job(dataset, seed, exact)
    except Exception as error:  # an observable outcome, compared like any output
        return _Failed(error=type(error).__name__ + (f": {error}"[:300] if str(error) else ""))
    if not isinstance(release, Release):
        raise TypeError(f"the job must return an audit.Release, got {type(release).__name__}")
    return release


# --------------------------------------------------------------------------------------------
# Comparing two runs
# --------------------------------------------------------------------------------------------

def compare(spec: AuditSpec, a, b, *, exact: bool, unchanged: bool = False) -> list[tuple[str, str]]:
    """(check, detail) for everything that differs between runs ``a`` (on D) and ``b`` (on D')
    beyond what ``spec`` allows; ``unchanged`` demands identical releases."""
    if isinstance(a, _Failed) or isinstance(b, _Failed):
        if isinstance(a, _Failed) and isinstance(b, _Failed) and a.error.split(":")[0] == b.error.split(":")[0]:
            return []
        return [("outcome", f"D: {_outcome(a)}; D': {_outcome(b)}")]
    found = []
    for release in (a, b):
        unknown = sorted(t for t in release.tables if spec.table_rule(t) is None)
        if unknown:
            found.append(("undeclared table", f"{unknown} have no TableRule"))
        unknown = sorted(r for r in release.reports if spec.report_rule(r) is None)
        if unknown:
            found.append(("undeclared report", f"{unknown} have no ReportRule"))
    if sorted(a.tables) != sorted(b.tables):
        found.append(("table names", f"D: {sorted(a.tables)}; D': {sorted(b.tables)}"))
    if sorted(a.files) != sorted(b.files):
        only_a, only_b = sorted(set(a.files) - set(b.files)), sorted(set(b.files) - set(a.files))
        found.append(("files", f"{len(a.files)} vs {len(b.files)} files; only in D: {only_a[:5]}; "
                               f"only in D': {only_b[:5]}"))
    for name in sorted(set(a.tables) & set(b.tables)):
        rule = spec.table_rule(name)
        if rule is not None:
            found.extend(_compare_tables(name, rule, a.tables[name], b.tables[name],
                                         exact=exact, unchanged=unchanged))
    for name in sorted(set(a.reports) | set(b.reports)):
        rule = spec.report_rule(name)
        if rule is None:
            continue
        if name not in a.reports or name not in b.reports:
            found.append(("report names", f"report {name!r} released by one run only"))
            continue
        masked_a, masked_b = rule.mask(a.reports[name]), rule.mask(b.reports[name])
        if masked_a != masked_b:
            found.append(("report text", f"{name}: {_first_difference(masked_a, masked_b)}"))
    return found


def _rule(rules: Mapping, name: str):
    if name in rules:
        return rules[name]
    return next((rule for pattern, rule in rules.items() if fnmatch.fnmatchcase(name, pattern)), None)


def _outcome(run):
    return f"failed ({run.error})" if isinstance(run, _Failed) else "released"


def _compare_tables(name, rule: TableRule, a: Table, b: Table, *, exact, unchanged):
    found = []
    if a.columns != b.columns:
        return [("schema", f"{name}: columns {list(a.columns)} vs {list(b.columns)}")]
    if a.types is not None and b.types is not None and a.types != b.types:
        diff = [f"{c}: {x} vs {y}" for c, x, y in zip(a.columns, a.types, b.types) if x != y]
        found.append(("schema", f"{name}: types differ ({'; '.join(diff)})"))
    missing = [c for c in (*rule.keys, *rule.noisy) if c not in a.columns]
    if missing:
        return found + [("schema", f"{name}: declared columns {missing} not released")]
    keyed = []
    for label, table in (("D", a), ("D'", b)):
        keys = [tuple(r[table.index(k)] for k in rule.keys) for r in table.rows]
        keyed.append(keys)
        found.extend(_check_keys(name, label, rule, keys))
    if unchanged:
        if a.rows != b.rows:
            found.append(("unchanged", f"{name}: the same rows in other batches changed the release: "
                                       f"{_row_difference(a, b, keyed)}"))
        return found
    rows_a = dict(zip(keyed[0], a.rows))
    rows_b = dict(zip(keyed[1], b.rows))
    only = set(rows_a) ^ set(rows_b)
    if only and not rule.keys_private:
        found.append(("key set", f"{name}: released keys differ: {_few(only)} released by one run only"))
    common = [k for k in keyed[0] if k in rows_b]
    fixed = [c for c in a.columns if c not in rule.keys and c not in rule.noisy]
    for column in fixed:
        i = a.index(column)
        differing = [k for k in common if not _same(rows_a[k][i], rows_b[k][i])]
        if differing:
            k = differing[0]
            found.append(("non-noisy column", f"{name}.{column} differs in {len(differing)} keys, e.g. "
                                              f"{k}: {rows_a[k][i]!r} vs {rows_b[k][i]!r}"))
    if exact:
        changed = set(only)
        for column, bound in rule.bounds.items():
            i = a.index(column)
            deltas = {}
            for k in common:
                x, y = rows_a[k][i], rows_b[k][i]
                if x is None or y is None:
                    if (x is None) != (y is None):
                        changed.add(k)
                    continue
                d = abs(float(y) - float(x))
                if d > rule.tolerance:
                    deltas[k] = d
            changed.update(deltas)
            if len(deltas) > bound.l0:
                found.append(("sensitivity l0", f"{name}.{column} changed in {len(deltas)} keys "
                                                f"(declared l0 = {bound.l0}): {_few(deltas)}"))
            worst = max(deltas.items(), key=lambda kv: kv[1], default=(None, 0.0))
            if worst[1] > bound.linf + rule.tolerance:
                found.append(("sensitivity linf", f"{name}.{column} changed by {worst[1]:g} in key "
                                                  f"{worst[0]} (declared linf = {bound.linf:g})"))
            total = sum(deltas.values())
            if total > bound.total + rule.tolerance * max(len(deltas), 1):
                found.append(("sensitivity l1", f"{name}.{column} changed by {total:g} in total "
                                                f"(declared l1 = {bound.total:g})"))
        if len(changed) > rule.max_changed_keys:
            found.append(("changed keys", f"{name}: {len(changed)} keys differ in presence or value "
                                          f"(declared {rule.max_changed_keys}): {_few(changed)}"))
    return found


def _check_keys(name, label, rule: TableRule, keys):
    found = []
    if len(set(keys)) != len(keys):
        found.append(("duplicate keys", f"{name} ({label}) releases a key more than once"))
    if rule.order is Order.SORTED:
        expected = sorted(keys, key=_order_key)
    else:
        position = {k: i for i, k in enumerate(rule.public_keys)}
        expected = sorted(keys, key=lambda k: position.get(k, len(position)))
    if keys != expected:
        first = next(i for i, (x, y) in enumerate(zip(keys, expected)) if x != y)
        found.append(("order", f"{name} ({label}): row {first} is key {keys[first]}, the public order "
                               f"({rule.order.value}) puts {expected[first]} there"))
    candidates = rule.candidate_keys if rule.candidate_keys is not None else rule.public_keys
    if candidates is not None:
        outside = set(keys) - set(candidates)
        if outside:
            found.append(("key outside the keyset", f"{name} ({label}): {_few(outside)}"))
        if rule.public_keys is not None and not rule.keys_private:
            absent = set(rule.public_keys) - set(keys)
            if absent:
                found.append(("key set", f"{name} ({label}): public keys not released: {_few(absent)}"))
    return found


# --------------------------------------------------------------------------------------------
# Key reuse: the same noise on other input
# --------------------------------------------------------------------------------------------

def repeated_noise(noisy_a: Table, noisy_b: Table, exact_a: Table, exact_b: Table, *,
                   keys: Sequence[str], columns: Sequence[str], tolerance: float = 1e-9) -> list[str]:
    """Where two releases on *different* inputs carry the same noise (one key applied twice).

    ``noisy_x`` and ``exact_x`` are the noisy and exact (noise-free) outputs of input x. For each
    column, the noise ``noisy - exact`` of the keys both released is compared: identical, non-zero
    noise on inputs whose exact answers differ means the difference of the two releases is the
    exact difference -- the noise cancels. Returns one finding per such column (empty: fresh noise).
    """
    keys = _names(keys)
    found = []

    def by_key(table):
        index = [table.index(k) for k in keys]
        return {tuple(r[i] for i in index): r for r in table.rows}

    na, nb, ea, eb = by_key(noisy_a), by_key(noisy_b), by_key(exact_a), by_key(exact_b)
    common = sorted(set(na) & set(nb) & set(ea) & set(eb), key=_order_key)
    for column in _names(columns):
        i = [t.index(column) for t in (noisy_a, noisy_b, exact_a, exact_b)]
        noise_a = np.array([float(na[k][i[0]]) - float(ea[k][i[2]]) for k in common])
        noise_b = np.array([float(nb[k][i[1]]) - float(eb[k][i[3]]) for k in common])
        inputs_differ = any(not _same(ea[k][i[2]], eb[k][i[3]]) for k in common)
        if (common and inputs_differ and np.any(np.abs(noise_a) > tolerance)
                and np.allclose(noise_a, noise_b, rtol=0, atol=tolerance)):
            found.append(f"{column}: the same noise in all {len(common)} common keys although the "
                         f"exact answers differ: the difference of the releases is noise-free")
    return found


# --------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------

def _names(value) -> tuple:
    return (value,) if isinstance(value, str) else tuple(value)


def _as_key(key) -> Key:
    return tuple(key) if isinstance(key, (tuple, list)) else (key,)


def _order_key(key):
    """A total order over key tuples of mixed component types (numbers < text < others < None)."""
    out = []
    for v in (key if isinstance(key, tuple) else (key,)):
        if v is None:
            out.append((9, 0))
        elif isinstance(v, numbers.Real) and not isinstance(v, bool):
            out.append((0, float(v)))
        elif isinstance(v, str):
            out.append((1, v))
        elif isinstance(v, bytes):
            out.append((2, v))
        else:
            out.append((5, str(type(v)), v))
    return tuple(out)


def _same(x, y) -> bool:
    if isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y):
        return True
    return x == y


def _few(keys, n=4) -> str:
    keys = sorted(keys, key=_order_key)
    return ", ".join(map(str, keys[:n])) + (f" (+{len(keys) - n})" if len(keys) > n else "")


def _row_difference(a: Table, b: Table, keyed) -> str:
    if keyed[0] != keyed[1]:
        return f"key sequence {_few(keyed[0], 6)} vs {_few(keyed[1], 6)}"
    for k, x, y in zip(keyed[0], a.rows, b.rows):
        if x != y:
            return f"key {k}: {dict(zip(a.columns, x))} vs {dict(zip(b.columns, y))}"
    return "?"


def _first_difference(x, y, path="") -> str:
    if isinstance(x, dict) and isinstance(y, dict):
        for k in sorted(set(x) | set(y), key=str):
            if k not in x or k not in y:
                return f"{path}{k}: present in one run only"
            if x[k] != y[k]:
                return _first_difference(x[k], y[k], f"{path}{k}.")
    if isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
        for i, (u, v) in enumerate(zip(x, y)):
            if u != v:
                return _first_difference(u, v, f"{path}{i}.")
    if isinstance(x, str) and isinstance(y, str):
        i = next((i for i, (c, d) in enumerate(zip(x, y)) if c != d), min(len(x), len(y)))
        return f"{path or 'text'} differs at character {i}: {x[max(0, i - 30):i + 30]!r} vs {y[max(0, i - 30):i + 30]!r}"
    return f"{path.rstrip('.') or 'value'}: {x!r} vs {y!r}"


__all__ = ["AuditFailure", "AuditResult", "AuditSpec", "Bound", "Change", "Dataset", "Neighbour",
           "Order", "Release", "ReportRule", "Table", "TableRule", "Units", "Violation",
           "ADD_REMOVE_CHANGES", "SUBSTITUTE_CHANGES", "assert_audit", "audit", "build_neighbours",
           "compare", "default_id_variants", "repeated_noise", "synthetic_dataset",
           "BatchSequence", "Refused", "SequencePair", "audit_sequences", "sequence_pairs"]


# --------------------------------------------------------------------------------------------
# Two-batch sequences (issue 30): what a second batch may add
# --------------------------------------------------------------------------------------------
#
# A unit's reports released in one batch must not be released again in a later one. A sequence
# audit runs two batches one after the other against one ledger (``job(first, second)``), in a
# world without a unit u and in a world where u's rows are in batch 1 and come back in batch 2
# (replayed, or re-sent with the whole of batch 1), with the *same keys* in both worlds. Batch 1
# may differ by what the job states for one unit; batch 2 must add nothing: it is refused before
# the charge (nothing reserved, no key or record left behind), or it is identical, noisy values
# included, to the world without u (the replayed rows were removed). SPLIT puts new rows of one
# unit in both batches: what the unit moves, summed over both batches, must stay within the
# bound stated for one batch (e.g. a source's 65,536 L1 over all its batches).

class BatchSequence(str, enum.Enum):
    REPLAY = "batch 2 replays one unit's rows of batch 1"
    OVERLAP = "batch 2 re-sends all of batch 1 with its own rows"
    SPLIT = "one new unit with rows in both batches (other rows in batch 2)"


@dataclass(frozen=True, kw_only=True)
class Refused:
    """A batch the job refused before the charge; ``left_behind``: anything it reserved or
    stored anyway (ledger records, keys, consumed-id records, published files): must be empty."""

    reason: str
    left_behind: tuple = ()


@dataclass(frozen=True, kw_only=True)
class SequencePair:
    kind: BatchSequence
    without: tuple    # (first, second) without the unit
    with_unit: tuple  # (first, second) with it
    #: REPLAY and OVERLAP: (first, second) as given, every replayed row once -- what a single
    #: release that keeps identical copies once must release for ``with_unit``.
    once: Optional[tuple] = None


def sequence_pairs(first: Dataset, second: Dataset, units: Units,
                   kinds: Sequence = tuple(BatchSequence),
                   split_rows: Optional[Callable[[Any, int], list]] = None) -> list[SequencePair]:
    """The two-batch neighbours of (``first``, ``second``): REPLAY and OVERLAP about the unit of
    ``first`` with the most rows; SPLIT about a new unit whose rows ``split_rows(unit_id, batch)``
    gives (default: ``units.new_rows`` in the busiest keys)."""
    rows_of, _, units_in = _unit_stats(first, units)
    heaviest = max(sorted(rows_of), key=lambda u: rows_of[u]) if rows_of else None
    busiest = sorted(units_in, key=lambda k: (-len(units_in[k]), _order_key(k)))
    out = []
    for kind in kinds:
        kind = BatchSequence(kind)
        if kind in (BatchSequence.REPLAY, BatchSequence.OVERLAP) and heaviest is not None:
            mine = [r for r in first.rows() if _id_text(r.get(units.column)) == heaviest]
            minus = Dataset(batches=_without_unit(first, units, heaviest),
                            name=f"{first.name}-u", extra=first.extra)
            if kind is BatchSequence.REPLAY:
                again = Dataset(batches=[*second.batches, mine], name=f"{second.name}+u",
                                extra=second.extra)
                out.append(SequencePair(kind=kind, without=(minus, second),
                                        with_unit=(first, again), once=(first, second)))
            else:
                out.append(SequencePair(
                    kind=kind, without=(minus, Dataset(batches=[*minus.batches, *second.batches],
                                                       name="b1-u+b2", extra=second.extra)),
                    with_unit=(first, Dataset(batches=[*first.batches, *second.batches],
                                              name="b1+b2", extra=second.extra)),
                    once=(first, second)))
        elif kind is BatchSequence.SPLIT and busiest:
            unit = _new_unit_id(Dataset(batches=[*first.batches, *second.batches]), units)
            make = split_rows or (lambda u, i: units.new_rows(u, busiest[:units.heavy_keys],
                                                              units.heavy_rows))
            out.append(SequencePair(
                kind=kind, without=(first, second),
                with_unit=(Dataset(batches=[*first.batches, make(unit, 0)], name="b1+u",
                                   extra=first.extra),
                           Dataset(batches=[*second.batches, make(unit, 1)], name="b2+u",
                                   extra=second.extra))))
    return out


def audit_sequences(job: Callable[[Dataset, Dataset], tuple], spec: AuditSpec,
                    pairs: Sequence[SequencePair], *,
                    replays_kept_once: bool = False) -> AuditResult:
    """Run ``job(first, second) -> (release of batch 1 or None, release of batch 2 or Refused)``
    on every pair's two worlds and check them (see the section comment). ``spec``: the job's
    table and report rules (bounds: what one unit may move in one batch).

    ``replays_kept_once``: the job is one release over both batches (``job`` returns no batch-1
    release) and keeps identical copies of a unit's rows once (rule 1 of
    ``pipelines.release.consumption``). A replay then counts the unit once: the release with
    the replay must be exactly the release of ``pair.once`` (the batches as given), and the
    world without the unit differs from it by that one unit (checked like a split: structure
    and the stated L1 bound)."""
    violations, runs = [], 0
    for pair in pairs:
        a1, a2 = job(*pair.without)
        b1, b2 = job(*pair.with_unit)
        runs += 4
        once = None
        if replays_kept_once and pair.once is not None and a1 is None and b1 is None:
            once = job(*pair.once)[1]
            runs += 2
        if isinstance(a1, Refused):
            raise RuntimeError(f"{pair.kind.name}: batch 1 without the unit was refused "
                               f"({a1.reason}): nothing to audit")

        def add(check, detail):
            violations.append(Violation(dataset="two batches", change=pair.kind, mode="sequence",
                                        check=check, detail=detail))

        for batch, run in ((1, b1), (2, b2)):
            if isinstance(run, Refused) and run.left_behind:
                add("refusal left state", f"batch {batch}: {', '.join(run.left_behind)[:300]}")
        if isinstance(b1, Refused):
            add("outcome", f"batch 1 refused with the unit: {b1.reason}")
            continue
        totals: dict = {}
        if a1 is not None and b1 is not None:
            for check, detail in compare(spec, a1, b1, exact=True):
                add(check, f"batch 1: {detail}")
            _add_l1(spec, a1, b1, totals)
        if isinstance(b2, Refused):
            continue                       # refused before the charge: batch 2 added nothing
        if isinstance(a2, Refused):        # e.g. an overlapping batch refused in both worlds
            add("outcome", f"batch 2 released with the unit, refused without it ({a2.reason})")
            continue
        if once is not None:
            if isinstance(once, Refused):
                add("outcome", f"the batches as given were refused ({once.reason})")
                continue
            for check, detail in compare(spec, once, b2, exact=True, unchanged=True):
                add("replayed rows changed batch 2" if check == "unchanged" else check,
                    f"batch 2: {detail}")
            for check, detail in compare(spec, a2, b2, exact=True):
                add(check, f"batch 2: {detail}")
            _add_l1(spec, a2, b2, totals)
        elif pair.kind is BatchSequence.SPLIT:
            for check, detail in compare(spec, a2, b2, exact=True):
                add(check, f"batch 2: {detail}")
            _add_l1(spec, a2, b2, totals)
        else:
            for check, detail in compare(spec, a2, b2, exact=True, unchanged=True):
                add("replayed rows changed batch 2" if check == "unchanged" else check,
                    f"batch 2: {detail}")
            _add_l1(spec, a2, b2, totals)
        for (name, column), (total, bound) in sorted(totals.items()):
            if total > bound.total + 1e-9 * max(1.0, bound.total):
                add("sequence l1", f"{name}.{column}: the unit moved it by {total:g} over both "
                                   f"batches, more than the {bound.total:g} stated for one")
    return AuditResult(violations=tuple(violations), runs=runs,
                       pairs=tuple(("two batches", p.kind) for p in pairs))


def _add_l1(spec: AuditSpec, a: Release, b: Release, totals: dict) -> None:
    """Accumulate, per bounded column, the L1 difference of the keys both releases hold."""
    for name in sorted(set(a.tables) & set(b.tables)):
        rule = spec.table_rule(name)
        if rule is None:
            continue
        base = name.rsplit("/", 1)[-1]
        ta, tb = a.tables[name], b.tables[name]
        for column, bound in rule.bounds.items():
            i, j = ta.index(column), tb.index(column)
            ka = {tuple(r[ta.index(k)] for k in rule.keys): r[i] for r in ta.rows}
            kb = {tuple(r[tb.index(k)] for k in rule.keys): r[j] for r in tb.rows}
            moved = sum(abs(float(kb[k]) - float(ka[k])) for k in set(ka) & set(kb)
                        if ka[k] is not None and kb[k] is not None)
            total, _ = totals.get((base, column), (0.0, bound))
            totals[(base, column)] = (total + moved, bound)
