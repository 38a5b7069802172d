"""Canonical encoding of output keys: the bytes a key is known by to the PRF and to routing.

A key is a tuple of components (a scalar key is the 1-tuple of itself). Each component is
written with a one-byte type tag and a fixed-width or length-prefixed body, so the encoding is
injective: two keys share bytes only if they are equal component by component and type by type.
Python values (:func:`encode_key`) and Arrow key columns (:func:`encode_keys`, vectorised column
by column in Arrow and numpy) give the same bytes; so do the PRF's fast paths, which write them
as numpy words (:class:`WindowedKeys`) or byte matrices (:func:`encode_keys_matrix`,
:func:`encode_keys_layouts`) rather than Arrow binary arrays.

Tags: ``N`` null, ``B`` boolean, ``I`` integer (sign byte and 16-byte big-endian magnitude),
``F`` float64 (big-endian IEEE; -0.0 as 0.0; NaN refused), ``S`` text (UTF-8), ``Y`` bytes,
``D`` date and ``E`` datetime (ISO text), each variable-length body with a 4-byte length; a key
is ``T``, its component count (4 bytes), then its components.
"""
from __future__ import annotations

import datetime as _dt
import math
import numbers
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

_U64 = np.uint64


def _encode_component(value, out: bytearray) -> None:
    if value is None:
        out += b"N"
    elif isinstance(value, (bool, np.bool_)):
        out += b"B" + (b"\x01" if value else b"\x00")
    elif isinstance(value, numbers.Integral):
        value = int(value)
        magnitude = -value if value < 0 else value
        if magnitude >= 1 << 128:
            raise ValueError(f"integer key component {value} is wider than 128 bits")
        out += b"I" + (b"\x01" if value < 0 else b"\x00") + magnitude.to_bytes(16, "big")
    elif isinstance(value, numbers.Real):
        value = float(value)
        if math.isnan(value):
            raise ValueError("a key component must not be NaN")
        out += b"F" + np.array([value + 0.0], dtype=">f8").tobytes()
    elif isinstance(value, str):
        raw = value.encode("utf-8")
        out += b"S" + len(raw).to_bytes(4, "big") + raw
    elif isinstance(value, (bytes, bytearray, memoryview)):
        raw = bytes(value)
        out += b"Y" + len(raw).to_bytes(4, "big") + raw
    elif isinstance(value, _dt.datetime):
        raw = value.isoformat().encode()
        out += b"E" + len(raw).to_bytes(4, "big") + raw
    elif isinstance(value, _dt.date):
        raw = value.isoformat().encode()
        out += b"D" + len(raw).to_bytes(4, "big") + raw
    else:
        raise TypeError(f"unsupported key component type {type(value).__name__}")


def encode_key(key) -> bytes:
    """Canonical bytes of one key; a scalar is the 1-tuple of itself."""
    parts = key if isinstance(key, tuple) else (key,)
    out = bytearray(b"T" + len(parts).to_bytes(4, "big"))
    for part in parts:
        _encode_component(part, out)
    return bytes(out)


def binary_rows(matrix: np.ndarray) -> pa.Array:
    """Rows of a (n, w) uint8 matrix as an Arrow large_binary array."""
    n, width = matrix.shape
    buffer = pa.py_buffer(np.ascontiguousarray(matrix, dtype=np.uint8).tobytes())
    return pa.FixedSizeBinaryArray.from_buffers(pa.binary(width), n, [None, buffer]).cast(pa.large_binary())


def join_binary(arrays: Sequence[pa.Array]) -> pa.Array:
    """Row-wise concatenation of binary arrays (vectorised in Arrow)."""
    if len(arrays) == 1:
        return arrays[0]
    return pc.binary_join_element_wise(*arrays, pa.scalar(b"", pa.large_binary()))


def be_bytes(values: np.ndarray, width: int) -> np.ndarray:
    """Big-endian bytes of unsigned integers, shape (n, width)."""
    return values.astype(f">u{width}").view(np.uint8).reshape(-1, width)


def _python_components(column: pa.Array) -> pa.Array:
    return pa.array([encode_key((v,))[5:] for v in column.to_pylist()], pa.large_binary())


def plain_column(column) -> pa.Array:
    """A key column as one array of its values (chunks combined, a dictionary decoded): what its
    canonical encoding, and the routing hash (:mod:`transforms.partials`), read."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    return column


#: Bytes of the component encoding of each fixed-width column type (tag byte included).
_INT_WIDTH, _BOOL_WIDTH, _FLOAT_WIDTH = 18, 2, 9


def _type_width(typ: pa.DataType):
    """The length every value of an integer, boolean or float type encodes to; None for other
    types."""
    if pa.types.is_integer(typ):
        return _INT_WIDTH
    if pa.types.is_boolean(typ):
        return _BOOL_WIDTH
    if pa.types.is_floating(typ):
        return _FLOAT_WIDTH
    return None


def _fixed_width(column: pa.Array):
    """The length every value of a null-free integer, boolean or float column encodes to; None
    for other columns (and columns with nulls)."""
    return None if column.null_count else _type_width(column.type)


def _field(rows: np.ndarray, offset: int, dtype) -> np.ndarray:
    """The ``dtype`` value at byte ``offset`` of each row of a C-contiguous (n, L) uint8 matrix, as
    an (n,) strided view: a multi-byte field is then written in one numpy loop over the rows
    (byte order and unaligned stores included) rather than one short loop per row."""
    if not rows.shape[0]:
        return np.empty(0, dtype=dtype)
    return np.ndarray((rows.shape[0],), dtype=dtype, buffer=rows, offset=offset,
                      strides=(rows.strides[0],))


def encodes_fixed_width(keys: pa.Table) -> bool:
    """Whether every key of a table encodes to one length (:func:`encode_keys_matrix` is then not
    None): its columns are integers, booleans or floats (dictionary-encoded or not) without
    nulls. Read from the types and null counts alone."""
    for column in keys.columns:
        typ = column.type.value_type if pa.types.is_dictionary(column.type) else column.type
        if column.null_count or _type_width(typ) is None:
            return False
    return True


def _fill_fixed(column: pa.Array, rows: np.ndarray, start: int) -> None:
    """Write the component encodings of a column with a :func:`_fixed_width` into bytes
    ``start``, ``start + 1``, ... of each row of ``rows`` (a C-contiguous (n, L) uint8 matrix
    that is zero where an encoding has zero bytes)."""
    typ = column.type
    if pa.types.is_integer(typ):
        values = column.to_numpy(zero_copy_only=False)
        _field(rows, start, np.uint8)[:] = ord("I")
        if pa.types.is_signed_integer(typ):
            values = values.astype(np.int64, copy=False)
            negative = values < 0
            magnitude = values.view(_U64) if not negative.any() else \
                np.where(negative, (-(values + 1)).astype(_U64) + _U64(1), values.astype(_U64))
            _field(rows, start + 1, np.uint8)[:] = negative
        else:
            magnitude = values.astype(_U64, copy=False)
        _field(rows, start + 10, ">u8")[:] = magnitude  # bytes 2..9: the magnitude's high half
    elif pa.types.is_boolean(typ):
        _field(rows, start, np.uint8)[:] = ord("B")
        _field(rows, start + 1, np.uint8)[:] = column.to_numpy(zero_copy_only=False)
    else:
        values = column.to_numpy(zero_copy_only=False).astype(np.float64)
        if np.isnan(values).any():
            raise ValueError("a key component must not be NaN")
        _field(rows, start, np.uint8)[:] = ord("F")
        _field(rows, start + 1, ">f8")[:] = values + 0.0  # -0.0 -> 0.0
    assert rows.shape[1] >= start + _fixed_width(column)


def _fixed_matrix(column: pa.Array):
    """The component encodings of a null-free integer, boolean or float column as an (n, width)
    uint8 matrix (every value encodes to the same length); None for other columns."""
    width = _fixed_width(column)
    if width is None:
        return None
    matrix = np.zeros((len(column), width), dtype=np.uint8)
    _fill_fixed(column, matrix, 0)
    return matrix


def _encode_arrow_column(column: pa.Array) -> pa.Array:
    """The canonical component encoding of every value of one key column (as in encode_key)."""
    column = plain_column(column)
    typ = column.type
    matrix = _fixed_matrix(column)
    if matrix is not None:
        return binary_rows(matrix)
    if column.null_count:
        return _python_components(column)
    if pa.types.is_date(typ):
        text = pc.strftime(column.cast(pa.date32()).cast(pa.timestamp("s")), format="%Y-%m-%d")
        return _encode_varlen(text, b"D")
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        return _encode_varlen(column, b"S")
    if pa.types.is_binary(typ) or pa.types.is_large_binary(typ) or pa.types.is_fixed_size_binary(typ):
        return _encode_varlen(column, b"Y")
    return _python_components(column)


def _encode_varlen(column: pa.Array, tag: bytes) -> pa.Array:
    values = column.cast(pa.large_binary())
    lengths = pc.binary_length(values).to_numpy(zero_copy_only=False)
    head = np.empty((len(values), 5), dtype=np.uint8)
    head[:, 0] = tag[0]
    head[:, 1:] = be_bytes(lengths.astype(np.uint32), 4)
    return join_binary([binary_rows(head), values])


def _fill_head(rows: np.ndarray, num_columns: int) -> None:
    """Write a key's head (tag and column count) into the first 5 bytes of each row of ``rows``,
    a C-contiguous (n, L) uint8 matrix."""
    _field(rows, 0, np.uint8)[:] = ord("T")
    _field(rows, 1, ">u4")[:] = num_columns


def _key_head(n: int, num_columns: int) -> np.ndarray:
    head = np.empty((n, 5), dtype=np.uint8)
    _fill_head(head, num_columns)
    return head


def encode_keys_matrix(keys, pad_to: int = 1):
    """The bytes of :func:`encode_keys` as an (n, width) uint8 matrix when every key encodes to
    the same length (Arrow key columns of integers, booleans or floats, without nulls): the PRF
    then reads whole blocks from it with no Arrow binary arrays in between. None otherwise.

    pad_to: the matrix is a view of the first ``width`` columns of a zero-padded matrix whose
    row length is a multiple of ``pad_to`` (``matrix.base``; the PRF's blocks, written in place
    with no second copy)."""
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        keys = pa.table({"k": keys})
    if not isinstance(keys, (pa.Table, pa.RecordBatch)):
        return None
    columns = [plain_column(column) for column in keys.columns]
    widths = [_fixed_width(column) for column in columns]
    if any(w is None for w in widths):
        return None
    n, width = keys.num_rows, 5 + sum(widths)
    padded = np.zeros((n, -(-width // pad_to) * pad_to), dtype=np.uint8)
    _fill_head(padded, len(columns))
    start = 5
    for column, w in zip(columns, widths):
        _fill_fixed(column, padded, start)
        start += w
    return padded[:, :width]


#: At most this many distinct layouts (per-column text lengths) go the grouped way of
#: :func:`encode_keys_layouts`; keys with more (free text of many lengths) take Arrow's joins.
_MAX_LAYOUTS = 256


def _text_buffers(column: pa.Array):
    """(offsets, data) of a null-free string or binary array as numpy: n + 1 int64 offsets into
    the uint8 data buffer (read in place: Arrow's own buffers, the array's slice offset applied)."""
    large = pa.types.is_large_string(column.type) or pa.types.is_large_binary(column.type)
    buffers = column.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64 if large else np.int32)
    offsets = offsets[column.offset:column.offset + len(column) + 1].astype(np.int64)
    data = np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None else np.zeros(0, np.uint8)
    return offsets, data


def encode_keys_layouts(keys, pad_to: int = 1):
    """The bytes of :func:`encode_keys` grouped by layout, for Arrow key columns of integers,
    booleans, floats, text and bytes (dictionary-encoded or not) without nulls: a list of
    ``(rows, matrix)``, ``rows`` an int64 array of row positions, ``matrix`` the (len(rows),
    width) uint8 matrix of those rows' encodings, all ``width`` bytes long (as for
    :func:`encode_keys_matrix`: a view of a zero-padded matrix, ``pad_to``). Keys whose text
    components have the same lengths have the same layout, so each group is written column by
    column with strided numpy stores and one gather per text column, with no Arrow binary arrays in
    between. None for other keys (other types, nulls, more than :data:`_MAX_LAYOUTS` layouts)."""
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        keys = pa.table({"k": keys})
    if not isinstance(keys, (pa.Table, pa.RecordBatch)):
        return None
    n = keys.num_rows
    columns = [plain_column(column) for column in keys.columns]
    parts, text_lengths = [], []
    for column in columns:
        if column.null_count:
            return None
        typ = column.type
        if _type_width(typ) is not None:
            parts.append(("fixed", column, None))
            continue
        if pa.types.is_string(typ) or pa.types.is_large_string(typ):
            tag = b"S"
        elif pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
            tag = b"Y"
        else:
            return None
        buffers = _text_buffers(column)
        parts.append(("text", buffers, tag))
        text_lengths.append(np.diff(buffers[0]))
    # One code per row naming its text lengths (mixed radix); rows of one code share a layout.
    code = np.zeros(n, dtype=np.int64)
    radix = 1
    for lengths in text_lengths:
        top = int(lengths.max()) + 1 if n else 1
        if radix * top >= 1 << 62:
            return None
        code += lengths * radix
        radix *= top
    if radix == 1 or not n:
        groups = [np.arange(n)]
    else:
        counts = np.bincount(code) if radix <= 1 << 20 else None
        distinct = np.flatnonzero(counts) if counts is not None else np.unique(code)
        if distinct.size > _MAX_LAYOUTS:
            return None
        if distinct.size == 1:
            groups = [np.arange(n)]
        else:
            order = np.argsort(code.astype(np.uint16) if radix <= 1 << 16 else code, kind="stable")
            sizes = counts[distinct] if counts is not None else np.unique(code, return_counts=True)[1]
            groups = np.split(order, np.cumsum(sizes)[:-1])
    out = []
    for rows in groups:
        whole = rows.size == n
        sizes = [int(lengths[rows[0]]) if rows.size else 0 for lengths in text_lengths]
        width = 5 + sum(_type_width(part.type) for kind, part, _ in parts if kind == "fixed") \
            + sum(5 + size for size in sizes)
        matrix = np.zeros((rows.size, -(-width // pad_to) * pad_to), dtype=np.uint8)
        _fill_head(matrix, len(columns))
        start, text = 5, 0
        for kind, part, tag in parts:
            if kind == "fixed":
                _fill_fixed(part if whole else part.take(pa.array(rows)), matrix, start)
                start += _type_width(part.type)
                continue
            offsets, data = part
            size = sizes[text]
            text += 1
            _field(matrix, start, np.uint8)[:] = tag[0]
            _field(matrix, start + 1, ">u4")[:] = size
            if size:
                first = offsets[:-1] if whole else offsets[rows]
                matrix[:, start + 5:start + 5 + size] = data[first[:, None] + np.arange(size)]
            start += 5 + size
        out.append((rows, matrix[:, :width]))
    return out


def encode_keys(keys) -> pa.Array:
    """Canonical encodings (large_binary) of many keys: Python keys or Arrow key columns.

    Arrow tables are encoded column by column in Arrow/numpy; the bytes equal
    :func:`encode_key` of the corresponding Python tuples.
    """
    if isinstance(keys, (pa.Table, pa.RecordBatch)):
        matrix = encode_keys_matrix(keys)
        if matrix is not None:
            return binary_rows(matrix)
        head = _key_head(keys.num_rows, keys.num_columns)
        return join_binary([binary_rows(head)] + [_encode_arrow_column(c) for c in keys.columns])
    if isinstance(keys, (pa.Array, pa.ChunkedArray)):
        return encode_keys(pa.table({"k": keys}))
    return pa.array([encode_key(k) for k in keys], pa.large_binary())


# --------------------------------------------------------------------------- windowed encoding

#: Longest text or bytes component the windowed encoder writes (a pass over a chunk's rows per
#: 8 bytes); keys with longer ones take the layout or Arrow paths.
_MAX_WINDOW_TEXT = 64
#: Rows encoded (and MAC'd) together: a chunk's words and blocks stay in the processor's cache.
WINDOW_ROWS = 1 << 14

_TAIL_MASKS = np.array([(1 << (8 * b)) - 1 for b in range(9)], dtype=_U64)  # b low bytes set


def _be_word(values: np.ndarray, dtype: str) -> np.ndarray:
    """The bytes of ``values`` written as the big-endian ``dtype``, read as a little-endian
    unsigned integer (widened to 64 bits): the value of a window that starts with those bytes."""
    raw = np.asarray(values).astype(dtype)
    raw = raw.view(f"<u{raw.dtype.itemsize}")
    return raw if raw.dtype.itemsize == 8 else raw.astype("<u8")


class WindowedKeys:
    """Keys' canonical encodings (:func:`encode_keys`) written a chunk of rows at a time as
    little-endian 64-bit words, word-major: ``words[k, r]`` holds bytes 8k .. 8k + 7 of row r
    (zero past the row's length: the PRF's zero padding). Rows stay in key order whatever their
    text lengths (no grouping by layout, no reordering); each component is OR'd in as 8-byte
    *windows* (its bytes 8w .. 8w + 7, zero past its end) at its row's byte offset, a window
    split over the two words it straddles by per-row shifts: a few contiguous numpy passes per
    component and chunk. For Arrow key columns of integers, booleans, floats, text and bytes
    (dictionary-encoded or not) without nulls; :meth:`of` is None for other keys."""

    def __init__(self, n: int, components: list, min_length: int, max_length: int):
        self.num_rows = n
        self._components = components  # (kind, width, arrays) per column
        self.min_length, self.max_length = min_length, max_length

    @classmethod
    def of(cls, keys):
        """The windowed form of ``keys`` (an Arrow table, batch or column), or None where it
        does not apply: Python keys, other column types, nulls, text or bytes longer than
        :data:`_MAX_WINDOW_TEXT`. A NaN float key is refused, as by :func:`encode_keys`."""
        if isinstance(keys, (pa.Array, pa.ChunkedArray)):
            keys = pa.table({"k": keys})
        if not isinstance(keys, (pa.Table, pa.RecordBatch)):
            return None
        n = keys.num_rows
        components, low, high = [], 5, 5
        for column in keys.columns:
            column = plain_column(column)
            if column.null_count:
                return None
            typ = column.type
            width = _type_width(typ)
            if width is not None:
                values = column.to_numpy(zero_copy_only=False)
                if pa.types.is_floating(typ):
                    values = values.astype(np.float64, copy=False)
                    if np.isnan(values).any():
                        raise ValueError("a key component must not be NaN")
                kind = "int" if pa.types.is_integer(typ) else "bool" if pa.types.is_boolean(typ) else "float"
                components.append((kind, width, values))
                low, high = low + width, high + width
                continue
            if pa.types.is_string(typ) or pa.types.is_large_string(typ):
                tag = ord("S")
            elif pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
                tag = ord("Y")
            else:
                return None
            offsets, data = _text_buffers(column)
            lengths = np.diff(offsets)
            shortest, longest = (int(lengths.min()), int(lengths.max())) if n else (0, 0)
            if longest > _MAX_WINDOW_TEXT:
                return None
            base = int(offsets[0]) if n else 0
            size = int(offsets[-1]) - base if n else 0
            words = np.zeros(size // 8 + 3, dtype="<u8")  # the data, then zero words to read past it
            words.view(np.uint8)[:size] = data[base:base + size]
            starts = offsets[:-1] - base if base else offsets[:-1]
            components.append(("text", longest, (tag, starts, lengths, words)))
            low, high = low + 5 + shortest, high + 5 + longest
        return cls(n, components, low, high)

    @property
    def padded_width(self) -> int:
        """Bytes of the longest key zero-padded to whole 16-byte blocks."""
        return -(-self.max_length // 16) * 16

    @property
    def num_words(self) -> int:
        """Rows of the ``words`` buffer :meth:`fill` writes: the padded width, and one word for
        windows reaching past it (zero)."""
        return self.padded_width // 8 + 1

    def fill(self, start: int, stop: int, words: np.ndarray) -> np.ndarray:
        """OR keys ``start`` .. ``stop`` - 1 into ``words`` ((:attr:`num_words`, >= stop -
        start) '<u8', zero on entry) and return their lengths in bytes (int64)."""
        m = stop - start
        words = words[:, :m]

        def put(position, values):
            """OR 8-byte windows (little-endian values) at byte ``position`` of each row."""
            if np.ndim(position) == 0:
                q, r = divmod(int(position), 8)
                words[q] |= values << _U64(8 * r)
                if r:
                    words[q + 1] |= values >> _U64(64 - 8 * r)
                return
            q = position >> 3
            shift = ((position & 7) << 3).astype(_U64)
            low = values << shift
            high = (values >> _U64(1)) >> (_U64(63) - shift)  # the bytes past word q (0 if none)
            first, last = int(q.min()), int(q.max())
            if first == last:
                words[first] |= low
                words[first + 1] |= high
                return
            for k in range(first, last + 1):
                here = q == k
                words[k] |= np.where(here, low, _U64(0))
                words[k + 1] |= np.where(here, high, _U64(0))

        put(0, _U64(ord("T")) | (_be_word(len(self._components), ">u4") << _U64(8)))
        position = 5  # one offset for every row until a text column's length varies it
        for kind, width, arrays in self._components:
            if kind == "text":
                tag, starts, lengths, data = arrays
                firsts, lengths = starts[start:stop], lengths[start:stop]
                # Window 0: the tag, the 4-byte length and data bytes 0..2; window w >= 1: data
                # bytes 8w - 5 .. 8w + 2; each masked to the bytes the row has.
                head = _U64(tag) | (_be_word(lengths, ">u4") << _U64(8))
                put(position, head | (_read_data(data, firsts, clip=False)
                                      & _TAIL_MASKS[np.minimum(lengths, 3)]) << _U64(40))
                for w in range(1, -(-(5 + width) // 8)):
                    skip = 8 * w - 5
                    put(position + 8 * w, _read_data(data, firsts + skip)
                        & _TAIL_MASKS[np.clip(lengths - skip, 0, 8)])
                position = position + 5 + lengths
                continue
            values = arrays[start:stop]
            if kind == "int":
                if values.dtype.kind == "i":
                    values = values.astype(np.int64, copy=False)
                    negative = values < 0
                    if negative.any():
                        magnitude = np.where(negative, (-(values + 1)).astype(_U64) + _U64(1),
                                             values.astype(_U64))
                        put(position, _U64(ord("I")) | (negative.astype(_U64) << _U64(8)))
                    else:
                        magnitude = values.view(_U64)
                        put(position, _U64(ord("I")))
                else:
                    magnitude = values.astype(_U64, copy=False)
                    put(position, _U64(ord("I")))
                put(position + 10, _be_word(magnitude, ">u8"))  # bytes 2..9: the high half, zero
            elif kind == "bool":
                put(position, _U64(ord("B")) | (values.astype(_U64) << _U64(8)))
            else:
                put(position, _U64(ord("F")))
                put(position + 1, _be_word(values + 0.0, ">f8"))  # -0.0 -> 0.0
            position = position + width
        return np.broadcast_to(np.asarray(position, dtype=np.int64), (m,))


def _read_data(words: np.ndarray, offsets: np.ndarray, clip: bool = True) -> np.ndarray:
    """The 8 bytes at each byte offset of the little-endian words of a text column's data, as a
    little-endian integer (two aligned gathers and shifts; offsets clipped inside the buffer,
    unless they are the values' own starts, all inside it)."""
    if clip:
        offsets = np.minimum(offsets, 8 * (words.size - 2))
    q = offsets >> 3
    shift = ((offsets & 7) << 3).astype(_U64)
    return (words[q] >> shift) | ((words[q + 1] << _U64(1)) << (_U64(63) - shift))
