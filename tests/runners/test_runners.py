"""The same jobs on every runner: outputs equal to the embedded runner's, byte for byte.

A release's noise is drawn from streams keyed by (release key, purpose, output key), so a job run
with the same key file must give identical noisy output on the FnApiRunner, Prism, Flink and
Spark, however each engine splits, orders and retries the work. The engine tests carry the
``runners`` marker; the profile tests below them are quick and engine-free.

Engines need artifacts that ``python -m runners.fetch prism|flink|spark`` caches. A test whose
artifact is missing is skipped with that command as the reason, unless the runner is named in
``$BEAM_DP_REQUIRE_RUNNERS`` (comma-separated: prism, flink, spark), where it fails instead — CI
sets it for what its setup fetched.

Adding a pipeline = one more :class:`JobCase` in ``JOBS`` (its main must build options with
``runners.profiles.pipeline_options_for``).
"""
from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import shlex
import shutil
import sys
from pathlib import Path
from typing import Callable

import pytest

from runners import cache, profiles
from runners.harness import REPO_ROOT, RunnerCase, read_outputs, run_pipeline_main, worker_pool

# ---------------------------------------------------------------------------------------------
# Jobs: (pipeline main, its arguments, where it writes)


@dataclasses.dataclass(frozen=True)
class JobCase:
    name: str
    module: str
    # (inputs dir with the files `write_inputs` made, output dir) -> the job's own arguments
    args: Callable[[Path, Path], list[str]]
    output_glob: str  # relative to the output dir
    # extra arguments that make Dataflow translation possible (e.g. validate=False reads)
    dataflow_args: tuple[str, ...] = ()
    # why the main cannot yet stop after translating (dry run / template): strict xfail
    dataflow_offline_defect: str | None = None


def write_demo_inputs(directory: Path, rows: int = 2000) -> None:
    rng = random.Random(5)
    with open(directory / "demo_rows.csv", "w") as handle:
        handle.write("user,campaign,impressions\n")
        for i in range(rows):
            handle.write(f"u{i},{rng.choice('abcdz')},{rng.randint(0, 9)}\n")
        handle.write("truncated-row\n")


DEMO_KEYS = "a,b,c,d,e"


def demo_args(inputs: Path, out: Path, seed: int = 7) -> list[str]:
    return ["--input", str(inputs / "demo_rows.csv"), "--output", str(out / "counts.csv"),
            "--key_column", "campaign", "--keys", DEMO_KEYS, "--epsilon", "1",
            "--testing_seed", str(seed)]


SAMPLE_DATA = REPO_ROOT / "pipelines" / "sample_data"


def reach_frequency_args(inputs: Path, out: Path) -> list[str]:
    return ["--input", str(SAMPLE_DATA / "reach_frequency" / "impressions.csv"),
            "--output", str(out), "--campaigns", "c1,c2",
            "--publishers", "pub_a,pub_b,pub_c", "--epsilon", "1.0986",
            "--num_registers", "20000", "--testing_seed", "7"]


def _sample_day(campaign: str = "C2026_000_fr") -> str:
    """The first scheduled day of a sample campaign (read from the bundled configuration, so a
    regenerated sample moves the tests with it)."""
    from pipelines.centralnotice.config import load_config
    config = load_config(str(SAMPLE_DATA / "centralnotice" / "campaigns.json"))
    return config.campaign(campaign).releases()[0].dates[0].isoformat()


SAMPLE_DAY = _sample_day()


def centralnotice_args(inputs: Path, out: Path) -> list[str]:
    sample = SAMPLE_DATA / "centralnotice"
    return ["--config", str(sample / "campaigns.json"),
            "--impressions", str(sample / "impressions.csv"), "--clicks", str(sample / "clicks.csv"),
            "--campaign", "C2026_000_fr", "--date", SAMPLE_DAY, "--output", str(out),
            "--output-format", "csv", "--testing-seed", "7"]


JOBS = [
    JobCase("demo_release", "runners.demo_release", demo_args, "counts.csv"),
    JobCase("centralnotice", "pipelines.centralnotice", centralnotice_args,
            f"testing-not-a-release/C2026_000_fr/{SAMPLE_DAY}/centralnotice.csv"),
    JobCase("reach_frequency", "pipelines.reach_frequency", reach_frequency_args,
            "testing-not-a-release/reach_frequency/*/reach_frequency.jsonl"),
]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("runner_inputs")
    write_demo_inputs(directory)
    return directory


_REFERENCE: dict[str, list] = {}
DIRECT = RunnerCase(label="direct", runner="DirectRunner")


def reference_output(job: JobCase, inputs: Path, tmp_root: Path) -> list:
    """The job's output on the DirectRunner profile (the embedded FnApiRunner), computed once."""
    if job.name not in _REFERENCE:
        out = tmp_root / f"reference_{job.name}"
        out.mkdir()
        run_pipeline_main(job.module, job.args(inputs, out), DIRECT.argv())
        _REFERENCE[job.name] = read_outputs(str(out / job.output_glob))
    return _REFERENCE[job.name]


# ---------------------------------------------------------------------------------------------
# Runners


def _required(runner: str) -> bool:
    wanted = os.environ.get("BEAM_DP_REQUIRE_RUNNERS", "")
    return runner in {w.strip().lower() for w in wanted.split(",")}


def need_artifact(kind: str, found, fetch: str) -> None:
    if found:
        return
    message = f"{kind} artifact not cached: run `python -m runners.fetch {fetch}`"
    if _required(kind):
        pytest.fail(message + " ($BEAM_DP_REQUIRE_RUNNERS requires it)")
    pytest.skip(message)


def _prism_ready():
    need_artifact("prism", cache.cached_prism(), "prism")


def _flink_ready():
    need_artifact("flink", cache.cached_flink_versions(), "flink")


def _spark_ready():
    need_artifact("spark", cache.cached_jar(cache.SPARK_ARTIFACT), "spark")


RUNNERS = [
    (RunnerCase(label="prism-loopback", runner="PrismRunner"), _prism_ready),
    (RunnerCase(label="prism-external", runner="PrismRunner", needs_worker_pool=True), _prism_ready),
    (RunnerCase(label="flink-loopback", runner="FlinkRunner"), _flink_ready),
    (RunnerCase(label="flink-external", runner="FlinkRunner", needs_worker_pool=True), _flink_ready),
    (RunnerCase(label="spark-loopback", runner="SparkRunner"), _spark_ready),
]


@pytest.mark.runners
@pytest.mark.parametrize("job", JOBS, ids=lambda j: j.name)
@pytest.mark.parametrize("case,ready", RUNNERS, ids=[c.label for c, _ in RUNNERS])
def test_runner_output_equals_direct_runner(job, case, ready, inputs, tmp_path_factory):
    ready()
    expected = reference_output(job, inputs, tmp_path_factory.getbasetemp())
    out = tmp_path_factory.mktemp(f"{job.name}_{case.label}")
    if case.needs_worker_pool:
        with worker_pool() as address:
            run_pipeline_main(job.module, job.args(inputs, out), case.argv(address))
    else:
        run_pipeline_main(job.module, job.args(inputs, out), case.argv())
    assert read_outputs(str(out / job.output_glob)) == expected


@pytest.mark.runners
def test_direct_runner_with_prism_location_runs_prism(inputs, tmp_path_factory):
    """Also after Beam's own DirectRunner ran in this process: its Prism attempt (no download
    here) leaves a per-process Prism job server behind that the profile must not reuse."""
    _prism_ready()
    import apache_beam as beam
    with beam.Pipeline(runner="DirectRunner") as pipeline:  # Beam's switching runner, on purpose
        pipeline | beam.Create([1, 2]) | beam.Map(lambda x: x)
    job = JOBS[0]
    expected = reference_output(job, inputs, tmp_path_factory.getbasetemp())
    out = tmp_path_factory.mktemp("direct_prism")
    run_pipeline_main(job.module, job.args(inputs, out),
                      ["--runner=DirectRunner", f"--prism_location={cache.cached_prism()}"])
    assert read_outputs(str(out / job.output_glob)) == expected


@pytest.mark.runners
def test_subprocess_main_matches_in_process(inputs, tmp_path_factory):
    """``python -m module`` (how cron and Airflow start a job) gives the in-process output."""
    job = JOBS[0]
    expected = reference_output(job, inputs, tmp_path_factory.getbasetemp())
    out = tmp_path_factory.mktemp("subprocess")
    run_pipeline_main(job.module, job.args(inputs, out), DIRECT.argv(), in_process=False)
    assert read_outputs(str(out / job.output_glob)) == expected


@pytest.mark.runners
def test_demo_release_is_noisy_and_keyed(inputs, tmp_path_factory):
    """Equal outputs across runners mean something only if the output depends on the key and
    is not the raw counts."""
    job = JOBS[0]
    noisy = reference_output(job, inputs, tmp_path_factory.getbasetemp())
    header, rows = noisy[-1], dict(line.split(",") for line in noisy[:-1])
    assert header == "key,noisy_count"
    assert sorted(rows) == DEMO_KEYS.split(",")  # every public key, "e" has no rows
    exact = {k: 0 for k in rows}
    with open(inputs / "demo_rows.csv") as handle:
        next(handle)
        for line in handle:
            fields = line.strip().split(",")
            if len(fields) == 3 and fields[1] in exact:
                exact[fields[1]] += 1
    assert any(int(rows[k]) != exact[k] for k in rows)
    # discrete Laplace, scale 1/epsilon = 1: |noise| >= 40 has probability < 1e-17
    assert all(abs(int(rows[k]) - exact[k]) < 40 for k in rows)
    out = tmp_path_factory.mktemp("other_seed")
    run_pipeline_main(job.module, demo_args(inputs, out, seed=8), ["--runner=FnApiRunner"])
    assert read_outputs(str(out / job.output_glob)) != noisy


# ---------------------------------------------------------------------------------------------
# Dataflow: translation and template staging, offline


DATAFLOW_JOBS = [
    pytest.param(job, id=job.name, marks=[pytest.mark.xfail(
        strict=True, reason=job.dataflow_offline_defect)] if job.dataflow_offline_defect else [])
    for job in JOBS]

DATAFLOW_ARGS = ["--runner=DataflowRunner", "--project=dp-test", "--region=europe-west1",
                 "--no_auth"]


@pytest.mark.runners
@pytest.mark.parametrize("job", DATAFLOW_JOBS)
def test_dataflow_dry_run_translates(job, inputs, tmp_path, monkeypatch):
    """The whole pipeline translates to a Dataflow job offline (the main raises otherwise)."""
    monkeypatch.setenv("NO_GCE_CHECK", "True")  # no 25 s metadata-server probe
    run_pipeline_main(job.module, job.args(inputs, tmp_path),
                      DATAFLOW_ARGS + ["--temp_location=gs://dp-test-bucket/tmp",
                                       "--dry_run=True", *job.dataflow_args])


@pytest.fixture
def gcs_emulator(monkeypatch):
    from gcs_emulator import storage_emulator

    monkeypatch.setenv("NO_GCE_CHECK", "True")
    with storage_emulator("dp-test-bucket") as bucket:
        yield bucket


def _copy_project(target: Path) -> Path:
    """A copy of the project's packages and setup.py: building the staged sdist writes
    *.egg-info next to setup.py, which must not land in the work tree."""
    for package in ("transforms", "accounting", "pipelines", "runners"):
        shutil.copytree(REPO_ROOT / package, target / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "setup.py", target / "setup.py")
    return target / "setup.py"


@pytest.mark.runners
@pytest.mark.parametrize("job", DATAFLOW_JOBS)
def test_dataflow_template_stages_project_to_gcs_emulator(job, inputs, tmp_path, gcs_emulator):
    setup_file = _copy_project(tmp_path / "src")
    template = tmp_path / "template.json"
    run_pipeline_main(
        job.module, job.args(inputs, tmp_path),
        DATAFLOW_ARGS + [f"--temp_location=gs://{gcs_emulator}/tmp",
                         f"--staging_location=gs://{gcs_emulator}/staging",
                         f"--template_location={template}", f"--setup_file={setup_file}",
                         *job.dataflow_args])
    description = json.loads(template.read_text())
    assert description["environment"]["tempStoragePrefix"].startswith(
        f"storage.googleapis.com/{gcs_emulator}/tmp")
    # The job runs this project's code on the workers: the packages are staged, not pickled in.
    assert "workflow.tar.gz" in json.dumps(description["environment"])

    from google.cloud import storage
    client = storage.Client.create_anonymous_client()
    staged = [blob.name for blob in client.list_blobs(gcs_emulator, prefix="staging/")]
    assert any(name.endswith("workflow.tar.gz") for name in staged), staged  # the project sdist
    assert any(name.endswith("pipeline.pb") for name in staged), staged


# ---------------------------------------------------------------------------------------------
# Profiles (no engine)


def test_direct_runner_profile_is_deterministic():
    assert profiles.resolve([]).runner == "FnApiRunner"
    assert profiles.resolve(["--runner", "DirectRunner"]).runner == "FnApiRunner"
    resolved = profiles.resolve(["--runner=direct", "--prism_location=/opt/prism"])
    assert resolved.runner == "PrismRunner"
    assert "--prism_location=/opt/prism" in resolved.argv


def test_explicit_options_win_over_profile_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("BEAM_DP_JAR_CACHE", str(tmp_path))
    resolved = profiles.resolve(["--runner=FlinkRunner", "--parallelism", "8",
                                 "--flink_master=host:8081"])
    assert resolved.argv.count("--parallelism") == 1 and "8" in resolved.argv
    assert "--flink_master=[local]" not in resolved.argv
    # a remote cluster's workers cannot reach a LOOPBACK worker in this process
    assert not any(a.startswith("--environment_type") for a in resolved.argv)
    local = profiles.resolve(["--runner=FlinkRunner"]).argv
    assert "--environment_type=LOOPBACK" in local and "--parallelism=2" in local
    spark = profiles.resolve(["--runner=SparkRunner", "--spark_master_url=spark://m:7077"]).argv
    assert not any(a.startswith("--environment_type") for a in spark)


def test_flink_profile_uses_newest_cached_jar(monkeypatch, tmp_path):
    monkeypatch.setenv("BEAM_DP_JAR_CACHE", str(tmp_path))
    assert not any(a.startswith("--flink_job_server_jar") for a in
                   profiles.resolve(["--runner=flink"]).argv)
    for version in ("1.19", "2.0"):
        (tmp_path / cache.jar_name(cache.flink_artifact(version))).write_bytes(b"PK")
    argv = profiles.resolve(["--runner=flink"]).argv
    assert "--flink_version=2.0" in argv
    jar = tmp_path / cache.jar_name(cache.flink_artifact("2.0"))
    assert f"--flink_job_server_jar={jar}" in argv
    argv = profiles.resolve(["--runner=flink", "--flink_version=1.19"]).argv
    assert any(a.endswith("beam-runners-flink-1.19-job-server-" + cache.BEAM_VERSION + ".jar")
               for a in argv)


def test_spark_profile_defaults(monkeypatch, tmp_path):
    monkeypatch.setenv("BEAM_DP_JAR_CACHE", str(tmp_path))
    (tmp_path / cache.jar_name(cache.SPARK_ARTIFACT)).write_bytes(b"PK")
    argv = profiles.resolve(["--runner=SparkRunner"]).argv
    assert "--spark_master_url=local[2]" in argv
    assert f"--spark_job_server_jar={tmp_path / cache.jar_name(cache.SPARK_ARTIFACT)}" in argv


def test_dataflow_profile_requires_project_region_temp_location():
    with pytest.raises(ValueError, match="--project, --region, --temp_location"):
        profiles.resolve(["--runner=DataflowRunner"])
    with pytest.raises(ValueError, match="gs://"):
        profiles.resolve(["--runner=DataflowRunner", "--project=p", "--region=r",
                          "--temp_location=/tmp/x"])
    argv = profiles.resolve(["--runner=DataflowRunner", "--project=p", "--region=r",
                             "--temp_location=gs://b/t"]).argv
    assert f"--setup_file={REPO_ROOT / 'setup.py'}" in argv
    container = profiles.resolve(["--runner=DataflowRunner", "--project=p", "--region=r",
                                  "--temp_location=gs://b/t",
                                  "--sdk_container_image=gcr.io/p/dp:1"]).argv
    assert not any(a.startswith("--setup_file") for a in container)
    options = profiles.pipeline_options_for(["--runner=DataflowRunner", "--project=p",
                                             "--region=r", "--temp_location=gs://b/t"])
    from apache_beam.options.pipeline_options import SetupOptions
    assert options.view_as(SetupOptions).save_main_session is False


def test_pipeline_defaults_apply_only_when_not_given():
    argv = profiles.resolve(["--runner=FnApiRunner"], {"direct_num_workers": 2}).argv
    assert "--direct_num_workers=2" in argv
    argv = profiles.resolve(["--runner=FnApiRunner", "--direct_num_workers=1"],
                            {"direct_num_workers": 2}).argv
    assert "--direct_num_workers=2" not in argv


def test_describe_profiles_names_every_runner():
    text = profiles.describe_profiles()
    for name in ("DirectRunner", "PrismRunner", "FlinkRunner", "SparkRunner", "DataflowRunner"):
        assert f"### {name}" in text


# ---------------------------------------------------------------------------------------------
# Scheduling examples


SAMPLE_CONFIG = SAMPLE_DATA / "centralnotice" / "campaigns.json"


def _schedule_file(tmp_path, **fields) -> Path:
    """A schedule file (runners/deploy/schedule.py) on the sample configuration."""
    data = {"config": str(SAMPLE_CONFIG), "data": str(tmp_path / "data"),
            "output": str(tmp_path / "releases"), "ledger": str(tmp_path / "ledger.json"),
            "key_store": str(tmp_path / "keys"), **fields}
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps(data))
    return path


def _airflow_dag(monkeypatch, tmp_path):
    monkeypatch.setenv("AIRFLOW_HOME", str(tmp_path))  # before Airflow's first import
    if os.environ.get("BEAM_DP_REQUIRE_AIRFLOW"):  # make test-airflow: a missing Airflow fails
        import airflow.providers.standard.operators.bash  # noqa: F401
    pytest.importorskip("airflow.providers.standard.operators.bash")
    import importlib.util

    spec = importlib.util.spec_from_file_location("centralnotice_dag",
                                                  REPO_ROOT / "runners" / "deploy" / "airflow_dag.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.dag


def _scheduled(dag):
    """The DAG as Airflow's scheduler sees it: serialized and read back, with the scheduler's
    timetable (Airflow 3's authoring timetables do not schedule themselves)."""
    from airflow.serialization.serialized_objects import DagSerialization

    return DagSerialization.from_dict(DagSerialization.to_dict(dag))


def _context(info, schedule: Path) -> dict:
    """The template context a run of ``info`` has (its data interval, nothing set by hand), with
    the run's params naming the schedule file and this interpreter."""
    return {"data_interval_start": info.data_interval.start,
            "data_interval_end": info.data_interval.end, "logical_date": info.logical_date,
            "run_after": info.run_after,
            "params": {"schedule": str(schedule), "python": sys.executable}}


def test_airflow_dag_plans_what_is_due_then_submits_finalizes_and_checks(monkeypatch, tmp_path):
    dag = _airflow_dag(monkeypatch, tmp_path)
    assert dag.dag_id == "centralnotice_daily_release"
    assert sorted(dag.task_ids) == ["catalog_check", "due", "finalize", "submit"]
    assert dag.get_task("submit").upstream_task_ids == {"due"}
    assert dag.get_task("finalize").upstream_task_ids == {"due", "submit"}
    check = dag.get_task("catalog_check")
    assert check.upstream_task_ids == {"finalize"} and check.downstream_task_ids == set()
    assert check.trigger_rule == "none_failed"  # runs when nothing was due (mapped tasks skipped)
    assert set(dag.params) == {"schedule", "python"}  # configuration: the run's params only
    assert dag.catchup and dag.max_active_runs == 1  # a missed day is released late, in order


def test_airflow_dag_releases_each_campaign_s_schedule_for_its_data_interval(monkeypatch,
                                                                             tmp_path):
    """Asked for its runs, the DAG's own timetable (under the installed Airflow) runs at 02:30
    UTC over the day before; its ``due`` task, rendered for each run, plans what each sample
    campaign's schedule has due that day: the daily campaign's day, the whole-campaign release
    (2026-11-01..03) on its last day only, nothing on other days; the check as of the morning
    after."""
    dag = _airflow_dag(monkeypatch, tmp_path)
    schedule = _schedule_file(tmp_path, runner="FlinkRunner",
                              runner_options={"flink_master": "jm:8081"})
    import pendulum

    scheduled = _scheduled(dag)
    first = scheduled.next_dagrun_info(last_automated_run_info=None)
    assert first.run_after.isoformat() == "2026-11-02T02:30:00+00:00"
    runs = list(scheduled.iter_dagrun_infos_between(
        pendulum.datetime(2026, 11, 1, tz="UTC"), pendulum.datetime(2026, 11, 5, tz="UTC")))
    runs += list(scheduled.iter_dagrun_infos_between(
        pendulum.datetime(2026, 11, 28, tz="UTC"), pendulum.datetime(2026, 11, 29, tz="UTC")))
    due = dag.get_task("due")
    planned = {}
    for info in runs:
        assert (info.run_after.hour, info.run_after.minute, str(info.run_after.tz)) == \
            (2, 30, "UTC")
        kwargs = due.render_template(due.op_kwargs, _context(info, schedule))
        day = (info.run_after - pendulum.duration(days=1)).date().isoformat()
        assert kwargs["day"] == day
        planned[day] = due.python_callable.__globals__["due_plan"](**kwargs)
    assert {day: plan["releases"] for day, plan in planned.items()} == {
        "2026-11-01": [], "2026-11-02": [],
        "2026-11-03": ["C2026_001_ed/2026-11-01_2026-11-03"],
        "2026-11-04": [], "2026-11-28": ["C2026_000_fr/2026-11-28"]}
    whole = planned["2026-11-03"]
    submit, finalize = (shlex.split(whole[step][0]) for step in ("submit", "finalize"))
    assert submit[:3] == [sys.executable, "-m", "pipelines.centralnotice"]
    assert submit[-1] == "--submit_only" and finalize[-1] == "--finalize"
    assert submit[:-1] == finalize[:-1]  # the same flags: finalize finds the submission
    assert "--runner=FlinkRunner" in submit and "--flink_master=jm:8081" in submit
    data = tmp_path / "data"
    assert (f"--impressions={data}/2026-11-01/impressions/,{data}/2026-11-02/impressions/,"
            f"{data}/2026-11-03/impressions/") in submit
    check = shlex.split(whole["check"])
    assert check[:3] == [sys.executable, "-m", "pipelines.catalog"]
    assert "--check" in check and "--as_of=2026-11-04" in check
    assert f"--config={SAMPLE_CONFIG}" in check and f"--ledger={tmp_path / 'ledger.json'}" in check
    # The mapped tasks take their commands from the due task's entries, the check from its XCom.
    assert dag.get_task("catalog_check").bash_command == \
        "{{ ti.xcom_pull(task_ids='due', key='check') }}"


def test_airflow_dag_names_dataflow_jobs_after_the_day(monkeypatch, tmp_path):
    dag = _airflow_dag(monkeypatch, tmp_path)
    schedule = _schedule_file(tmp_path, runner="DataflowRunner", runner_options={
        "project": "p", "region": "europe-west1", "temp_location": "gs://b/tmp"})
    import pendulum

    info = next(iter(_scheduled(dag).iter_dagrun_infos_between(
        pendulum.datetime(2026, 11, 29, tz="UTC"), pendulum.datetime(2026, 11, 29, 12, tz="UTC"))))
    due = dag.get_task("due")
    plan = due.python_callable.__globals__["due_plan"](
        **due.render_template(due.op_kwargs, _context(info, schedule)))
    command = shlex.split(plan["submit"][0])
    assert "--job_name=centralnotice-c2026-000-fr-20261129" in command
    assert "--release=C2026_000_fr/2026-11-29" in command


def test_airflow_dag_fails_its_due_task_on_a_bad_schedule_file(monkeypatch, tmp_path):
    dag = _airflow_dag(monkeypatch, tmp_path)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"config": str(SAMPLE_CONFIG), "dat": "x"}))
    with pytest.raises(RuntimeError, match=r"exited 2: .*bad\.json: unknown field\(s\) \['dat'\]"):
        dag.get_task("due").python_callable.__globals__["due_plan"](
            schedule=str(bad), python=sys.executable, day="2026-11-29")


def test_cron_wrapper_runs_what_is_due_then_the_check(tmp_path):
    import subprocess

    script = REPO_ROOT / "runners" / "deploy" / "daily_release.sh"
    schedule = _schedule_file(tmp_path, runner="SparkRunner",
                              runner_options={"spark_master_url": "spark://m:7077"})
    env = dict(os.environ, BEAM_DP_DRY_RUN="1", BEAM_DP_PYTHON=sys.executable,
               PYTHONPATH=str(REPO_ROOT))
    def dry(day):
        done = subprocess.run(["bash", str(script), str(schedule), day], env=env,
                              capture_output=True, text=True, check=True, cwd=REPO_ROOT)
        return done.stdout.strip().splitlines()

    lines = dry("2026-11-03")  # the whole-campaign release's last day
    assert len(lines) == 2
    assert "--release=C2026_001_ed/2026-11-01_2026-11-03" in lines[0]
    assert "-m pipelines.centralnotice" in lines[0] and "--runner=SparkRunner" in lines[0]
    assert "--spark_master_url=spark://m:7077" in lines[0]
    assert "-m pipelines.catalog" in lines[1] and "--check" in lines[1]
    assert len(dry("2026-11-02")) == 1  # inside the whole-campaign period: only the check
    assert "--release=C2026_002_wlm/2026-11-21" in dry("2026-11-21")[0]
    bad = subprocess.run(["bash", str(script), str(schedule), "20-11-2026"], env=env,
                         capture_output=True, text=True, cwd=REPO_ROOT)
    assert bad.returncode == 2 and "YYYY-MM-DD" in bad.stderr


def test_cron_wrapper_releases_yesterday_by_default(tmp_path):
    """Without a date, the 02:30 cron run covers yesterday (UTC): the day the Airflow DAG's run
    at the same time covers (its data interval's day)."""
    import datetime as dt
    import subprocess

    script = REPO_ROOT / "runners" / "deploy" / "daily_release.sh"
    env = dict(os.environ, BEAM_DP_DRY_RUN="1", BEAM_DP_PYTHON=sys.executable,
               PYTHONPATH=str(REPO_ROOT))
    days = {(dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)).date()}
    done = subprocess.run(["bash", str(script), str(_schedule_file(tmp_path))], env=env,
                          capture_output=True, text=True, check=True, cwd=REPO_ROOT)
    days.add((dt.datetime.now(dt.timezone.utc) - dt.timedelta(days=1)).date())
    assert any(f"--as_of={day + dt.timedelta(days=1)}" in done.stdout for day in days), \
        done.stdout
    cron = (REPO_ROOT / "runners" / "deploy" / "cron.example").read_text()
    assert "CRON_TZ=UTC" in cron and re.search(r"^30\s+2\s+\*\s+\*\s+\*\s+.*daily_release\.sh "
                                               r"\S+ >>", cron, re.M)


@pytest.mark.runners
def test_cron_wrapper_releases_a_day_and_a_rerun_reproduces_it(tmp_path):
    """The wrapper runs the real CentralNotice release on the sample data, with a ledger, then
    the catalog's check; a second run of the same day leaves the published release and the
    ledger as they were."""
    import subprocess

    sample = SAMPLE_DATA / "centralnotice"
    day = SAMPLE_DAY
    for table in ("impressions", "clicks"):
        (tmp_path / "data" / day / table).mkdir(parents=True)
        shutil.copy(sample / f"{table}.csv", tmp_path / "data" / day / table / f"{table}.csv")
    schedule = _schedule_file(tmp_path, campaigns=["C2026_000_fr"])
    env = dict(os.environ, TMPDIR=str(tmp_path), BEAM_DP_PYTHON=sys.executable,
               PYTHONPATH=str(REPO_ROOT))
    script = str(REPO_ROOT / "runners" / "deploy" / "daily_release.sh")
    release_dir = tmp_path / "releases" / "C2026_000_fr" / day
    first_run = subprocess.run(["bash", script, str(schedule), day], env=env, cwd=REPO_ROOT,
                               capture_output=True, text=True, timeout=300)
    # The release is published; the check then names the sample's other campaigns' slots,
    # never run here, as overdue (exit 1 of pipelines.catalog --check).
    assert first_run.returncode == 1, first_run.stderr
    assert f"release C2026_000_fr/{day} (released)" in first_run.stdout
    assert "OVERDUE" in first_run.stdout and f"C2026_000_fr/{day}" not in "".join(
        line for line in first_run.stdout.splitlines() if line.startswith("OVERDUE"))
    # Releases are published once, as version directories; the first run publishes v1.
    assert sorted(p.name for p in release_dir.iterdir()) == ["v1"]
    first = (release_dir / "v1" / "centralnotice.parquet").read_bytes()
    def charges():
        ledger = json.loads((tmp_path / "ledger.json").read_text())
        return {release_id: (entry["charged_at"], entry["measures"], entry["files"])
                for release_id, entry in ledger["releases"].items()}

    charged = charges()
    assert list(charged) == [f"C2026_000_fr/{day}"]
    rerun = subprocess.run(["bash", script, str(schedule), day], env=env, cwd=REPO_ROOT,
                           capture_output=True, text=True, timeout=300)
    assert "(reproduced)" in rerun.stdout
    # The rerun charges nothing and publishes nothing new: the same bytes, still one version.
    assert sorted(p.name for p in release_dir.iterdir()) == ["v1"]
    assert (release_dir / "v1" / "centralnotice.parquet").read_bytes() == first
