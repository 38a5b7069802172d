"""Row-level faults are dropped (or neutralised) and counted, never a refusal or a failed run
(issue 30 item 3): one row's bytes or one record's value must not decide a run's outcome. The
neighbouring-pair audits of the same rules are in tests/test_publication_decisions.py; the
operator's view of them in tests/test_fault_injection.py.
"""
from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pytest

from pipelines.release import consumption, inputs


class _Counted:
    def __init__(self):
        self.counts = {}

    def other(self, name, amount):
        self.counts[name] = self.counts.get(name, 0) + int(amount)

    def dropped(self, reason, amount):
        self.other(f"dropped.{reason}", amount)


# ---- the CSV reader: a value whose bytes are not UTF-8 --------------------------------------

_PIECES = [b"a", b"\xc3\xa9", b"\xe2\x82\xac", b"\xf0\x9f\x98\x80", b"\x80", b"\xbf", b"\xc0",
           b"\xc1\x81", b"\xe0\x80\x80", b"\xe0\xa0\x80", b"\xed\xa0\x80", b"\xed\x9f\xbf",
           b"\xf0\x80\x80\x80", b"\xf0\x90\x80\x80", b"\xf4\x90\x80\x80", b"\xf4\x8f\xbf\xbf",
           b"\xf5", b"\xff", b"\xc3", b"\xe2\x82", b"\xf0\x9f"]


def _decodes(value: bytes) -> bool:
    try:
        value.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _string_array(values, large=False):
    """A string array holding ``values`` (bytes or None) unchecked, as the CSV reader makes it
    with check_utf8=False."""
    binary = pa.array(values, pa.large_binary() if large else pa.binary())
    return pa.Array.from_buffers(pa.large_string() if large else pa.string(), len(values),
                                 binary.buffers(), null_count=binary.null_count)


def test_the_vectorised_utf8_check_agrees_with_pythons_decoder():
    """Overlong forms, surrogates, code points above U+10FFFF, stray continuation bytes and
    sequences cut by a value's end (also where the next value would complete them); slices
    and 64-bit offsets."""
    rng = random.Random(7)
    checked = invalid = 0
    for _ in range(1500):
        values = []
        for _ in range(rng.randint(0, 10)):
            if rng.random() < 0.1:
                values.append(None)
            elif rng.random() < 0.6:
                values.append(b"".join(rng.choice(_PIECES) for _ in range(rng.randint(0, 4))))
            else:
                values.append(bytes(rng.randrange(256) for _ in range(rng.randint(0, 6))))
        for large in (False, True):
            array = _string_array(values, large)
            start = rng.randint(0, len(values))
            for part, expected in ((array, values), (array.slice(start), values[start:])):
                want = [v is None or _decodes(v) for v in expected]
                assert inputs.utf8_valid_mask(part).tolist() == want, expected
                checked += len(want)
                invalid += want.count(False)
    assert checked > 10_000 and invalid > 3_000


def test_a_value_whose_bytes_are_not_utf8_is_read_as_missing(tmp_path):
    """The row stays (the job's rule for a missing value decides: drop, neutralise or keep), the
    value is missing, the reader counts it; other columns and lines are untouched. Before: the
    whole file failed to read (the run failed after its charge, or was refused)."""
    path = tmp_path / "rows.csv"
    lines = [b"key,value,note\n"] + [f"k{i},{i},ok\n".encode() for i in range(1000)]
    lines[500] = b"k\xff\xfe,499,ok\n"              # a column the job reads
    lines[700] = b"k699,699,caf\xe9\n"             # Latin-1, in a column it does not read
    lines[800] = b"k799,\xed\xa0\x80,ok\n"         # a surrogate: not UTF-8 either
    lines[900] = b"k899,1,2,3\n"                   # too many fields: a malformed line
    path.write_bytes(b"".join(lines))
    counted = _Counted()
    table = pa.concat_tables(inputs._read_tables(str(path), "csv", ["key", "value"], None,
                                                 counted))
    assert table.num_rows == 999
    keys, values = table.column("key").to_pylist(), table.column("value").to_pylist()
    assert keys[499] is None and values[499] == "499" and keys[699] == "k699"
    assert keys[799] == "k799" and values[799] is None and "k899" not in keys
    assert counted.counts == {"dropped.malformed_csv_line": 1, "values_not_utf8": 2}


def test_what_consumes_scans_before_the_charge_reads_the_same_way(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_bytes(b"key,value\nk1,1\nk\xff2,2\nk3,\xff\n")
    spec = inputs.InputSpec(name="rows", paths=(str(path),), columns={"key": "text",
                                                                      "value": "number"})
    tables = list(consumption.read_columns(inputs.preflight(spec), ["key"]))
    assert pa.concat_tables(tables).column("key").to_pylist() == ["k1", None, "k3"]
    assert consumption.canonical_ids(inputs.preflight(spec), "key").to_pylist() == ["k1", "k3"]


def test_valid_batches_take_the_one_pass_check_only(tmp_path, monkeypatch):
    """Every column is checked by Arrow in C++; the per-value mask runs only for a column that
    fails that check (never a loop over a valid batch's values)."""
    calls = []
    real = inputs.utf8_valid_mask
    monkeypatch.setattr(inputs, "utf8_valid_mask", lambda a: calls.append(len(a)) or real(a))
    path = tmp_path / "rows.csv"
    path.write_bytes(b"key\n" + "".join(f"k{i}\u00e9\n" for i in range(5000)).encode())
    counted = _Counted()
    assert sum(t.num_rows for t in inputs._read_tables(str(path), "csv", ["key"], None,
                                                       counted)) == 5000
    assert calls == [] and counted.counts == {"dropped.malformed_csv_line": 0,
                                              "values_not_utf8": 0}


def test_a_batch_digest_reads_bytes_not_utf8_as_the_pipeline_does(tmp_path):
    """Summary reports digests a batch (and collects what it consumes) before the charge from
    every column of the file: a value whose bytes are not UTF-8 is missing there too. Before:
    the batch was refused."""
    from pipelines.summary_reports import content_digest

    def digest(name, lines):
        path = tmp_path / name
        path.write_bytes(b"source_id,value,note\n" + b"".join(lines))
        spec = inputs.InputSpec(name="conversions", paths=(str(path),),
                                columns={"source_id": "id", "value": "number"})
        return content_digest([inputs.preflight(spec)])

    good = [b"s1,1,a\n", b"s2,2,b\n"]
    assert digest("a.csv", good + [b"s3,3\xff,c\n"]) == digest("b.csv", good + [b"s3,,c\n"])
    assert digest("c.csv", good + [b"s3,3,\xfe\n"]) == digest("d.csv", good + [b"s3,3,\n"])
