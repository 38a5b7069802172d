"""Every job and DPAggregate on a real Dask cluster: released files byte-identical to in-process.

The cluster is a ``distributed.LocalCluster`` of two worker *processes* (scheduler, nannies,
workers), so elements, DoFns and side inputs are pickled across process boundaries as on a
remote cluster. Each job runs twice with the same testing seed: on the embedded FnApiRunner (the
DirectRunner profile) and with ``--runner=DaskRunner --dask_client_address=<cluster>``; every
released file (data and RELEASE.json; not the operator reports, which hold timings) must be equal
byte for byte.

Beam's Dask runner returns no metrics; a release's row counters are pipeline output
(transforms/counting.py) staged beside it, so a release on Dask reads the same counters and row
rules as in process (tested below with a real CentralNotice release). The project's translation
keeps what ``finish_bundle`` emits and tagged outputs apart, which those counters need.

Engine tests: marker ``runners`` (``make test-runners``); select them with ``-k dask``.
"""
from __future__ import annotations

import contextlib
import os
import re
import socket
from pathlib import Path

import apache_beam as beam
import pytest

from runners import dask_cluster, execution, profiles, seam
from runners.deploy.flex_template import JOBS as JOB_COMMANDS
from runners.harness import REPO_ROOT, RunnerCase, run_pipeline_main

on_engine = pytest.mark.runners  # the engine tests (make test-runners); the profile test is quick

SAMPLE = REPO_ROOT / "pipelines" / "sample_data"
SEED = "20261123"
DIRECT = RunnerCase(label="direct", runner="DirectRunner")


def test_dask_profile_resolves_without_an_engine():
    resolved = profiles.resolve(["--runner=dask"])
    assert resolved.runner == dask_cluster.DASK_RUNNER == "runners.dask_runner.DaskRunner"
    assert "--dask_local_workers=2" in resolved.argv
    remote = profiles.resolve(["--runner=DaskRunner", "--dask_client_address=tcp://h:8786"])
    assert not any(a.startswith("--dask_local_workers") for a in remote.argv)
    options = profiles.pipeline_options_for(["--runner=dask", "--dask_local_workers=3"])
    assert dask_cluster.is_dask(options)
    assert options.view_as(dask_cluster.DaskClusterOptions).dask_local_workers == 3
    assert not dask_cluster.is_dask(profiles.pipeline_options_for([]))
    assert "### DaskRunner" in profiles.describe_profiles()


def test_dask_runs_are_partitioned_for_the_cluster_unless_the_run_says_how():
    """A job's Create holds a few file names: Beam's default (128 elements per bag partition)
    would run the whole job as one partition on one worker thread."""
    from apache_beam.runners.dask.dask_runner import DaskOptions

    from runners.profiles import pipeline_options_for

    dask = pipeline_options_for(["--runner=dask"]).view_as(DaskOptions)
    with dask_cluster._partitioned(dask, threads=3):
        assert dask.npartitions == 3 * dask_cluster.PARTITIONS_PER_THREAD
    assert dask.npartitions is None  # restored after the run
    for given in (["--dask_npartitions=5"], ["--dask_partition_size=7"]):
        dask = pipeline_options_for(["--runner=dask", *given]).view_as(DaskOptions)
        with dask_cluster._partitioned(dask, threads=3):
            assert (dask.npartitions, dask.partition_size) in ((5, None), (None, 7))
    dask = pipeline_options_for(["--runner=dask"]).view_as(DaskOptions)
    with dask_cluster._partitioned(dask, threads=0):  # a scheduler that could not be asked
        assert dask.npartitions is None


def test_each_profile_owns_how_a_run_goes_on_its_runner():
    """The runner seam (runners.seam): the Dask profile's execution starts a cluster for the
    run, refuses what the runner gets wrong and joins every leaf into one last transform; other
    runners' executions leave Beam's run as it is."""
    from apache_beam.options.pipeline_options import PipelineOptions

    dask = profiles.profile_of(profiles.pipeline_options_for(["--runner=dask"]))
    assert isinstance(dask.execution, dask_cluster.DaskExecution)
    for argv in ([], ["--runner=FnApiRunner"],
                 ["--runner=apache_beam.runners.portability.flink_runner.FlinkRunner"],
                 ["--runner=some.other.Runner"]):
        assert type(profiles.profile_of(PipelineOptions(argv)).execution) is execution.Execution, argv
    dataflow = profiles.profile_of(PipelineOptions(["--runner=DataflowRunner"]))
    assert dataflow.name == "DataflowRunner"
    # Dataflow's execution only submits without waiting, awaits from another process and knows
    # a Flex Template launcher's job object (runners/dataflow_jobs.py); a whole run goes as Beam's.
    from runners.dataflow_jobs import DataflowExecution

    assert type(dataflow.execution) is DataflowExecution
    assert {name for name in vars(DataflowExecution) if not name.startswith("_")} == \
        {"submit", "wait", "launches_job"}
    launch = "gs://b/staging/template_launches/2026-11-27_02_30_07-1234567890123456789/job_object"
    assert dataflow.execution.launches_job(PipelineOptions([f"--template_location={launch}"]))
    assert not dataflow.execution.launches_job(PipelineOptions(["--template_location=gs://b/t.json"]))
    assert not execution.Execution().launches_job(PipelineOptions([f"--template_location={launch}"]))
    from runners.prism import PrismExecution  # Beam's own run, its binary checked first

    assert type(profiles.profile_of(PipelineOptions(["--runner=PrismRunner"])).execution) is PrismExecution
    assert isinstance(profiles.profile_of(PipelineOptions(
        ["--runner=" + dask_cluster.BEAM_DASK_RUNNER])).execution, dask_cluster.DaskExecution)

    pipeline = beam.Pipeline()
    numbers = pipeline | "Numbers" >> beam.Create([1, 2, 3])
    _ = numbers | "Double" >> beam.Map(lambda x: 2 * x)
    _ = numbers | "Square" >> beam.Map(lambda x: x * x)
    assert len(execution.leaves(pipeline)) == 2
    dask.execution.prepare(pipeline)
    [leaf] = execution.leaves(pipeline)
    assert leaf.producer.full_label == "AllLeavesForDask"
    dask.execution.prepare(pipeline)  # one leaf: nothing more is added
    assert execution.leaves(pipeline) == [leaf]


def test_the_dask_runner_states_the_beam_it_was_written_against():
    """runners/dask_runner.py relies on private Beam names: it refuses other Beam releases at
    import, and the lock pins a Beam it was written against (the runners suite runs on it)."""
    import re

    from runners import dask_runner

    locked = re.search(r"^apache-beam==(\S+)$", (REPO_ROOT / "requirements.lock").read_text(),
                       re.MULTILINE).group(1)
    dask_runner.check_beam_version(locked)
    for other in ("2.60.0", "2.78.0", "3.0.0"):
        with pytest.raises(ImportError, match="written against Apache Beam"):
            dask_runner.check_beam_version(other)


@on_engine
def test_the_runners_suite_runs_on_the_locked_beam():
    import re
    from importlib.metadata import version

    locked = re.search(r"^apache-beam==(\S+)$", (REPO_ROOT / "requirements.lock").read_text(),
                       re.MULTILINE).group(1)
    assert version("apache-beam") == locked, "install with --constraint requirements.lock (make setup)"


@pytest.fixture(scope="module")
def cluster():
    pytest.importorskip("distributed")
    with dask_cluster.local_cluster(workers=2) as address:
        yield address


def dask_argv(address: str) -> list[str]:
    return RunnerCase(label="dask", runner="DaskRunner", args=(f"--dask_client_address={address}",)).argv()


def released_files(root: Path) -> dict[str, bytes]:
    """Every released file under ``root`` (relative path -> bytes), operator reports aside."""
    files = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and ".reports" not in rel.parts and ".staging" not in rel.parts:
            files[str(rel)] = path.read_bytes()
    assert files, f"nothing released under {root}"
    return files


def centralnotice_args(tmp: Path, out: Path) -> list[str]:
    sample = SAMPLE / "centralnotice"
    return ["--config", str(sample / "campaigns.json"),
            "--impressions", str(sample / "impressions.csv"),
            "--clicks", str(sample / "clicks.csv"), "--campaign", "C2026_000_fr",
            "--date", "2026-11-28", "--output", str(out), "--testing_seed", SEED]


def reach_frequency_args(tmp: Path, out: Path) -> list[str]:
    return ["--input", str(SAMPLE / "reach_frequency" / "impressions.csv"), "--output", str(out),
            "--campaigns", "c1,c2", "--publishers", "pub_a,pub_b,pub_c", "--epsilon", "1.0986",
            "--testing_seed", SEED]


def summary_reports_args(tmp: Path, out: Path) -> list[str]:
    import pyarrow.parquet as pq

    from pipelines.ara import optimize
    from pipelines.ara import synthetic

    conversions, config = tmp / "conv.parquet", tmp / "ara_config.json"
    if not config.exists():
        data = synthetic.generate("adtech_real_estate", 3, scale=0.03)
        pq.write_table(data.to_arrow(), conversions)
        workload = optimize.workload_from_conversions(data)
        params, _ = optimize.optimize_parameters(workload, 8.0, k_candidates=[3, 6])
        config.write_text(params.to_config(workload).to_json())
    return ["--input", str(conversions), "--input_format", "parquet", "--config", str(config),
            "--epsilon", "8", "--output", str(out), "--batch_id", "dask",
            "--testing_seed", SEED]


def event_level_reports_args(tmp: Path, out: Path) -> list[str]:
    sample = SAMPLE / "event_level"
    return ["--sources", str(sample / "sources.csv"), "--conversions",
            str(sample / "conversions.csv"), "--epsilon", "3", "--batch_id", "sample",
            "--trigger_data_cardinality", "2", "--report_windows", "2", "--max_reports", "2",
            "--value_edges", "20", "--window_ends", "2,30", "--group_by", "campaign",
            "--output", str(out), "--testing_seed", SEED]


LDP = SAMPLE / "ldp"
LOCAL_DP_ARGS = {
    "ldp_frequencies": ["--input", str(LDP / "reports_oue.parquet"), "--oracle", "oue",
                        "--epsilon", "2", "--domain_size", "32", "--collection_id", "sample"],
    "ldp_heavy_hitters": ["--input", str(LDP / "pem_reports.parquet"), "--epsilon", "4",
                          "--value_bits", "16", "--top_k", "9", "--collection_id", "sample"],
    "shuffle_sum": ["--input", str(LDP / "shares.parquet"), "--num_clients", "1000",
                    "--value_bound", "10", "--epsilon", "1", "--delta", "1e-6",
                    "--collection_id", "sample"],
    "label_dp": ["--input", str(LDP / "training.csv"), "--labels", "no,yes", "--epsilon", "2",
                 "--features", "feature_1,feature_2", "--dataset_id", "sample"],
}


def _local_dp(name: str):
    return lambda tmp, out: LOCAL_DP_ARGS[name] + ["--output", str(out), "--testing_seed", SEED]


def masked_lark_share_args(tmp: Path, out: Path) -> list[str]:
    sample = SAMPLE / "masked_lark"
    return ["--input", str(sample / "conversions.csv"), "--params",
            str(sample / "aggregation_params.json"), "--batch_id", "b1", "--output", str(out),
            "--testing_seed", SEED]


def masked_lark_train_args(tmp: Path, out: Path) -> list[str]:
    sample = SAMPLE / "masked_lark"
    return ["--input", str(sample / "train.csv"), "--params",
            str(sample / "gradient_params.json"), "--model", str(sample / "model.json"),
            "--model_id", "m1", "--epochs", "2", "--output", str(out), "--testing_seed", SEED]


LARK = SAMPLE / "masked_lark"


def _lark_helper_output(tmp: Path, h: int) -> Path:
    """Helper ``h``'s released table for the sample batch (browsers and helper run in process,
    once per test directory)."""
    from pipelines.masked_lark import helper as masked_lark_helper
    from pipelines.masked_lark import share as masked_lark_share

    shares, out = tmp / "lark_shares", tmp / f"lark_helper_{h}"
    if not shares.exists():
        assert masked_lark_share.main(masked_lark_share_args(tmp, shares)) == 0
    if not out.exists():
        assert masked_lark_helper.main(_lark_helper_args(tmp, h, out)) == 0
    return next(out.rglob(f"helper_{h}.parquet"))


def _lark_helper_args(tmp: Path, h: int, out: Path) -> list[str]:
    reports = next((tmp / "lark_shares").rglob(f"reports_helper_{h}.parquet"))
    return ["--input", str(reports), "--params", str(LARK / "aggregation_params.json"),
            "--helper", str(h), "--batch_id", "b1", "--output", str(out), "--testing_seed", SEED]


def masked_lark_helper_args(tmp: Path, out: Path) -> list[str]:
    from pipelines.masked_lark import share as masked_lark_share

    if not (tmp / "lark_shares").exists():
        assert masked_lark_share.main(masked_lark_share_args(tmp, tmp / "lark_shares")) == 0
    return _lark_helper_args(tmp, 0, out)


def masked_lark_combine_args(tmp: Path, out: Path) -> list[str]:
    files = [str(_lark_helper_output(tmp, h)) for h in (0, 1)]
    return ["--helper_outputs", ",".join(files), "--params", str(LARK / "aggregation_params.json"),
            "--batch_id", "b1", "--output", str(out), "--testing_seed", SEED]


JOBS = {"centralnotice": ("pipelines.centralnotice", centralnotice_args),
        "reach_frequency": ("pipelines.reach_frequency", reach_frequency_args),
        "summary_reports": ("pipelines.ara.summary_reports", summary_reports_args),
        "event_level_reports": ("pipelines.ara.event_level_reports", event_level_reports_args),
        **{name: (JOB_COMMANDS[name], _local_dp(name)) for name in LOCAL_DP_ARGS},
        "masked_lark_share": ("pipelines.masked_lark.share", masked_lark_share_args),
        "masked_lark_helper": ("pipelines.masked_lark.helper", masked_lark_helper_args),
        "masked_lark_combine": ("pipelines.masked_lark.combine", masked_lark_combine_args),
        "masked_lark_train": ("pipelines.masked_lark.train", masked_lark_train_args)}


def test_transforms_the_dask_runner_would_get_wrong_are_refused():
    """BatchElements (its finish_bundle batch is dropped) and tagged outputs (not kept apart)
    run wrongly on Beam's own DaskRunner without an error: a pipeline holding either is refused
    there before it runs (the project's runner gets both right: tested on a cluster below).
    WindowInto other than the global window is refused on both (neither translates it)."""
    from apache_beam.transforms import window

    class Tagged(beam.DoFn):
        def process(self, element):
            yield beam.pvalue.TaggedOutput("odd" if element % 2 else "even", element)

    for build, feature in ((lambda p: p | beam.Create([1, 2]) | beam.BatchElements(), "BatchElements"),
                           (lambda p: p | beam.Create([1, 2]) | beam.ParDo(Tagged()).with_outputs("odd", "even"),
                            "ParDo with tagged outputs"),
                           (lambda p: p | beam.Create([1, 2]) | beam.WindowInto(window.FixedWindows(10)),
                            "WindowInto")):
        pipeline = beam.Pipeline()
        build(pipeline)
        with pytest.raises(NotImplementedError, match=feature):
            dask_cluster.check_supported(pipeline, beams_own=True)
        if feature == "WindowInto":
            with pytest.raises(NotImplementedError, match=feature):
                dask_cluster.check_supported(pipeline)
        else:
            dask_cluster.check_supported(pipeline)  # the project's runner runs it right


def test_fan_out_and_sharded_batches_keep_every_value():
    """The replacements: every tagged value reaches its own output only; sharded batches hold
    every element once, none larger than the batch size; an unknown tag is an error."""
    import apache_beam as beam
    from apache_beam.testing.test_pipeline import TestPipeline
    from apache_beam.testing.util import assert_that, equal_to

    from transforms.batching import ShardedBatches
    from transforms.fanout import ByTag

    with TestPipeline() as p:
        parts = (p | "Values" >> beam.Create([("a", 1), ("b", 2), ("a", 3)]) | ByTag(["a", "b", "c"]))
        assert_that(parts["a"], equal_to([1, 3]), label="a")
        assert_that(parts["b"], equal_to([2]), label="b")
        assert_that(parts["c"], equal_to([]), label="c")
        batches = (p | "Many" >> beam.Create(list(range(1000)))
                   | ShardedBatches(lambda x: x, shards=7, batch_size=64))
        assert_that(batches | beam.FlatMap(lambda b: b), equal_to(list(range(1000))), label="all")
        assert_that(batches | beam.Map(len) | beam.CombineGlobally(max), equal_to([64]), label="max")
    with pytest.raises(Exception, match="not one of"):
        with TestPipeline() as p:
            _ = p | beam.Create([("z", 1)]) | ByTag(["a"])


@on_engine
@pytest.mark.parametrize("job", sorted(JOBS))
def test_job_releases_identical_bytes_on_dask(job, cluster, tmp_path):
    module, args = JOBS[job]
    local, dask = tmp_path / "in_process", tmp_path / "dask"
    run_pipeline_main(module, args(tmp_path, local), DIRECT.argv())
    run_pipeline_main(module, args(tmp_path, dask), dask_argv(cluster))
    expected, got = released_files(local), released_files(dask)
    assert sorted(got) == sorted(expected)
    for name in expected:
        assert got[name] == expected[name], f"{job}: {name} differs on Dask"


@on_engine
def test_a_centralnotice_release_on_a_two_worker_cluster_has_its_counters(tmp_path, capsys):
    """A real CentralNotice release of the sample data (ledger, fresh keys) on the local cluster
    of 2 worker processes the profile starts for the run: published, exit 0 even with
    --alert_exit_code, its operator report holding the row counters the in-process engine
    counts for the same input (read from staging: the runner returns no metrics), no alert."""
    import json

    from pipelines.centralnotice.job import main

    local = tmp_path / "in_process"
    assert main(centralnotice_args(tmp_path, local) + DIRECT.argv()) == 0
    (expected,) = [json.loads(p.read_text())["counters"] for p in local.rglob("report.json")]
    argv = [a for a in centralnotice_args(tmp_path, tmp_path / "out") if a not in ("--testing_seed", SEED)]
    argv += ["--ledger", str(tmp_path / "private" / "ledger.json"), "--key_store",
             str(tmp_path / "private" / "keys"), "--alert_exit_code", "9",
             "--runner", "DaskRunner", "--dask_local_workers", "2"]
    assert main(argv) == 0, capsys.readouterr().err
    assert "impressions.read=" in capsys.readouterr().out
    assert (tmp_path / "out" / "C2026_000_fr" / "2026-11-28" / "v1" / "RELEASE.json").exists()
    (report,) = [json.loads(p.read_text()) for p in (tmp_path / "private").rglob("report.json")]
    assert report["counters"] == expected and expected["impressions.read"] > 0
    assert report["alerts"] == []


#: A line of ``distributed``'s INFO chatter, in its own format (``... - distributed.scheduler -
#: INFO - ...``) or the logging module's basic one (``INFO:distributed.core:...``).
DISTRIBUTED_INFO = re.compile(r"INFO:distributed|distributed(\.[\w.]+)? - INFO - ")


@on_engine
def test_a_successful_dask_run_s_console_has_no_distributed_info_lines(tmp_path):
    """A release on a local cluster of 2 worker processes, run as an operator runs it (a fresh
    ``python -m pipelines.centralnotice``, its workers' output on the same console): exit 0 and
    the console is the release summary, without one ``INFO`` line of ``distributed`` (the
    scheduler's, the nannies' or the workers', which read the level from the environment).
    ``--log_level INFO`` brings them back: the check can fail, and the flag still asks."""
    import subprocess
    import sys

    def run(out, *extra):
        argv = [a for a in centralnotice_args(tmp_path, tmp_path / out)
                if a not in ("--testing_seed", SEED)]
        argv += ["--ledger", str(tmp_path / out / "private" / "ledger.json"), "--key_store",
                 str(tmp_path / out / "private" / "keys"), "--runner", "DaskRunner",
                 "--dask_local_workers", "2", *extra]
        env = {k: v for k, v in os.environ.items() if not k.startswith("DASK_")}
        return subprocess.run([sys.executable, "-m", "pipelines.centralnotice", *argv],
                              capture_output=True, text=True, cwd=REPO_ROOT, env=env, timeout=600)

    quiet = run("quiet")
    console = quiet.stdout + quiet.stderr
    assert quiet.returncode == 0, console
    assert "impressions.read=" in quiet.stdout                # the summary is there ...
    assert not DISTRIBUTED_INFO.search(console), console      # ... and no chatter around it
    told = run("told", "--log_level", "INFO")
    assert told.returncode == 0, told.stderr
    assert DISTRIBUTED_INFO.search(told.stdout + told.stderr), told.stderr


@on_engine
def test_finish_bundle_and_tagged_outputs_are_kept_on_the_cluster(cluster, tmp_path):
    """The project's translation (runners/dask_runner.py run_dofn): a ParDo's tagged outputs
    reach their own consumers only, what finish_bundle emits is kept (BatchElements' last
    batch, a DoFn's partial counts), as in process."""
    import json

    from runners.profiles import pipeline_options_for
    from transforms.counting import AllCounts, Counted, Counters, CountingDoFn

    class Parity(CountingDoFn):
        def __init__(self, tagged: bool):
            self._counts, self._tagged = Counters("test"), tagged

        def process(self, x):
            self._counts.inc("odd" if x % 2 else "even")
            yield beam.pvalue.TaggedOutput("odd", x) if x % 2 and self._tagged else x

    def build_for(out: Path):
        def build(p):
            numbers = p | beam.Create(list(range(100)))
            parts = numbers | beam.ParDo(Parity(tagged=True)).with_outputs("odd", main="even")
            counted = numbers | "Counted" >> Counted(Parity(tagged=False))
            batches = numbers | beam.BatchElements(min_batch_size=8, max_batch_size=8)
            ((parts.even | "Even" >> beam.combiners.ToList() | "E" >> beam.Map(lambda v: ["even", sorted(v)]),
              parts.odd | "Odd" >> beam.combiners.ToList() | "O" >> beam.Map(lambda v: ["odd", sorted(v)]),
              counted | "Main" >> beam.combiners.Count.Globally() | "M" >> beam.Map(lambda n: ["main", n]),
              batches | beam.Map(len) | "Sum" >> beam.CombineGlobally(sum) | "B" >> beam.Map(lambda n: ["batched", n]),
              p | AllCounts() | "C" >> beam.Map(lambda c: ["counts", c]))
             | beam.Flatten() | beam.combiners.ToList()
             | beam.Map(lambda got: out.write_text(json.dumps(sorted(got)))))
        return build

    results = {}
    for name, argv in (("local", []), ("dask", dask_argv(cluster) + ["--dask_npartitions=3"])):
        out = tmp_path / f"{name}.json"
        seam.run(pipeline_options_for(argv), build_for(out))
        results[name] = json.loads(out.read_text())
    assert results["dask"] == results["local"]
    got = dict(results["dask"])
    assert got["even"] == list(range(0, 100, 2)) and got["odd"] == list(range(1, 100, 2))
    assert got["main"] == 100 and got["batched"] == 100
    assert got["counts"] == {"test": {"even": 50, "odd": 50}}  # the Counted one's (a plain ParDo's
    # CountingDoFn counts in Beam metrics only: no counts tag is declared for it)


def _write_text(lines, path):
    Path(path).write_text("\n".join(str(x) for x in sorted(lines)))


@on_engine
def test_every_branch_of_a_pipeline_runs_on_dask(cluster, tmp_path):
    """Beam's Dask translation computes only the last-applied transform's graph; the profile's
    execution joins every leaf into one, so a write on another branch runs too."""
    from runners.profiles import pipeline_options_for

    first, second = tmp_path / "first.txt", tmp_path / "second.txt"

    def build(p):
        numbers = p | "Numbers" >> beam.Create([1, 2, 3])
        _ = (numbers | "Double" >> beam.Map(lambda x: 2 * x) | "AllDoubled" >> beam.combiners.ToList()
             | "WriteFirst" >> beam.Map(_write_text, str(first)))
        _ = (numbers | "Square" >> beam.Map(lambda x: x * x) | "AllSquared" >> beam.combiners.ToList()
             | "WriteSecond" >> beam.Map(_write_text, str(second)))

    seam.run(pipeline_options_for(dask_argv(cluster)), build)
    assert first.read_text() == "2\n4\n6" and second.read_text() == "1\n4\n9"


def _dp_aggregate(target: str, dict_rows: bool = False, staging_dir: str = None):
    """The DPAggregate of tests/test_release_digests.py, writing its table to ``target``; its
    input is Arrow tables, or dicts (``dict_rows``: buffered into tables by the transform). With
    ``staging_dir`` its keyset is the same keys as a PCollection, staged there
    (transforms.keyset_staging)."""
    import apache_beam as beam
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

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

    def write(tables):
        table = pa.concat_tables(tables).sort_by([("country", "ascending"), ("day", "ascending")])
        pq.write_table(table, target)

    def build(p):
        data = rows.slice(0, 1500).to_pylist() if dict_rows else \
            [rows.slice(0, 1200), rows.slice(1200, 2000), rows.slice(2000)]
        keyset = PublicKeyset.cross_product({"country": ["DE", "FR", "US", "IT"], "day": [1, 2, 3]})
        if staging_dir is not None:
            keys = p | "Keys" >> beam.Create(keyset.to_table().to_pylist()[::-1])
            keyset = PublicKeyset.from_pcollection(keys, ["country", "day"], expected_size=12,
                                                   staging_dir=staging_dir)
        (p | beam.Create(data)
         | DPAggregate(
             compute=Compute(metrics=[Count(), Sum(), Mean(name="mean_seconds"), PrivacyUnitCount()], value="seconds"),
             keys=Keys(privacy_unit="user", columns=["country", "day"], keyset=keyset),
             bounds=ContributionBounds(max_partitions=2, max_contributions_per_partition=3,
                                                 min_value=0, max_value=100),
             budget=PrivacyBudget(epsilon=1.0),
             release_key=ReleaseKey.for_testing(7))
         | beam.combiners.ToList()
         | beam.Map(write))
    return build


@on_engine
@pytest.mark.parametrize("trim", [False, True])
def test_local_workers_keep_glibc_malloc_tuning_unless_asked(trim, monkeypatch):
    """Dask's nannies set MALLOC_TRIM_THRESHOLD_=65536 in the workers they spawn (every array
    above 128 KiB then faults its pages in afresh); local clusters unset it unless
    --dask_trim_worker_memory keeps it."""
    distributed = pytest.importorskip("distributed")
    import os

    monkeypatch.delenv(dask_cluster.MALLOC_TRIM, raising=False)
    options = profiles.pipeline_options_for(
        ["--runner=dask"] + (["--dask_trim_worker_memory"] if trim else []))
    local = options.view_as(dask_cluster.DaskClusterOptions)
    assert local.dask_trim_worker_memory is trim
    with dask_cluster.local_cluster(1, trim_memory=local.dask_trim_worker_memory) as address:
        with distributed.Client(address, set_as_default=False) as client:
            [seen] = client.run(lambda: os.environ.get("MALLOC_TRIM_THRESHOLD_")).values()
            [limit] = [w["memory_limit"] for w in client.scheduler_info()["workers"].values()]
    assert seen == ("65536" if trim else None)
    # "auto": one worker gets the machine's memory, not Dask's share by threads over cores
    from distributed.system import MEMORY_LIMIT
    assert abs(limit - MEMORY_LIMIT) <= 1


@on_engine
def test_local_workers_share_the_machines_memory_out_equally():
    distributed = pytest.importorskip("distributed")
    from distributed.system import MEMORY_LIMIT

    with dask_cluster.local_cluster(2) as address:
        with distributed.Client(address, set_as_default=False) as client:
            limits = [w["memory_limit"] for w in client.scheduler_info()["workers"].values()]
    assert len(limits) == 2 and all(abs(limit - MEMORY_LIMIT / 2) <= 1 for limit in limits)
    with dask_cluster.local_cluster(1, memory_limit="0") as address:
        with distributed.Client(address, set_as_default=False) as client:
            [limit] = [w["memory_limit"] for w in client.scheduler_info()["workers"].values()]
    assert not limit  # no limit


def _side_input_pipeline(calls: Path, out: Path):
    """A ParDo reading four side inputs (list, singleton with a combine's default, dict, and a
    side input read by two ParDos), the side input's producer also in the main graph; each call
    of the producer leaves a file in ``calls``; the sorted results are written to ``out``."""
    import json
    import uuid

    import apache_beam as beam

    def record(value):
        (calls / f"{value}-{uuid.uuid4().hex}").touch()
        return value

    def build(p):
        side = p | "Side" >> beam.Create(["a", "b", "c"]) | "Record" >> beam.Map(record)
        count = side | "Count" >> beam.combiners.Count.Globally()
        upper = side | "Upper" >> beam.Map(lambda k: (k, k.upper()))
        main = p | "Main" >> beam.Create(list(range(20)))
        rows = main | "Read" >> beam.Map(
            lambda x, listed, n, mapped: [x, sorted(listed), n, mapped[["a", "b", "c"][x % 3]]],
            beam.pvalue.AsList(side), beam.pvalue.AsSingleton(count), beam.pvalue.AsDict(upper))
        again = main | "ReadAgain" >> beam.Map(lambda x, n: [-x, n], beam.pvalue.AsSingleton(count))
        empty = main | "None" >> beam.Filter(lambda x: x < 0) | "NoCount" >> beam.combiners.Count.Globally()
        alone = main | "Default" >> beam.Map(lambda x, n: [x, "default", n], beam.pvalue.AsSingleton(empty))
        ((rows, again, alone, side | "Plain" >> beam.Map(lambda s: [s]))
         | beam.Flatten() | beam.combiners.ToList()
         | beam.Map(lambda got: out.write_text(json.dumps(sorted(map(json.dumps, got))))))
    return build


@on_engine
def test_side_inputs_are_computed_once_as_graph_dependencies(cluster, tmp_path):
    """The project's DaskRunner (runners/dask_runner.py): every DoFn sees the side input values
    the in-process engine gives it, and each side input is computed once, as a task of the graph
    it shares with the main input's steps (Beam's translation computes it inside every task that
    reads it, again for each partition and again for the main graph: more than 3 calls here)."""
    import json

    from apache_beam.options.pipeline_options import StandardOptions

    from runners import dask_runner
    from runners.profiles import pipeline_options_for

    results = {}
    for name, argv in (("local", []), ("dask", dask_argv(cluster))):
        calls, out = tmp_path / f"calls-{name}", tmp_path / f"{name}.json"
        calls.mkdir()
        options = pipeline_options_for(argv)
        if name == "dask":
            assert options.view_as(StandardOptions).runner == dask_runner.RUNNER
        seam.run(options, _side_input_pipeline(calls, out))
        results[name] = out.read_text()
        assert sorted(p.name.split("-")[0] for p in calls.iterdir()) == ["a", "b", "c"], name
    assert results["dask"] == results["local"]
    got = json.loads(results["local"])
    assert json.dumps([0, ["a", "b", "c"], 3, "A"]) in got and json.dumps([4, "default", 0]) in got
    assert len(got) == 3 * 20 + 3


@on_engine
def test_a_remote_cluster_is_asked_for_its_worker_threads(cluster):
    assert dask_cluster.scheduler_threads(cluster) == 2  # two worker processes of one thread


@on_engine
def test_dp_aggregate_of_dict_rows_on_dask(cluster, tmp_path):
    """Dict rows are buffered into Arrow tables, the last of a bundle emitted by finish_bundle
    (kept by the project's Dask translation): the same table, no row lost."""
    from runners.profiles import pipeline_options_for

    local, dask = str(tmp_path / "local.parquet"), str(tmp_path / "dask.parquet")
    seam.run(pipeline_options_for([]), _dp_aggregate(local, dict_rows=True))
    seam.run(pipeline_options_for(dask_argv(cluster)), _dp_aggregate(dask, dict_rows=True))
    assert Path(dask).read_bytes() == Path(local).read_bytes()


@on_engine
def test_dp_aggregate_with_a_staged_keyset_on_dask(cluster, tmp_path):
    """A PCollection keyset staged as files (workers write and read its key shards): the table
    equals the in-process one and the release with the same keys as a cross product."""
    from runners.profiles import pipeline_options_for

    cross, local, dask = (str(tmp_path / f"{name}.parquet") for name in ("cross", "local", "dask"))
    seam.run(pipeline_options_for([]), _dp_aggregate(cross))
    seam.run(pipeline_options_for([]), _dp_aggregate(local, staging_dir=str(tmp_path / "stage")))
    seam.run(pipeline_options_for(dask_argv(cluster)),
                     _dp_aggregate(dask, staging_dir=str(tmp_path / "stage")))
    assert Path(dask).read_bytes() == Path(local).read_bytes() == Path(cross).read_bytes()
    runs = list((tmp_path / "stage").iterdir())
    assert len(runs) == 2 and all(list(run.glob("keys-*.arrow")) and list(run.glob("filter-*"))
                                  for run in runs)


@on_engine
def test_dp_aggregate_on_a_run_scoped_local_cluster(tmp_path, monkeypatch):
    """The profile without a scheduler: a local cluster of 2 worker processes is started for the
    run and shut down after it (client first); the table equals the in-process one."""
    pytest.importorskip("distributed")
    from runners.profiles import pipeline_options_for

    local, dask = str(tmp_path / "local.parquet"), str(tmp_path / "dask.parquet")
    seam.run(pipeline_options_for(["--runner=FnApiRunner"]), _dp_aggregate(local))
    started = []
    real_local_cluster = dask_cluster.local_cluster

    @contextlib.contextmanager
    def recording(workers, *args):
        with real_local_cluster(workers, *args) as address:
            started.append((workers, address))
            yield address

    monkeypatch.setattr(dask_cluster, "local_cluster", recording)
    options = pipeline_options_for(["--runner=dask"])
    from apache_beam.runners.dask.dask_runner import DaskOptions
    partitions = []
    build = _dp_aggregate(dask)

    def recording_build(pipeline):
        partitions.append(pipeline.options.view_as(DaskOptions).npartitions)
        build(pipeline)

    result = seam.run(options, recording_build)
    assert result.client.status == "closed"
    assert Path(dask).read_bytes() == Path(local).read_bytes()
    [(workers, address)] = started
    assert workers == 2
    assert partitions == [2 * dask_cluster.PARTITIONS_PER_THREAD]
    host, port = address.removeprefix("tcp://").rsplit(":", 1)
    with pytest.raises(OSError):  # the scheduler is gone with the run
        socket.create_connection((host, int(port)), timeout=2).close()


def test_shard_numbers_spread_evenly_over_shuffle_partitions():
    """The project's Dask shuffles place an int key by its Fibonacci hash: the jobs' key and unit
    shards (0..S-1) land almost evenly (Dask's token hash put 22 to 36 of 120 shards in each of 4
    partitions, so one worker released 20% more than the other); other keys by Dask's token."""
    from collections import Counter

    from dask.base import tokenize

    from runners.dask_runner import partition_hash

    for shards, partitions in ((120, 4), (120, 2), (64, 6), (30, 4)):
        sizes = Counter(partition_hash(k) % partitions for k in range(shards)).values()
        assert len(sizes) == partitions and max(sizes) - min(sizes) <= 3, (shards, partitions, sizes)
    assert partition_hash(-5) >= 0 and partition_hash(2**70) >= 0
    for key in ("a", (1, "b"), None, True, 1.5):
        assert partition_hash(key) == int(tokenize(key), 16)


class _RecordingSum(beam.CombineFn):
    """Sums values; the accumulator also counts the inputs it holds. Each ``compact`` and
    ``merge_accumulators`` call leaves a file in ``calls`` naming the count it saw."""

    def __init__(self, calls: Path):
        self._calls = calls

    def _record(self, what: str, n: int) -> None:
        import uuid

        (self._calls / f"{what}-{n}-{uuid.uuid4().hex}").touch()

    def create_accumulator(self):
        return 0, 0

    def add_input(self, accumulator, value):
        return accumulator[0] + 1, accumulator[1] + value

    def merge_accumulators(self, accumulators):
        accumulators = list(accumulators)
        self._record("merge", len(accumulators))
        return sum(a[0] for a in accumulators), sum(a[1] for a in accumulators)

    def compact(self, accumulator):
        self._record("compact", accumulator[0])
        return accumulator

    def extract_output(self, accumulator):
        return list(accumulator)


@on_engine
def test_combines_are_lifted_before_the_shuffle(cluster, tmp_path):
    """The project's DaskRunner combines each partition's values per key before the shuffle
    (``compact`` once per partition and key) and only accumulators cross it: each key's merge
    gets one accumulator per partition holding the key, and the sums equal the in-process ones.
    Beam's translation shuffles every value and combines after (no compact, no merge here).
    A combine with extra arguments keeps Beam's expansion; empty input gives CombineGlobally's
    default."""
    import json

    from runners.profiles import pipeline_options_for

    def build_for(calls: Path, out: Path):
        def build(p):
            values = p | beam.Create([(k, i) for i in range(200) for k in ("a", "b", "c")])
            lifted = values | "Lifted" >> beam.CombinePerKey(_RecordingSum(calls))
            with_arg = values | "WithArg" >> beam.CombinePerKey(lambda vs, m: sum(vs) % m, 1000)
            empty = (values | beam.Filter(lambda kv: kv[1] < 0) | beam.Map(lambda kv: kv[1])
                     | "Empty" >> beam.CombineGlobally(sum))
            ((lifted, with_arg, empty | beam.Map(lambda s: ("empty", s)))
             | beam.Flatten() | beam.combiners.ToList()
             | beam.Map(lambda got: out.write_text(json.dumps(sorted(map(json.dumps, got))))))
        return build

    results = {}
    for name, argv in (("local", []), ("dask", dask_argv(cluster) + ["--dask_npartitions=2"])):
        calls, out = tmp_path / f"calls-{name}", tmp_path / f"{name}.json"
        calls.mkdir()
        seam.run(pipeline_options_for(argv), build_for(calls, out))
        results[name] = json.loads(out.read_text())
        if name == "dask":
            made = sorted(p.name.rsplit("-", 1)[0] for p in calls.iterdir())
            assert made == ["compact-100"] * 6 + ["merge-2"] * 3, made  # 3 keys x 2 partitions
    assert results["dask"] == results["local"]
    got = [json.loads(r) for r in results["dask"]]
    assert ["a", [200, sum(range(200))]] in got and ["empty", 0] in got
    assert ["b", sum(range(200)) % 1000] in got and len(got) == 3 + 3 + 1


def test_only_global_combines_of_a_combine_fn_are_lifted():
    from apache_beam.pipeline import PipelineVisitor
    from apache_beam.transforms import window

    from runners.dask_runner import lifts

    p = beam.Pipeline()
    values = p | beam.Create([("a", 1)])
    values | "Sum" >> beam.CombinePerKey(sum)
    values | "Mean" >> beam.combiners.Mean.PerKey()
    values | "WithArg" >> beam.CombinePerKey(lambda vs, m: sum(vs) % m, 7)
    values | beam.WindowInto(window.FixedWindows(10)) | "Windowed" >> beam.CombinePerKey(sum)
    found = {}

    class Visitor(PipelineVisitor):
        def enter_composite_transform(self, node):
            if isinstance(node.transform, beam.CombinePerKey):
                found[node.full_label] = lifts(node)

    p.visit(Visitor())
    assert found == {"Sum": True, "Mean/CombinePerKey(MeanCombineFn)": True, "WithArg": False, "Windowed": False}, found


def test_a_create_makes_exactly_the_partitions_asked_for():
    """Dask's from_sequence (Beam's translation) turned 125 file names into 3 partitions when
    asked for 2 (62, 62 and 1), and every later step kept the odd one: 5 release tasks on 2
    workers. The project's runner splits them evenly, in order."""
    import apache_beam as beam
    from apache_beam.runners.dask.dask_runner import DaskRunner as BeamDaskRunner
    from apache_beam.runners.dask.overrides import dask_overrides

    from runners.dask_runner import DaskRunner

    def partitions(runner, items, npartitions):
        p = beam.Pipeline()
        p | "Files" >> beam.Create(items)
        p.replace_all(dask_overrides())
        visitor = runner.to_dask_bag_visitor({"npartitions": npartitions})
        p.visit(visitor)
        [bag] = [bag for node, bag in visitor.bags.items() if node.full_label == "Files"]
        return [len(part) for part in bag.map_partitions(lambda part: [list(part)]).compute(scheduler="sync")], \
            bag.compute(scheduler="sync")

    assert partitions(BeamDaskRunner, list(range(125)), 2)[0] == [62, 62, 1]
    sizes, items = partitions(DaskRunner, list(range(125)), 2)
    assert sizes == [62, 63] and items == list(range(125))
    assert partitions(DaskRunner, list(range(7)), 3)[0] == [2, 2, 3]
    assert partitions(DaskRunner, ["a"], 4) == ([1], ["a"])


@on_engine
def test_workers_size_beam_elements_by_what_they_hold():
    """Beam's translation wraps every element in a WindowedValue, which Dask sized at 80 bytes
    whatever it held, so its scheduler placed tasks as if partitions of Arrow batches were
    empty. The project's runner registers a size for them in every worker before the run."""
    pytest.importorskip("distributed")
    import distributed
    import numpy as np
    import pyarrow as pa

    from runners.profiles import pipeline_options_for

    def held_size():
        from apache_beam.transforms.window import GlobalWindow
        from apache_beam.utils.windowed_value import WindowedValue
        from dask.sizeof import sizeof

        batch = pa.record_batch({"a": np.arange(100_000)})
        return sizeof([WindowedValue(batch, 0, (GlobalWindow(),))] * 10) / (10 * batch.nbytes)

    with dask_cluster.local_cluster(1) as address:
        with distributed.Client(address, set_as_default=False) as client:
            [before] = client.run(held_size).values()
            seam.run(pipeline_options_for(["--runner=DaskRunner", f"--dask_client_address={address}"]),
                             lambda p: p | beam.Create([1, 2]) | beam.Map(lambda x: x))
            [after] = client.run(held_size).values()
    assert before < 0.01 and 1 <= after < 1.1, (before, after)


def _optimized_graph(build, npartitions: int):
    """The graph the project's runner submits for ``build(pipeline)``, before placement."""
    from runners.dask_runner import DaskRunner

    p = beam.Pipeline()
    build(p)
    return dict(DaskRunner.translate(p, {"npartitions": npartitions}).__dask_graph__())


def test_small_root_stages_are_dealt_round_the_workers():
    """With every task of a stage guessed at the same duration, Dask assigned a small stage's
    partitions in the order the graph's random tokens gave, and in some runs one worker read both
    halves of the rows. Partition i of a root stage now goes to the i-th worker thread."""
    from runners.dask_runner import spread_roots, worker_slots

    assert worker_slots({"tcp://b:1": 1, "tcp://a:1": 2}) == ["tcp://a:1", "tcp://b:1", "tcp://a:1"]
    assert worker_slots({}) == []

    def build(p):
        files = p | "Files" >> beam.Create(["f0", "f1", "f2", "f3", "f4"]) | "Read" >> beam.Map(str.upper)
        one = p | "One" >> beam.Create(["x"])
        (files, one) | beam.Flatten() | beam.Map(lambda x: (x, 1)) | beam.CombinePerKey(sum)

    graph = _optimized_graph(build, npartitions=2)
    roots = {key for key, task in graph.items() if not task.dependencies}
    placement = spread_roots(graph, ["w0", "w1"])
    assert set(placement) == roots and len(roots) == 3, (placement, roots)
    # the Flatten's 3 partitions (the files' 2, then "x"), each fused with the combine's first half
    assert [placement[key] for key in sorted(roots)] == ["w0", "w1", "w0"]
    assert spread_roots(graph, ["w0"]) == {}
    # a stage of more partitions than twice the threads is left to Dask's queueing
    assert spread_roots(_optimized_graph(build, npartitions=5), ["w0", "w1"]) == {}
    assert len(spread_roots(_optimized_graph(build, npartitions=5), ["w0", "w1", "w2"])) == 6


@on_engine
def test_root_partitions_run_on_the_workers_they_are_dealt_to(cluster):
    """The placement reaches the scheduler as a loose worker restriction on each root task (a
    scheduler plugin records what the graph carried), and the tasks run there."""
    import distributed
    from distributed.diagnostics.plugin import SchedulerPlugin

    from runners.profiles import pipeline_options_for

    class Recorder(SchedulerPlugin):
        name = "test-placement-recorder"

        def __init__(self):
            self.annotations = []

        def update_graph(self, scheduler, *, annotations=None, **kwargs):
            self.annotations.append({kind: dict(values) for kind, values in (annotations or {}).items()
                                     if kind in ("workers", "allow_other_workers")})

    with distributed.Client(cluster, set_as_default=False) as client:
        client.register_plugin(Recorder())
        workers = sorted(client.nthreads())
        with distributed.get_task_stream(client=client) as stream:
            seam.run(pipeline_options_for(dask_argv(cluster)),
                             lambda p: p | beam.Create(range(40)) | beam.Map(lambda x: x * x)
                             | beam.Map(lambda x: (x % 3, x)) | beam.CombinePerKey(sum))
        [recorded] = client.run_on_scheduler(
            lambda dask_scheduler: dask_scheduler.plugins[Recorder.name].annotations)
    ran_on = {s["key"]: s["worker"] for s in stream.data}
    placed = recorded["workers"]
    assert sorted(placed.values()) == workers, placed  # the Create's 2 partitions, one per worker
    assert all(recorded["allow_other_workers"][key] for key in placed)
    assert {key: ran_on[key] for key in placed} == placed
    assert [placed[key] for key in sorted(placed)] == workers  # partition i on the i-th worker
