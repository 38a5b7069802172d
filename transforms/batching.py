"""Batches for vectorised DoFns from a shuffle on a content-derived shard.

``beam.BatchElements`` emits its last batch in ``finish_bundle``, which Beam's DaskRunner drops
(runners/README.md, "Dask"): a job batching with it loses elements there without an error.
:class:`ShardedBatches` groups elements by a shard of a key taken from the element itself
(CRC-32 of the key's ``repr``: the same in every process and on every runner) and cuts each
shard's values into lists of at most ``batch_size`` as they are read, so memory stays bounded
however large a shard is. Which elements share a batch depends on the data and the runner's
grouping order; DoFns fed this way must not depend on it (keyed randomness per element,
per-element results), as with ``BatchElements``.
"""
from __future__ import annotations

import zlib
from typing import Callable

import apache_beam as beam


def shard_of_key(key, shards: int) -> int:
    """The shard of ``key`` (a str, int or tuple of them): CRC-32 of its ``repr`` mod ``shards``."""
    return zlib.crc32(repr(key).encode("utf-8")) % shards


def _batches(element, batch_size: int):
    _, values = element
    batch = []
    for value in values:
        batch.append(value)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


class ShardedBatches(beam.PTransform):
    """Elements -> lists of at most ``batch_size`` elements, grouped by ``shards`` shards of
    ``key(element)``."""

    def __init__(self, key: Callable, *, shards: int, batch_size: int, label: str = None):
        super().__init__(label)
        if shards < 1 or batch_size < 1:
            raise ValueError("shards and batch_size must be at least 1")
        self._key, self._shards, self._batch_size = key, int(shards), int(batch_size)

    def expand(self, pcoll):
        key, shards = self._key, self._shards
        return (pcoll
                | "Shard" >> beam.Map(lambda element: (shard_of_key(key(element), shards), element))
                | "ByShard" >> beam.GroupByKey()
                | "Batches" >> beam.FlatMap(_batches, self._batch_size))
