"""The worker container, the dependency lock and the scheduled job names, checked statically.

No Docker engine runs here: the Dockerfile is read as text and checked against the lock
(Beam and Python versions equal to the base image's), setup.py (every package copied, every
requirement pinned in the lock within its lower bound) and the Makefile (`make setup` installs
with the same lock). The Airflow DAG's Dataflow job names are checked without Airflow.
"""
from __future__ import annotations

import ast
import datetime as dt
import json
import re
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

from runners import profiles

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = (ROOT / "Dockerfile").read_text()
LOCK = (ROOT / "requirements.lock").read_text()
AIRFLOW_LOCK = (ROOT / "requirements-airflow.lock").read_text()
MAKEFILE = (ROOT / "Makefile").read_text()
# extras installed by `make setup` (test, plot), `make test-slow` (dataframes), `make
# test-browser` (browser) and by the container (gcp, dask)
LOCKED_EXTRAS = ("gcp", "dask", "test", "plot", "dataframes", "browser")


def _setup_call() -> dict:
    tree = ast.parse((ROOT / "setup.py").read_text())
    call = next(node for node in ast.walk(tree)
                if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "setup")
    return {kw.arg: kw.value for kw in call.keywords}


def _locked(lock: str = LOCK) -> dict[str, Version]:
    pins = {}
    for line in lock.splitlines():
        match = re.fullmatch(r"([A-Za-z0-9._-]+)==([^\s;]+).*", line)
        if match:
            pins[re.sub(r"[-_.]+", "-", match[1].lower())] = Version(match[2])
    return pins


def _args(name: str) -> str:
    match = re.search(rf"^ARG {name}=(\S+)$", DOCKERFILE, re.M)
    assert match, f"Dockerfile has no ARG {name}"
    return match[1]


def test_base_image_is_beams_sdk_image_at_the_locked_versions():
    assert re.search(r"^FROM apache/beam_python\$\{PYTHON_VERSION\}_sdk:\$\{BEAM_VERSION\}$",
                     DOCKERFILE, re.M)
    assert Version(_args("BEAM_VERSION")) == _locked()["apache-beam"]
    lock_python = re.search(r"--python-version (\S+)", MAKEFILE)[1]
    assert _args("PYTHON_VERSION") == lock_python
    # the SDK harness entrypoint of the base image is kept
    assert not re.search(r"^(ENTRYPOINT|CMD)\b", DOCKERFILE, re.M)


def test_container_installs_the_project_with_the_lock():
    call = _setup_call()
    packages = {elt.value.rstrip("*") for elt in call["packages"].keywords[0].value.elts}
    for package in sorted(packages) + ["setup.py", "requirements.lock"]:
        assert re.search(rf"^COPY .*\b{re.escape(package)}/?\s", DOCKERFILE + "\n", re.M), package
    install = re.search(r"^RUN pip install (.*)$", DOCKERFILE, re.M)[1]
    assert "--constraint requirements.lock" in install
    extras = re.search(r'"\.\[([a-z,]+)\]"', install)[1].split(",")
    assert set(extras) <= set(LOCKED_EXTRAS)
    assert ".venv" in (ROOT / ".dockerignore").read_text().split()


@pytest.mark.parametrize("lock_name, lock, locked_extras, more", [
    ("requirements.lock", LOCK, LOCKED_EXTRAS, []),
    ("requirements-airflow.lock", AIRFLOW_LOCK, ("airflow",), ["pytest"])])
def test_lock_pins_every_requirement_of_setup_py_within_its_bounds(lock_name, lock, locked_extras,
                                                                    more):
    call = _setup_call()
    extras = ast.literal_eval(call["extras_require"])
    requirements = ast.literal_eval(call["install_requires"]) + more
    for extra in locked_extras:
        requirements += extras[extra]
    pins = _locked(lock)
    for text in requirements:
        req = Requirement(text)
        name = re.sub(r"[-_.]+", "-", req.name.lower())
        assert name in pins, f"{req.name} is not in {lock_name}: run `make lock`"
        assert req.specifier.contains(pins[name], prereleases=True), \
            f"{req.name}=={pins[name]} in {lock_name} is outside {req.specifier}: run `make lock`"


def test_test_extra_is_not_all_of_apache_beam_gcp():
    """`make setup` stays lean: the tests need Beam's GCS IO and Dataflow client, not the 20-odd
    google-cloud libraries of apache-beam[gcp] (those are the worker container's)."""
    extras = ast.literal_eval(_setup_call()["extras_require"])
    assert not any(Requirement(r).extras for r in extras["test"] if r.startswith("apache-beam"))
    assert "polars" not in {Requirement(r).name for r in extras["test"]}


def test_make_setup_installs_with_the_lock():
    rule = MAKEFILE[MAKEFILE.index("$(STAMP):"):MAKEFILE.index("setup: $(STAMP)")]
    assert "$(LOCK)" in rule.splitlines()[0]  # a new lock re-installs
    assert "--constraint $(LOCK)" in rule
    assert re.search(r"^lock:", MAKEFILE, re.M) and "uv pip compile setup.py" in MAKEFILE


def test_make_test_airflow_installs_with_its_lock():
    rule = MAKEFILE[MAKEFILE.index("test-airflow:"):]
    rule = rule[:rule.index("\n\n")]
    assert "--constraint $(AIRFLOW_LOCK)" in rule and "--quiet" not in rule  # progress shown
    assert "--output-file $(AIRFLOW_LOCK)" in MAKEFILE


def test_remote_profiles_take_the_worker_image(monkeypatch):
    monkeypatch.setenv(profiles.WORKER_IMAGE_ENV, "registry.example/beam-dp-release:0.1.0")
    image = "--sdk_container_image=registry.example/beam-dp-release:0.1.0"
    dataflow = profiles.resolve(["--runner=dataflow", "--project=p", "--region=r",
                                 "--temp_location=gs://b/t"]).argv
    assert image in dataflow and not any(a.startswith("--setup_file") for a in dataflow)
    assert image in profiles.resolve(["--runner=spark", "--spark_master_url=spark://h:7077"]).argv
    assert image in profiles.resolve(["--runner=flink", "--flink_master=jm:8081"]).argv
    for local in (["--runner=flink"], ["--runner=spark"]):  # LOOPBACK: no container
        assert image not in profiles.resolve(local).argv
    monkeypatch.delenv(profiles.WORKER_IMAGE_ENV)
    dataflow = profiles.resolve(["--runner=dataflow", "--project=p", "--region=r",
                                 "--temp_location=gs://b/t"]).argv
    assert any(a.startswith("--setup_file=") for a in dataflow)


def _release(campaign: str, day: str = "2026-11-26"):
    from pipelines.centralnotice.config import ScheduledRelease

    date = dt.date.fromisoformat(day)
    return ScheduledRelease(release_id=f"{campaign}/{day}", campaign_id=campaign,
                            periods=(day,), dates=(date,))


def test_the_scheduled_tasks_run_the_job_with_flags_its_cli_accepts(tmp_path):
    """Both tasks' commands (runners/deploy/schedule.py: the DAG's and the cron script's), for a
    day, parse with the job's own command line, as one submission and its finalize."""
    import shlex

    from pipelines.centralnotice import job as centralnotice
    from pipelines.release.cli import parse_request
    from runners.deploy import schedule as sched

    path = tmp_path / "schedule.json"
    path.write_text(json.dumps({
        "config": str(ROOT / "pipelines" / "sample_data" / "centralnotice" / "campaigns.json"),
        "data": "/in", "output": "/out", "ledger": "/l.json", "key_store": "/keys",
        "runner": "DataflowRunner",
        "runner_options": {"project": "p", "region": "europe-west1"}}))
    planned = sched.plan(sched.read_schedule(str(path)), dt.date(2026, 11, 28))
    requests = []
    for step in ("submit", "finalize"):
        argv = shlex.split(planned[step][0])
        assert argv[1:3] == ["-m", "pipelines.centralnotice"]
        requests.append(parse_request(centralnotice.JOB, argv[3:]))
    submit, finalize = requests
    assert submit.options.submit_only and finalize.options.finalize
    assert submit.release == finalize.release == "C2026_000_fr/2026-11-28"
    assert "--job_name=centralnotice-c2026-000-fr-20261128" in submit.options.pipeline_args


@pytest.mark.parametrize("campaign", [
    "C2026_000_fr", "example_campaign", "9-lives.EN", "x" * 128, "Wiki_Loves_Monuments_2026__de"])
def test_scheduled_dataflow_job_names_are_accepted_by_dataflow(campaign):
    from runners.deploy.schedule import dataflow_job_name

    name = dataflow_job_name(_release(campaign))
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name) and name.endswith("-20261126"), name
    assert len(name) <= 63 and "--" not in name


def test_scheduled_job_names_of_the_sample_campaigns_are_distinct():
    from runners.deploy.schedule import dataflow_job_name

    config = json.loads((ROOT / "pipelines" / "sample_data" / "centralnotice" /
                         "campaigns.json").read_text())
    ids = [c["campaign_id"] for c in config["campaigns"]]
    names = {dataflow_job_name(_release(c)) for c in ids}
    assert len(names) == len(ids)
