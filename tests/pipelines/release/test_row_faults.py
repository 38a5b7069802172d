"""Row-level faults are dropped (or neutralised) and counted, never a refusal or a failed run
(issue 30 item 3): one row's bytes or one record's value must not decide a run's outcome. The
neighbouring-pair audits of the same rules are in tests/pipelines/release/test_publication_decisions.py; the
operator's view of them in tests/pipelines/release/test_fault_injection.py.
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
    ids, faults = consumption.canonical_ids(inputs.preflight(spec), "key")
    assert ids.to_pylist() == ["k1", "k3"] and faults == 0


def test_an_id_without_a_canonical_form_is_left_out_and_counted_before_the_charge(tmp_path):
    """Issue 40: "1e999" has no canonical form: a row fault (counted, its row dropped by the
    job), never a refusal of the batch; a missing id is counted only when ids are required."""
    path = tmp_path / "rows.csv"
    path.write_text("key,value\n7,1\n1e999,2\n,3\n007,4\n")
    spec = inputs.InputSpec(name="rows", paths=(str(path),), columns={"key": "id",
                                                                      "value": "number"})
    ids, faults = consumption.canonical_ids(inputs.preflight(spec), "key")
    assert ids.to_pylist() == ["7", "7"] and faults == 1
    ids, faults = consumption.canonical_ids(inputs.preflight(spec), "key", required=True)
    assert ids.to_pylist() == ["7", "7"] and faults == 2


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
    from pipelines.ara.summary_reports import content_digest

    def digest(name, lines):
        path = tmp_path / name
        path.write_bytes(b"source_id,value,note\n" + b"".join(lines))
        spec = inputs.InputSpec(name="conversions", paths=(str(path),),
                                columns={"source_id": "id", "value": "number"})
        return content_digest([inputs.preflight(spec)])

    good = [b"s1,1,a\n", b"s2,2,b\n"]
    assert digest("a.csv", good + [b"s3,3\xff,c\n"]) == digest("b.csv", good + [b"s3,,c\n"])
    assert digest("c.csv", good + [b"s3,3,\xfe\n"]) == digest("d.csv", good + [b"s3,3,\n"])


# ---- shuffle_sum: a share no honest client sends --------------------------------------------

SHUFFLE = dict(num_clients=30, value_bound=5, epsilon=1.0, delta=1e-6)


def _shares(tmp_path, name, values, plant=None):
    """The shuffled shares of 30 clients' ``values``, with ``plant(shares)`` applied (uint64)."""
    from transforms.ldp.randomness import KeyedRandomness
    from transforms.ldp.sample_data import write_table
    from transforms.ldp.shuffle import SplitAndMix, shares_table

    spec = SplitAndMix(**SHUFFLE)
    source = KeyedRandomness.for_testing(5, "row-faults-clients")
    table = shares_table(spec.encode(np.asarray(values, dtype=np.int64), source=source,
                                     ids=np.arange(1, 31, dtype=np.int64)), spec)
    if plant is not None:
        shares = table.column("share").to_pylist()
        table = pa.table({"share": pa.array(plant(shares, spec.modulus), pa.uint64())}).\
            replace_schema_metadata(table.schema.metadata)
    path = str(tmp_path / name)
    write_table(table, path)
    return path


def _shuffle_sum(tmp_path, path, collection="c1"):
    import contextlib
    import io

    from pipelines.ldp import shuffle_sum

    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = shuffle_sum.main([
            "--input", path, "--num_clients", "30", "--value_bound", "5", "--epsilon", "1",
            "--delta", "1e-6", "--collection_id", collection, "--output", str(tmp_path / "out"),
            "--ledger", str(tmp_path / "private" / "ledger.json"),
            "--key_store", str(tmp_path / "private" / "keys")])
    return code, err.getvalue()


def _set(index, value):
    def plant(shares, modulus):
        shares = list(shares)
        shares[index] = value(modulus) if callable(value) else value
        return shares
    return plant


@pytest.mark.parametrize("plant, says", [
    (_set(7, lambda q: q), "0 missing share(s) and 1 outside [0, 2^12)"),
    (_set(7, lambda q: 2 ** 64 - 1), "0 missing share(s) and 1 outside"),
    (_set(0, None), "1 missing share(s) and 0 outside"),
])
def test_a_share_no_honest_client_sends_is_refused_before_the_charge(tmp_path, plant, says):
    """The decision reads the bad share only: the same on both sides of a neighbouring pair
    (one client's value replaced). Before: the sum failed after the charge (exit 3)."""
    values = np.random.default_rng(5).integers(0, 5, 30)
    neighbour = values.copy()
    neighbour[3] = 5 - values[3]
    for name, vals in (("d.parquet", values), ("d2.parquet", neighbour)):
        path = _shares(tmp_path, name, vals, plant)
        code, err = _shuffle_sum(tmp_path, path)
        assert code == 2, err
        assert f"--input: {path} holds {says}" in err and "nothing was charged" in err
        assert not (tmp_path / "private" / "ledger.json").exists()
        assert str(2 ** 64 - 1) not in err
    code, err = _shuffle_sum(tmp_path, _shares(tmp_path, "ok.parquet", values))
    assert code == 0, err


# ---- Masked LARk: one record's content ---------------------------------------------------------

def _agg_params(lower=0.0, upper=10.0):
    from transforms.lark.params import AggregationParams

    return AggregationParams(value_columns=("v", "w"), lower=lower, upper=upper, epsilon=1.0,
                             k=2, fraction_bits=8, num_helpers=2)


#: (record, faults it must be counted under, kept?) -- one reason per record, the first in the
#: browser's order: identity (removed) before content (neutralised).
AGGREGATION_ROWS = [
    ({"record_id": "1", "key": "a", "v": "1.5", "w": " 2 "}, {}, True),
    ({"record_id": None, "key": "a", "v": "oops", "w": "1"}, {"missing_record_id": 1}, False),
    ({"record_id": "3", "key": None, "v": "1", "w": "1"}, {"missing_key": 1}, False),
    ({"record_id": "4", "key": "a", "v": "1", "w": None}, {"value_missing": 1}, True),
    ({"record_id": "5", "key": "a", "v": "  ", "w": "x"}, {"value_missing": 1}, True),
    ({"record_id": "6", "key": "a", "v": "1,5", "w": "1"}, {"value_not_a_number": 1}, True),
    ({"record_id": "7", "key": "a", "v": "nan", "w": "1"}, {"value_not_a_number": 1}, True),
    ({"record_id": "8", "key": "a", "v": "1e400", "w": "1"}, {"value_not_finite": 1}, True),
    ({"record_id": "9", "key": "a", "v": "-50", "w": "1e3"}, {}, True),   # clipped, not faults
]


@pytest.mark.parametrize("row, faults, kept", AGGREGATION_ROWS)
def test_an_aggregation_records_faults_are_its_own(row, faults, kept):
    from transforms.lark.browser import check_aggregation_records

    good = {"record_id": "0", "key": "a", "v": "2", "w": "3"}
    table = pa.table({c: pa.array([good[c], row[c]], pa.string()) for c in good})
    checked = check_aggregation_records(table, _agg_params())
    assert dict(checked.faults) == faults
    assert checked.kept.num_rows == 1 + kept and checked.values[0].tolist() == [2.0, 3.0]
    if kept:
        assert checked.neutralised.tolist() == [False, bool(faults)]
        if faults:
            assert checked.values[1].tolist() == [0.0, 0.0]


def test_the_neutral_value_is_zero_clipped_into_the_declared_range():
    from transforms.lark.browser import check_aggregation_records

    table = pa.table({"record_id": [1, 2], "key": ["a", "a"], "v": [1.0, None],
                      "w": [3.0, 4.0]})
    assert check_aggregation_records(table, _agg_params(2.0, 10.0)).values[1].tolist() == \
        [2.0, 2.0]
    assert check_aggregation_records(table, _agg_params(-10.0, -1.0)).values[1].tolist() == \
        [-1.0, -1.0]


GRADIENT_ROWS = [
    ({"x_0": "3", "x_1": "4", "label": "1", "fake": "TRUE "}, {}),
    ({"x_0": None, "x_1": "4", "label": "1", "fake": "false"}, {"feature_missing": 1}),
    ({"x_0": "a", "x_1": "4", "label": "1", "fake": "false"}, {"feature_not_a_number": 1}),
    ({"x_0": "256", "x_1": "4", "label": "1", "fake": "0"}, {"feature_not_a_byte": 1}),
    ({"x_0": "2.5", "x_1": "4", "label": "1", "fake": "0"}, {"feature_not_a_byte": 1}),
    ({"x_0": "2", "x_1": "4", "label": None, "fake": "0"}, {"label_missing": 1}),
    ({"x_0": "2", "x_1": "4", "label": "yes", "fake": "0"}, {"label_not_a_number": 1}),
    ({"x_0": "2", "x_1": "4", "label": "2", "fake": "0"}, {"label_outside_domain": 1}),
    ({"x_0": "2", "x_1": "4", "label": "1", "fake": "maybe"}, {"fake_not_boolean": 1}),
    ({"x_0": "2", "x_1": "4", "label": "1", "fake": None}, {"fake_not_boolean": 1}),
]


@pytest.mark.parametrize("row, faults", GRADIENT_ROWS)
def test_a_gradient_records_faults_make_it_strictly_fake(row, faults):
    from transforms.lark.browser import check_gradient_records

    good = {"record_id": "0", "x_0": "7", "x_1": "8", "label": "0", "fake": "false"}
    table = pa.table({c: pa.array([good[c], row.get(c, "1")], pa.string()) for c in good})
    checked = check_gradient_records(table, num_features=2)
    assert dict(checked.faults) == faults and checked.kept.num_rows == 2
    assert checked.neutralised.tolist() == [False, bool(faults)]
    assert checked.values[0].tolist() == [7.0, 8.0, 0.0]
    if faults:
        assert checked.values[1].tolist() == [0.0, 0.0, 0.0] and checked.fake[1]


def test_a_tables_faults_are_the_callers_error():
    """A column whose type holds no numbers is the same whatever the rows hold: raised."""
    from transforms.lark.browser import check_aggregation_records, check_gradient_records
    from transforms.lark.reports import LarkInputError

    ids = pa.array([1, 2])
    with pytest.raises(LarkInputError, match="column 'v' has type list<item: int64>"):
        check_aggregation_records(pa.table({"record_id": ids, "key": ["a", "b"],
                                            "v": [[1], [2]], "w": [1.0, 2.0]}), _agg_params())
    with pytest.raises(LarkInputError, match="column 'label' has type bool"):
        check_gradient_records(pa.table({"record_id": ids, "x_0": [1, 2], "label": [True, False]}),
                               num_features=1)
    with pytest.raises(LarkInputError, match="lack column"):
        check_gradient_records(pa.table({"record_id": ids, "x_0": [1, 2]}), num_features=1)


def test_a_faulty_record_changes_no_other_records_reports():
    """Each record's randomness is keyed by its own content: the others' reports are the same
    bytes whether or not a faulty record shares their table; the neutralised gradient record's
    masks share 0 (it adds nothing), and its stream is not a real record's."""
    from transforms.lark.browser import aggregation_reports, gradient_reports
    from transforms.lark.randomness import BrowserRandomness

    source = BrowserRandomness.for_testing(3)
    records = pa.table({"record_id": ["1", "2", "3", "4"], "key": ["a", "a", "b", "b"],
                        "v": ["1", "x", "3", "4"], "w": ["1", "2", "3", None]})
    every = aggregation_reports(records, _agg_params(), randomness=source, batch_id="b")
    clean = aggregation_reports(records.take([0, 2]), _agg_params(), randomness=source,
                                batch_id="b")
    for h in (0, 1):
        assert every[h].num_rows == 4 and every[h].take([0, 2]).equals(clean[h])

    gradient = pa.table({"record_id": [1, 2, 3], "x_0": ["5", "300", "7"], "label": [1, 0, 1]})
    every = gradient_reports(gradient, num_features=1, randomness=source, batch_id="b")
    clean = gradient_reports(gradient.take([0, 2]), num_features=1, randomness=source,
                             batch_id="b")
    for h in (0, 1):
        assert every[h].take([0, 2]).equals(clean[h])
    masks = [sum(int(every[h].column(m)[1].as_py()) for h in (0, 1)) % 2 ** 64
             for m in ("mask_a", "mask_b")]
    assert masks == [0, 0]
    zero = gradient_reports(pa.table({"record_id": [2], "x_0": [0], "label": [0]}),
                            num_features=1, randomness=source, batch_id="b")
    assert zero[0].column("report_id")[0] != every[0].column("report_id")[1]


def _run_job(module, argv):
    import contextlib
    import io

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = module.main(argv)
    return code, out.getvalue(), err.getvalue()


def _operator_counters(folder):
    import json

    (path,) = list(folder.rglob("report.json"))
    return json.loads(path.read_text())["counters"]


def test_the_browsers_job_shares_a_batch_with_faulty_records_and_counts_them(tmp_path):
    """Before: one value that is not a number refused the whole batch inside the pipeline."""
    import json

    import pyarrow.parquet as pq

    from pipelines.masked_lark import share as masked_lark_share

    rows = [f"{i},k{i % 2},{i % 7}.5" for i in range(20)]
    rows[4], rows[9], rows[13] = "4,k0,SECRET-12x", "9,,3.5", "13,k1,"
    (tmp_path / "records.csv").write_text("record_id,key,value\n" + "\n".join(rows) + "\n")
    params = {"kind": "aggregation", "value_columns": ["value"], "lower": 0.0, "upper": 10.0,
              "epsilon": 1.0, "k": 2, "fraction_bits": 8, "num_helpers": 2}
    (tmp_path / "params.json").write_text(json.dumps(params))
    code, out, err = _run_job(masked_lark_share, [
        "--input", str(tmp_path / "records.csv"), "--params", str(tmp_path / "params.json"),
        "--batch_id", "b1", "--output", str(tmp_path / "out"),
        "--ledger", str(tmp_path / "private" / "ledger.json"),
        "--key_store", str(tmp_path / "private" / "keys")])
    assert code == 0, err
    counters = _operator_counters(tmp_path / "private")
    assert counters["records.dropped.value_not_a_number"] == 1
    assert counters["records.dropped.value_missing"] == 1
    assert counters["records.dropped.missing_key"] == 1
    assert "records.dropped.value_not_a_number=1" in out and "SECRET-12x" not in out + err
    for h in (0, 1):   # the neutralised records are shared, the one without a key is not
        path = tmp_path / "out" / "masked_lark_share" / "b1" / "v1" / f"reports_helper_{h}.parquet"
        assert pq.read_table(path).num_rows == 19


def test_the_training_driver_trains_with_a_faulty_record_and_counts_it(tmp_path):
    """Before: one feature outside 0..255 refused the run before the charge."""
    import os

    from pipelines.masked_lark import train as masked_lark_train

    sample = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                          "pipelines", "sample_data", "masked_lark")
    lines = open(os.path.join(sample, "train.csv")).read().splitlines()
    first = lines[1].split(",")
    lines[1] = ",".join(first[:1] + ["777"] + first[2:])
    lines[2] = ",".join(lines[2].split(",")[:-1] + ["yes"])
    (tmp_path / "train.csv").write_text("\n".join(lines) + "\n")
    code, out, err = _run_job(masked_lark_train, [
        "--input", str(tmp_path / "train.csv"),
        "--params", os.path.join(sample, "gradient_params.json"),
        "--model", os.path.join(sample, "model.json"), "--epochs", "1", "--batch_size", "120",
        "--model_id", "m1", "--output", str(tmp_path / "out"),
        "--ledger", str(tmp_path / "private" / "ledger.json"),
        "--key_store", str(tmp_path / "private" / "keys")])
    assert code == 0, err
    counters = _operator_counters(tmp_path / "private")
    assert counters["records.dropped.feature_not_a_byte"] == 1
    assert counters["records.dropped.label_not_a_number"] == 1
    assert "777" not in err
