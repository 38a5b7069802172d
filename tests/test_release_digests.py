"""Released bytes in testing mode are pinned: a refactoring must not change what a job releases.

Each job releases its bundled (or seeded synthetic) sample with a public testing seed; the
content of every released table is hashed and compared with ``tests/data/release_digests.json``.
A commit that only moves code keeps these digests; a commit that changes what is released on
purpose (a privacy fix, a new output column) updates the file and says why in its message:

    BEAM_DP_UPDATE_DIGESTS=1 python -m pytest tests/test_release_digests.py

The digest is over the released rows (canonical CSV text of the table in file order), not over
file bytes, so a Parquet writer's metadata does not matter; row order does.
"""
from __future__ import annotations

import glob
import hashlib
import io
import json
import os

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DIGESTS = os.path.join(ROOT, "tests", "data", "release_digests.json")
SAMPLE = os.path.join(ROOT, "pipelines", "sample_data")
SEED = 20261123


def _table_digest(table: pa.Table) -> str:
    sink = io.BytesIO()
    pacsv.write_csv(table, sink)
    return "sha256:" + hashlib.sha256(sink.getvalue()).hexdigest()


def _text_digest(text: str) -> str:
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def _only(pattern: str) -> str:
    found = sorted(glob.glob(pattern, recursive=True))
    assert len(found) == 1, f"expected one file for {pattern}, got {found}"
    return found[0]


# --------------------------------------------------------------------------- one adapter per job

def centralnotice(tmp) -> dict:
    from pipelines.centralnotice import config as centralnotice_config
    from pipelines.centralnotice.job import main

    config = os.path.join(SAMPLE, "centralnotice", "campaigns.json")
    out = {}
    for campaign in centralnotice_config.load_config(config).campaigns:
        release = campaign.releases()[0].release_id
        target = os.path.join(tmp, "cn", campaign.campaign_id)
        assert main(["--config", config,
                     "--impressions", os.path.join(SAMPLE, "centralnotice", "impressions.csv"),
                     "--clicks", os.path.join(SAMPLE, "centralnotice", "clicks.csv"),
                     "--release", release, "--output", target, "--testing_seed", str(SEED)]) == 0
        out[release] = _table_digest(pq.read_table(_only(f"{target}/**/centralnotice.parquet")))
    return out


def reach_frequency(tmp) -> dict:
    from pipelines.reach_frequency.job import main

    target = os.path.join(tmp, "rf")
    assert main(["--input", os.path.join(SAMPLE, "reach_frequency", "impressions.csv"),
                 "--output", target, "--campaigns", "c1,c2", "--publishers", "pub_a,pub_b,pub_c",
                 "--epsilon", "1.0986", "--testing_seed", str(SEED)]) == 0
    out = {}
    for campaign in ("c1", "c2"):
        with open(_only(f"{target}/**/{campaign}/reach_frequency.jsonl")) as handle:
            out[campaign] = _text_digest(handle.read())
    return out


def summary_reports(tmp) -> dict:
    from pipelines.ara import summary_reports
    from pipelines.ara import optimize
    from pipelines.ara import synthetic

    data = synthetic.generate("adtech_real_estate", 3, scale=0.03)
    conversions = os.path.join(tmp, "conv.parquet")
    pq.write_table(data.to_arrow(), conversions)
    workload = optimize.workload_from_conversions(data)
    params, _ = optimize.optimize_parameters(workload, 8.0, k_candidates=[3, 6])
    config = os.path.join(tmp, "ara_config.json")
    with open(config, "w") as handle:
        handle.write(params.to_config(workload).to_json())
    target = os.path.join(tmp, "ara")
    assert summary_reports.main([
        "--input", conversions, "--input_format", "parquet", "--config", config,
        "--epsilon", "8", "--output", target, "--batch_id", "digest",
        "--testing_seed", str(SEED)]) == 0
    with open(_only(f"{target}/**/*.csv")) as handle:
        return {"adtech_real_estate": _text_digest(handle.read())}


def event_level_reports(tmp) -> dict:
    from pipelines.ara.event_level_reports import main

    sample = os.path.join(SAMPLE, "event_level")
    target = os.path.join(tmp, "event")
    assert main(["--sources", os.path.join(sample, "sources.csv"),
                 "--conversions", os.path.join(sample, "conversions.csv"),
                 "--epsilon", "3", "--batch_id", "sample", "--trigger_data_cardinality", "2",
                 "--report_windows", "2", "--max_reports", "2", "--value_edges", "20",
                 "--window_ends", "2,30", "--group_by", "campaign", "--output", target,
                 "--testing_seed", str(SEED)]) == 0
    out = {}
    for name in ("reports.csv", "estimates.csv"):
        with open(_only(f"{target}/**/{name}")) as handle:
            out[name] = _text_digest(handle.read())
    return out


def dp_aggregate(tmp) -> dict:
    import apache_beam as beam
    import numpy as np

    from accounting.budget import PrivacyBudget
    from accounting.keys import ReleaseKey
    from accounting.sensitivity import ContributionBounds
    from transforms.aggregate import Compute, DPAggregate, Keys
    from transforms.keyset import PublicKeyset
    from transforms.metrics import Count, Mean, PrivacyUnitCount, Sum

    rng = np.random.default_rng(7)
    n = 5000
    rows = pa.table({"user": rng.integers(0, 400, n), "country": rng.choice(["DE", "FR", "US"], n),
                     "day": rng.integers(1, 4, n), "seconds": rng.uniform(0, 120, n)})
    target = os.path.join(tmp, "aggregate.parquet")
    with beam.Pipeline(runner="FnApiRunner") as p:
        (p | beam.Create([rows.slice(0, 2000), rows.slice(2000)])
         | DPAggregate(
             compute=Compute(metrics=[Count(), Sum(), Mean(name="mean_seconds"), PrivacyUnitCount()], value="seconds"),
             keys=Keys(privacy_unit="user", columns=["country", "day"], keyset=PublicKeyset.cross_product({"country": ["DE", "FR", "US", "IT"],
                                                          "day": [1, 2, 3]})),
             bounds=ContributionBounds(max_partitions=2, max_contributions_per_partition=3,
                                                 min_value=0, max_value=100),
             budget=PrivacyBudget(epsilon=1.0),
             release_key=ReleaseKey.for_testing(SEED))
         | beam.combiners.ToList()
         | beam.Map(lambda tables: pq.write_table(pa.concat_tables(tables), target)))
    table = pq.read_table(target).sort_by([("country", "ascending"), ("day", "ascending")])
    return {"keyset": _table_digest(table)}


def local_dp(tmp) -> dict:
    """The four local/shuffle-DP jobs on their bundled samples (pipelines/sample_data/ldp)."""
    from pipelines.ldp import label_dp
    from pipelines.ldp import frequencies as ldp_frequencies
    from pipelines.ldp import heavy_hitters as ldp_heavy_hitters
    from pipelines.ldp import shuffle_sum

    data = os.path.join(SAMPLE, "ldp")
    runs = {
        "ldp_frequencies": (ldp_frequencies, [
            "--input", os.path.join(data, "reports_oue.parquet"), "--oracle", "oue",
            "--epsilon", "2", "--domain_size", "32", "--collection_id", "sample"]),
        "ldp_heavy_hitters": (ldp_heavy_hitters, [
            "--input", os.path.join(data, "pem_reports.parquet"), "--epsilon", "4",
            "--value_bits", "16", "--top_k", "9", "--collection_id", "sample"]),
        "shuffle_sum": (shuffle_sum, [
            "--input", os.path.join(data, "shares.parquet"), "--num_clients", "1000",
            "--value_bound", "10", "--epsilon", "1", "--delta", "1e-6",
            "--collection_id", "sample"]),
        "label_dp": (label_dp, [
            "--input", os.path.join(data, "training.csv"), "--labels", "no,yes",
            "--epsilon", "2", "--features", "feature_1,feature_2", "--dataset_id", "sample"]),
    }
    out = {}
    for name, (module, argv) in runs.items():
        target = os.path.join(tmp, name)
        assert module.main([*argv, "--output", target, "--testing_seed", str(SEED)]) == 0
        for path in sorted(glob.glob(f"{target}/testing-not-a-release/{name}/**/*.*",
                                     recursive=True)):
            base = os.path.basename(path)
            if base == "RELEASE.json":
                continue
            if base.endswith(".parquet"):
                out[f"{name}/{base}"] = _table_digest(pq.read_table(path))
            else:
                with open(path) as handle:
                    out[f"{name}/{base}"] = _text_digest(handle.read())
    return out


def masked_lark(tmp) -> dict:
    """The sample through browsers, both helpers and the ad server; and the training driver."""
    from pipelines.masked_lark import combine as masked_lark_combine
    from pipelines.masked_lark import helper as masked_lark_helper
    from pipelines.masked_lark import share as masked_lark_share
    from pipelines.masked_lark import train as masked_lark_train

    sample = os.path.join(SAMPLE, "masked_lark")
    params = os.path.join(sample, "aggregation_params.json")
    seed = ["--testing_seed", str(SEED)]
    assert masked_lark_share.main(["--input", os.path.join(sample, "conversions.csv"),
                                   "--params", params, "--batch_id", "b1",
                                   "--output", os.path.join(tmp, "share")] + seed) == 0
    out, helper_files = {}, []
    for h in (0, 1):
        reports = _only(f"{tmp}/share/**/reports_helper_{h}.parquet")
        out[f"share/helper-{h}"] = _table_digest(pq.read_table(reports))
        assert masked_lark_helper.main(["--input", reports, "--params", params, "--helper",
                                        str(h), "--batch_id", "b1",
                                        "--output", os.path.join(tmp, f"h{h}")] + seed) == 0
        helper_files.append(_only(f"{tmp}/h{h}/**/helper_{h}.parquet"))
        out[f"helper-{h}"] = _table_digest(pq.read_table(helper_files[-1]))
    assert masked_lark_combine.main(["--helper_outputs", ",".join(helper_files), "--params",
                                     params, "--batch_id", "b1",
                                     "--output", os.path.join(tmp, "server")] + seed) == 0
    with open(_only(f"{tmp}/server/**/aggregates.csv")) as handle:
        out["combine"] = _text_digest(handle.read())
    assert masked_lark_train.main(["--input", os.path.join(sample, "train.csv"),
                                   "--params", os.path.join(sample, "gradient_params.json"),
                                   "--model", os.path.join(sample, "model.json"),
                                   "--model_id", "m1", "--epochs", "2",
                                   "--output", os.path.join(tmp, "train")] + seed) == 0
    with open(_only(f"{tmp}/train/**/model.csv")) as handle:
        out["train/model"] = _text_digest(handle.read())
    return out


JOBS = {"centralnotice": centralnotice, "reach_frequency": reach_frequency,
        "summary_reports": summary_reports, "dp_aggregate": dp_aggregate,
        "event_level_reports": event_level_reports, "local_dp": local_dp,
        "masked_lark": masked_lark}


@pytest.mark.parametrize("job", sorted(JOBS))
def test_testing_mode_release_bytes_are_pinned(job, tmp_path):
    got = JOBS[job](str(tmp_path))
    with open(DIGESTS) as handle:
        pinned = json.load(handle)
    if os.environ.get("BEAM_DP_UPDATE_DIGESTS"):
        pinned[job] = got
        with open(DIGESTS, "w") as handle:
            json.dump(pinned, handle, indent=1, sort_keys=True)
            handle.write("\n")
    assert got == pinned.get(job), f"{job}: released bytes changed (see this module's docstring)"
