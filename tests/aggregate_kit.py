"""DPAggregate as an audited job and as a sampled mechanism (shared by the audit and DP-tester
tests).

* :class:`AggregateJob` runs the real transform in a real Beam pipeline (FnApiRunner) on an
  :class:`accounting.verification.audit.Dataset` and returns what it released, as the audit harness expects;
  its :meth:`AggregateJob.spec` states what the transform declares (its plan's sensitivities,
  the public keyset, which columns are noisy).
* :func:`sample_releases` draws many independent releases of one small DPAggregate in a single
  pipeline, for :mod:`accounting.verification.dp_tester`: the dataset is replicated under a public replica
  key column, each replica with its own unit ids, under a fresh secret key. Noise, selection and
  bounding priorities are keyed PRFs of (key, unit) under the release key, so distinct replicas
  draw independent randomness: one run of N replicas is N releases with fresh keys, at the cost
  of one pipeline.
"""
from __future__ import annotations

import dataclasses
import os
import tempfile
import uuid
from dataclasses import dataclass, field
from typing import Optional, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa

from accounting.verification.audit import AuditSpec, Bound, Dataset, Release, ReportRule, Table, TableRule, Units
from accounting.budget import PrivacyBudget
from accounting.verification.dp_tester import ReleaseLayout
from accounting.keys import ReleaseKey
from accounting.sensitivity import ContributionBounds, Neighbouring
from transforms.aggregate import Compute, DPAggregate, Keys, Output
from transforms.keyset import PublicKeyset
from transforms.metrics import Metric
from transforms.selection import PrivateSelection

REPLICA = "replica"


class _WriteTables(beam.DoFn):
    """Each emitted table to its own Arrow IPC file (rows keep their emitted order)."""

    def __init__(self, directory):
        self._directory = directory

    def process(self, table):
        path = os.path.join(self._directory, f"{uuid.uuid4().hex}.arrow")
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)


def run_and_collect(build) -> list[pa.Table]:
    """Run ``build(pipeline) -> PCollection of Arrow tables`` on the FnApiRunner; the emitted
    tables in a canonical order (by their first row: the order of a PCollection is no output)."""
    with tempfile.TemporaryDirectory() as directory:
        with beam.Pipeline(runner="FnApiRunner") as pipeline:
            build(pipeline) | "CollectTables" >> beam.ParDo(_WriteTables(directory))
        tables = []
        for name in os.listdir(directory):
            with pa.OSFile(os.path.join(directory, name), "rb") as source:
                tables.append(pa.ipc.open_stream(source).read_all())
    return sorted(tables, key=lambda t: repr(t.slice(0, 1).to_pylist()))


def arrow_batches(dataset: Dataset) -> list[pa.Table]:
    """One Arrow table per batch (each batch's columns have one type; batches may differ)."""
    return [pa.Table.from_pylist(list(batch)) for batch in dataset.batches if batch]


#: DPAggregate's configuration objects and the flat argument names each takes (the tests'
#: shorthand, :func:`aggregate_of`).
_FLAT = {"compute": (Compute, {"metrics": "metrics", "value": "value", "integer_values": "integer_values"}),
         "keys": (Keys, {"privacy_unit": "privacy_unit", "keys": "columns", "keyset": "keyset",
                         "selection": "selection"}),
         "output": (Output, {"output": "format", "threshold_mode": "threshold_mode",
                             "error_columns": "error_columns", "num_shards": "num_shards"})}


def aggregate_of(**flat) -> DPAggregate:
    """A DPAggregate from flat arguments, as tests vary one of them at a time: ``privacy_unit``,
    ``keys``, ``keyset``, ``selection`` -> :class:`~transforms.aggregate.Keys`; ``metrics``,
    ``value``, ``integer_values`` -> ``Compute``; ``output``, ``threshold_mode``,
    ``error_columns``, ``num_shards`` -> ``Output``; the others (bounds, budget, release_key,
    testing, neighbouring, label) as they are."""
    arguments = {}
    for name, (cls, fields) in _FLAT.items():
        given = {new: flat.pop(old) for old, new in fields.items() if old in flat}
        if given or name != "output":
            arguments[name] = cls(**given)
    return DPAggregate(**arguments, **flat)


@dataclass(frozen=True, kw_only=True)
class AggregateJob:
    """One DPAggregate configuration, callable as an audited job ``(dataset, seed, exact)``.

    public_keys: the keyset (keyset mode) or None with ``selection`` (private selection); both:
    the keyset and private selection of ``outside_keys`` beside it.
    The release runs on one shard so its single table's row order is the released order.
    """

    unit: str = "user"
    keys: tuple = ("k",)
    value: Optional[str] = None
    metrics: Sequence[Metric] = ()
    bounds: ContributionBounds
    budget: PrivacyBudget
    public_keys: Optional[Sequence] = None
    selection: Optional[PrivateSelection] = None
    outside_keys: Sequence = ()   # with both: the keys outside the keyset selection may release
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE
    input: str = "arrow"          # or "dicts": rows as dicts (the dict / Row input path)
    options: dict = field(default_factory=dict)   # other DPAggregate arguments

    def keyset(self) -> Optional[PublicKeyset]:
        if self.public_keys is None:
            return None
        return PublicKeyset.from_keys(list(self.public_keys), list(self.keys))

    def transform(self, key: ReleaseKey, exact: bool, *, keys=None, keyset=None) -> DPAggregate:
        return aggregate_of(privacy_unit=self.unit, keys=list(keys or self.keys), value=self.value,
                            metrics=list(self.metrics), bounds=self.bounds, budget=self.budget,
                            keyset=keyset if keyset is not None else self.keyset(),
                            selection=self.selection, neighbouring=self.neighbouring,
                            release_key=key, testing=exact, num_shards=1, **self.options)

    def __call__(self, dataset: Dataset, seed: int, exact: bool) -> Release:
        transform = self.transform(ReleaseKey.for_testing(seed), exact)
        elements = arrow_batches(dataset) if self.input == "arrow" else dataset.rows()
        tables = run_and_collect(lambda p: p | "Input" >> beam.Create(elements, reshuffle=False)
                                 | "DPAggregate" >> transform)
        both = self.selection is not None and self.public_keys is not None
        if len(tables) > 1 + both:
            raise AssertionError(f"one shard emitted {len(tables)} tables")
        if len(tables) == 2:  # the keyset's keys and the selected ones: one table, in key order
            tables = [pa.concat_tables(tables, promote_options="permissive").sort_by(
                [(k, "ascending") for k in self.keys])]
        columns = [*self.keys, *self.released_columns()]
        table = Table.from_arrow(self.expand_vectors(tables[0])) if tables else \
            Table(columns=columns, rows=())
        return Release(tables={"release": table}, reports={"explain": transform.explain()})

    def _vector_metrics(self) -> list:
        return [m for m in self.metrics if m.is_vector]

    def released_columns(self) -> list:
        """The released columns as audited: a vector sum's list column becomes one column per
        coordinate (``name[i]``), so each coordinate is checked against its bound."""
        out = []
        for m in self.metrics:
            if m.is_vector:
                out += [f"{m.column}[{i}]" for i in range(m.dimension)]
            else:
                out += list(m.output_columns) + self.error_columns(m)
        return out

    def error_columns(self, metric: Metric) -> list:
        """The error columns released beside ``metric`` (on by default): functions of its noisy
        values and public noise parameters, audited as noisy columns."""
        from transforms.aggregate import ERROR_COLUMN_KINDS

        if not self.options.get("error_columns", True) or metric.kind not in ERROR_COLUMN_KINDS:
            return []
        return [metric.column + suffix for suffix in ("_ci95_low", "_ci95_high", "_std")]

    def expand_vectors(self, table: pa.Table) -> pa.Table:
        import pyarrow.compute as pc

        for m in self._vector_metrics():
            i = table.schema.get_field_index(m.column)
            column = table.column(i)
            table = table.remove_column(i)
            for j in range(m.dimension):
                table = table.add_column(i + j, f"{m.column}[{j}]", pc.list_element(column, j))
        return table

    def declared(self) -> DPAggregate:
        """A transform instance for its declarations (plan, selector); never applied."""
        return self.transform(ReleaseKey.for_testing(0), True)

    def rule(self) -> TableRule:
        transform = self.declared()
        columns = [m.column for m in self.metrics]
        # A selected quantile (permute-and-flip, no additive noise) is a choice: no additive
        # bound; the DP tester checks it (tests/accounting/verification/test_dp_tester_quantile.py).
        bounds = {m.name: Bound.of(m.sensitivities) for m in transform.plan.measures if m.name in columns
                  and m.noise is not None and not m.name.startswith(tuple(f"{q.column}" for q in self.metrics
                                                  if len(q.output_columns) > 1 or q.output_columns != (q.column,)))}
        # A vector sum's measure covers every key and coordinate: each coordinate column changes
        # in at most l0 / dimension keys, by at most linf per key and l1 in total.
        for m in self._vector_metrics():
            s = next(x for x in transform.plan.measures if x.name == m.column).sensitivities
            bounds.pop(m.column, None)
            for j in range(m.dimension):
                bounds[f"{m.column}[{j}]"] = Bound(l0=int(s.l0) // m.dimension, linf=float(s.linf),
                                                   l1=float(s.l1))
        # A quantiles metric releases one column per quantile (post-processing of its tree).
        columns = self.released_columns()
        private = self.selection is not None or any(m.threshold is not None for m in self.metrics)
        # value mode: a value not above its threshold is null (and its error columns with it)
        value_mode = self.options.get("threshold_mode") == "value"
        thresholded = tuple(c for m in self.metrics if m.threshold is not None
                            for c in [*m.output_columns, *self.error_columns(m)]) if value_mode else ()
        candidates = None
        if self.selection is not None and self.public_keys is not None:
            candidates = [(k,) if not isinstance(k, tuple) else k
                          for k in [*self.public_keys, *self.outside_keys]]
        return TableRule(keys=self.keys, noisy=columns, bounds=bounds, public_keys=self.public_keys,
                         candidate_keys=candidates,
                         keys_private=private, tolerance=1e-6, thresholded=thresholded,
                         indicator_claim=transform.guarantee() if private else None)

    def spec(self, units: Units, **kwargs) -> AuditSpec:
        relation = "substitute" if self.neighbouring is Neighbouring.SUBSTITUTE else "add_remove"
        return AuditSpec(job=self, units=units, tables={"release": self.rule()},
                         reports={"explain": ReportRule()}, relation=relation, **kwargs)

    def with_(self, **changes) -> "AggregateJob":
        return dataclasses.replace(self, **changes)


# --------------------------------------------------------------------------------------------
# Sampling many releases for the DP tester
# --------------------------------------------------------------------------------------------

def replicate(rows: Sequence[dict], n: int, unit: str) -> pa.Table:
    """``rows`` repeated ``n`` times with a replica column and unit ids of their own per replica."""
    base = pa.Table.from_pylist(list(rows))
    replicas = np.repeat(np.arange(n, dtype=np.int64), base.num_rows)
    table = pa.concat_tables([base] * n) if base.num_rows else base
    units = [f"{r}/{u}" for r, u in zip(replicas.tolist(), table.column(unit).to_pylist())]
    table = table.set_column(table.schema.get_field_index(unit), unit, pa.array(units))
    return table.append_column(REPLICA, pa.array(replicas))


def sample_releases(job: AggregateJob, rows: Sequence[dict], n: int, layout: ReleaseLayout,
                    *, key: ReleaseKey = None, transform=None, batch_rows: int = 50_000) -> np.ndarray:
    """n independent releases of ``job`` on ``rows`` as an (n, layout.width) array.

    One pipeline: the rows replicated n times under a public ``replica`` key column (keyset:
    replicas x public keys), a fresh secret key (or ``key``), and the real transform. ``transform``
    overrides how the DPAggregate is built: ``transform(job, key, keys, keyset)``.
    """
    key = key or ReleaseKey.generate()
    keys = (REPLICA, *job.keys)
    keyset = None
    if job.public_keys is not None:
        public = [k if isinstance(k, tuple) else (k,) for k in job.public_keys]
        keyset = PublicKeyset.from_table(pa.table({
            REPLICA: np.repeat(np.arange(n, dtype=np.int64), len(public)),
            **{c: [k[i] for k in public] * n for i, c in enumerate(job.keys)}}))
    build = transform or (lambda job_, key_, keys_, keyset_: job_.transform(key_, False, keys=keys_, keyset=keyset_))
    aggregate = build(job, key, keys, keyset)
    data = replicate(rows, n, job.unit)
    batches = [data.slice(i, batch_rows) for i in range(0, data.num_rows, batch_rows)] or [data]
    tables = run_and_collect(lambda p: p | "Input" >> beam.Create(batches, reshuffle=False)
                             | "DPAggregate" >> aggregate)
    columns = [REPLICA, *job.keys, *layout.values]
    if tables:
        data = pa.concat_tables([t.select(columns) for t in tables])
        arrays = {c: data.column(c).to_numpy(zero_copy_only=False) for c in columns}
    else:
        arrays = {c: np.zeros(0) for c in columns}
    return layout.vectorize(arrays, n, replica_column=REPLICA)


# --------------------------------------------------------------------------------------------
# A broken variant the audits and the DP tester must catch: thresholds on the exact values
# --------------------------------------------------------------------------------------------

def thresholds_on_exact_values(original):
    """Test-only broken variant of the release stage (``transforms.release._NoiseAndRelease
    ._release``; issue 30, the classic leak): each release threshold compared against the
    *exact* value while the released values stay noisy. It runs the real stage twice on the
    shard -- in the testing (exact) mode, to learn which keys and values pass their thresholds,
    and with the thresholds removed, for the noisy values -- and releases the noisy rows of the
    keys that passed, nulls where the exact run nulled. The stage reads only its settings
    (``self._s``), so each run gets a settings object of its own."""
    from types import SimpleNamespace

    import pyarrow.compute as pc

    def release(self, table, counts):
        settings = self._s
        decided = list(original(SimpleNamespace(_s=dataclasses.replace(settings, testing=True)), table, []))
        unthresholded = dataclasses.replace(settings, outputs=tuple(
            dataclasses.replace(c, threshold=None) for c in settings.outputs))
        noisy = list(original(SimpleNamespace(_s=unthresholded), table, counts))
        if not decided or not noisy:
            return
        decided, noisy = decided[0], noisy[0]
        keys = list(settings.keys)
        passed = set(zip(*(decided.column(k).to_pylist() for k in keys)))
        kept = noisy.filter(pa.array([key in passed for key in zip(*(noisy.column(k).to_pylist()
                                                                      for k in keys))]))
        for column in settings.outputs:         # the same keys in the same (sorted) order
            exact = decided.column(column.name)
            if exact.null_count:
                i = kept.schema.get_field_index(column.name)
                values = kept.column(i)
                kept = kept.set_column(i, column.name, pc.if_else(
                    pc.is_null(exact), pa.nulls(len(values), values.type), values))
        yield kept
    return release


# --------------------------------------------------------------------------------------------
# choose_bounds as an audited job
# --------------------------------------------------------------------------------------------

@dataclass(frozen=True, kw_only=True)
class ChooseBoundsJob:
    """:func:`transforms.utility.choose_bounds` as an audited job ``(dataset, seed, exact)``.

    Released table, keyed by (bound, candidate), public: ``utility``, each candidate's score in
    the quantile mechanism (:func:`transforms.utility.bound_utilities` on the per-unit
    :func:`~transforms.utility.bound_statistics`: what the mechanism's privacy rests on, declared
    to move by at most the utility sensitivity per neighbouring change), and ``chosen`` (1 for
    the candidate the mechanism picked with the run's key, noisy). The batches are concatenated
    with unit ids as text (``bound_statistics`` canonicalises ids; Arrow needs one column type).
    """

    unit: str = "user"
    keys: tuple = ("k",)
    quantile: float = 0.5
    candidates: tuple = (1, 2, 4, 8)
    budget: PrivacyBudget = PrivacyBudget(epsilon=1.0)
    neighbouring: Neighbouring = Neighbouring.ADD_REMOVE

    BOUNDS = ("max_partitions", "max_contributions_per_partition")

    def public_keys(self) -> list:
        return [(b, c) for b in self.BOUNDS for c in self.candidates]

    def _table(self, dataset: Dataset) -> pa.Table:
        rows = [dict(r, **{self.unit: None if r.get(self.unit) is None else str(r[self.unit])})
                for r in dataset.rows()]
        if not rows:
            return pa.table({self.unit: pa.array([], pa.string()),
                             **{k: pa.array([], pa.string()) for k in self.keys}})
        return pa.Table.from_pylist([{c: r.get(c) for c in (self.unit, *self.keys)} for r in rows])

    def __call__(self, dataset: Dataset, seed: int, exact: bool) -> Release:
        from accounting.shared_budget import SharedBudget
        from transforms.utility import bound_statistics, bound_utilities, choose_bounds

        table = self._table(dataset)
        key = ReleaseKey.for_testing(seed)
        if exact:
            key = ReleaseKey(key.secret_bytes(), is_testing=True, noise_free=True)
        part = SharedBudget(self.budget, weights={"bounds": 1}).part("bounds")
        choice = choose_bounds(table, privacy_unit=self.unit, keys=list(self.keys), budget=part,
                               release_key=key, quantile=self.quantile, candidates=self.candidates,
                               neighbouring=self.neighbouring)
        utilities = bound_utilities(bound_statistics(table, privacy_unit=self.unit, keys=list(self.keys)),
                                    sorted(self.candidates), self.quantile)
        picked = {"max_partitions": choice.max_partitions,
                  "max_contributions_per_partition": choice.max_contributions_per_partition}
        rows = sorted((b, c, float(utilities[b][i]), int(picked[b] == c))
                      for b in self.BOUNDS for i, c in enumerate(sorted(self.candidates)))
        # the plan's explain (the chosen values are the noisy part of choice.explain())
        return Release(tables={"choice": Table(columns=("bound", "candidate", "utility", "chosen"),
                                               rows=rows)},
                       reports={"explain": choice.plan.explain()})

    def rule(self) -> TableRule:
        sensitivity = float(Neighbouring(self.neighbouring).factor)
        n = len(self.BOUNDS) * len(self.candidates)
        return TableRule(keys=("bound", "candidate"), noisy=("utility", "chosen"),
                         bounds={"utility": Bound(l0=n, linf=sensitivity, l1=n * sensitivity)},
                         public_keys=self.public_keys(), tolerance=1e-9)
