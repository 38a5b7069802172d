"""A job's inputs: resolved once, checked before any charge, read into Arrow tables.

:func:`resolve` is the one definition of "the input files" of a run: the same sorted list is
hashed into the input digest the release's keys are bound to, and read by the pipeline. A local
path may be a file, a glob (relative globs are made absolute, so they work with every runner) or
a folder (every file below it, recursively); a ``gs://`` path may be an object, a glob or a
prefix ending in ``/``. Below a folder, a prefix or a glob's fixed part, names starting with ``.``
or ``_`` (``_SUCCESS``, ``_temporary/``, ``.hidden``) are skipped.

:func:`preflight` checks every resolved file before the ledger is touched: it opens; its format
is known (from the input's declared format or the file name: ``.parquet``/``.pq``, ``.csv``,
``.jsonl``/``.ndjson``); compression is detected from the first bytes and accepted only when the
name says so (``.csv.gz``, ``.jsonl.bz2``, ``.zst``), otherwise refused by name; a CSV header has
every required column, spelled exactly, and an uncompressed CSV's last line is whole (a file
that does not end with a line break, or whose last row is short, is a truncated copy: refused);
a Parquet file's footer reads and its columns have usable types (a ``bool`` count or an ``int64``
date is refused); a release key file (the key store's format) is refused by name, whatever its
declared format. Messages name the file and the column, never file content (a wrong file's first
line may be a secret). Faults of the *file* that only a full read can find (a corrupt page --
Parquet pages are verified against their checksums, :mod:`transforms.parquet_files` --, a
compressed stream cut short) fail the run after its reservation; nothing is published and a
corrected re-run takes the reservation over (see :mod:`pipelines.release`).

Faults of *one row* never fail or refuse a run (one row must not decide whether a release is
published: pipelines/release/__init__.py, "Publication decisions"). A CSV line whose fields do
not parse as CSV (too many or too few) is a malformed line: dropped and counted
(``dropped.malformed_csv_line``). A value whose bytes are not UTF-8 is read as a *missing*
value -- what an empty field is -- and counted (``values_not_utf8``), the bytes never shown; the
job's own rule for a missing value then applies to its row, as its neighbouring relation
requires: most jobs drop and count such a row, label_dp keeps it with a uniform label, Masked
LARk shares it neutralised -- dropping every such row here would let one value decide whether a
row exists where the relation holds the rows public. Text is checked per batch in one C++ pass
per column; only a column that fails it is checked value by value, still vectorised
(:func:`utf8_valid_mask`, numpy over the batch's bytes). A header that is not UTF-8 is a fault of
the file, refused in preflight. What ``Job.consumes`` scans before the charge
(:func:`pipelines.release.consumption.read_columns`) reads the same way.

:class:`ReadInput` reads the files in the pipeline: CSV columns as text (only an empty field is
missing: Arrow's default null markers include "NA", which is Namibia), Parquet by row group,
JSON lines as one ``line`` column; rows read, malformed CSV lines and files without a row
(``read_files_without_rows``: header-only or empty) are row counters (pipelines.release.counters).
"""
from __future__ import annotations

import contextlib
import fnmatch
import glob
import io
import os
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

import apache_beam as beam

from accounting import gcs
from pipelines.release import storage, textfiles
from pipelines.release.counters import RowCounters
from transforms.counting import Counted, CountingDoFn
from pipelines.release.errors import ReleaseRefused

FORMATS = ("csv", "parquet", "jsonl")
#: Column kinds an input can declare, and the Arrow types a Parquet column of that kind may have.
KINDS = ("text", "number", "integer", "date", "id", "any")
_COMPRESSION_MAGIC = {b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\x28\xb5\x2f\xfd": "zstd",
                      b"PK\x03\x04": "zip", b"\xfd7zXZ": "xz"}
_COMPRESSION_SUFFIX = {"gzip": (".gz", ".gzip"), "bzip2": (".bz2",), "zstd": (".zst", ".zstd"),
                       "xz": (".xz",)}


@dataclass(frozen=True, kw_only=True)
class InputSpec:
    """One input of a job: where it is, its format, and the columns (name -> kind) it must have.

    ``optional`` columns are read when present and checked for type; where a file lacks one, its
    tables carry it as a column of Arrow's ``null`` type, so a job can tell "absent" from "present
    but empty" (an empty CSV field is a null *string*). ``flag``: the command-line
    flag that gave the paths (for messages).
    """

    name: str
    paths: Sequence[str]
    columns: Mapping[str, str]
    optional: Mapping[str, str] = field(default_factory=dict)
    format: Optional[str] = None
    flag: Optional[str] = None

    def __post_init__(self):
        paths = (self.paths,) if isinstance(self.paths, str) else tuple(self.paths)
        if not paths or not all(isinstance(p, str) and p for p in paths):
            raise ReleaseRefused(f"{self.label}: give at least one input path")
        object.__setattr__(self, "paths", paths)
        if self.format is not None and self.format not in FORMATS:
            raise ValueError(f"{self.label}: format must be one of {FORMATS}, got {self.format!r}")
        for column, kind in {**self.columns, **self.optional}.items():
            if kind not in KINDS:
                raise ValueError(f"{self.label}: column {column!r} has unknown kind {kind!r}")

    @property
    def label(self) -> str:
        return self.flag or f"--{self.name}"

    @property
    def all_columns(self) -> list[str]:
        return list(self.columns) + [c for c in self.optional if c not in self.columns]


@dataclass(frozen=True, kw_only=True)
class ResolvedInput:
    """An input's files, format of each, and the columns each actually has (after preflight)."""

    spec: InputSpec
    files: tuple[str, ...]
    formats: Mapping[str, str]
    compression: Mapping[str, Optional[str]]
    present: Mapping[str, tuple[str, ...]]


class _Decompressed(io.RawIOBase):
    """Beam's ``CompressedFile`` as a standard binary stream: it has no ``readline(size)``,
    no line iteration, and its ``closed`` is a method (always true as an attribute), so neither
    Python's line reading nor pyarrow can use it directly."""

    def __init__(self, handle):
        super().__init__()
        self._handle = handle

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        data = self._handle.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._handle.close()
        super().close()


@contextlib.contextmanager
def open_input(path: str, compression: Optional[str] = None):
    """A binary stream of an input file's content, decompressed as preflight detected it (never
    guessed from the name again: ``.gzip`` is gzip too)."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    if compression is None:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            yield handle
        return
    beam_type = {"gzip": CompressionTypes.GZIP, "bzip2": CompressionTypes.BZIP2,
                 "zstd": CompressionTypes.ZSTD, "xz": CompressionTypes.LZMA}[compression]
    with io.BufferedReader(_Decompressed(FileSystems.open(path, compression_type=beam_type)),
                           buffer_size=1 << 20) as stream:
        yield stream


# --------------------------------------------------------------------------- resolve

def _visible(path: str, base: str) -> bool:
    """No name below ``base`` (the part of the pattern without wildcards) starts with ``.`` or
    ``_``: hidden files, ``_SUCCESS`` markers and the ``_temporary`` folders of unfinished
    writers are never read (their rows would count twice), whether a folder or a wildcard
    reached them. A name spelled out in the pattern itself is read."""
    rest = path[len(base):] if path.startswith(base) else path.rsplit("/", 1)[-1]
    return not any(part.startswith((".", "_")) for part in rest.replace("\\", "/").split("/"))


def _fixed_part(pattern: str) -> str:
    """The folder part of a glob before its first wildcard (with a trailing ``/``)."""
    head = pattern[:min(pattern.index(ch) for ch in "*?[" if ch in pattern)]
    return head[:head.rfind("/") + 1]


def _resolve_one(pattern: str) -> list[str]:
    if gcs.is_gcs(pattern):
        if any(ch in pattern for ch in "*?["):
            base = _fixed_part(pattern)
            found = [u for u in gcs.list_objects(base) if fnmatch.fnmatchcase(u, pattern)]
        elif pattern.endswith("/"):
            base, found = pattern, gcs.list_objects(pattern)
        else:
            return [pattern] if storage.exists(pattern) else []
        return [f for f in found if _visible(f, base)]
    path = storage.absolute(pattern)
    if any(ch in path for ch in "*?["):
        base = _fixed_part(path)
        return sorted(p for p in glob.glob(path, recursive=True)
                      if os.path.isfile(p) and _visible(p, base))
    if os.path.isdir(path):
        base = path.rstrip(os.sep) + os.sep
        out = []
        for root, dirs, files in os.walk(path):
            dirs[:] = [d for d in dirs if not d.startswith((".", "_"))]
            out.extend(os.path.join(root, f) for f in files)
        return sorted(p for p in out if _visible(p, base))
    return [path] if os.path.isfile(path) else []


def resolve(spec: InputSpec) -> list[str]:
    """The input's files (sorted, distinct); refuses a pattern that matches nothing."""
    files = []
    for pattern in spec.paths:
        found = _resolve_one(pattern)
        if not found:
            raise ReleaseRefused(f"{spec.label}: {pattern!r} matches no file")
        files.extend(found)
    return sorted(set(files))


# --------------------------------------------------------------------------- preflight

def _format_of(spec: InputSpec, path: str, compression: Optional[str]) -> str:
    if spec.format:
        return spec.format
    name = path.lower()
    if compression:
        for suffix in _COMPRESSION_SUFFIX[compression]:
            if name.endswith(suffix):
                name = name[: -len(suffix)]
    if name.endswith((".parquet", ".pq")):
        return "parquet"
    if name.endswith(".csv"):
        return "csv"
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    raise ReleaseRefused(f"{spec.label}: cannot tell the format of {path} from its name "
                         "(use .parquet, .csv or .jsonl, or give the input's format)")


def _compression_of(spec: InputSpec, path: str, head: bytes) -> Optional[str]:
    kind = next((k for magic, k in _COMPRESSION_MAGIC.items() if head.startswith(magic)), None)
    if kind is None:
        return None
    if kind == "zip" or not path.lower().endswith(_COMPRESSION_SUFFIX.get(kind, ())):
        raise ReleaseRefused(f"{spec.label}: {path} is {kind}-compressed but its name does not say "
                             f"so; decompress it, or name it with "
                             f"{' or '.join(_COMPRESSION_SUFFIX.get(kind, ('(unsupported)',)))}")
    return kind


def _parquet_type_ok(kind: str, typ) -> bool:
    import pyarrow as pa

    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    if kind == "any" or pa.types.is_null(typ):
        return True
    if kind == "text":
        return pa.types.is_string(typ) or pa.types.is_large_string(typ)
    if kind == "integer":
        return pa.types.is_integer(typ)
    if kind == "number":
        return pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ)
    if kind == "date":
        return pa.types.is_date(typ) or pa.types.is_timestamp(typ) or pa.types.is_string(typ) \
            or pa.types.is_large_string(typ)
    if kind == "id":
        from transforms.privacy_units import UnitIdError, check_unit_type

        try:
            check_unit_type(typ, "id")
            return True
        except UnitIdError:
            return False
    raise AssertionError(kind)


def _header_columns(spec: InputSpec, path: str, compression: Optional[str]) -> list[str]:
    import csv

    with open_input(path, compression) as handle:
        raw = handle.readline(1 << 16)
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ReleaseRefused(f"{spec.label}: {path} does not start with a UTF-8 CSV header")
    return next(csv.reader(io.StringIO(text)), [])


def _last_line(path: str) -> tuple[bytes, bool]:
    """The last line of an uncompressed file (at most its last MiB) and whether the file ends
    with a line break."""
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
        handle.seek(0, os.SEEK_END)
        size = handle.tell()
        handle.seek(max(0, size - (1 << 20)))
        tail = handle.read()
    ends = tail.endswith(b"\n")
    body = tail.rstrip(b"\r\n")
    return body[body.rfind(b"\n") + 1:], ends


def _check_complete(spec: InputSpec, path: str, header: Sequence[str]) -> None:
    """Refuse a CSV whose last line is cut (a truncated copy): one that does not end with a line
    break, or whose last row has fewer fields than the header. Never quotes the line."""
    import csv

    line, ends = _last_line(path)
    if not ends:
        raise ReleaseRefused(f"{spec.label}: {path} does not end with a line break: its last line "
                             "may be cut (a truncated copy?). Refusing it; nothing was charged")
    if line.count(b'"') % 2:  # a quoted field spans lines: the last line alone says nothing
        return
    fields = next(csv.reader([line.decode("utf-8", errors="replace")]), [])
    if line.strip() and len(fields) < len(header):
        raise ReleaseRefused(f"{spec.label}: {path}: its last row has {len(fields)} of the "
                             f"header's {len(header)} fields: the file may be cut (a truncated "
                             "copy?). Refusing it; nothing was charged")


def _check_unique(spec: InputSpec, path: str, names: Sequence[str]) -> None:
    """Refuse a header (or Parquet schema) that names a column twice: which of the two a reader
    takes differs between readers, and the row would be read differently on another runner."""
    seen = set()
    for position, name in enumerate(names, 1):
        if name in seen and name != "":
            raise ReleaseRefused(f"{spec.label}: {path}: column {name!r} is named twice (again "
                                 f"as field {position}); each column must be named once. "
                                 "Nothing was charged")
        seen.add(name)


def _check_csv(spec: InputSpec, path: str, compression: Optional[str]) -> tuple[str, ...]:
    header = _header_columns(spec, path, compression)
    _check_unique(spec, path, header)
    for position, name in enumerate(header, 1):
        if name != name.strip() and name.strip() in spec.all_columns:
            raise ReleaseRefused(f"{spec.label}: {path}: header field {position} is column "
                                 f"{name.strip()!r} with surrounding spaces; the header must "
                                 "name columns exactly")
    missing = [c for c in spec.columns if c not in header]
    if missing:
        raise ReleaseRefused(f"{spec.label}: {path} has no column {missing[0]!r} in its header "
                             f"(the header has {len(header)} field(s); required: "
                             f"{sorted(spec.columns)})")
    if compression is None:  # a cut compressed stream fails its decompression instead
        _check_complete(spec, path, header)
    return tuple(header)


def _check_parquet(spec: InputSpec, path: str) -> tuple[str, ...]:
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    from transforms import parquet_files

    try:
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            schema = parquet_files.open_file(handle).schema_arrow
    except Exception:  # noqa: BLE001 -- any footer fault: the file is not readable Parquet
        raise ReleaseRefused(f"{spec.label}: {path} is not a readable Parquet file (bad footer)")
    names = schema.names
    _check_unique(spec, path, names)
    missing = [c for c in spec.columns if c not in names]
    if missing:
        raise ReleaseRefused(f"{spec.label}: {path} has no column {missing[0]!r} (columns: {names})")
    for column, kind in {**spec.columns, **spec.optional}.items():
        if column in names and not _parquet_type_ok(kind, schema.field(column).type):
            raise ReleaseRefused(f"{spec.label}: {path}: column {column!r} has type "
                                 f"{schema.field(column).type}, not a usable {kind} column")
    return tuple(names)


def _check_jsonl(spec: InputSpec, path: str, compression: Optional[str]) -> tuple[str, ...]:
    import json

    with open_input(path, compression) as handle:
        first = handle.readline(1 << 20)
    if not first.strip():
        return ("line",)
    try:
        value = json.loads(first)
    except ValueError:
        raise ReleaseRefused(f"{spec.label}: {path}: the first line is not JSON")
    if not isinstance(value, dict):
        raise ReleaseRefused(f"{spec.label}: {path}: the first line is not a JSON object")
    return ("line",)


def preflight(spec: InputSpec) -> ResolvedInput:
    """Resolve and check one input (see the module docstring); raises ReleaseRefused."""
    files = resolve(spec)
    formats, compression, present = {}, {}, {}
    for path in files:
        try:
            head = storage.read_head(path, textfiles.KEY_PROBE_BYTES)
        except (OSError, IOError):
            raise ReleaseRefused(f"{spec.label}: {path} cannot be opened")
        if head is None:
            raise ReleaseRefused(f"{spec.label}: {path} cannot be opened")
        if textfiles.is_key_file(head):
            raise ReleaseRefused(f"{spec.label}: {path} is {textfiles.KEY_FILE_REASON}")
        kind = None if head.startswith(b"PAR1") else _compression_of(spec, path, head)
        fmt = _format_of(spec, path, kind)
        if fmt == "parquet":
            if kind:
                raise ReleaseRefused(f"{spec.label}: {path}: a compressed Parquet file; Parquet "
                                     "compresses its pages itself, give the .parquet file")
            present[path] = _check_parquet(spec, path)
        elif fmt == "csv":
            present[path] = _check_csv(spec, path, kind)
        else:
            present[path] = _check_jsonl(spec, path, kind)
        formats[path], compression[path] = fmt, kind
    return ResolvedInput(spec=spec, files=tuple(files), formats=formats, compression=compression,
                         present=present)


# --------------------------------------------------------------------------- read

class InputReadError(RuntimeError):
    """A preflighted file failed while being read in full (a fault only a full read finds).
    Its message names the input and the file only, so it may be shown to the operator."""


class _ReadFile(CountingDoFn):
    """One file -> Arrow tables of the input's columns (CSV as text), counting rows read."""

    def __init__(self, resolved: ResolvedInput, job: str):
        self._resolved = resolved
        self._job = job

    def setup(self):
        self._counters = RowCounters(self._job, self._resolved.spec.name)

    def process(self, path: str):
        import pyarrow as pa

        fmt = self._resolved.formats[path]
        spec = self._resolved.spec
        present = self._resolved.present[path]
        columns = [c for c in spec.all_columns if c in present] if fmt != "jsonl" else ["line"]
        tables = _read_tables(path, fmt, columns, self._resolved.compression[path], self._counters)
        rows = 0
        while True:
            try:  # only the reading: a fault downstream of ``yield`` is not this file's
                table = next(tables)
            except StopIteration:
                break
            except Exception as err:  # noqa: BLE001 -- name the file, never its content
                from transforms.parquet_files import is_checksum_error

                if is_checksum_error(err):
                    raise InputReadError(f"{spec.label}: {path} could not be read in full (a "
                                         "Parquet page failed its checksum: the file is "
                                         "corrupt)") from None
                raise InputReadError(f"{spec.label}: {path} could not be read in full "
                                     f"({type(err).__name__}: a corrupt page or block, invalid "
                                     "UTF-8 or a truncated file?)") from None
            missing = [c for c in spec.optional if c not in table.column_names]
            for column in missing:  # absent: Arrow's null type (an empty CSV field is text)
                table = table.append_column(column, pa.nulls(table.num_rows, pa.null()))
            self._counters.read(table.num_rows)
            rows += table.num_rows
            if table.num_rows:
                yield table
        # A file without a row (header-only, empty): detected for the operator.
        self._counters.other("read_files_without_rows", rows == 0)


def _read_tables(path: str, fmt: str, columns: Sequence[str], compression, counters):
    import pyarrow as pa
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    if fmt == "parquet":
        from transforms import parquet_files

        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            parquet = parquet_files.open_file(handle)
            for group in range(parquet.num_row_groups):
                yield parquet.read_row_group(group, columns=list(columns), use_threads=False)
        return
    if fmt == "jsonl":
        with open_input(path, compression) as handle:
            lines = []
            for raw in handle:
                text = raw.decode("utf-8", errors="replace").strip()
                if text:
                    lines.append(text)
                if len(lines) >= 65536:
                    yield pa.table({"line": pa.array(lines, pa.string())})
                    lines = []
            if lines:
                yield pa.table({"line": pa.array(lines, pa.string())})
        return
    from pyarrow import csv as pacsv

    malformed = []
    options = pacsv.ParseOptions(invalid_row_handler=lambda row: malformed.append(1) or "skip")
    # UTF-8 is checked per value below (check_utf8=True fails the whole file on one value).
    convert = pacsv.ConvertOptions(include_columns=list(columns),
                                   column_types={c: pa.string() for c in columns},
                                   null_values=[""], strings_can_be_null=True, check_utf8=False)
    with open_input(path, compression) as handle:
        reader = pacsv.open_csv(handle, parse_options=options, convert_options=convert,
                                read_options=pacsv.ReadOptions(block_size=8 << 20,
                                                               use_threads=False))
        not_utf8 = 0
        for batch in reader:
            table, count = text_not_utf8_as_missing(pa.Table.from_batches([batch]))
            not_utf8 += count
            yield table
    counters.dropped("malformed_csv_line", len(malformed))
    counters.other("values_not_utf8", not_utf8)


def text_not_utf8_as_missing(table):
    """(``table`` with every string value whose bytes are not UTF-8 made missing, how many): a
    value of the CSV reader's (check_utf8=False) is then what an empty field is, and the job's
    rule for a missing value applies to its row. One C++ pass per column
    (``validate(full=True)``); only a column that fails it is checked value by value, still
    vectorised (:func:`utf8_valid_mask`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    count = 0
    for index, column in enumerate(table.columns):
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            continue
        chunks, changed = [], False
        for chunk in column.chunks:
            try:
                chunk.validate(full=True)
            except pa.ArrowInvalid:  # its message names an index, never the bytes
                valid = utf8_valid_mask(chunk)  # nulls are valid
                count += int(len(valid) - valid.sum())
                chunk = pc.if_else(pa.array(valid), chunk, pa.scalar(None, chunk.type))
                changed = True
            chunks.append(chunk)
        if changed:
            table = table.set_column(index, table.field(index),
                                     pa.chunked_array(chunks, column.type))
    return table, count


def utf8_valid_mask(array):
    """Per value of a string array: True when its bytes are well-formed UTF-8 (RFC 3629: no
    overlong forms, no surrogates, nothing above U+10FFFF, no sequence cut by the value's end);
    nulls are valid. Vectorised over the array's data buffer with numpy (no loop over values):
    every byte's class is computed at once, a continuation byte must be required by a lead
    byte one to three positions before it in the same value and vice versa, and a value is
    valid when none of its bytes is flagged."""
    import numpy as np
    import pyarrow as pa

    n = len(array)
    if n == 0:
        return np.ones(0, dtype=bool)
    wide = pa.types.is_large_string(array.type)
    _, offsets_buffer, data_buffer = array.buffers()
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64 if wide else np.int32)
    offsets = offsets[array.offset:array.offset + n + 1].astype(np.int64)
    start = int(offsets[0])
    data = (np.frombuffer(data_buffer, dtype=np.uint8)[start:int(offsets[-1])]
            if data_buffer is not None else np.zeros(0, dtype=np.uint8))
    ends = offsets[1:] - start
    lengths = np.diff(offsets)
    if data.size == 0:
        return np.ones(n, dtype=bool)
    row = np.repeat(np.arange(n, dtype=np.int64), lengths)
    # Sequence length announced by each byte (0: a continuation or a byte never allowed).
    size = np.zeros(data.size, dtype=np.int8)
    size[data < 0x80] = 1
    size[(data >= 0xC2) & (data <= 0xDF)] = 2
    size[(data >= 0xE0) & (data <= 0xEF)] = 3
    size[(data >= 0xF0) & (data <= 0xF4)] = 4
    continuation = (data & 0xC0) == 0x80
    bad = (size == 0) & ~continuation  # C0, C1, F5..FF
    required = np.zeros(data.size, dtype=bool)
    for k in (1, 2, 3):  # byte i continues the lead byte i - k of the same value
        required[k:] |= (size[:-k] > k) & (row[:-k] == row[k:])
    bad |= continuation != required
    lead = np.nonzero(size > 1)[0]
    bad[lead] |= lead + size[lead] > ends[row[lead]]  # cut by the value's end
    second = np.append(data[1:], np.uint8(0x80))
    bad |= (((data == 0xE0) & (second < 0xA0)) | ((data == 0xED) & (second > 0x9F))
            | ((data == 0xF0) & (second < 0x90)) | ((data == 0xF4) & (second > 0x8F)))
    valid = np.bincount(row[bad], minlength=n) == 0
    if array.null_count:
        valid |= ~np.asarray(array.is_valid())
    return valid


class ReadInput(beam.PTransform):
    """The files of a preflighted input -> PCollection of Arrow tables of its columns."""

    def __init__(self, resolved: ResolvedInput, job: str):
        super().__init__()
        self._resolved = resolved
        self._job = job

    def expand(self, pbegin):
        return (pbegin
                | "Files" >> beam.Create(list(self._resolved.files))
                | "Spread" >> beam.Reshuffle()
                | "Read" >> Counted(_ReadFile(self._resolved, self._job)))
