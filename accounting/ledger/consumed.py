"""What each release consumed: exact, compact records of the ids it aggregated, beside the ledger.

A report, a source or a client's report may be aggregated at most once across all batches. The
input digest cannot see that (a batch made of an earlier batch plus one late report has a new
digest), so the ledger keeps, per release and per *namespace* (``ara-summary/report``, one LDP
collection's clients, ...), the set of ids the release consumed, and checks every new release
against the records of all others inside its reservation's transaction -- before the charge,
atomically with it: two overlapping batches racing cannot both pass.

Two kinds of namespace:

* **at most once** (``limit`` None): an id held by another release is a conflict. The release is
  refused, naming how many ids and which releases hold them -- or, with ``skip``, those ids are
  removed from it (the job drops their rows inside the pipeline) and the rest is recorded.
* **budgeted** (``limit`` L): each id carries an amount (e.g. a source's L1 contribution); over
  all releases an id's amounts sum to at most L. A release is granted, per id, the least of what
  it asks and what is left; the grant is what it records. Nothing is refused.

The record (:func:`encode_record`): per release and namespace one Arrow IPC file of the ids' 128-bit
keyed hashes, sorted (``hi``, ``lo``: two uint64 columns; budgeted namespaces add ``amount``),
named by its SHA-256 and stored beside the ledger document (``<ledger>.consumed/``, local or
``gs://``). The ledger record references it with that SHA-256 and the count, so a missing or
edited file is detected and refused; the ledger JSON stays small. 10M ids take 160 MB; a check
reads the files of its own namespaces only and searches them with ``numpy.searchsorted``
(``benchmarks/consumed_ids.py`` measures the cost against a release's own time).

**Why keyed hashes.** The ids (report ids, source ids, client ids) are private operator data, and
the consumed records hold every id ever released. Plain hashes would let whoever reads the files
(a backup, a bucket shared more widely than the key store, an auditor of the budgets) test a
guessed id for membership -- "was this person's report in batch 7?" -- outside any DP guarantee,
and many ids are guessable (sequential client ids, impression ids). So every id is hashed with
BLAKE2b keyed by a per-namespace sub-key of one secret that the ledger keeps in its key store
(created with the first record, referenced by fingerprint like a release key). Without the key
store the files are uniform noise; losing the key store makes earlier records uncheckable, and
releases that need them are refused (the same as for a missing file). 128 bits make a false
match of two distinct ids negligible (about n^2 / 2^129: below 1e-24 for 10^7 ids).
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import numpy as np

FORMAT = "beam-dp-release/consumed-ids/v1"
HASH_BYTES = 16
_PERSON = b"consumed-ids/v1"
_NAMESPACE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/=+-]{0,199}$")


class ConsumedRecordError(RuntimeError):
    """A consumed-id record is missing, edited or unreadable (raised as a LedgerError)."""


@dataclass(frozen=True, kw_only=True)
class ConsumedIds:
    """What one release consumes in one namespace (``ReleaseRequest.consumes``).

    ``ids``: canonical ids, each once (the release layer resolves repeats within a batch first);
    a sequence of ``str`` or a pyarrow string array. ``limit``: None for "at most once", else the
    per-id budget over all releases, with ``amounts`` (non-negative integers, one per id: what
    this release asks). ``skip``: remove conflicting ids instead of refusing the release.
    ``noun``: how messages call the ids ("report ids", "sources").
    """

    namespace: str
    ids: Any = field(repr=False)
    limit: Optional[int] = None
    amounts: Optional[np.ndarray] = field(default=None, repr=False)
    skip: bool = False
    noun: str = "ids"

    def __post_init__(self):
        if not isinstance(self.namespace, str) or not _NAMESPACE.match(self.namespace):
            raise ValueError(f"consumed-id namespace must be a short safe name, got "
                             f"{self.namespace!r}")
        ids = _as_strings(self.ids)
        object.__setattr__(self, "ids", ids)
        if self.limit is None:
            if self.amounts is not None:
                raise ValueError(f"{self.namespace}: amounts need a limit (a budgeted namespace)")
        else:
            if isinstance(self.limit, bool) or not isinstance(self.limit, (int, np.integer)) \
                    or self.limit < 1:
                raise ValueError(f"{self.namespace}: limit must be a positive integer")
            amounts = np.asarray(self.amounts if self.amounts is not None else [], dtype=np.int64)
            if amounts.shape != (len(ids),) or (amounts < 0).any():
                raise ValueError(f"{self.namespace}: one non-negative amount per id")
            object.__setattr__(self, "amounts", amounts)
            object.__setattr__(self, "limit", int(self.limit))

    @property
    def budgeted(self) -> bool:
        return self.limit is not None

    def __len__(self) -> int:
        return len(self.ids)


@dataclass(frozen=True, kw_only=True)
class ConsumedResult:
    """The ledger's decision for one namespace of a reservation (aligned with ``ConsumedIds.ids``).

    ``held``: the ids other releases hold (at-most-once namespaces; with ``skip`` they are not
    this release's and its job removes their rows). ``granted``: budgeted namespaces, per id,
    what this release may spend. ``holders``: {versioned release id: how many of these ids it
    holds} (at most once) or {versioned release id: ids with an earlier spend} (budgeted).
    ``recorded``: how many ids the release's record holds.
    """

    namespace: str
    held: np.ndarray = field(repr=False)
    granted: Optional[np.ndarray] = field(default=None, repr=False)
    holders: Mapping[str, int] = field(default_factory=dict)
    recorded: int = 0


# --------------------------------------------------------------------------------------------
# Keyed hashes
# --------------------------------------------------------------------------------------------

def _as_strings(ids) -> list:
    if hasattr(ids, "to_pylist"):          # a pyarrow array / chunked array
        ids = ids.to_pylist()
    out = list(ids)
    if not all(isinstance(i, str) for i in out):
        raise ValueError("consumed ids must be canonical strings (no nulls)")
    return out


def namespace_key(secret: bytes, namespace: str) -> bytes:
    """The namespace's sub-key: ids hashed in two namespaces cannot be linked."""
    return hashlib.blake2b(namespace.encode("utf-8"), key=secret, digest_size=32,
                           person=_PERSON).digest()


def hash_ids(secret: bytes, namespace: str, ids: Sequence[str]) -> np.ndarray:
    """(n, 2) uint64: each id's 128-bit BLAKE2b hash under the namespace's sub-key."""
    base = hashlib.blake2b(key=namespace_key(secret, namespace), digest_size=HASH_BYTES)

    def one(text: str) -> bytes:
        h = base.copy()
        h.update(text.encode("utf-8"))
        return h.digest()

    raw = b"".join(map(one, ids))
    return np.frombuffer(raw, dtype="<u8").reshape(-1, 2).copy() if raw else \
        np.zeros((0, 2), dtype=np.uint64)


def sort_order(hashes: np.ndarray) -> np.ndarray:
    """Indices that sort (n, 2) hashes by (hi, lo)."""
    return np.lexsort((hashes[:, 1], hashes[:, 0]))


# --------------------------------------------------------------------------------------------
# The record file
# --------------------------------------------------------------------------------------------

def encode_record(namespace: str, hashes: np.ndarray, amounts: Optional[np.ndarray] = None, *,
           presorted: bool = False) -> bytes:
    """One record file: the hashes sorted by (hi, lo) (amounts alongside), Arrow IPC.
    ``presorted``: the hashes are sorted already."""
    import pyarrow as pa

    order = slice(None) if presorted else sort_order(hashes)
    columns = {"hi": pa.array(hashes[order, 0], pa.uint64()),
               "lo": pa.array(hashes[order, 1], pa.uint64())}
    if amounts is not None:
        columns["amount"] = pa.array(np.asarray(amounts, dtype=np.int64)[order], pa.int64())
    table = pa.table(columns).replace_schema_metadata(
        {b"format": FORMAT.encode(), b"namespace": namespace.encode()})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def file_name(data: bytes) -> tuple[str, str]:
    """(file name, "sha256:<hex>") of a record file's bytes (files are content-addressed)."""
    digest = hashlib.sha256(data).hexdigest()
    return f"{digest}.arrow", f"sha256:{digest}"


@dataclass(frozen=True, kw_only=True)
class Record:
    """One release's record in one namespace, read and verified: sorted hashes (and amounts)."""

    hi: np.ndarray
    lo: np.ndarray
    amount: Optional[np.ndarray] = None

    def __len__(self) -> int:
        return int(self.hi.shape[0])


def decode_record(data: bytes, *, namespace: str, sha256: str, count: int, where: str) -> Record:
    """Verify a record file against its ledger entry and read it (zero-copy where possible)."""
    import pyarrow as pa

    if "sha256:" + hashlib.sha256(data).hexdigest() != sha256:
        raise ConsumedRecordError(f"{where} was edited (its SHA-256 does not match the ledger)")
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, OSError) as err:
        raise ConsumedRecordError(f"{where} is not a consumed-id record ({type(err).__name__})")
    meta = table.schema.metadata or {}
    if meta.get(b"format") != FORMAT.encode() or meta.get(b"namespace") != namespace.encode() \
            or table.num_rows != count:
        raise ConsumedRecordError(f"{where} does not hold the {count} ids of namespace "
                                  f"{namespace!r} the ledger records")

    def column(name):
        return table.column(name).combine_chunks().to_numpy(zero_copy_only=False)

    return Record(hi=column("hi"), lo=column("lo"),
                  amount=column("amount") if "amount" in table.column_names else None)


# --------------------------------------------------------------------------------------------
# Matching (vectorised)
# --------------------------------------------------------------------------------------------

def matches(record: Record, hashes: np.ndarray) -> np.ndarray:
    """For each of ``hashes`` ((n, 2)), its row in ``record`` or -1: a binary search on ``hi``
    (fastest, and cache-friendly, when ``hashes`` are sorted: numpy narrows each search from the
    last), then equality of ``lo``; equal ``hi`` values -- about n^2 / 2^65 of them -- are
    compared one by one."""
    n = len(record)
    out = np.full(hashes.shape[0], -1, dtype=np.int64)
    if not n or not hashes.shape[0]:
        return out
    hi, lo = hashes[:, 0], hashes[:, 1]
    start = np.searchsorted(record.hi, hi, side="left")
    inside = start < n
    at = np.where(inside, start, 0)
    same_hi = inside & (record.hi[at] == hi)
    hit = same_hi & (record.lo[at] == lo)
    out[hit] = start[hit]
    # a record with several ids sharing this hi: look at the next ones too
    after = np.where(same_hi & ~hit & (at + 1 < n), at + 1, 0)
    for i in np.flatnonzero(same_hi & ~hit & (at + 1 < n) & (record.hi[after] == hi)):
        j = int(start[i])
        while j < n and record.hi[j] == hi[i]:
            if record.lo[j] == lo[i]:
                out[i] = j
                break
            j += 1
    return out


class Check:
    """Accumulates one namespace's check of a release against the other releases' records:
    which of its ids they hold (at most once), what they spent of each id's budget (budgeted),
    and how many each holder holds. Works on the release's hashes sorted by (hi, lo)
    (``order``: the sorting permutation)."""

    def __init__(self, *, ids: ConsumedIds, hashes: np.ndarray):
        self.ids, self.hashes = ids, hashes
        n = self.hashes.shape[0]
        self.order = sort_order(self.hashes)
        self.sorted = self.hashes[self.order]
        self.held = np.zeros(n, dtype=bool)      # in sorted order
        self.spent = np.zeros(n, dtype=np.int64)
        self.holders = {}

    def add(self, holder: str, record: Record) -> None:
        rows = matches(record, self.sorted)
        found = rows >= 0
        if not found.any():
            return
        if self.ids.budgeted:
            if record.amount is None:
                raise ConsumedRecordError(f"the record of {holder} has no amounts")
            np.add.at(self.spent, np.flatnonzero(found), record.amount[rows[found]])
        else:
            self.held |= found
        self.holders[holder] = int(found.sum())

    def _unsorted(self, values: np.ndarray) -> np.ndarray:
        out = np.empty_like(values)
        out[self.order] = values
        return out

    def result(self) -> tuple[ConsumedResult, np.ndarray, Optional[np.ndarray]]:
        """(result, sorted hashes to record, their amounts)."""
        ids = self.ids
        if ids.budgeted:
            left = np.maximum(ids.limit - self.spent, 0)
            granted = np.minimum(ids.amounts[self.order], left)
            keep = granted > 0
            return (ConsumedResult(namespace=ids.namespace, held=np.zeros(len(ids), dtype=bool),
                                   granted=self._unsorted(granted), holders=dict(self.holders),
                                   recorded=int(keep.sum())),
                    self.sorted[keep], granted[keep])
        keep = ~self.held
        return (ConsumedResult(namespace=ids.namespace, held=self._unsorted(self.held),
                               holders=dict(self.holders), recorded=int(keep.sum())),
                self.sorted[keep], None)


def own_result(ids: ConsumedIds, hashes: np.ndarray, record: Record) -> ConsumedResult:
    """A re-run's decision, read from its own record: what it did not record was removed (held
    by others when it ran) and budgeted grants are what it recorded."""
    order = sort_order(hashes)
    rows = np.empty(hashes.shape[0], dtype=np.int64)
    rows[order] = matches(record, hashes[order])
    found = rows >= 0
    if ids.budgeted:
        granted = np.zeros(len(ids), dtype=np.int64)
        if record.amount is not None:
            granted[found] = record.amount[rows[found]]
        return ConsumedResult(namespace=ids.namespace, held=np.zeros(len(ids), dtype=bool),
                              granted=granted, recorded=len(record))
    return ConsumedResult(namespace=ids.namespace, held=~found, recorded=len(record))


def describe_holders(holders: Mapping[str, int], limit: int = 8) -> str:
    items = sorted(holders.items(), key=lambda kv: (-kv[1], kv[0]))
    text = ", ".join(f"{vid} ({n})" for vid, n in items[:limit])
    return text + (f" and {len(items) - limit} more releases" if len(items) > limit else "")

