"""Contribution bounding on Arrow tables, by keyed random priorities (pure: no Beam).

Each row gets three secret 64-bit values derived from the release key (AES PRF, see
:mod:`transforms.noise.prf`):

* ``__unit``: a hash of the privacy unit (groups a unit's rows; never the raw id);
* ``__pair``: a hash of (unit, key), which is also the key's priority within its unit;
* ``__row``: the row's priority, from the pair hash, the row's position in its batch and a tag of
  the batch's contents.

Bounding keeps, per unit, the L0 keys of smallest pair priority and, per (unit, key), the Linf
rows of smallest row priority. Because priorities are uniform and independent, the kept subset is
a uniformly random one (no bias towards first rows or small keys); because they are global, the
operation is *mergeable*: ``bound(concat(bound(A), bound(B))) == bound(A ∪ B)``. So each batch is
bounded before the shuffle (a unit with ten million rows never sits in memory: every batch sends
at most L0·Linf of its rows) and the partial results are re-bounded as they meet. The optional
total bound L1 (rows per unit) is not mergeable in that way and is applied once, after all of a
unit's partials have met.

Rows of one unit that are byte-identical within the same position of byte-identical batches share
a priority; with Parquet input, batches are row groups, so priorities (hence the kept rows) are
the same on every runner.
"""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from accounting.keys import ReleaseKey
from transforms.noise.encoding import encode_keys
from transforms.noise.prf import cbc_mac, mac_words

UNIT = "__unit"
PAIR = "__pair"
ROW = "__row"
VALUE = "__value"
INTERNAL = (UNIT, PAIR, ROW, VALUE)


def _distinct(table: pa.Table, columns: Sequence[str]):
    """Per row, a dense code of its values in ``columns``, and one representative row per code."""
    indices = [pc.dictionary_encode(table.column(c).combine_chunks()).indices.to_numpy(zero_copy_only=False)
               .astype(np.int64) for c in columns]
    sizes = [int(i.max()) + 1 if i.size else 1 for i in indices]
    if float(np.prod(sizes, dtype=np.float64)) < 2 ** 62:
        combined = np.zeros(table.num_rows, dtype=np.int64)
        for index, size in zip(indices, sizes):
            combined = combined * size + index
        _, first, codes = np.unique(combined, return_index=True, return_inverse=True)
    else:
        _, first, codes = np.unique(np.stack(indices, axis=1), axis=0, return_index=True,
                                    return_inverse=True)
    return codes.reshape(-1), first


def _keyed_hash(release_key: ReleaseKey, purpose: str, table: pa.Table, columns: Sequence[str]) -> np.ndarray:
    """PRF (AES CBC-MAC) of each row's values in ``columns``, computed once per distinct value."""
    codes, first = _distinct(table, columns)
    mac = cbc_mac(release_key.derive(purpose).secret_bytes(), encode_keys(table.select(list(columns)).take(first)))
    return mac_words(mac)[codes]


def prioritize(table: pa.Table, unit_column: str, key_columns: Sequence[str],
               release_key: ReleaseKey) -> pa.Table:
    """Add the secret ``__unit``, ``__pair`` and ``__row`` columns to a batch of rows."""
    n = table.num_rows
    unit_words = _keyed_hash(release_key, "bound:unit", table, [unit_column])
    pair_words = _keyed_hash(release_key, "bound:pair", table, [unit_column, *key_columns])
    # The batch tag separates identical rows in different batches; it depends only on content.
    tag = np.bitwise_xor.reduce(pair_words[:, 0] * np.uint64(0x9E3779B97F4A7C15)) if n else np.uint64(0)
    # Row priority: AES under its own sub-key of (pair seed XOR (position, tag)) -- one block per
    # row; distinct rows give distinct inputs except with probability ~2^-128 (seeds are secret).
    block = pair_words.copy()
    block[:, 0] ^= np.arange(n, dtype=np.uint64)
    block[:, 1] ^= tag ^ np.uint64(n)
    encryptor = Cipher(algorithms.AES(release_key.derive("bound:row").secret_bytes()), modes.ECB()).encryptor()
    row_words = np.frombuffer(encryptor.update(block.tobytes()), dtype=np.uint64).reshape(-1, 2)
    return table.append_column(UNIT, pa.array(unit_words[:, 0])) \
                .append_column(PAIR, pa.array(pair_words[:, 0])) \
                .append_column(ROW, pa.array(row_words[:, 0]))


def _group_starts(flags: np.ndarray) -> np.ndarray:
    """For each position, the index where its run (started where flags is True) begins."""
    idx = np.arange(flags.size)
    return np.maximum.accumulate(np.where(flags, idx, 0))


def bound(table: pa.Table, max_partitions: int, max_per_partition: int) -> pa.Table:
    """Keep at most ``max_partitions`` keys per unit and ``max_per_partition`` rows per key."""
    n = table.num_rows
    if n == 0:
        return table
    unit = table.column(UNIT).to_numpy()
    pair = table.column(PAIR).to_numpy()
    row = table.column(ROW).to_numpy()
    order = np.lexsort((row, pair, unit))
    unit, pair = unit[order], pair[order]
    new_unit = np.empty(n, dtype=bool)
    new_unit[0] = True
    new_unit[1:] = unit[1:] != unit[:-1]
    new_pair = new_unit.copy()
    new_pair[1:] |= pair[1:] != pair[:-1]
    row_rank = np.arange(n) - _group_starts(new_pair)
    pair_index = np.cumsum(new_pair) - 1
    pair_rank = pair_index - pair_index[_group_starts(new_unit)]
    keep = (row_rank < max_per_partition) & (pair_rank < max_partitions)
    if keep.all():
        return table.take(pa.array(order))
    return table.take(pa.array(order[keep]))


def bound_total(table: pa.Table, max_contributions: int) -> pa.Table:
    """Keep at most ``max_contributions`` rows per unit (smallest row priorities)."""
    n = table.num_rows
    if n == 0:
        return table
    unit = table.column(UNIT).to_numpy()
    order = np.lexsort((table.column(ROW).to_numpy(), unit))
    unit = unit[order]
    new_unit = np.empty(n, dtype=bool)
    new_unit[0] = True
    new_unit[1:] = unit[1:] != unit[:-1]
    keep = (np.arange(n) - _group_starts(new_unit)) < max_contributions
    return table.take(pa.array(order[keep]))


class BoundedRows:
    """Accumulates bounded batches of rows, re-bounding them as they grow.

    Re-bounding happens when the held rows double since the last time, so its cost is amortised
    O(n log n) and the memory held is at most about twice the bounded data of the units seen.
    """

    def __init__(self, max_partitions: int, max_per_partition: int, min_rows: int = 200_000):
        self._l0, self._linf, self._min_rows = max_partitions, max_per_partition, min_rows
        self._tables, self._rows, self._after_last = [], 0, 0

    @property
    def rows(self) -> int:
        return self._rows

    def add(self, table: pa.Table) -> None:
        self._tables.append(table)
        self._rows += table.num_rows
        if self._rows > max(self._min_rows, 2 * self._after_last):
            self._compact()

    def _compact(self) -> None:
        table = pa.concat_tables(self._tables, promote_options="permissive") \
            if len(self._tables) > 1 else self._tables[0]
        bounded = bound(table, self._l0, self._linf)
        self._tables, self._rows, self._after_last = [bounded], bounded.num_rows, bounded.num_rows

    def result(self) -> Optional[pa.Table]:
        if not self._tables:
            return None
        self._compact()
        return self._tables[0]
