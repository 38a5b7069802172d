"""What a release consumes: reports, sources and clients aggregated at most once across batches.

A content digest cannot see a batch made of an earlier batch plus one late report, so jobs whose
rows carry such ids declare them (:meth:`Job.consumes <pipelines.release.job.Job.consumes>` ->
:class:`Consumes`, one per namespace, read from the preflighted inputs before the charge) and the
release layer applies one set of rules, the same way for every job:

1. **Within the batch** (every run, testing runs too): an id that must be aggregated at most
   once and appears more than once has *every* copy removed inside the pipeline, counted for the
   operator (``<noun>_removed_repeated_in_batch``) -- never a refusal: one row sent twice never
   decides whether a release is published (the Aggregation Service drops later copies too).
   Every copy, not the first: "first" by arrival is not the same on every runner, and a copy
   kept by a rule on its content (the smallest digest) would let a neighbour's added copy
   *replace* the kept row -- a substitution, twice the add/remove sensitivity. Dropping every
   copy depends on the rows of that id only, whatever the batching: under each job's relation
   (a report, an example's label, a client, a record or a source is one id, ids are not shared
   between privacy units) adding or removing one copy changes the aggregate by at most the
   rows of one id, which the stated sensitivity already covers (and under label DP the ids are
   public: which rows are kept is a function of public data). The audits of
   ``tests/pipelines/release/test_publication_decisions.py`` check this edge for every job
   that declares consumed ids. A row whose id has no canonical form (``"1e999"``: see
   :func:`~transforms.privacy_units.unit_ids_and_faults`) is no id: dropped and counted
   (``<noun>_dropped_id_without_canonical_form``), like any other row fault.
2. **Across batches** (releases): the ledger checks the ids against every other release's
   record inside the reservation's transaction and records them (:mod:`accounting.ledger.
   consumed`). Ids another release holds refuse the release (exit 2: how many, and which
   releases hold them; nothing reserved, no key left behind) -- or, with ``--skip_consumed``,
   their rows are removed inside the pipeline and the rest is aggregated. A re-run of the same
   batch removes exactly what the first run removed (read back from its record); a take-over
   of a failed reservation replaces that reservation's record; a published batch's ids are
   permanent, for every later version of the same batch id too.
3. **Budgeted namespaces** (a source's L1 contribution budget) are never refused: each id is
   granted what is left of its budget over all batches, and the job bounds it by that grant.

What the job must then remove and grant reaches its ``build`` as ``ReleaseContext.consumed``
(:class:`Consumed` per namespace); the job counts the rows it removes in an operator counter.
The ids themselves never leave the operator's side: the ledger stores keyed hashes only.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from accounting.ledger.consumed import ConsumedIds
from pipelines.release.errors import ReleaseRefused
from transforms.counting import Counted, Counters, CountingDoFn

SKIP_FLAG = "--skip_consumed"
SKIP_HELP = ("remove rows whose ids an earlier batch already consumed inside the pipeline, "
             "counted for the operator, and release the rest; without it such a batch is "
             "refused before the charge (ids repeated within the batch are always removed, "
             "every copy, and counted)")


@dataclass(frozen=True, kw_only=True)
class Consumes:
    """One namespace of ids a release consumes (what ``Job.consumes`` returns).

    ``ids``: the canonical id of each row (or unit) in the batch, as a pyarrow string array (or
    a sequence of str; no nulls: rows without an id are the job's row faults). ``noun``: how
    messages call them ("report ids"); ``label``: the input they come from ("--input").
    ``faults``: rows whose id has no canonical form (left out of ``ids``; the job drops and
    counts them: :func:`remove_consumed` does). At most once (default): ``ids`` may repeat
    (rule 1: every copy removed). Budgeted: ``limit`` per id over all batches and ``amounts``
    (one per row of ``ids``, summed per id). ``skip``: the job's ``--skip_consumed`` (None: the
    job offers no such flag; ids held by earlier batches are always refused).
    ``across_batches=False``: checked within the batch only, never recorded (Masked LARk record
    ids: each record shared once per batch; an LDP collection's clients: a collection is
    released once, its scope budgeted at the clients' epsilon).
    """

    namespace: str
    ids: object = field(repr=False)
    noun: str
    label: str
    limit: Optional[int] = None
    amounts: Optional[np.ndarray] = field(default=None, repr=False)
    skip: Optional[bool] = False
    across_batches: bool = True
    faults: int = 0

    def __post_init__(self):
        ids = self.ids
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        if not isinstance(ids, pa.Array):
            ids = pa.array(list(ids), pa.string())
        if not pa.types.is_string(ids.type):
            ids = ids.cast(pa.string())
        if ids.null_count:
            raise ValueError(f"{self.namespace}: consumed ids must not be null")
        object.__setattr__(self, "ids", ids)
        if (self.limit is None) != (self.amounts is None):
            raise ValueError(f"{self.namespace}: a budgeted namespace needs limit and amounts")
        if self.amounts is not None:
            amounts = np.asarray(self.amounts, dtype=np.int64)
            if amounts.shape != (len(ids),):
                raise ValueError(f"{self.namespace}: one amount per id")
            object.__setattr__(self, "amounts", amounts)


@dataclass(frozen=True, kw_only=True)
class Consumed:
    """What a job removes and grants in one namespace (``ReleaseContext.consumed[namespace]``).

    ``removed``: ids whose rows the job drops inside the pipeline (repeated within the batch,
    or held by earlier batches, under ``--skip_consumed``); of those, ``repeated_ids`` repeat
    within the batch; ``repeated`` / ``held``: how many of each; ``holders``: {versioned release
    id: ids it holds}. ``grants``: budgeted namespaces, {id: what it may still spend} for the
    ids granted less than their rows ask (every other id is granted all it asks). ``faults``:
    rows whose id has no canonical form (dropped too).
    """

    namespace: str
    removed: pa.Array = field(default_factory=lambda: pa.array([], pa.string()), repr=False)
    repeated_ids: pa.Array = field(default_factory=lambda: pa.array([], pa.string()),
                                   repr=False)
    repeated: int = 0
    held: int = 0
    holders: Mapping[str, int] = field(default_factory=dict)
    grants: Mapping[str, int] = field(default_factory=dict, repr=False)
    faults: int = 0

    @property
    def removes(self) -> bool:
        """Whether the job must drop rows (of removed ids, or without a canonical id)."""
        return len(self.removed) > 0 or self.faults > 0


@dataclass(frozen=True, kw_only=True)
class BatchConsumption:
    """One namespace after rule 1: the ledger's request (None: within the batch only) and the
    ids repeated within the batch (every copy removed). Not the job's
    :class:`~pipelines.release.job.Prepared` request: both meet in one ``Preflight``."""

    consumes: Consumes
    ledger_ids: Optional[ConsumedIds]
    repeated: pa.Array


def _repeats(ids: pa.Array) -> tuple[pa.Array, pa.Array]:
    """(ids that appear once, ids that appear more than once)."""
    counts = pc.value_counts(ids)
    values, times = counts.field("values"), counts.field("counts")
    return (pc.filter(values, pc.equal(times, 1)), pc.filter(values, pc.greater(times, 1)))


def prepare(consumes: Consumes) -> BatchConsumption:
    """Rule 1 (within the batch), and the ledger's part of ``consumes``."""
    c = consumes
    if c.limit is not None:
        table = pa.table({"id": c.ids, "amount": pa.array(c.amounts, pa.int64())})
        summed = table.group_by("id").aggregate([("amount", "sum")])
        ledger = ConsumedIds(namespace=c.namespace, ids=summed.column("id"), limit=c.limit,
                             amounts=summed.column("amount_sum").to_numpy(), noun=c.noun,
                             skip=bool(c.skip))
        return BatchConsumption(consumes=c, ledger_ids=ledger, repeated=pa.array([], pa.string()))
    once, repeated = _repeats(c.ids)
    # Every copy of a repeated id is removed (module docstring, rule 1): the ledger records the
    # ids aggregated, so a repeated id is not consumed by this batch.
    ids = once if len(repeated) else c.ids
    ledger = ConsumedIds(namespace=c.namespace, ids=ids, noun=c.noun, skip=bool(c.skip)) \
        if c.across_batches else None
    return BatchConsumption(consumes=c, ledger_ids=ledger, repeated=repeated)


def preflight(job, prepared, planned, resolved) -> dict:
    """{release id: [BatchConsumption]}: each planned release's ``Job.consumes``, rule 1 applied."""
    out = {}
    for p in planned:
        wanted = {n: resolved[n] for n in (p.inputs or sorted(resolved))}
        declared = list(job.consumes(prepared, p, wanted) or ())
        spaces = [c.namespace for c in declared]
        if len(set(spaces)) != len(spaces) or not all(isinstance(c, Consumes) for c in declared):
            raise ValueError(f"{job.name}: consumes() must return Consumes of distinct namespaces")
        out[p.release_id] = [prepare(c) for c in declared]
    return out


def for_ledger(prepared: Sequence[BatchConsumption]) -> list[ConsumedIds]:
    return [p.ledger_ids for p in prepared if p.ledger_ids is not None]


def views(prepared: Sequence[BatchConsumption], reservation=None) -> dict:
    """{namespace: Consumed} for the job's build (``reservation``: the ledger's; None in
    testing runs, which check within the batch only)."""
    decided = {} if reservation is None else dict(reservation.consumed)
    out = {}
    for p in prepared:
        c, ledger = p.consumes, p.ledger_ids
        result = decided.get(c.namespace)
        removed, held, holders, grants = p.repeated, 0, {}, {}
        if result is not None and ledger is not None:
            holders = dict(result.holders)
            if ledger.budgeted:
                short = np.flatnonzero(result.granted < ledger.amounts)
                grants = {ledger.ids[i]: int(result.granted[i]) for i in short.tolist()}
            else:
                held = int(result.held.sum())
                if held:
                    removed = pa.concat_arrays([removed, pa.array(
                        [ledger.ids[i] for i in np.flatnonzero(result.held).tolist()],
                        pa.string())])
        out[c.namespace] = Consumed(namespace=c.namespace, removed=removed,
                                    repeated_ids=p.repeated, repeated=len(p.repeated),
                                    held=held, holders=holders, grants=grants, faults=c.faults)
    return out


def drop_rows(table: pa.Table, ids: pa.Array, removed: pa.Array) -> tuple[pa.Table, int]:
    """``table`` without the rows whose canonical id (``ids``, aligned) is in ``removed``, and
    how many were dropped (vectorised)."""
    if not len(removed) or not table.num_rows:
        return table, 0
    hit = pc.fill_null(pc.is_in(ids, value_set=removed), False)
    dropped = int(pc.sum(hit).as_py() or 0)
    return (table.filter(pc.invert(hit)) if dropped else table), dropped


def read_columns(resolved, columns: Sequence[str]):
    """Arrow tables of ``columns`` of a preflighted input, every file, read as the pipeline reads
    them (CSV as text, Parquet by row group): what ``Job.consumes`` scans before the charge. A
    file that cannot be read is refused naming the file, never its content."""
    from pipelines.release.inputs import _read_tables

    class _Uncounted:
        def dropped(self, *args):
            pass

        def other(self, *args):
            pass

    wanted = list(columns)
    for path in resolved.files:
        present = [c for c in wanted if c in resolved.present[path]]
        try:
            for table in _read_tables(path, resolved.formats[path], present,
                                      resolved.compression[path], _Uncounted()):
                for column in wanted:
                    if column not in table.column_names:
                        table = table.append_column(column, pa.nulls(table.num_rows, pa.null()))
                yield table
        except (pa.ArrowException, UnicodeDecodeError, OSError, EOFError) as err:
            raise ReleaseRefused(f"{resolved.spec.label}: {path} could not be read "
                                 f"({type(err).__name__}); nothing was charged") from None


def canonical_ids(resolved, column: str, *, required: bool = False) -> tuple[pa.Array, int]:
    """(the canonical ids (``transforms.privacy_units``) of ``column`` over every row of a
    preflighted input, how many rows the pipeline must drop for their id): rows whose id has no
    canonical form -- and, when ``required``, rows without an id (they could not be checked
    against the batch's other rows or earlier batches) -- are left out and counted (pass the
    count as ``Consumes.faults``; :func:`remove_consumed` with ``drop_missing=required`` drops
    them); other rows without an id are left out, the job's own row rule."""
    from transforms.privacy_units import UnitIdError, unit_ids_and_faults

    parts, missing, faults = [], 0, 0
    for table in read_columns(resolved, [column]):
        try:
            ids, bad = unit_ids_and_faults(table.column(column), column)
        except UnitIdError as err:
            raise ReleaseRefused(f"{resolved.spec.label}: {err}; nothing was charged") from None
        faults += int(bad.sum())
        missing += ids.null_count - int(bad.sum())
        parts.append(ids.drop_null())
    return ((pa.concat_arrays(parts) if parts else pa.array([], pa.string())),
            faults + (missing if required else 0))


class _RemoveRowsFn(CountingDoFn):
    """Drops the rows of removed ids (counted apart: repeated within the batch, held by earlier
    batches), the rows whose id has no canonical form and (``drop_missing``) rows without one."""

    def __init__(self, column: str, namespace: str, noun: str, drop_missing: bool = False):
        self._column, self._drop_missing = column, drop_missing
        counters = Counters(namespace)
        self._missing = counters.counter(f"{noun}_dropped_missing_id")
        self._held = counters.counter(f"{noun}_removed_already_consumed")
        self._repeated = counters.counter(f"{noun}_removed_repeated_in_batch")
        self._faults = counters.counter(f"{noun}_dropped_id_without_canonical_form")
        self._cache = (None, None)

    def process(self, table: pa.Table, removed):
        from transforms.privacy_units import unit_ids_and_faults

        if self._cache[0] is not removed:
            held, repeated = removed
            self._cache = (removed, (pa.array(held, pa.string()), pa.array(repeated, pa.string())))
        held, repeated = self._cache[1]
        ids, bad = unit_ids_and_faults(table.column(self._column), self._column)
        missing = (~ids.is_valid().to_numpy(zero_copy_only=False) & ~bad) \
            if self._drop_missing and ids.null_count else np.zeros(len(ids), dtype=bool)
        if bad.any() or missing.any():
            self._faults.inc(int(bad.sum()))
            self._missing.inc(int(missing.sum()))
            keep = pa.array(~(bad | missing))
            table, ids = table.filter(keep), ids.filter(keep)
        table, dropped = drop_rows(table, ids, repeated)
        if dropped:
            self._repeated.inc(dropped)
            ids = unit_ids_and_faults(table.column(self._column), self._column)[0]
        kept, dropped = drop_rows(table, ids, held)
        self._held.inc(dropped)
        if kept.num_rows:
            yield kept


def remove_consumed(tables, pipeline, release, namespace: str, column: str, *,
                    counter: tuple[str, str], label: str, drop_missing: bool = False):
    """``tables`` (Arrow tables) without the rows whose canonical ``column`` id the release must
    remove in ``namespace`` (``release.consumed``) and without the rows whose id has no
    canonical form; counted in ``counter`` = (namespace, noun), for the operator:
    ``NOUN_removed_repeated_in_batch``, ``NOUN_removed_already_consumed`` and
    ``NOUN_dropped_id_without_canonical_form`` (and, ``drop_missing``: the ids are required,
    ``NOUN_dropped_missing_id``). Unchanged when nothing is removed."""
    consumed = release.consumed.get(namespace)
    if consumed is None or not consumed.removes:
        return tables
    repeated = set(consumed.repeated_ids.to_pylist())
    held = [i for i in consumed.removed.to_pylist() if i not in repeated]
    removed = (pipeline | release.label(f"ConsumedIds[{label}]")
               >> beam.Create([(held, sorted(repeated))]))
    return tables | release.label(f"RemoveConsumed[{label}]") >> Counted(
        _RemoveRowsFn(column, *counter, drop_missing=drop_missing),
        beam.pvalue.AsSingleton(removed))
