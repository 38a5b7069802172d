"""What a release consumes: reports, sources and clients aggregated at most once across batches.

A content digest cannot see a batch made of an earlier batch plus one late report, so jobs whose
rows carry such ids declare them (:meth:`Job.consumes <pipelines.release.job.Job.consumes>` ->
:class:`Consumes`, one per namespace, read from the preflighted inputs before the charge) and the
release layer applies one set of rules, the same way for every job:

1. **Within the batch** (every run, testing runs too): an id that must be aggregated at most
   once and appears more than once is never a refusal -- one row sent twice never decides
   whether a release is published -- and is settled on the rows of that id alone, counted for
   the operator:

   * every copy *identical* (the same content in every column the job reads: a batch
     submitted twice, a report sent twice): exactly one copy is kept, the others dropped
     (``<noun>_dropped_identical_copies_in_batch``), as the Aggregation Service drops later
     copies of a report;
   * copies that *differ*: every copy is removed (``<noun>_removed_conflicting_copies_in_batch``)
     -- keeping "the first" would make the result depend on arrival order (not the same on
     every runner), and a neighbour's added copy would *replace* the kept row: a substitution,
     twice the add/remove sensitivity.

   Why this is stable under add/remove. Let ``D`` be a batch and ``D' = D + x``, one more record
   ``x`` with id ``i``. If ``i`` is absent from ``D``, the output gains ``x``. If every copy of
   ``i`` in ``D`` is ``y``: ``x == y`` changes nothing (one copy kept either way), ``x != y``
   removes ``y`` (now conflicting). If ``D``'s copies of ``i`` already conflict, nothing changes
   (all removed either way). Ids other than ``i`` are untouched. So the set of kept records
   changes by at most one record -- the add/remove neighbour every job's stated sensitivity
   covers -- and which copy is kept never matters: kept copies are identical in everything the
   job reads. (Under label DP the ids are public and the relation changes one label: a changed
   label makes identical copies conflict or conflicting ones identical, which moves rows of that
   one example only.) The audits of ``tests/pipelines/release/test_publication_decisions.py``
   check both edges (an identical copy added, a conflicting copy added) for every job that
   declares consumed ids (the public-identity jobs below: identical copies in D, one copy's
   value changed in D'); the mutant ``repeat-keeps-the-first-copy`` (keep-first instead of
   keep-identical-once) is caught by them.

   **Public identities, private content.** The rule compares content, so it is for relations
   where adding or removing a record is the neighbour (summary reports: a source; event-level
   registrations, which are public; local-DP clients, whose reports are already randomized on
   the device: comparing them is post-processing). Where a job's relation makes the ids public
   and changes a *value* (label DP: one example's label; Masked LARk: one record's values),
   "identical or not" would be a decision on the private value -- one copy's label flipped would
   remove an exported example (the audit shows the key set moving) -- so those jobs pass no
   content (``Consumes.content`` None) and every copy of a repeated id is removed, which
   depends on the public ids only (``<noun>_removed_repeated_in_batch``).

   How (:func:`prepare`, :func:`remove_consumed`): before the charge, each row's content digest
   (:func:`content_digests`: a keyed MAC, 128 bits, of the row's values in every column of the
   input, the file's schema in its key) decides per id, vectorised (one group-by of the ids and
   one of the distinct (id, digest) pairs): one digest -> identical, several -> conflicting; the
   ledger records an id with identical copies, not one whose copies conflict. Inside the
   pipeline that verdict is applied as it was taken (the ledger's record and the released rows
   agree): the rows of a conflicting id are dropped vectorised, and the copies of an identical
   id meet in one combine keyed by the id that holds *one* row (bounded memory whatever the
   number of copies; which one does not matter). A row whose id has no canonical form
   (``"1e999"``: see
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
from transforms.counting import MAIN, Counted, Counters, CountingDoFn

SKIP_FLAG = "--skip_consumed"
SKIP_HELP = ("remove rows whose ids an earlier batch already consumed inside the pipeline, "
             "counted for the operator, and release the rest; without it such a batch is "
             "refused before the charge (an id repeated within the batch keeps one copy when "
             "its copies are identical and loses every copy when they differ, counted)")


@dataclass(frozen=True, kw_only=True)
class Consumes:
    """One namespace of ids a release consumes (what ``Job.consumes`` returns).

    ``ids``: the canonical id of each row (or unit) in the batch, as a pyarrow string array (or
    a sequence of str; no nulls: rows without an id are the job's row faults). ``noun``: how
    messages call them ("report ids"); ``label``: the input they come from ("--input").
    ``faults``: rows whose id has no canonical form (left out of ``ids``; the job drops and
    counts them: :func:`remove_consumed` does). At most once (default): ``ids`` may repeat
    (rule 1), and ``content`` (:func:`content_digests`, one (2,) uint64 digest per row of ``ids``;
    :func:`scan_ids` gives both) tells identical copies (one kept) from conflicting ones (every
    copy removed); without it every repeated id counts as conflicting. Budgeted: ``limit`` per
    id over all batches and ``amounts``
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
    content: Optional[np.ndarray] = field(default=None, repr=False)
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
        if self.content is not None:
            content = np.asarray(self.content, dtype=np.uint64)
            if content.shape != (len(ids), 2):
                raise ValueError(f"{self.namespace}: one (2,) content digest per id")
            object.__setattr__(self, "content", content)


@dataclass(frozen=True, kw_only=True)
class Consumed:
    """What a job removes and grants in one namespace (``ReleaseContext.consumed[namespace]``).

    ``removed``: ids whose rows the job drops inside the pipeline (copies that conflict within
    the batch, or held by earlier batches, under ``--skip_consumed``); of those,
    ``repeated_ids`` conflict within the batch; ``identical_ids``: ids repeated within the batch
    whose copies are identical (one copy kept, unless an earlier batch holds the id);
    ``repeated`` / ``identical`` / ``held``: how many of each; ``compared``: whether copies
    were compared (False: a public-identity job, every copy of a repeated id removed);
    ``holders``: {versioned release
    id: ids it holds}. ``grants``: budgeted namespaces, {id: what it may still spend} for the
    ids granted less than their rows ask (every other id is granted all it asks). ``faults``:
    rows whose id has no canonical form (dropped too).
    """

    namespace: str
    removed: pa.Array = field(default_factory=lambda: pa.array([], pa.string()), repr=False)
    repeated_ids: pa.Array = field(default_factory=lambda: pa.array([], pa.string()),
                                   repr=False)
    identical_ids: pa.Array = field(default_factory=lambda: pa.array([], pa.string()),
                                    repr=False)
    repeated: int = 0
    identical: int = 0
    compared: bool = True
    held: int = 0
    holders: Mapping[str, int] = field(default_factory=dict)
    grants: Mapping[str, int] = field(default_factory=dict, repr=False)
    faults: int = 0

    @property
    def removes(self) -> bool:
        """Whether the job must drop rows (of removed ids, identical copies, or rows without a
        canonical id)."""
        return len(self.removed) > 0 or len(self.identical_ids) > 0 or self.faults > 0


@dataclass(frozen=True, kw_only=True)
class BatchConsumption:
    """One namespace after rule 1: the ledger's request (None: within the batch only), the ids
    whose copies within the batch conflict (``repeated``: every copy removed) and those whose
    copies are identical (``identical``: one kept). Not the job's
    :class:`~pipelines.release.job.Prepared` request: both meet in one ``Preflight``."""

    consumes: Consumes
    ledger_ids: Optional[ConsumedIds]
    repeated: pa.Array
    identical: pa.Array = field(default_factory=lambda: pa.array([], pa.string()))


_EMPTY = pa.array([], pa.string())


def repeats(ids: pa.Array, content: Optional[np.ndarray]) -> tuple[pa.Array, pa.Array, pa.Array]:
    """(the distinct ids the batch aggregates, ids repeated with identical copies, ids repeated
    with conflicting copies) -- rule 1, vectorised: the copies of each id from one group-by,
    the distinct contents per id from a second over the distinct (id, digest) pairs. Without
    ``content`` every repeated id conflicts."""
    counts = pc.value_counts(ids)
    values, times = counts.field("values"), counts.field("counts")
    repeated = pc.filter(values, pc.greater(times, 1))
    if not len(repeated):
        return ids, _EMPTY, _EMPTY
    if content is None:
        return pc.filter(values, pc.equal(times, 1)), _EMPTY, repeated
    pairs = pa.table({"id": ids, "a": content[:, 0], "b": content[:, 1]})
    distinct = pairs.group_by(["id", "a", "b"]).aggregate([]).column("id")
    kinds = pc.value_counts(distinct)
    contents = pa.table({"id": kinds.field("values"), "contents": kinds.field("counts")})
    copies = pa.table({"id": values, "copies": times}).join(contents, "id")
    many = pc.greater(copies.column("copies"), 1)
    one_content = pc.equal(copies.column("contents"), 1)
    identical = copies.filter(pc.and_(many, one_content)).column("id").combine_chunks()
    conflicting = copies.filter(pc.invert(one_content)).column("id").combine_chunks()
    kept = copies.filter(one_content).column("id").combine_chunks()
    return kept, identical, conflicting


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
    # Rule 1 (module docstring): the ledger records the ids aggregated -- an id with identical
    # copies once (one copy is), an id whose copies conflict not at all (none is).
    ids, identical, repeated = repeats(c.ids, c.content)
    ledger = ConsumedIds(namespace=c.namespace, ids=ids, noun=c.noun, skip=bool(c.skip)) \
        if c.across_batches else None
    return BatchConsumption(consumes=c, ledger_ids=ledger, repeated=repeated,
                            identical=identical)


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
                                    identical_ids=p.identical, identical=len(p.identical),
                                    compared=c.content is not None,
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


@dataclass(frozen=True, kw_only=True)
class ScannedIds:
    """What :func:`scan_ids` reads of a preflighted input: the canonical ids (``Consumes.ids``),
    one content digest per id (``Consumes.content``) and the rows the pipeline must drop for
    their id (``Consumes.faults``)."""

    ids: pa.Array
    content: Optional[np.ndarray]
    faults: int


_DIGEST_SECRET: list = []


def _digest_secret() -> bytes:
    """A fresh secret per process: digests are compared within one preflight only, so nothing
    outside this process can choose two different rows that collide."""
    if not _DIGEST_SECRET:
        import os

        _DIGEST_SECRET.append(os.urandom(32))
    return _DIGEST_SECRET[0]


def _comparable(column) -> tuple[list, str]:
    """Null-free Arrow columns encoding ``column`` exactly (values and where they are null) for
    the keyed MAC, and a tag of its type: a float as its 64 bits (NaN, -0.0 kept apart), a
    date as its day number, text and bytes as they are, anything else by its text form."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    typ = column.type
    valid = pc.is_valid(column)
    if pa.types.is_null(typ):
        return [], "null"
    if pa.types.is_floating(typ):
        bits = column.cast(pa.float64()).fill_null(0.0).to_numpy(zero_copy_only=False)
        values = pa.array(bits.view(np.int64))
    elif pa.types.is_integer(typ) or pa.types.is_boolean(typ):
        values = column.fill_null(0)
    elif pa.types.is_date(typ):
        values = column.cast(pa.date32()).cast(pa.int32()).fill_null(0)
    elif pa.types.is_string(typ) or pa.types.is_large_string(typ) \
            or pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        values = column.cast(pa.large_binary()).fill_null(b"")
    elif pa.types.is_fixed_size_binary(typ):
        values = pa.array([b"" if v is None else v for v in column.to_pylist()],
                          pa.large_binary()) \
            if column.null_count else pa.Array.from_buffers(
                pa.binary(typ.byte_width), len(column), column.buffers()[:2],
                offset=column.offset).cast(pa.large_binary())
    elif pa.types.is_fixed_size_list(typ) and not column.null_count:
        # one column per position (a PEM report's hashes), each encoded as above
        width = typ.list_size
        flat = column.flatten()
        columns, tags = [], []
        for j in range(width):
            part, tag = _comparable(flat.take(pa.array(np.arange(len(column)) * width + j)))
            columns.extend(part)
            tags.append(tag)
        return columns, f"{typ}[{','.join(tags)}]"
    else:
        try:
            text = column.cast(pa.large_string())
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            text = pa.array([None if v is None else repr(v) for v in column.to_pylist()],
                            pa.large_string())
        values = text.cast(pa.large_binary()).fill_null(b"")
    return [values, valid], str(typ)


def content_digests(table: pa.Table, columns: Optional[Sequence[str]] = None) -> np.ndarray:
    """A 128-bit keyed MAC (AES CBC-MAC, :func:`transforms.noise.prf.mac_keys`; this process's
    secret, the columns' names and types in its key) of each row's values in ``columns`` (all
    by default), as (n, 2) uint64, vectorised: two rows get one digest exactly when they hold
    the same values in every column (up to a collision no one outside this process can aim
    for). What rule 1 compares copies of an id by."""
    import hashlib

    from transforms.noise.prf import mac_keys, mac_words

    names = list(table.column_names if columns is None else columns)
    parts, tags = [], []
    for name in names:
        encoded, tag = _comparable(table.column(name))
        parts.extend(encoded)
        tags.append(f"{name}={tag}")
    key = hashlib.blake2b("\x00".join(tags).encode("utf-8"), key=_digest_secret(),
                          digest_size=32, person=b"batch-copies").digest()
    if not parts:
        parts = [pa.array(np.zeros(table.num_rows, dtype=np.int64))]
    return mac_words(mac_keys(key, pa.table({f"c{i}": c for i, c in enumerate(parts)}))).copy()


def scan_ids(resolved, column: str, *, required: bool = False,
             content: bool = True) -> ScannedIds:
    """The canonical ids (``transforms.privacy_units``) of ``column`` over every row of a
    preflighted input, each row's content digest over every column the job reads of that input
    (:func:`content_digests`) and how many rows the pipeline must drop for their id: rows whose
    id has no canonical form -- and, when ``required``, rows without an id (they could not be
    checked against the batch's other rows or earlier batches) -- are left out and counted
    (pass the count as ``Consumes.faults``; :func:`remove_consumed` with
    ``drop_missing=required`` drops them); other rows without an id are left out, the job's own
    row rule. ``content=False``: the id column only, no digests (``content`` is then None)."""
    from transforms.privacy_units import UnitIdError, unit_ids_and_faults

    wanted = list(dict.fromkeys([column, *resolved.spec.all_columns])) if content else [column]
    parts, digests, missing, faults = [], [], 0, 0
    for table in read_columns(resolved, wanted):
        try:
            ids, bad = unit_ids_and_faults(table.column(column), column)
        except UnitIdError as err:
            raise ReleaseRefused(f"{resolved.spec.label}: {err}; nothing was charged") from None
        faults += int(bad.sum())
        missing += ids.null_count - int(bad.sum())
        valid = ids.is_valid().to_numpy(zero_copy_only=False)
        parts.append(ids.drop_null())
        if content:
            digests.append(content_digests(table, wanted)[valid])
    return ScannedIds(ids=(pa.concat_arrays(parts) if parts else pa.array([], pa.string())),
                      content=None if not content else (
                          np.concatenate(digests) if digests
                          else np.zeros((0, 2), dtype=np.uint64)),
                      faults=faults + (missing if required else 0))


def canonical_ids(resolved, column: str, *, required: bool = False) -> tuple[pa.Array, int]:
    """(ids, faults) of :func:`scan_ids`, without the content digests (the id column only)."""
    scanned = scan_ids(resolved, column, required=required, content=False)
    return scanned.ids, scanned.faults


class _RemoveRowsFn(CountingDoFn):
    """Drops the rows of removed ids (counted apart: conflicting copies within the batch, held by
    earlier batches), the rows whose id has no canonical form and (``drop_missing``) rows without
    one; the rows of ids with identical copies go on to :class:`_OneCopy` (``copies``) or, in
    the other tables keyed by the same ids, stay."""

    def __init__(self, column: str, namespace: str, noun: str, drop_missing: bool = False,
                 copies: bool = False, compared: bool = True):
        self._column, self._drop_missing, self._copies = column, drop_missing, copies
        counters = Counters(namespace)
        self._missing = counters.counter(f"{noun}_dropped_missing_id")
        self._held = counters.counter(f"{noun}_removed_already_consumed")
        # copies not compared (public-identity jobs): every copy of a repeated id, one counter
        self._repeated = counters.counter(f"{noun}_removed_conflicting_copies_in_batch" if compared
                                          else f"{noun}_removed_repeated_in_batch")
        self._faults = counters.counter(f"{noun}_dropped_id_without_canonical_form")
        self._cache = (None, None)

    def _sets(self, removed):
        if self._cache[0] is not removed:
            self._cache = (removed, tuple(pa.array(ids, pa.string()) for ids in removed))
        return self._cache[1]

    def _ids(self, table):
        from transforms.privacy_units import unit_ids_and_faults

        return unit_ids_and_faults(table.column(self._column), self._column)

    def process(self, table: pa.Table, removed):
        held, repeated, identical = self._sets(removed)
        ids, bad = self._ids(table)
        missing = (~ids.is_valid().to_numpy(zero_copy_only=False) & ~bad) \
            if self._drop_missing and ids.null_count else np.zeros(len(ids), dtype=bool)
        if bad.any() or missing.any():
            self._faults.inc(int(bad.sum()))
            self._missing.inc(int(missing.sum()))
            keep = pa.array(~(bad | missing))
            table, ids = table.filter(keep), ids.filter(keep)
        table, dropped = drop_rows(table, ids, held)
        self._held.inc(dropped)
        if dropped:
            ids = self._ids(table)[0]
        # every copy of an id whose copies conflict (in another input keyed by the same ids,
        # e.g. a source's conversions: its rows)
        table, dropped = drop_rows(table, ids, repeated)
        self._repeated.inc(dropped)
        if dropped:
            ids = self._ids(table)[0]
        if self._copies and len(identical) and table.num_rows:
            hit = pc.fill_null(pc.is_in(ids, value_set=identical), False)
            if pc.any(hit).as_py():
                # the copies of an id with identical copies, each on its own keyed by its id:
                # one combine per id keeps one
                copies = table.filter(hit)
                for i, key in enumerate(ids.filter(hit).to_pylist()):
                    yield beam.pvalue.TaggedOutput(_COPIES, (key, copies.slice(i, 1)))
                table = table.filter(pc.invert(hit))
        if table.num_rows:
            yield table


_COPIES = "copies"


class _OneCopy(beam.CombineFn):
    """The copies of one id whose copies are identical (their content digests, before the
    charge): one row held, whatever the number of copies (bounded memory), and how many there
    were. Which copy is held does not matter: they hold the same values in every column the job
    reads (a 128-bit MAC under a secret of the preflight's process: a collision no one can aim
    for)."""

    def create_accumulator(self):
        return (None, 0)

    def add_input(self, acc, row):
        return (row if acc[0] is None else acc[0], acc[1] + 1)

    def merge_accumulators(self, accs):
        kept, copies = None, 0
        for row, n in accs:
            kept, copies = (row if kept is None else kept), copies + n
        return (kept, copies)

    def extract_output(self, acc):
        return acc


class _KeptCopyFn(CountingDoFn):
    """Rule 1 on one id whose copies are identical: one row, the others counted as dropped."""

    def __init__(self, namespace: str, noun: str):
        counters = Counters(namespace)
        self._identical = counters.counter(f"{noun}_dropped_identical_copies_in_batch")

    def process(self, item):
        _, (row, copies) = item
        self._identical.inc(copies - 1)
        yield row


def _by_schema(rows):
    """Single-row tables as one table per schema (kept copies back into the table stream)."""
    groups: dict = {}
    for row in rows:
        groups.setdefault(row.schema, []).append(row)
    for group in groups.values():
        yield pa.concat_tables(group)


def remove_consumed(tables, pipeline, release, namespace: str, column: str, *,
                    counter: tuple[str, str], label: str, drop_missing: bool = False,
                    copies: bool = True):
    """``tables`` (Arrow tables) as rule 1 and 2 of the module docstring leave them in
    ``namespace`` (``release.consumed``): without the rows of ids held by earlier batches
    (``--skip_consumed``), without every copy of an id whose copies conflict within the batch,
    with one copy of an id whose copies are identical (``copies``: ``tables`` are the rows the
    ids were read from; False for another input keyed by the same ids, whose rows then stay),
    and without the rows whose id has no canonical form; counted in ``counter`` = (namespace,
    noun), for the operator: ``NOUN_dropped_identical_copies_in_batch``,
    ``NOUN_removed_conflicting_copies_in_batch`` (a public-identity job, whose copies are not
    compared: ``NOUN_removed_repeated_in_batch``, every copy), ``NOUN_removed_already_consumed`` and
    ``NOUN_dropped_id_without_canonical_form`` (and, ``drop_missing``: the ids are required,
    ``NOUN_dropped_missing_id``). Unchanged when nothing is removed."""
    consumed = release.consumed.get(namespace)
    if consumed is None or not consumed.removes:
        return tables
    repeated = set(consumed.repeated_ids.to_pylist())
    held = sorted(i for i in consumed.removed.to_pylist() if i not in repeated)
    # an id an earlier batch holds loses every copy (rule 2), identical or not
    identical = sorted(set(consumed.identical_ids.to_pylist()) - set(held)) if copies else []
    removed = (pipeline | release.label(f"ConsumedIds[{label}]")
               >> beam.Create([(held, sorted(repeated), identical)]))
    settle = copies and bool(identical)
    fn = _RemoveRowsFn(column, *counter, drop_missing=drop_missing, copies=settle,
                       compared=consumed.compared)
    side = beam.pvalue.AsSingleton(removed)
    if not settle:
        return tables | release.label(f"RemoveConsumed[{label}]") >> Counted(fn, side)
    out = tables | release.label(f"RemoveConsumed[{label}]") >> Counted(fn, side,
                                                                        tagged=(_COPIES,))
    kept = (out[_COPIES]
            | release.label(f"OneCopy[{label}]") >> beam.CombinePerKey(_OneCopy())
            | release.label(f"KeptCopies[{label}]") >> Counted(_KeptCopyFn(*counter))
            | release.label(f"KeptCopiesBatched[{label}]") >> beam.BatchElements(
                min_batch_size=1, max_batch_size=4096)
            | release.label(f"KeptCopiesTables[{label}]") >> beam.FlatMap(_by_schema))
    return ((out[MAIN], kept)
            | release.label(f"WithKeptCopies[{label}]") >> beam.Flatten())
