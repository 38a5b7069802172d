"""The release layer (pipelines/release) on its own: names, input resolution, preflight,
publication rules, ledger binding, the CLI convention and the dropped-rows rule (with a toy job:
the layer's behaviour, independent of any real job)."""
from __future__ import annotations

import bz2
import dataclasses
import gzip
import json
import lzma
import os
import re
from dataclasses import dataclass, field

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from release_testkit import read_json, write_csv

from accounting.budget import PrivacyBudget
from accounting.calibration import calibrate
from accounting.ledger import BudgetLedger, Scope
from accounting.measures import Measure
from accounting.sensitivity import Sensitivities
from pipelines.release import (InputSpec, Job, OutputSpec, PlannedRelease, ReleaseFailed,
                               ReleaseOptions, ReleaseRefused, cli, counters, inputs, names,
                               publish, storage)
from pipelines.release import flags as release_flags
from pipelines.release.errors import EXIT_NOT_COMMITTED
from pipelines.release import run as run_release
from transforms.counting import Counted, CountingDoFn

# --------------------------------------------------------------------------- names


@pytest.mark.parametrize("value", ["C1", "c2026_fr-x.1", "2026-11-01", "a" * 128, "v1.2"])
def test_safe_segments(value):
    assert names.check_segment(value, "campaign") == value


@pytest.mark.parametrize("value", ["", ".", "..", "...", "a/b", "/a", ".hidden", "-a", "_a",
                                   "a b", "a\\b", "a" * 129, "ü", "a\n", None, 7])
def test_unsafe_segments_are_refused(value):
    with pytest.raises(ValueError, match="campaign"):
        names.check_segment(value, "campaign")


def test_release_ids_are_safe_paths_inside_the_output():
    assert names.release_path("C1/2026-11-01") == ["C1", "2026-11-01"]
    for bad in ["C1/../x", "../C1", "C1//d", "/C1", "C1/", "/".join("a" * 9), "C1/."]:
        with pytest.raises(ValueError):
            names.check_release_id(bad)
    with pytest.raises(ValueError):
        publish.release_folder("/out", "C1/..", 1, False)


# --------------------------------------------------------------------------- resolving inputs

def _spec(paths, columns=None, **kw):
    return InputSpec(name="rows", paths=paths, columns=columns or {"key": "text"}, flag="--rows", **kw)


def _tree(root):
    for rel in ["a.csv", "sub/b.csv", "sub/deeper/c.csv", "_SUCCESS", ".hidden.csv",
                "_tmp/x.csv", ".git/y.csv", "sub/_part.csv", "other.txt"]:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("key\nk\n")
    return root


def test_a_folder_is_read_recursively_without_hidden_or_underscore_files(tmp_path):
    root = _tree(tmp_path / "in")
    assert inputs.resolve(_spec(str(root))) == [
        str(root / "a.csv"), str(root / "other.txt"), str(root / "sub/b.csv"),
        str(root / "sub/deeper/c.csv")]


def test_globs_recursive_relative_and_several_patterns(tmp_path, monkeypatch):
    root = _tree(tmp_path / "in")
    assert inputs.resolve(_spec(str(root / "**" / "*.csv"))) == [
        str(root / "a.csv"), str(root / "sub/b.csv"), str(root / "sub/deeper/c.csv")]
    monkeypatch.chdir(tmp_path)
    got = inputs.resolve(_spec(["in/sub/*.csv", "in/a.csv", str(root / "sub" / "b.csv")]))
    assert got == [str(root / "a.csv"), str(root / "sub/b.csv")]  # absolute, sorted, distinct
    assert inputs.resolve(_spec("in/a.csv")) == [str(root / "a.csv")]
    # A name spelled out is read; what a wildcard reaches below it is not if hidden.
    assert inputs.resolve(_spec(["in/_tmp/*.csv", "in/_SUCCESS"])) == [
        str(root / "_SUCCESS"), str(root / "_tmp/x.csv")]


def test_gcs_prefixes_and_globs_skip_hidden_names_too():
    pytest.importorskip("gcp_storage_emulator.server")
    from gcs_emulator import storage_emulator

    from accounting import gcs

    with storage_emulator("inputs") as bucket:
        for name in ["in/a.csv", "in/_temporary/0/b.csv", "in/sub/c.csv", "in/_SUCCESS", "in/.x.csv"]:
            gcs.blob(f"gs://{bucket}/{name}").upload_from_string(b"key\n")
        want = [f"gs://{bucket}/in/a.csv", f"gs://{bucket}/in/sub/c.csv"]
        assert inputs.resolve(_spec(f"gs://{bucket}/in/")) == want
        assert inputs.resolve(_spec(f"gs://{bucket}/in/*.csv")) == want
        assert inputs.resolve(_spec(f"gs://{bucket}/in/_temporary/*/*.csv")) == [
            f"gs://{bucket}/in/_temporary/0/b.csv"]
        with pytest.raises(ReleaseRefused, match="matches no file"):
            inputs.resolve(_spec(f"gs://{bucket}/in/nothing*"))


@pytest.mark.parametrize("pattern", ["in/*.parquet", "missing.csv", "in/.hidden*", "in/_*/*.csv"])
def test_a_pattern_matching_nothing_is_refused_naming_it(tmp_path, monkeypatch, pattern):
    _tree(tmp_path / "in")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ReleaseRefused, match=re.escape(f"--rows: '{pattern}' matches no file")):
        inputs.resolve(_spec(["in/a.csv", pattern]))
    with pytest.raises(ReleaseRefused, match="at least one input path"):
        _spec([])


# --------------------------------------------------------------------------- preflight

CSV = "key,value\nk1,1\nk2,2\n"


def _preflight(path, columns=None, **kw):
    return inputs.preflight(_spec(str(path), columns or {"key": "text", "value": "number"}, **kw))


@pytest.mark.parametrize("name, fmt", [("x.csv", "csv"), ("x.CSV", "csv"), ("x.parquet", "parquet"),
                                       ("x.pq", "parquet"), ("x.jsonl", "jsonl"),
                                       ("x.ndjson", "jsonl")])
def test_format_from_the_name(tmp_path, name, fmt):
    path = tmp_path / name
    if fmt == "parquet":
        pq.write_table(pa.table({"key": ["a"], "value": [1]}), path)
    elif fmt == "jsonl":
        path.write_text('{"a": 1}\n')
    else:
        path.write_text(CSV)
    resolved = _preflight(path, {} if fmt == "jsonl" else None)
    assert resolved.formats == {str(path): fmt} and resolved.compression == {str(path): None}


def test_an_unknown_format_is_refused_unless_declared(tmp_path):
    path = tmp_path / "rows.txt"
    path.write_text(CSV)
    with pytest.raises(ReleaseRefused, match="cannot tell the format of .*rows.txt"):
        _preflight(path)
    assert _preflight(path, format="csv").present[str(path)] == ("key", "value")


@pytest.mark.parametrize("suffix, compress", [
    (".csv.gz", gzip.compress), (".csv.gzip", gzip.compress), (".csv.bz2", bz2.compress),
    (".csv.zst", lambda b: zstandard.ZstdCompressor().compress(b)),
    (".csv.xz", lambda b: lzma.compress(b))])
def test_compression_named_so_is_read(tmp_path, suffix, compress):
    path = tmp_path / f"rows{suffix}"
    path.write_bytes(compress(CSV.encode() * 1))
    resolved = _preflight(path)
    assert resolved.formats[str(path)] == "csv" and resolved.compression[str(path)] is not None
    tables = list(inputs._read_tables(str(path), "csv", ["key", "value"],
                                      resolved.compression[str(path)], counters.RowCounters("t", "rows")))
    assert pa.concat_tables(tables).to_pylist() == [{"key": "k1", "value": "1"},
                                                    {"key": "k2", "value": "2"}]


@pytest.mark.parametrize("name, data, message", [
    ("rows.csv", gzip.compress(CSV.encode()), "gzip-compressed but its name does not say so"),
    ("rows.csv.bz2", gzip.compress(CSV.encode()), "gzip-compressed but its name does not say so"),
    ("rows.csv", bz2.compress(CSV.encode()), "bzip2-compressed"),
    ("rows.zip", b"PK\x03\x04" + b"\0" * 40, "zip-compressed"),
    ("rows.parquet.gz", gzip.compress(b"PAR1"), "compressed Parquet"),
], ids=["gzip-named-csv", "gzip-named-bz2", "bzip2-named-csv", "zip", "gzipped-parquet"])
def test_compression_is_detected_by_magic_bytes_not_trusted_from_the_name(tmp_path, name, data, message):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ReleaseRefused, match=message):
        _preflight(path)


@pytest.mark.parametrize("header, message", [
    ("key, value", "header field 2 is column 'value' with surrounding spaces"),
    (" key,value", "header field 1 is column 'key' with surrounding spaces"),
    ("Key,value", "no column 'key'"),
    ("key;value", "no column 'key'"),
    ("", "no column 'key'"),
])
def test_a_csv_header_must_name_columns_exactly(tmp_path, header, message):
    path = tmp_path / "rows.csv"
    path.write_text(header + "\nk,1\n" if header else "")
    with pytest.raises(ReleaseRefused, match=message) as info:
        _preflight(path)
    assert str(path) in str(info.value) and "--rows" in str(info.value)


def test_a_csv_header_may_carry_a_byte_order_mark_and_quotes_and_extra_columns(tmp_path):
    path = tmp_path / "rows.csv"
    path.write_bytes(b'\xef\xbb\xbf"key","other","value"\r\nk,x,1\r\n')
    assert _preflight(path).present[str(path)] == ("key", "other", "value")


def test_messages_name_files_and_columns_never_content(tmp_path):
    secret = "8f5189b971b5d101b9145bedfb053e6d9f9e4b7604141b364b08531f009a2c0e"
    for name, data in [("k.csv", secret + "\n"), ("k.key", secret + "\n"),
                       ("k.jsonl", secret + "\n"), ("k.parquet", secret)]:
        path = tmp_path / name
        path.write_text(data)
        with pytest.raises(ReleaseRefused) as info:
            _preflight(path, {} if name.endswith("jsonl") else None)
        assert secret not in str(info.value) and secret[:16] not in str(info.value)
    path = tmp_path / "bad-utf8.csv"
    path.write_bytes(b"\xff\xfe" + secret.encode() + b"\n")
    with pytest.raises(ReleaseRefused, match="does not start with a UTF-8 CSV header"):
        _preflight(path)


def _parquet(tmp_path, **columns):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.table(columns), path)
    return path


@pytest.mark.parametrize("kind, array, ok", [
    ("number", pa.array([1], pa.int64()), True), ("number", pa.array([1.5]), True),
    ("number", pa.array([True]), False), ("number", pa.array(["1"]), False),
    ("integer", pa.array([1.0]), False), ("integer", pa.array([1], pa.int32()), True),
    ("date", pa.array([20261101], pa.int64()), False), ("date", pa.array(["2026-11-01"]), True),
    ("date", pa.array([0], pa.date32()), True), ("date", pa.array([0], pa.timestamp("s")), True),
    ("text", pa.array([1]), False), ("text", pa.array(["a"]).dictionary_encode(), True),
    ("id", pa.array([True]), False), ("id", pa.array([7]), True), ("id", pa.array(["u"]), True),
    ("number", pa.nulls(1), True),
])
def test_parquet_column_types_are_checked_from_the_footer(tmp_path, kind, array, ok):
    path = _parquet(tmp_path, key=["k"], value=array)
    if ok:
        _preflight(path, {"key": "text", "value": kind})
    else:
        with pytest.raises(ReleaseRefused, match=rf"column 'value' has type .*not a usable {kind}"):
            _preflight(path, {"key": "text", "value": kind})


def test_parquet_footer_and_columns(tmp_path):
    path = _parquet(tmp_path, key=["k"], value=[1])
    with pytest.raises(ReleaseRefused, match=r"has no column 'other' \(columns: \['key', 'value'\]\)"):
        _preflight(path, {"key": "text", "other": "number"})
    with pytest.raises(ReleaseRefused, match="column 'value' has type int64, not a usable text"):
        _preflight(path, {"key": "text"}, optional={"value": "text"})
    path.write_bytes(path.read_bytes()[:-12])  # a truncated footer
    with pytest.raises(ReleaseRefused, match="not a readable Parquet file"):
        _preflight(path)
    (tmp_path / "empty.parquet").write_bytes(b"")
    with pytest.raises(ReleaseRefused, match="not a readable Parquet file"):
        _preflight(tmp_path / "empty.parquet")


def test_an_absent_optional_column_is_null_typed_an_empty_field_is_text(tmp_path):
    write_csv(tmp_path / "a.csv", ["key", "value"], [("k", 1)])
    write_csv(tmp_path / "b.csv", ["key", "value", "extra"], [("k", 1, "")])
    resolved = inputs.preflight(_spec(str(tmp_path / "*.csv"), {"key": "text"},
                                      optional={"value": "any", "extra": "any"}))
    reader = inputs._ReadFile(resolved, "t")
    reader.setup()
    (a,) = reader.process(str(tmp_path / "a.csv"))
    (b,) = reader.process(str(tmp_path / "b.csv"))
    assert a.schema.field("extra").type == pa.null()
    assert b.schema.field("extra").type == pa.string() and b.column("extra").null_count == 1


# --------------------------------------------------------------------------- publication

def _stage(folder, files):
    os.makedirs(folder, exist_ok=True)
    for name, data in files.items():
        with open(os.path.join(folder, name), "wb") as handle:
            handle.write(data)
    return str(folder)


FILES = {"out.csv": b"k,1\n", publish.MARKER: b'{"release_id": "r"}\n'}


def test_publish_new_then_an_identical_rerun_is_a_no_op(tmp_path):
    final = str(tmp_path / "out" / "r" / "v1")
    assert publish.publish(_stage(tmp_path / "s1", FILES), final, testing=False) == "new"
    assert not (tmp_path / "s1").exists()
    stamp = os.stat(os.path.join(final, "out.csv")).st_mtime_ns
    assert publish.publish(_stage(tmp_path / "s2", FILES), final, testing=False) == "identical"
    assert not (tmp_path / "s2").exists()
    assert os.stat(os.path.join(final, "out.csv")).st_mtime_ns == stamp
    assert publish.digests(final) == {n: storage.sha256_of(os.path.join(final, n)) for n in FILES}


def test_published_bytes_are_never_replaced(tmp_path):
    final = str(tmp_path / "out" / "r" / "v1")
    publish.publish(_stage(tmp_path / "s1", FILES), final, testing=False)
    other = dict(FILES, **{"out.csv": b"k,2\n"})
    with pytest.raises(ReleaseFailed, match=r"published with other bytes \(out.csv\).*--new_release"):
        publish.publish(_stage(tmp_path / "s2", other), final, testing=False)
    with pytest.raises(ReleaseFailed, match=r"other bytes \(extra.csv\)"):
        publish.publish(_stage(tmp_path / "s3", dict(FILES, **{"extra.csv": b""})), final,
                        testing=False)
    assert {n: open(os.path.join(final, n), "rb").read() for n in os.listdir(final)} == FILES


def test_a_partial_publication_is_completed_with_the_marker_last_or_refused(tmp_path, monkeypatch):
    final = tmp_path / "out" / "r" / "v1"
    _stage(final, {"out.csv": FILES["out.csv"]})  # a crash left the data file, no marker
    written = []
    real = storage.write_bytes
    monkeypatch.setattr(storage, "write_bytes",
                        lambda path, data, **kw: written.append(os.path.basename(path)) or real(path, data, **kw))
    staged = dict(FILES, **{"b.csv": b"b\n", "z.csv": b"z\n"})
    assert publish.publish(_stage(tmp_path / "s", staged), str(final), testing=False) == "resume"
    assert written[-1] == publish.MARKER and sorted(written) == sorted(staged)
    assert sorted(os.listdir(final)) == sorted(staged)
    partial = tmp_path / "out" / "r" / "v2"
    _stage(partial, {"out.csv": b"other\n"})
    with pytest.raises(ReleaseFailed, match=r"partly published release with other bytes \(out.csv\)"):
        publish.publish(_stage(tmp_path / "s2", FILES), str(partial), testing=False)
    assert (partial / "out.csv").read_bytes() == b"other\n" and not (partial / publish.MARKER).exists()


def test_the_layout_module_names_what_the_layer_writes(tmp_path):
    """pipelines.release.layout is the one statement of the release layout (the catalog reads
    with it): the folders, the marker, the reports the layer writes are its names."""
    from pipelines.release import layout
    from pipelines.release import report as release_report

    out = str(tmp_path / "out")
    assert publish.release_folder(out, "C1/d", 2, False) == os.path.join(out, "C1", "d", "v2")
    assert publish.release_folder(out, "C1/d", 2, True) == os.path.join(
        out, layout.TESTING_PREFIX, "C1", "d")
    folder = publish.release_folder(out, "C1/d", 1, False)
    publish.publish(_stage(tmp_path / "s", FILES), folder, testing=False)
    assert sorted(os.listdir(folder)) == sorted(FILES) and layout.MARKER in FILES
    assert release_report.report_path("r", "C1/d", 1) == os.path.join("r", "C1", "d", "v1",
                                                                      layout.REPORT)
    path = release_report.write_failure({"status": "failed"}, root=str(tmp_path / "r"),
                                        release_id="C1/d", version=1)
    assert os.path.basename(path) == layout.FAILURE and os.path.isfile(path)


def test_testing_runs_live_under_their_prefix_and_replace_only_their_own_output(tmp_path):
    out = str(tmp_path / "out")
    final = publish.release_folder(out, "C1/2026-11-01", 1, True)
    assert final == os.path.join(out, publish.TESTING_PREFIX, "C1", "2026-11-01")
    assert publish.release_folder(out, "C1/2026-11-01", 3, False) == os.path.join(out, "C1", "2026-11-01", "v3")
    publish.publish(_stage(tmp_path / "s1", FILES), final, testing=True)
    publish.publish(_stage(tmp_path / "s2", {"new.csv": b"x"}), final, testing=True)
    assert os.listdir(final) == ["new.csv"]


def test_output_roots_inside_a_release_or_the_testing_prefix_are_refused(tmp_path):
    out = tmp_path / "out"
    release = out / "C1" / "2026-11-01" / "v1"
    _stage(release, FILES)
    publish.check_output_root(str(out), False)
    publish.check_output_root(str(out), True)
    for root in [release, release / "x", release / "x" / "y"]:
        for testing in (False, True):
            with pytest.raises(ReleaseRefused, match=f"inside the published release {release}"):
                publish.check_output_root(str(root), testing)
    with pytest.raises(ReleaseRefused, match="a release never goes there"):
        publish.check_output_root(str(out / publish.TESTING_PREFIX / "x"), False)
    publish.check_output_root(str(out / publish.TESTING_PREFIX / "x"), True)


# --------------------------------------------------------------------------- ledger binding

def _ledger(path, tmp_path) -> BudgetLedger:
    ledger = BudgetLedger(str(path), str(tmp_path / "keys"))
    ledger.set_budget(Scope(name="s", budget=PrivacyBudget(epsilon=1.0)))
    return ledger


def test_the_output_root_is_bound_to_one_ledger(tmp_path):
    out = str(tmp_path / "out")
    ledger = _ledger(tmp_path / "ledger.json", tmp_path)
    assert publish.check_binding(out, ledger) is None
    publish.bind(out, ledger)
    binding = publish.binding_path(out, ledger.path)
    assert binding.startswith(ledger.path + publish.BINDINGS_SUFFIX + "/")
    assert not os.path.exists(out)  # nothing but releases in the public root
    assert read_json(binding) == {"ledger": ledger.path, "ledger_id": ledger.ledger_id(),
                                  "output": out}
    assert publish.check_binding(out, ledger)["ledger_id"] == ledger.ledger_id()
    publish.bind(out, ledger)  # a second first run binds nothing new
    # Deleted: the message names the binding and both ledger paths.
    os.rename(tmp_path / "ledger.json", tmp_path / "away.json")
    with pytest.raises(ReleaseRefused) as info:
        publish.check_binding(out, BudgetLedger(str(tmp_path / "ledger.json"), str(tmp_path / "keys")))
    assert binding in str(info.value) and ledger.path in str(info.value)
    assert "does not exist" in str(info.value)
    # Replaced by another ledger at the same path.
    other = _ledger(tmp_path / "ledger.json", tmp_path)
    with pytest.raises(ReleaseRefused, match="is another ledger") as info:
        publish.check_binding(out, other)
    assert binding in str(info.value) and ledger.ledger_id() in str(info.value)
    # Emptied.
    (tmp_path / "ledger.json").write_bytes(b"")
    with pytest.raises(ReleaseRefused, match="cannot be read.*not valid JSON") as info:
        publish.check_binding(out, other)
    assert binding in str(info.value) and str(tmp_path / "ledger.json") in str(info.value)


def test_an_interrupted_binding_is_repaired_and_an_older_root_migrated(tmp_path):
    out = str(tmp_path / "out")
    ledger = _ledger(tmp_path / "ledger.json", tmp_path)
    publish.bind(out, ledger)
    binding = publish.binding_path(out, ledger.path)
    whole = open(binding, "rb").read()
    for interrupted in (b"", whole[:len(whole) // 2]):
        with open(binding, "wb") as handle:
            handle.write(interrupted)
        assert publish.check_binding(out, ledger) is None  # ours, cut: not another ledger's
        publish.bind(out, ledger)
        assert open(binding, "rb").read() == whole
    with open(binding, "wb") as handle:
        handle.write(b"not a binding")
    with pytest.raises(ReleaseRefused, match="is not a ledger binding"):
        publish.check_binding(out, ledger)
    # An output root of an older version: its binding and empty staging leave the public root.
    os.remove(binding)
    os.makedirs(os.path.join(out, publish.STAGING, "C1", "d"))
    legacy = os.path.join(out, publish.BINDING)
    with open(legacy, "wb") as handle:
        handle.write(whole)
    assert publish.check_binding(out, ledger)["ledger_id"] == ledger.ledger_id()
    publish.bind(out, ledger)
    assert open(binding, "rb").read() == whole and os.listdir(out) == []
    os.remove(tmp_path / "ledger.json")
    other = _ledger(tmp_path / "ledger.json", tmp_path)
    with open(legacy, "wb") as handle:  # a legacy binding of another ledger still refuses
        handle.write(whole)
    os.remove(binding)
    with pytest.raises(ReleaseRefused, match="is another ledger"):
        publish.check_binding(out, other)


def test_releases_without_a_binding_or_a_ledger_record_are_refused(tmp_path):
    out = tmp_path / "out"
    marker = {"release_id": "C1/d", "version": 1, "testing": False, "key_fingerprints": {"release": "ab"}}
    _stage(out / "C1" / "d" / "v1", {publish.MARKER: json.dumps(marker).encode()})
    _stage(out / publish.TESTING_PREFIX / "T" / "d", {publish.MARKER: b'{"testing": true}'})
    ledger = _ledger(tmp_path / "ledger.json", tmp_path)
    with pytest.raises(ReleaseRefused, match="holds published releases of ledger None .*C1/d/v1/"
                                             "RELEASE.json.*no ledger binding") as info:
        publish.check_binding(str(out), ledger)
    assert ledger.path in str(info.value)
    with pytest.raises(ReleaseRefused, match=f"C1/d/v1/RELEASE.json is a published release that ledger "
                                             f"{ledger.path} does not hold"):
        publish.check_markers_in_ledger(str(out), "C1/d", ledger)
    publish.check_markers_in_ledger(str(out), "T/d", ledger)  # testing markers are not releases
    publish.check_markers_in_ledger(str(out), "C2/d", ledger)


# --------------------------------------------------------------------------- a toy job

NOISE = calibrate("discrete_laplace", epsilon=1.0, l1_sensitivity=1)
ONE = Sensitivities(l0=1, linf=1.0, l1=1.0, l2=1.0)
TOY_SCHEMA = pa.schema([("key", pa.string()), ("count", pa.int64())])


@dataclass(frozen=True, kw_only=True)
class ToyRequest:
    rows: tuple = field(metadata={"help": "CSV files with key,value"})
    label: str = field(default="toy", metadata={"help": "the release id"})
    shards: int = field(default=1, metadata={"help": "an integer option"})
    options: ReleaseOptions = field(metadata={"cli": False})


class _ToyCount(CountingDoFn):
    """All rows (one list of tables) -> the counts table; faulty rows counted."""

    def __init__(self, counters):
        self._counters = counters

    def process(self, tables):
        yield _toy_count(tables, self._counters)


def _toy_count(tables, counters):
    import numpy as np

    out = {}
    for table in tables:
        for row in table.to_pylist():
            if row["key"] == "other":
                counters.skipped("other_release", 1)
            elif not (row["value"] or "").isdigit():
                counters.dropped("unparseable", 1)
            else:
                out[row["key"]] = out.get(row["key"], 0) + int(row["value"])
    keys = sorted(out)
    return pa.table({"key": pa.array(keys, pa.string()),
                     "count": pa.array(np.array([out[k] for k in keys], dtype=np.int64))})


class ToyJob(Job):
    """Sums of value per key (exact: a toy for the layer's rules, never a real release)."""

    name = "toyjob"
    request_type = ToyRequest
    description = "A toy job."

    def inputs(self, prepared):
        return [InputSpec(name="rows", paths=prepared.request.rows, columns={"key": "text", "value": "text"},
                          flag="--rows")]

    def plan(self, prepared):
        return [PlannedRelease(
            release_id=prepared.request.label, measures=[Measure.of_noise("count", NOISE, ONE)],
            scopes=[Scope(name="toy", budget=PrivacyBudget(epsilon=10.0))],
            outputs=[OutputSpec(name="counts.csv", sort_by=["key"], schema=TOY_SCHEMA)], config={})]

    def build(self, pipeline, prepared, inputs, release):
        rows = release.counters(self.name, "rows")
        return {"counts.csv": (inputs["rows"]
                               | release.label("All") >> beam.combiners.ToList()
                               | release.label("Count") >> Counted(_ToyCount(rows)))}


TOY = ToyJob()


def test_dashed_flags_are_the_underscore_flags():
    parser, flags = cli.build_parser(TOY)
    argv = ["--rows", "a.csv,b.csv", "--testing-seed=3", "--output", "o", "--new-release",
            "--max-dropped-fraction", "0.25", "--alert-exit-code", "9", "--runner", "FnApiRunner",
            "--temp-location", "t"]
    assert release_flags.normalise(argv, flags) == [
        "--rows", "a.csv,b.csv", "--testing_seed=3", "--output", "o", "--new_release",
        "--max_dropped_fraction", "0.25", "--alert_exit_code", "9", "--runner", "FnApiRunner",
        "--temp-location", "t"]
    argv.remove("--new-release")  # (no release with --testing_seed)
    known = [o for a in parser._actions for o in a.option_strings]
    dashed = cli.parse_request(TOY, argv)
    underscore = cli.parse_request(TOY, release_flags.normalise(argv, known))
    assert dashed == underscore
    assert dashed.rows == ("a.csv", "b.csv") and dashed.options.testing_seed == 3
    assert dashed.options.alert_exit_code == 9 and dashed.options.max_dropped_fraction == 0.25
    # Beam's flags have their dashed alias too (Beam itself would drop --temp-location)
    assert dashed.options.pipeline_args == ("--runner", "FnApiRunner", "--temp_location", "t")


@pytest.mark.parametrize("flag", ["--allow_dropped_rows", "--allow-dropped-rows",
                                  "--allow_dropped_rows=true"])
def test_the_removed_allow_dropped_rows_flag_is_refused_naming_its_replacement(flag, capsys):
    """It meant "publish although the dropped-rows rule refuses"; nothing is refused for
    dropped rows any more, so it is refused rather than passed on to Beam and ignored."""
    assert cli.main(TOY, ["--rows", "a.csv", "--testing_seed", "1", "--output", "o", flag]) == 2
    err = capsys.readouterr().err
    assert "--allow_dropped_rows was removed" in err and "--alert_exit_code" in err


@pytest.mark.parametrize("options, message", [
    (dict(testing_seed=1, ledger="l"), "--testing_seed makes no release"),
    (dict(testing_seed=True), "--testing_seed must be an integer"),
    (dict(ledger="l"), "a release needs --ledger and --key_store"),
    (dict(testing_seed=1, max_dropped_fraction=1.0), r"--max_dropped_fraction must be in \[0, 1\)"),
    (dict(testing_seed=1, alert_exit_code=3), r"--alert_exit_code must be an integer in 5\.\.125"),
    (dict(testing_seed=1, alert_exit_code=126), r"--alert_exit_code must be an integer"),
    (dict(testing_seed=1, alert_exit_code=True), r"--alert_exit_code must be an integer"),
    (dict(output=""), "--output is required"),
])
def test_release_options_are_checked_when_built(options, message):
    with pytest.raises(ReleaseRefused, match=message):
        ReleaseOptions(**{"output": "o", **options})


def _toy(tmp_path, rows, **options):
    path = write_csv(tmp_path / "rows.csv", ["key", "value"], rows)
    return ToyRequest(rows=(path,), options=ReleaseOptions(output=str(tmp_path / "out"),
                                                           testing_seed=1, **options))


def test_an_output_states_each_values_error_in_its_marker(tmp_path):
    """OutputSpec.errors: a public statement per value column, published in RELEASE.json; a
    statement for a column the schema does not have is refused when the spec is made."""
    class StatedErrors(ToyJob):
        def plan(self, prepared):
            (planned,) = super().plan(prepared)
            output = dataclasses.replace(planned.outputs[0], errors={"count": "no interval: a toy"})
            return [dataclasses.replace(planned, outputs=[output])]

    (outcome,) = run_release(StatedErrors(), _toy(tmp_path, [("a", 1)])).releases
    marker = read_json(os.path.join(outcome.folder, publish.MARKER))
    assert marker["outputs"]["counts.csv"]["errors"] == {"count": "no interval: a toy"}
    with pytest.raises(ValueError, match="not in its schema"):
        OutputSpec(name="counts.csv", sort_by=["key"], schema=TOY_SCHEMA, errors={"mean": "x"})


@pytest.mark.parametrize("rows, options, alert", [
    ([("a", 1), ("b", 2)], {}, None),
    ([("a", 1), ("b", "x")], {}, None),                          # 1 of 2: not more than 50 %
    ([("a", 1), ("b", "x"), ("c", "y")], {}, "rows: 2 of 3 eligible rows dropped (more than 50%)"),
    ([("a", 1), ("b", "x"), ("c", "y")], {"max_dropped_fraction": 0.7}, None),
    ([("a", "x"), ("b", "y")], {"max_dropped_fraction": 0.99}, "rows: all 2 eligible rows dropped"),
    ([("a", 1)] * 4 + [("b", "x")], {"max_dropped_fraction": 0.1}, "1 of 5 eligible rows dropped"),
    ([("other", "x")] * 5 + [("a", 1)], {}, None),               # skipped rows are not eligible
    ([("other", "x")] * 5, {}, "rows: no eligible rows"),        # rows of other releases only
    ([], {}, "rows: no eligible rows (an empty or header-only input"),
])
def test_the_row_rules_alert_the_operator_and_never_stop_a_release(tmp_path, rows, options, alert):
    (outcome,) = run_release(TOY, _toy(tmp_path, rows, **options)).releases
    report = outcome.report
    assert os.path.exists(os.path.join(outcome.folder, publish.MARKER))  # published, always
    if alert is None:
        assert report["alerts"] == []
    else:
        (found,) = report["alerts"]
        assert found.startswith(alert) or alert in found, found
    dropped = sum(1 for k, v in rows if k != "other" and not str(v).isdigit())
    if dropped:
        assert f"rows.dropped.unparseable={dropped}" in "".join(report["alerts"]) or alert is None
    assert report["counters"].get("rows.read", 0) == len(rows)
    public = json.dumps(outcome.marker)
    assert "rows.read" not in public and "alert" not in public  # operator facts never published


def test_an_alert_exits_zero_unless_the_operator_asks_for_a_code(tmp_path, capsys):
    path = write_csv(tmp_path / "rows.csv", ["key", "value"], [("a", "x"), ("b", 2), ("c", "y")])
    argv = ["--rows", path, "--testing_seed", "1", "--output", str(tmp_path / "out")]
    assert cli.main(TOY, argv) == 0
    captured = capsys.readouterr()
    line = "toyjob: alert (operator only; published): toy: rows: 2 of 3 eligible rows dropped"
    assert line in captured.err
    assert "ALERT (operator only; the release is published): rows: 2 of 3" in captured.out
    assert cli.main(TOY, argv + ["--alert_exit_code", "9"]) == 9
    assert line in capsys.readouterr().err
    clean = write_csv(tmp_path / "rows.csv", ["key", "value"], [("a", 1), ("b", 2)])
    assert cli.main(TOY, ["--rows", clean] + argv[2:] + ["--alert_exit_code", "9"]) == 0
    assert "alert" not in capsys.readouterr().err


def test_explain_needs_no_ledger_key_store_or_output_and_prepares_once(tmp_path, monkeypatch,
                                                                       capsys):
    """--explain reads no input and charges nothing: it runs with none of --ledger,
    --key_store, --output (and the input need not exist), preparing the request once."""
    calls = []
    real = ToyJob.prepare

    def counting(self, request):
        calls.append(request)
        return real(self, request)

    monkeypatch.setattr(ToyJob, "prepare", counting)
    monkeypatch.chdir(tmp_path)
    assert cli.main(TOY, ["--rows", "missing.csv", "--label", "toy/2026", "--explain"]) == 0
    out = capsys.readouterr().out
    assert "toyjob release toy/2026" in out and "count:" in out
    assert len(calls) == 1 and list(tmp_path.iterdir()) == []  # nothing read or written
    # The Python API makes releases only: explain is the command line's (or Job.planned).
    with pytest.raises(ReleaseRefused, match="--explain makes no release"):
        run_release(TOY, ToyRequest(rows=("missing.csv",),
                                    options=ReleaseOptions(explain=True)))
    # Without --explain the release flags are required again.
    assert cli.main(TOY, ["--rows", "missing.csv"]) == 2
    assert "--output is required" in capsys.readouterr().err


def test_alerts_are_made_from_the_dropped_shares_alone():
    share = {"rows": {"eligible": 4, "dropped": 3, "share": 0.75, "reasons": {"rows.dropped.x": 3}}}
    assert counters.alerts(share, ["rows", "other"], 0.5) == [
        "other: no eligible rows (an empty or header-only input, or rows of other releases only)",
        "rows: 3 of 4 eligible rows dropped (more than 50%); by rows.dropped.x=3"]
    assert counters.alerts(share, ["rows"], 0.75) == []


def test_the_dropped_share_counts_eligible_rows():
    got = counters.dropped_share({"rows.read": 10, "rows.skipped.other": 4, "rows.dropped.a": 1,
                                  "rows.dropped.malformed_csv_line": 2, "rows.excluded.p": 3,
                                  "lib.rows_x": 5, "rows_read": 7})
    assert got == {"rows": {"eligible": 8, "dropped": 3, "share": 3 / 8,
                            "reasons": {"rows.dropped.a": 1, "rows.dropped.malformed_csv_line": 2}}}


def test_a_release_selects_its_own_counters_from_the_runs():
    counts = {"toyjob": {"rows.read": 5}, "toyjob/a": {"rows.dropped.x": 1},
              "toyjob/b": {"rows.dropped.x": 2}, "ara": {"reports_parsed": 3},
              "dp_aggregate": {"rows_read": 9}, "other": {"n": 1}}
    assert counters.select(counts, "toyjob", "a", ("ara",)) == {
        "ara.reports_parsed": 3, "rows.dropped.x": 1, "rows.read": 5}
    assert counters.select(counts, "toyjob", "b") == {"rows.dropped.x": 2, "rows.read": 5}


def test_collect_reads_the_counters_from_staging_alone(tmp_path):
    """compute stages each release's counters beside its files; collect reads them back from
    staging and the reservation only (a finalize in another process can), and a release whose
    staging holds none is an operator alert, never "nothing dropped"."""
    from pipelines.release import lifecycle

    reserved = lifecycle.reserve(lifecycle.preflight(TOY, _toy(tmp_path, [("a", 1), ("b", "x")])))
    computed = lifecycle.compute(reserved)
    staged = os.path.join(computed.staging["toy"], publish.COUNTERS)
    assert read_json(staged)["counters"] == {"rows.dropped.unparseable": 1, "rows.read": 2}
    again = lifecycle.collect(reserved, dict(computed.staging))
    assert again.counters == computed.counters == {"toy": {"rows.dropped.unparseable": 1,
                                                           "rows.read": 2}}
    os.remove(staged)
    ruled = lifecycle.rule(lifecycle.collect(reserved, dict(computed.staging)))
    assert ruled.alerts == {"toy": (counters.NO_COUNTERS,)} and ruled.counts == {"toy": {}}
    published = lifecycle.publish(ruled)
    assert sorted(os.listdir(published.releases[0].folder)) == ["RELEASE.json", "counts.csv"]


def test_a_toy_release_through_the_cli_and_the_ledger(tmp_path, capsys):
    path = write_csv(tmp_path / "rows.csv", ["key", "value"], [("b", 2), ("a", 1), ("a", 4)])
    argv = ["--rows", path, "--output", str(tmp_path / "out"), "--ledger", str(tmp_path / "l.json"),
            "--key-store", str(tmp_path / "keys"), "--label", "toy/2026"]
    assert cli.main(TOY, argv) == 0
    folder = tmp_path / "out" / "toy" / "2026" / "v1"
    assert (folder / "counts.csv").read_text() == '"key","count"\n"a",5\n"b",2\n'  # public order
    marker = read_json(folder / "RELEASE.json")
    assert marker["outputs"]["counts.csv"]["sha256"] == storage.sha256_of(str(folder / "counts.csv"))
    assert marker["ledger_id"] == read_json(tmp_path / "l.json")["ledger_id"]
    out = capsys.readouterr().out
    assert "toyjob release toy/2026 (released)" in out and "rows (operator only): rows.read=3" in out
    report = read_json(tmp_path / "reports" / "toy" / "2026" / "v1" / "report.json")
    assert report["counters"]["rows.read"] == 3 and report["ledger"]["scopes"][0]["spent"]["epsilon"] == 1.0
    assert sorted(os.listdir(folder)) == ["RELEASE.json", "counts.csv"]  # counters stay private
    assert "rows.read" not in (folder / "RELEASE.json").read_text()
    assert cli.main(TOY, argv) == 0 and "(reproduced)" in capsys.readouterr().out
    assert cli.main(TOY, argv[:-2] + ["--label", "../x"]) == 2
    assert "not a valid name" in capsys.readouterr().err


# --------------------------------------------------------------------------- after publication

class TwoReleaseToyJob(ToyJob):
    """The toy job releasing the same sums twice, as two releases of one run."""

    name = "toyjob2"

    def plan(self, prepared):
        (one,) = ToyJob.plan(self, prepared)
        return [dataclasses.replace(one, release_id=f"{prepared.request.label}/{part}")
                for part in "ab"]


def _toy_argv(tmp_path, label="toy/2026"):
    path = write_csv(tmp_path / "rows.csv", ["key", "value"], [("b", 2), ("a", 1)])
    return ["--rows", path, "--output", str(tmp_path / "out"), "--ledger", str(tmp_path / "l.json"),
            "--key_store", str(tmp_path / "keys"), "--label", label]


def test_a_failing_ledger_commit_after_publication_exits_4_and_a_rerun_completes_it(
        tmp_path, monkeypatch, capsys):
    from accounting.ledger import machine

    argv = _toy_argv(tmp_path)
    real_commit = machine.BudgetLedger.commit

    def broken(self, *args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(machine.BudgetLedger, "commit", broken)
    # the release is out, its record incomplete: exit 4 (issue 40), never 0 with a warning
    assert cli.main(TOY, argv) == EXIT_NOT_COMMITTED == 4
    captured = capsys.readouterr()
    assert "published but its ledger record was not committed (OSError" in captured.err
    assert f"exit {EXIT_NOT_COMMITTED}" in captured.err
    folder = tmp_path / "out" / "toy" / "2026" / "v1"
    assert (folder / "RELEASE.json").exists()
    assert read_json(tmp_path / "l.json")["releases"]["toy/2026"]["state"] == "publishing"
    published_bytes = (folder / "counts.csv").read_bytes()
    monkeypatch.setattr(machine.BudgetLedger, "commit", real_commit)
    assert cli.main(TOY, argv) == 0 and "(reproduced)" in capsys.readouterr().out
    assert read_json(tmp_path / "l.json")["releases"]["toy/2026"]["state"] == "committed"
    assert (folder / "counts.csv").read_bytes() == published_bytes
    ledger = BudgetLedger(str(tmp_path / "l.json"), str(tmp_path / "keys"))
    assert ledger.spent("toy").epsilon == pytest.approx(1.0)  # charged once


def test_a_publication_failing_part_way_names_what_is_out_and_a_rerun_publishes_the_rest(
        tmp_path, monkeypatch, capsys):
    job, argv = TwoReleaseToyJob(), _toy_argv(tmp_path)
    real_publish, calls = publish.publish, []

    def second_fails(staging, final, *, testing, **kwargs):
        calls.append(final)
        if len(calls) == 2:
            raise OSError("connection reset")
        return real_publish(staging, final, testing=testing, **kwargs)

    monkeypatch.setattr(publish, "publish", second_fails)
    assert cli.main(job, argv) == 3
    err = capsys.readouterr().err
    assert "published toy/2026/a, but toy/2026/b could not be published" in err
    assert "internal error" not in err
    assert (tmp_path / "out" / "toy" / "2026" / "a" / "v1" / "RELEASE.json").exists()
    assert not (tmp_path / "out" / "toy" / "2026" / "b" / "v1").exists()
    # What is out is committed, with its operator report (publish's failure policy).
    states = {r: v["state"] for r, v in read_json(tmp_path / "l.json")["releases"].items()}
    assert states == {"toy/2026/a": "committed", "toy/2026/b": "publishing"}
    assert (tmp_path / "reports" / "toy" / "2026" / "a" / "v1" / "report.json").exists()
    first = (tmp_path / "out" / "toy" / "2026" / "a" / "v1" / "counts.csv").read_bytes()
    monkeypatch.setattr(publish, "publish", real_publish)
    assert cli.main(job, argv) == 0
    assert (tmp_path / "out" / "toy" / "2026" / "a" / "v1" / "counts.csv").read_bytes() == first
    assert (tmp_path / "out" / "toy" / "2026" / "b" / "v1" / "RELEASE.json").exists()
    ledger = BudgetLedger(str(tmp_path / "l.json"), str(tmp_path / "keys"))
    assert ledger.spent("toy").epsilon == pytest.approx(2.0)  # two releases, each charged once
    assert {r["state"] for r in ledger.records()} == {"committed"}


def test_a_taken_over_reservation_leaves_no_failure_record_beside_the_release(
        tmp_path, monkeypatch, capsys):
    from pipelines.release import lifecycle

    argv = _toy_argv(tmp_path)
    real = lifecycle.run_pipeline

    def disk_full(options, build):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(lifecycle, "run_pipeline", disk_full)
    assert cli.main(TOY, argv) == 3
    folder = tmp_path / "reports" / "toy" / "2026" / "v1"
    assert read_json(folder / "failure.json")["status"] == "failed: nothing published"
    monkeypatch.setattr(lifecycle, "run_pipeline", real)
    write_csv(tmp_path / "rows.csv", ["key", "value"], [("a", 1), ("b", 3)])  # another input
    assert cli.main(TOY, argv) == 0
    assert not (folder / "failure.json").exists()
    report = read_json(folder / "report.json")
    assert report["status"] == "released"
    assert report["earlier_failure"]["status"] == "failed: nothing published"
