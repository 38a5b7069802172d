"""A PCollection keyset staged as files instead of crossing the shuffle or a side input.

The release stage joins each key shard's summed partials with the shard's keyset keys
(:mod:`transforms.release`), and bounding drops rows outside the keyset through a filter of its
key hashes (:mod:`transforms.membership`). By default the keys reach their shard through the
join's GroupByKey and the filter reaches every worker as a side input. Engines that hold a
shuffle in memory (the in-process FnApiRunner buffers every grouped value, then copies them again
when it hands them out; a cluster's worker holds its partitions' share) then hold the whole
keyset twice (about 40 bytes per key), and the in-process engine holds about four copies of the
side input.

With ``PublicKeyset.from_pcollection(..., staging_dir=D)`` the keyset gets its own directory
``D/keyset-<run>`` (``PublicKeyset.staging_run``). Each keyset element's keys (after exclusions)
are split by key shard and written as one file of consecutive Arrow IPC streams, one per shard;
only markers cross the shuffle (tables of the file, offset and length of pieces, one row per
piece, merged per shard before the shuffle: :func:`merge_markers`), and each release shard reads
its pieces back. The filter is written once as a
file of its words, which local workers memory-map (one copy in the page cache, shared by every
process) and others read once per process; only its path is a side input.

What the directory must be: readable and writable by every worker, through Beam's
``FileSystems`` (a local path for the in-process engine or a local cluster; a shared
filesystem or an object store path elsewhere). The keyset is public, so its files are public:
the directory needs no secrecy, only room for the keyset (about its Arrow size plus 2 bytes per
key). Files are written once and never changed; the pipeline does not delete them (a release
shard may be re-run by an engine, and must then find its pieces): remove ``staging_run`` when
the pipeline has finished.

Staging changes no released byte: the same keys reach the same shard (by the public routing
hash), the filter is the same bytes, and every released table is sorted by its keys.
"""
from __future__ import annotations

import posixpath
import uuid

import pyarrow as pa

#: A marker's schema: one row per staged piece (its file, offset and length), and the metadata
#: that tells a marker from a table of keys.
MARKER_SCHEMA = pa.schema([("path", pa.string()), ("offset", pa.int64()), ("length", pa.int64())],
                          metadata={b"beam_dp.staged_keyset_marker": b"1"})


def run_directory(staging_dir: str) -> str:
    """A new directory name under ``staging_dir`` for one keyset's staged files."""
    return _join(staging_dir, f"keyset-{uuid.uuid4().hex}")


def _join(base: str, *parts: str) -> str:
    from apache_beam.io.filesystems import FileSystems
    return FileSystems.join(base, *parts) if "://" in base else posixpath.join(base, *parts)


def _write(path: str, data) -> None:
    from apache_beam.io.filesystems import FileSystems
    with FileSystems.create(path) as handle:
        handle.write(data)


def write_pieces(run_dir: str, pieces) -> list:
    """Write one keyset element's shard pieces (``(shard, keys)`` pairs) as one file of Arrow IPC
    streams; return ``(shard, marker)`` pairs (a marker: a one-row table of
    :data:`MARKER_SCHEMA` naming the file, offset and length of the shard's piece)."""
    pieces = list(pieces)
    if not pieces:
        return []
    path = _join(run_dir, f"keys-{uuid.uuid4().hex}.arrow")
    sink = pa.BufferOutputStream()
    places = []
    for shard, keys in pieces:
        offset = sink.tell()
        with pa.ipc.new_stream(sink, keys.schema) as writer:
            writer.write_table(keys)
        places.append((shard, offset, sink.tell() - offset))
    _write(path, sink.getvalue())
    return [(shard, pa.table([[path], [offset], [length]], schema=MARKER_SCHEMA))
            for shard, offset, length in places]


def is_marker(table) -> bool:
    """Whether ``table`` is a marker of staged pieces (else a table of keys)."""
    return table.schema.metadata == MARKER_SCHEMA.metadata


def merge_markers(markers) -> pa.Table:
    """One marker of every piece the ``markers`` name, ordered by file and offset (the order
    pieces are read in; not an output order: a release shard's table is sorted by its keys).
    The staged keyset's markers are merged per shard before the shuffle: an element writes one
    piece per shard, so a large keyset in many elements would send one small Arrow table per
    piece through the shuffle, each pickled and moved on its own before the release shards can
    start; merged, one per shard and bundle (benchmarks/RESULTS.md has the measurement)."""
    merged = pa.concat_tables([MARKER_SCHEMA.empty_table(), *markers])
    return merged.sort_by([("path", "ascending"), ("offset", "ascending")]).combine_chunks()


class PieceReader:
    """Reads staged pieces, keeping the files it opened open (a shard reads one piece of many
    files, and the next shard the next piece of the same files). Close it when done."""

    def __init__(self, max_open: int = 512):
        self._open, self._max_open = {}, max_open

    def _handle(self, path: str):
        from apache_beam.io.filesystems import FileSystems

        handle = self._open.get(path)
        if handle is None:
            if len(self._open) >= self._max_open:
                self.close()
            try:
                handle = FileSystems.open(path, compression_type="uncompressed")
            except Exception as err:  # noqa: BLE001 (each filesystem has its own "not found")
                raise FileNotFoundError(
                    f"staged keyset file {path} cannot be read ({type(err).__name__}): the staging "
                    "directory must be shared by every worker and kept until the pipeline has "
                    "finished (see transforms.keyset_staging)") from None
            self._open[path] = handle
        return handle

    def read(self, markers) -> list:
        """The keys of each piece the markers name (one table each), in the markers' order.

        Synchronous IPC reads: the tables own the Python bytes read, and no Arrow thread keeps a
        reference to them (compare pipelines.release.arrow_files)."""
        tables = []
        for marker in markers:
            for path, offset, length in zip(*(marker.column(name).to_pylist()
                                              for name in MARKER_SCHEMA.names)):
                handle = self._handle(path)
                handle.seek(offset)
                tables.append(pa.ipc.open_stream(pa.py_buffer(handle.read(length))).read_all())
        return tables

    def close(self) -> None:
        handles, self._open = list(self._open.values()), {}
        for handle in handles:
            handle.close()


def stage_filter(filter_bytes: bytes, run_dir: str) -> str:
    """Write a membership filter's bytes under ``run_dir``; return the file's path (what the
    bounding step gets as a side input instead of the bytes)."""
    path = _join(run_dir, f"filter-{uuid.uuid4().hex}.u64")
    _write(path, filter_bytes)
    return path


def load_filter(path: str):
    """A staged filter: memory-mapped (read-only) from a local file, else read once."""
    import numpy as np

    from transforms.membership import KeyFilter

    if "://" not in path:
        return KeyFilter(np.memmap(path, dtype="<u8", mode="r"))
    from apache_beam.io.filesystems import FileSystems
    with FileSystems.open(path, compression_type="uncompressed") as handle:
        return KeyFilter.from_bytes(handle.read())
