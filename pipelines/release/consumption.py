"""What a release consumes: reports, sources and clients aggregated at most once across batches.

A content digest cannot see a batch made of an earlier batch plus one late report, so jobs whose
rows carry such ids declare them (:meth:`Job.consumes <pipelines.release.job.Job.consumes>` ->
:class:`Consumes`, one per namespace, read from the preflighted inputs before the charge) and the
release layer applies one set of rules, the same way for every job:

1. **Within the batch** (every run, testing runs too): an id that must be aggregated at most
   once and appears more than once is refused (exit 2, naming how many) -- or, when the job's
   ``--skip_consumed`` is given, *every* copy is removed. Keeping one copy would have to pick it
   by content or by arrival order: the first makes the kept value depend on the replayed copy,
   the second is not the same on every runner.
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
SKIP_HELP = ("remove rows whose ids an earlier batch already consumed (or that repeat within this "
             "batch) inside the pipeline, counted for the operator, and release the rest; "
             "without it such a batch is refused before the charge")


@dataclass(frozen=True, kw_only=True)
class Consumes:
    """One namespace of ids a release consumes (what ``Job.consumes`` returns).

    ``ids``: the canonical id of each row (or unit) in the batch, as a pyarrow string array (or
    a sequence of str; no nulls: rows without an id are the job's row faults). ``noun``: how
    messages call them ("report ids"); ``label``: the input they come from ("--input").
    At most once (default): ``ids`` may repeat (rule 1). Budgeted: ``limit`` per id over all
    batches and ``amounts`` (one per row of ``ids``, summed per id). ``skip``: the job's
    ``--skip_consumed`` (None: the job offers no such flag; repeats are always refused).
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
    or held by earlier batches, under ``--skip_consumed``); ``repeated`` / ``held``: how many of
    each; ``holders``: {versioned release id: ids it holds}. ``grants``: budgeted namespaces,
    {id: what it may still spend} for the ids granted less than their rows ask (every other id
    is granted all it asks).
    """

    namespace: str
    removed: pa.Array = field(default_factory=lambda: pa.array([], pa.string()), repr=False)
    repeated: int = 0
    held: int = 0
    holders: Mapping[str, int] = field(default_factory=dict)
    grants: Mapping[str, int] = field(default_factory=dict, repr=False)

    @property
    def removes(self) -> bool:
        return len(self.removed) > 0


@dataclass(frozen=True, kw_only=True)
class BatchConsumption:
    """What one namespace of a batch consumes, after rule 1: the ledger's request (None: within
    the batch only) and the ids repeated within the batch (removed under skip). Not the job's
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
    if len(repeated) and not c.skip:
        rows = int(pc.sum(pc.is_in(c.ids, value_set=repeated)).as_py() or 0)
        remedy = f", or pass {SKIP_FLAG} to remove every copy (counted)" if c.skip is not None \
            else ""
        raise ReleaseRefused(
            f"{c.label}: {len(repeated)} {c.noun} appear more than once in this batch ({rows} "
            f"rows); each is aggregated at most once: remove the copies{remedy}. Nothing was "
            "charged")
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
                                    repeated=len(p.repeated), held=held, holders=holders,
                                    grants=grants)
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


def canonical_ids(resolved, column: str, *, required: bool = False) -> pa.Array:
    """The canonical ids (``transforms.privacy_units``) of ``column`` over every row of a
    preflighted input, rows without an id left out (the pipeline drops and counts those) --
    unless ``required``: then a row without an id refuses the release (its rows could not be
    checked against earlier batches)."""
    from transforms.privacy_units import UnitIdError, canonical_unit_ids

    parts, missing = [], 0
    for table in read_columns(resolved, [column]):
        try:
            ids = canonical_unit_ids(table.column(column), column)
        except UnitIdError as err:
            raise ReleaseRefused(f"{resolved.spec.label}: {err}; nothing was charged") from None
        missing += ids.null_count
        parts.append(ids.drop_null())
    if required and missing:
        raise ReleaseRefused(f"{resolved.spec.label}: {missing} rows have no {column!r}; a "
                             "release checks every row's id against earlier batches, so each "
                             "needs one. Nothing was charged")
    return pa.concat_arrays(parts) if parts else pa.array([], pa.string())


class _RemoveRowsFn(CountingDoFn):
    def __init__(self, column: str, namespace: str, counter: str):
        self._column = column
        self._removed = Counters(namespace).counter(counter)
        self._cache = (None, None)

    def process(self, table: pa.Table, removed):
        from transforms.privacy_units import canonical_unit_ids

        if self._cache[0] is not removed:
            self._cache = (removed, pa.array(removed, pa.string()))
        ids = canonical_unit_ids(table.column(self._column), self._column)
        kept, dropped = drop_rows(table, ids, self._cache[1])
        self._removed.inc(dropped)
        if kept.num_rows:
            yield kept


def remove_consumed(tables, pipeline, release, namespace: str, column: str, *,
                    counter: tuple[str, str], label: str):
    """``tables`` (Arrow tables) without the rows whose canonical ``column`` id the release must
    remove in ``namespace`` (``release.consumed``); the rows removed are counted in
    ``counter`` = (namespace, name), for the operator. Unchanged when nothing is removed."""
    consumed = release.consumed.get(namespace)
    if consumed is None or not consumed.removes:
        return tables
    removed = (pipeline | release.label(f"ConsumedIds[{label}]")
               >> beam.Create([consumed.removed.to_pylist()]))
    return tables | release.label(f"RemoveConsumed[{label}]") >> Counted(
        _RemoveRowsFn(column, *counter), beam.pvalue.AsSingleton(removed))
