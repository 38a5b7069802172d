"""Relative globs and folders on the command line work in every job (issue 16).

Every job reads its files through the release layer's one resolution
(:func:`pipelines.release.inputs.resolve`: relative patterns made absolute by
:func:`transforms.file_patterns.normalize_glob`), so ``--impressions 'impressions*.csv'`` run from the
data folder releases exactly what the absolute paths release. One test per input kind: CSV,
gzip-compressed CSV, Parquet, a folder, JSON lines; and the CentralNotice tuning tool.
"""
from __future__ import annotations

import gzip
import json
import os
import shutil

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from pipelines.centralnotice import config as centralnotice_config
from pipelines.centralnotice.data import SAMPLE_DIR

SEED = 77
CONFIG = os.path.join(SAMPLE_DIR, "campaigns.json")


def _release_id() -> str:
    return centralnotice_config.load_config(CONFIG).campaigns[0].releases()[0].release_id


def _centralnotice(cwd, impressions: str, clicks: str, out: str, extra=()) -> pa.Table:
    from pipelines.centralnotice.job import main

    here = os.getcwd()
    os.chdir(cwd)
    try:
        assert main(["--config", CONFIG, "--impressions", impressions, "--clicks", clicks,
                     "--release", _release_id(), "--output", out, "--testing_seed", str(SEED),
                     *extra]) == 0
    finally:
        os.chdir(here)
    found = [os.path.join(root, f) for root, _, files in os.walk(os.path.join(cwd, out))
             for f in files if f.startswith("centralnotice.")]
    assert len(found) == 1, found
    return pq.read_table(found[0])


@pytest.fixture(scope="module")
def absolute_release(tmp_path_factory):
    """The release of the bundled sample given by absolute paths."""
    folder = tmp_path_factory.mktemp("absolute")
    return _centralnotice(folder, os.path.join(SAMPLE_DIR, "impressions.csv"),
                          os.path.join(SAMPLE_DIR, "clicks.csv"), "out")


def _split_csv(source: str, folder, stem: str, parts: int = 2, fmt: str = "csv") -> None:
    """``source`` split into ``parts`` files ``<stem>-<i>.<fmt>`` in ``folder``."""
    table = pacsv.read_csv(source, convert_options=pacsv.ConvertOptions(
        column_types={"date": pa.string()}))
    step = -(-table.num_rows // parts)
    os.makedirs(folder, exist_ok=True)
    for i in range(parts):
        part = table.slice(i * step, step)
        path = os.path.join(folder, f"{stem}-{i}.{fmt}")
        if fmt == "parquet":
            pq.write_table(part, path)
        else:
            pacsv.write_csv(part, path)
            if fmt == "csv.gz":
                with open(path, "rb") as raw, gzip.open(path + ".tmp", "wb") as packed:
                    shutil.copyfileobj(raw, packed)
                os.replace(path + ".tmp", path)


@pytest.mark.parametrize("fmt", ["csv", "csv.gz", "parquet"])
def test_relative_globs_release_what_absolute_paths_release(tmp_path, absolute_release, fmt):
    _split_csv(os.path.join(SAMPLE_DIR, "impressions.csv"), tmp_path / "data", "impressions", 2, fmt)
    _split_csv(os.path.join(SAMPLE_DIR, "clicks.csv"), tmp_path / "data", "clicks", 3, fmt)
    extra = ("--input_format", "parquet") if fmt == "parquet" else ()
    released = _centralnotice(tmp_path, f"data/impressions-*.{fmt}", f"data/clicks-*.{fmt}", "out",
                              extra)
    assert released.equals(absolute_release)


def test_a_relative_folder_and_a_relative_file(tmp_path, absolute_release):
    _split_csv(os.path.join(SAMPLE_DIR, "clicks.csv"), tmp_path / "clicks", "part", 3)
    shutil.copy(os.path.join(SAMPLE_DIR, "impressions.csv"), tmp_path / "impressions.csv")
    released = _centralnotice(tmp_path, "impressions.csv", "clicks", "out")
    assert released.equals(absolute_release)


def test_a_relative_glob_matching_nothing_is_refused_naming_it(tmp_path, monkeypatch, capsys):
    from pipelines.centralnotice.job import main

    monkeypatch.chdir(tmp_path)
    assert main(["--config", CONFIG, "--impressions", "nothing-*.csv", "--clicks", "clicks-*.csv",
                 "--release", _release_id(), "--output", "out", "--testing_seed", "1"]) == 2
    assert "'nothing-*.csv' matches no file" in capsys.readouterr().err


def test_relative_json_lines_glob(tmp_path):
    """Summary reports read JSON lines: two relative files release what one absolute file does."""
    from pipelines.ara.summary_reports import main

    lines = [json.dumps({"source_id": f"s{i}", "contributions": [
        {"bucket": hex(16 + (i % 3)), "value": 100 * (i % 5) + 1}]}) for i in range(30)]
    (tmp_path / "all.jsonl").write_text("\n".join(lines) + "\n")
    (tmp_path / "parts").mkdir()
    (tmp_path / "parts" / "reports-0.jsonl").write_text("\n".join(lines[:12]) + "\n")
    (tmp_path / "parts" / "reports-1.jsonl").write_text("\n".join(lines[12:]) + "\n")
    (tmp_path / "domain.txt").write_text("0x10\n0x11\n0x12\n")
    outputs = {}
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        for name, source in (("absolute", str(tmp_path / "all.jsonl")),
                             ("relative", "parts/reports-*.jsonl")):
            assert main(["--input", source, "--input_format", "reports", "--output_domain",
                         "domain.txt", "--epsilon", "4", "--batch_id", "b1", "--output", name,
                         "--testing_seed", str(SEED)]) == 0
            path = os.path.join(name, "testing-not-a-release", "summary_reports", "b1", "summary.csv")
            outputs[name] = open(path).read()
    finally:
        os.chdir(here)
    assert outputs["relative"] == outputs["absolute"] and outputs["absolute"].count("\n") == 4


def test_tuning_tool_reads_relative_globs(tmp_path):
    from pipelines.centralnotice import tuning

    _split_csv(os.path.join(SAMPLE_DIR, "clicks.csv"), tmp_path / "clicks", "part", 2)
    shutil.copy(os.path.join(SAMPLE_DIR, "impressions.csv"), tmp_path / "impressions.csv")
    here = os.getcwd()
    os.chdir(tmp_path)
    try:
        split = tuning.read_tables("clicks/part-*.csv")
        whole = tuning.read_tables(os.path.join(SAMPLE_DIR, "clicks.csv"))
        assert split.num_rows == whole.num_rows
        assert tuning.read_tables("impressions.csv,clicks/part-0.csv").num_rows > 0
        with pytest.raises(ValueError, match="matches no file"):
            tuning.read_tables("missing-*.csv")
    finally:
        os.chdir(here)
