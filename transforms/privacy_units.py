"""One canonical form for privacy-unit ids (and ARA source ids), applied before any hashing.

Contribution bounding counts a person's rows by their id. If the same person reached a job as
``7`` (an int64 column), ``7.0`` (a float64 column: what pandas writes for an integer column with
a null) and ``"7"`` (text), a type-tagged hash would see three people and let them contribute
three times their bound. So every path that groups, bounds or hashes by a privacy unit first maps
its ids to one canonical text form, here.

Which ids count as the same unit (the rules, in order; tests/transforms/test_privacy_units.py holds them as a
table):

* null, and NaN in a float column, is *no id*: the caller drops the row by its documented rule
  and counts it;
* integers of any width, and integral floats or decimals (``7``, ``7.0``, ``Decimal("7.00")``)
  are the integer, written in decimal without leading zeros or sign for non-negative values
  (``"7"``, ``"-3"``);
* text is folded as Unicode's NFKC_Casefold does, in this order: format characters (category
  Cf: zero-width spaces and joiners, the byte-order mark, soft hyphens, bidirectional marks) are
  removed; the text is normalised to NFKC, *fully* case-folded (``"Straße"`` and ``"STRASSE"`` are
  ``"strasse"``; lower-casing alone keeps the ``ß``) and normalised to NFKC again; decimal digits
  of every script (category Nd: ``"٧"``, ``"७"``, fullwidth ``"７"``) become ASCII digits; and
  surrounding white space is stripped;
* a folded text that reads as a decimal number -- optional sign, digits with an optional
  fraction, an optional exponent (``"7"``, ``" +007 "``, ``"7.00"``, ``"7."``, ``"7e0"``,
  ``"0.7E1"``) -- is that number: an integral one is the integer (``"7"``), so text and numbers
  agree; a non-integral one is its exact plain decimal without trailing zeros (``"7.50"`` and
  ``"75e-1"`` are ``"7.5"``); leading zeros never count (``"007"`` is ``7``). Any other text is
  kept as folded (``"alice@example.org"``, ``"0x1f"``, ``"inf"``);
* anything else is refused before any work: booleans, dates and times, binary, nested types,
  non-integral numbers *of a numeric type* (``7.5`` is not an id: a float is no exact
  identifier), integral floats too large to be exact (|x| >= 2^53), and numeric text whose plain
  decimal form would be longer than both the text and 64 characters (``"1e999"``).

When in doubt the rules *merge*: two different people mapped to one id are bounded together,
which can only remove contributions (less utility, never less privacy); one person split into
two ids would break the guarantee. So ``"007"`` and ``7``, ``"Alice"`` and ``"alice"``, and
``"user\u200b1"`` and ``"user1"`` are one unit. Error messages name the column, never a value (ids
are personal data).

Vectorised with pyarrow and numpy: an all-ASCII array (the usual case) takes a fast path (ASCII
lower-casing is the whole fold there); non-ASCII values are folded in Python once per distinct
value. Only texts starting with a digit, a sign or a point (read from the Arrow buffers) are
checked for numbers; canonical integers (the usual numeric id) stay as they are, and the rest
(signs, leading zeros, fractions, exponents: rare) are converted exactly, with :mod:`decimal`
where needed. A scalar form serves Python values.
"""
from __future__ import annotations

import decimal
import math
import numbers
import unicodedata
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

#: Integral floats at or beyond this magnitude are not exact: refused.
_EXACT_FLOAT = 2.0 ** 53
#: Numbers in folded text: what they start with, canonical integers (kept as they are), other
#: integer text (vectorised), and any decimal number (exact, in Python).
_NUMBER_STARTS = np.frombuffer(b"0123456789+-.", dtype=np.uint8)
_CANONICAL_INTEGER = r"^(0|-?[1-9][0-9]*)$"
_INTEGER_TEXT = r"^[+-]?[0-9]+(\.0*)?$"
_NUMBER_TEXT = r"^[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)(e[+-]?[0-9]+)?$"
#: A numeric text may expand by its exponent to this many characters (or its own length).
_MAX_NUMBER_CHARS = 64


class UnitIdError(ValueError):
    """A privacy-unit column or value that has no canonical form (the message names the column)."""


def check_unit_type(typ: pa.DataType, column: str) -> None:
    """Refuse a column *type* that cannot hold canonicalisable ids (preflight, before any work)."""
    if pa.types.is_dictionary(typ):
        typ = typ.value_type
    if (pa.types.is_integer(typ) or pa.types.is_floating(typ) or pa.types.is_decimal(typ)
            or pa.types.is_string(typ) or pa.types.is_large_string(typ) or pa.types.is_null(typ)):
        return
    raise UnitIdError(f"privacy unit column {column!r} has type {typ}: ids must be integers, "
                      "integral numbers or text (booleans, dates, binary and nested values are "
                      "not ids)")


def _integer_text(text: pa.Array) -> pa.Array:
    """Canonical decimal text of strings that match ``_INTEGER_TEXT`` (others: unspecified)."""
    body = pc.replace_substring_regex(text, pattern=r"\.0*$", replacement="")
    negative = pc.starts_with(body, "-")
    digits = pc.replace_substring_regex(body, pattern=r"^[+-]", replacement="")
    digits = pc.replace_substring_regex(digits, pattern=r"^0+", replacement="")
    zero = pc.equal(pc.utf8_length(digits), 0)
    digits = pc.if_else(zero, pa.scalar("0"), digits)
    signed = pc.binary_join_element_wise(pa.scalar("-"), digits, "")
    return pc.if_else(pc.and_(negative, pc.invert(zero)), signed, digits)


def _fold(value: str) -> str:
    """One non-ASCII text folded (module docstring): Cf removed, NFKC, full case folding, NFKC,
    decimal digits of every script as ASCII (and any Cf the normalisation produced removed)."""
    value = "".join(ch for ch in value if unicodedata.category(ch) != "Cf")
    value = unicodedata.normalize("NFKC", unicodedata.normalize("NFKC", value).casefold())
    return "".join(ch if ch.isascii() or not ch.isdecimal() else chr(48 + unicodedata.decimal(ch))
                   for ch in value if unicodedata.category(ch) != "Cf")


def _folded(text: pa.Array) -> pa.Array:
    """The folded texts: ASCII lower-casing for ASCII values (their whole fold), :func:`_fold`
    once per distinct non-ASCII value."""
    ascii_ = pc.fill_null(pc.string_is_ascii(text), True)
    lowered = pc.ascii_lower(text)
    if pc.all(ascii_).as_py():
        return lowered
    others = pc.dictionary_encode(pc.filter(text, pc.invert(ascii_)))
    folded = pa.array([_fold(v) for v in others.dictionary.to_pylist()], pa.string())
    rows = np.flatnonzero(~ascii_.to_numpy(zero_copy_only=False))
    return _scatter(lowered, rows, folded.take(others.indices))


def _scatter(base: pa.Array, rows: np.ndarray, replacements: pa.Array) -> pa.Array:
    """``base`` with ``rows`` (ascending positions) replaced by ``replacements``, in order (one
    gather: faster than ``replace_with_mask`` on strings)."""
    n = len(base)
    order = np.arange(n, dtype=np.int64)
    order[rows] = n + np.arange(len(rows), dtype=np.int64)
    return pa.concat_arrays([base, replacements.cast(base.type)]).take(pa.array(order))


def _number_text(value: str, name: str) -> str:
    """The exact canonical text of a decimal number written as ``value`` (``_NUMBER_TEXT``)."""
    sign, digits, exponent = decimal.Decimal(value).as_tuple()
    digits = "".join(map(str, digits)).lstrip("0")
    if not digits:
        return "0"
    stripped = digits.rstrip("0")
    exponent += len(digits) - len(stripped)
    digits = stripped
    point = len(digits) + exponent  # digits before the decimal point
    length = point if exponent >= 0 else len(digits) + 1 if point > 0 else 2 - point + len(digits)
    if length > max(len(value), _MAX_NUMBER_CHARS):
        raise UnitIdError(f"privacy unit column {name!r} holds numeric text whose exponent "
                          f"expands it past {_MAX_NUMBER_CHARS} digits: not an id")
    if exponent >= 0:
        body = digits + "0" * exponent
    elif point > 0:
        body = digits[:point] + "." + digits[point:]
    else:
        body = "0." + "0" * -point + digits
    return ("-" if sign else "") + body


def _first_bytes(text: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """Each string's first byte and whether it has one (non-null, non-empty), read from the
    Arrow buffers: no per-string kernel."""
    width = np.int64 if pa.types.is_large_string(text.type) else np.int32
    _, offsets, data = text.buffers()
    offsets = np.frombuffer(offsets, dtype=width)[text.offset:text.offset + len(text) + 1]
    present = offsets[1:] > offsets[:-1]
    if text.null_count:
        present &= text.is_valid().to_numpy(zero_copy_only=False)
    if data is None or not present.any():
        return np.zeros(len(text), np.uint8), present
    raw = np.frombuffer(data, dtype=np.uint8)
    return raw[np.minimum(offsets[:-1], len(raw) - 1)], present


def _canonical_text(text: pa.Array, name: str = "privacy unit", faults=None) -> pa.Array:
    """``faults``: None raises for a numeric text without a canonical form; a list collects one
    entry per such value and leaves it null instead (:func:`unit_ids_and_faults`)."""
    text = pc.utf8_trim_whitespace(_folded(text))
    # Numbers start with a digit, a sign or a point: most text ids stop here.
    first, present = _first_bytes(text)
    maybe = present & np.isin(first, _NUMBER_STARTS)
    if not maybe.any():
        return text
    rows = np.flatnonzero(maybe)
    candidates = text.take(pa.array(rows))
    # Already canonical integers (the usual numeric id) stay as they are.
    done = pc.match_substring_regex(candidates, _CANONICAL_INTEGER).to_numpy(zero_copy_only=False)
    if done.all():
        return text
    rows, candidates = rows[~done], candidates.filter(pa.array(~done))
    integral = pc.match_substring_regex(candidates, _INTEGER_TEXT)
    numeric = pc.match_substring_regex(candidates, _NUMBER_TEXT).to_numpy(zero_copy_only=False)
    if not numeric.any():
        return text
    out = pc.if_else(integral, _integer_text(candidates), candidates).to_pylist()
    integral = integral.to_numpy(zero_copy_only=False)
    for i in np.flatnonzero(numeric & ~integral):
        try:
            out[i] = _number_text(out[i], name)
        except UnitIdError:
            if faults is None:
                raise
            faults.append(int(rows[i]))
            out[i] = None
    return _scatter(text, rows, pa.array(out, pa.string()))


def canonical_unit_ids(column, name: str = "privacy unit") -> pa.Array:
    """The canonical ids (a ``string`` array, nulls where there is no id) of one Arrow column.

    Raises :class:`UnitIdError` naming ``name`` for a type or a value without a canonical form.
    """
    return _canonical_ids(column, name, None)


def unit_ids_and_faults(column, name: str = "privacy unit") -> tuple[pa.Array, np.ndarray]:
    """(canonical ids, a boolean mask of the values without a canonical form) of one Arrow
    column: the row rule of the release layer -- a *value* without a canonical form
    (``"1e999"``, ``7.5`` or infinity in a float column) is no id, null like a missing one, and
    marked so that the caller drops and counts its row (one row never decides a release). A
    column *type* that cannot hold ids still raises :class:`UnitIdError` (a schema fault,
    refused in preflight)."""
    faults: list = []
    ids = _canonical_ids(column, name, faults)
    mask = np.zeros(len(ids), dtype=bool)
    mask[np.asarray(faults, dtype=np.int64)] = True
    return ids, mask


def _canonical_ids(column, name: str, faults) -> pa.Array:
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    typ = column.type
    check_unit_type(typ, name)
    if pa.types.is_null(typ):
        return pa.nulls(len(column), pa.string())
    if pa.types.is_integer(typ):
        return pc.cast(column, pa.string())
    if pa.types.is_floating(typ):
        values = pc.cast(column, pa.float64()).to_numpy(zero_copy_only=False)
        present = np.isfinite(values)
        infinite = np.isinf(values)
        inexact = present & ((np.floor(values) != values) | (np.abs(values) >= _EXACT_FLOAT))
        if faults is not None:
            bad = infinite | inexact
            faults.extend(np.flatnonzero(bad).tolist())
            present &= ~bad
        elif infinite.any():
            raise UnitIdError(f"privacy unit column {name!r} holds an infinite number: not an id")
        elif inexact.any():
            raise UnitIdError(f"privacy unit column {name!r} holds non-integral (or inexact, "
                              f"|x| >= 2^53) numbers: ids must be integers or text")
        mask = ~present | (column.is_null().to_numpy(zero_copy_only=False) if column.null_count
                           else np.zeros(len(values), dtype=bool))
        ints = pa.array(np.where(present, values, 0).astype(np.int64), mask=mask)
        return pc.cast(ints, pa.string())
    if pa.types.is_decimal(typ):
        text = pc.cast(column, pa.string())
        integral = pc.fill_null(pc.match_substring_regex(text, _INTEGER_TEXT), True)
        if not pc.all(integral).as_py():
            if faults is None:
                raise UnitIdError(f"privacy unit column {name!r} holds non-integral numbers: "
                                  "ids must be integers or text")
            bad = ~integral.to_numpy(zero_copy_only=False)
            faults.extend(np.flatnonzero(bad).tolist())
            text = pc.if_else(integral, text, pa.scalar(None, pa.string()))
        return _integer_text(text)
    return _canonical_text(pc.cast(column, pa.string()), name, faults)


def canonical_unit_dictionary(column, name: str = "privacy unit") -> pa.DictionaryArray:
    """The canonical ids of one Arrow column as a dictionary array: per row an index (null where
    there is no id) into a dictionary of *distinct* canonical ids, numbered in order of first
    appearance. Decoded, it is :func:`canonical_unit_ids` of the column (same rules, same
    errors); only each distinct raw value is canonicalised, and hashing per distinct id reads the
    indices instead of hashing the ids' text row by row (an integer id column then costs one
    integer dictionary encoding and a cast per distinct user instead of a cast per row and a
    string dictionary encoding; benchmarks/RESULTS.md has the measurement)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    check_unit_type(column.type, name)
    raw = pc.dictionary_encode(column)  # distinct raw values, in order of first appearance
    canonical = pc.dictionary_encode(canonical_unit_ids(raw.dictionary, name))
    # Raw values with one canonical form merge (" Alice" and "alice", 0.0 and -0.0): re-number.
    # Both numberings follow first appearance, so the merged one does too.
    indices = canonical.indices.take(raw.indices)
    return pa.DictionaryArray.from_arrays(indices, canonical.dictionary)


def canonical_unit_id(value, name: str = "privacy unit") -> Optional[str]:
    """The canonical id of one Python value (None for no id); the same rules as the array form."""
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)):
        raise UnitIdError(f"privacy unit {name!r}: a boolean is not an id")
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, decimal.Decimal):
        if value.is_nan():
            return None
        if not value.is_finite() or value != value.to_integral_value():
            raise UnitIdError(f"privacy unit {name!r}: non-integral number is not an id")
        return str(int(value))
    if isinstance(value, numbers.Real):
        value = float(value)
        if math.isnan(value):
            return None
        if math.isinf(value) or not value.is_integer() or abs(value) >= _EXACT_FLOAT:
            raise UnitIdError(f"privacy unit {name!r}: non-integral (or inexact) number is not an id")
        return str(int(value))
    if isinstance(value, str):
        return _canonical_text(pa.array([value], pa.string()), name)[0].as_py()
    raise UnitIdError(f"privacy unit {name!r}: a {type(value).__name__} is not an id")


def canonical_unit_column(values, name: str = "privacy unit") -> pa.Array:
    """Canonical ids of a Python sequence of possibly mixed-type ids (dict or Row input)."""
    return pa.array([canonical_unit_id(v, name) for v in values], pa.string())
