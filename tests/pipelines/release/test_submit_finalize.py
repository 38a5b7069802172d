"""A release made by two processes: ``--submit_only`` in one, ``--finalize`` in another.

Across real processes (``python -m pipelines.centralnotice`` on the in-process engine, and on a
2-worker local Dask cluster under the ``runners`` marker): the submission reserves and stages but
publishes nothing; finalize publishes once and spends nothing more; a second finalize reproduces;
two finalizers at once take turns (forked processes, one held back inside its turn); finalize
without a submission, or after the input changed, is refused before anything is published.
Dataflow's side (a job awaited by another process) runs Beam's own polling against a stand-in
for the Dataflow service, which cannot run here.
"""
from __future__ import annotations

import contextlib
import io
import json
import multiprocessing
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from release_testkit import published, read_json

ROOT = Path(__file__).resolve().parents[3]
SAMPLE = ROOT / "pipelines" / "sample_data" / "centralnotice"
RELEASE = "C2026_000_fr/2026-11-28"


def _argv(ws: Path, release: str = RELEASE) -> list[str]:
    return ["--config", str(SAMPLE / "campaigns.json"), "--impressions", str(ws / "imp.csv"),
            "--clicks", str(ws / "clk.csv"), "--release", release, "--output", str(ws / "out"),
            "--ledger", str(ws / "private" / "ledger.json"),
            "--key_store", str(ws / "private" / "keys")]


@pytest.fixture
def ws(tmp_path):
    shutil.copy(SAMPLE / "impressions.csv", tmp_path / "imp.csv")
    shutil.copy(SAMPLE / "clicks.csv", tmp_path / "clk.csv")
    return tmp_path


def cli(ws: Path, *extra: str, release: str = RELEASE) -> subprocess.CompletedProcess:
    """One run of the job in a process of its own."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-m", "pipelines.centralnotice", *_argv(ws, release),
                           *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def run_main(argv) -> tuple[int, str, str]:
    from pipelines.centralnotice import job as centralnotice

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = centralnotice.main(list(argv))
    return code, out.getvalue(), err.getvalue()


def record(ws: Path, release: str = RELEASE) -> dict:
    return read_json(ws / "private" / "ledger.json")["releases"][release]


def spent(ws: Path) -> float:
    state = read_json(ws / "private" / "ledger.json")
    return sum(m["epsilon"] for r in state["releases"].values() for m in r["measures"])


def test_submit_then_finalize_in_other_processes_publishes_once(ws):
    done = cli(ws, "--submit_only")
    assert done.returncode == 0, done.stderr
    assert f"submitted {RELEASE} (FnApiRunner, DONE)" in done.stdout
    submitted = record(ws)
    assert submitted["state"] == "reserved" and published(ws / "out") == {}
    handle = submitted["submission"]
    assert handle["runner"] == "FnApiRunner" and handle["state"] == "DONE"
    assert handle["staging"].startswith(str(ws / "private" / "staging") + "/")
    assert handle["key_fingerprints"] == {n: k["fingerprint"] for n, k in submitted["keys"].items()}
    charged = spent(ws)
    assert charged > 0

    done = cli(ws, "--finalize")
    assert done.returncode == 0, done.stderr
    assert f"{RELEASE} (released)" in done.stdout
    assert "rows (operator only): clicks.excluded" in done.stdout  # the submitted run's counters
    # The first finalize is the plan, not a re-run: it says where the charge was made.
    assert "(finalized: charged when it was submitted; nothing more was spent)" in done.stdout
    assert "re-run of a charged release" not in done.stdout
    out = published(ws / "out")
    assert sorted(Path(p).name for p in out) == ["RELEASE.json", "centralnotice.parquet"]
    assert record(ws)["state"] == "committed" and spent(ws) == pytest.approx(charged)
    marker = read_json(ws / "out" / RELEASE / "v1" / "RELEASE.json")
    assert marker["key_fingerprints"] == handle["key_fingerprints"]
    assert not list((ws / "private" / "staging").rglob("*.*"))  # attempt and its counters gone

    again = cli(ws, "--finalize")
    assert again.returncode == 0, again.stderr
    assert f"{RELEASE} (reproduced)" in again.stdout
    assert published(ws / "out") == out and spent(ws) == pytest.approx(charged)
    # one release key (the ledger's own chain key apart)
    assert len([k for k in (ws / "private" / "keys").iterdir()
                if not k.name.startswith("ledger-")]) == 1


def test_finalize_without_a_submission_is_refused_and_changes_nothing(ws):
    done = cli(ws, "--finalize")
    assert done.returncode == 2
    assert "--finalize found no submitted release for these flags" in done.stderr
    assert "does not exist" in done.stderr
    assert not (ws / "private").exists() and published(ws / "out") == {}
    # A release of these flags that was run (not submitted) has no job to finish.
    assert cli(ws, "--submit_only").returncode == 0
    other = cli(ws, "--finalize", release="C2026_000_fr/2026-11-29")
    assert other.returncode == 2 and "has no record in ledger" in other.stderr


def test_finalize_refuses_input_changed_since_the_submission(ws):
    assert cli(ws, "--submit_only").returncode == 0
    charged, ledger = spent(ws), (ws / "private" / "ledger.json").read_bytes()
    original = (ws / "imp.csv").read_text()
    (ws / "imp.csv").write_text(original + original.splitlines()[1] + "\n")
    done = cli(ws, "--finalize")
    assert done.returncode == 2 and "the input is now" in done.stderr, done.stderr
    assert published(ws / "out") == {} and (ws / "private" / "ledger.json").read_bytes() == ledger
    (ws / "imp.csv").write_text(original)
    done = cli(ws, "--finalize")
    assert done.returncode == 0 and "(released)" in done.stdout, done.stderr
    assert spent(ws) == pytest.approx(charged)


def test_submit_and_finalize_are_refused_together_and_for_testing_runs(ws):
    both = cli(ws, "--submit_only", "--finalize")
    assert both.returncode == 2 and "--submit_only and --finalize are two runs" in both.stderr
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    testing = [a for a in _argv(ws) if "private" not in a and a not in ("--ledger", "--key_store")]
    done = subprocess.run([sys.executable, "-m", "pipelines.centralnotice", *testing,
                           "--testing_seed", "3", "--submit_only"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 2 and "a --testing_seed run is not a release" in done.stderr


def test_a_whole_run_after_the_submission_leaves_finalize_to_reproduce(ws):
    """A run of the same flags without --submit_only (a scheduler retrying the old way) reuses
    the reservation and publishes; finalize then finds the release out with its keys."""
    assert cli(ws, "--submit_only").returncode == 0
    charged = spent(ws)
    code, out, err = run_main(_argv(ws))
    assert code == 0 and "(released)" in out, err
    done = cli(ws, "--finalize")
    assert done.returncode == 0 and "(reproduced)" in done.stdout, done.stderr
    assert spent(ws) == pytest.approx(charged)


def test_a_reservation_taken_over_while_its_job_ran_is_not_recorded(ws, monkeypatch):
    """Another run took the reservation over (other input: fresh keys) while the submitted job
    ran: the handle is not recorded for keys it did not compute with (exit 3), and finalize is
    refused."""
    import dataclasses

    from pipelines.release import lifecycle, submission

    real = submission.record

    def taken_over_first(reserved, staging, handle):
        # (while this run holds it no other run can take it over: the hold ends first, as when
        # a Dataflow job outlives the process that submitted it)
        lifecycle.end_hold(reserved)
        request = dataclasses.replace(lifecycle._requests(reserved.pre)[1][0],
                                      input_digest="sha256:corrected")
        reserved.ledger.reserve([request])
        return real(reserved, staging, handle)

    monkeypatch.setattr(submission, "record", taken_over_first)
    code, out, err = run_main(_argv(ws) + ["--submit_only"])
    assert code == 3 and "could not be recorded" in err and "taken over" in err, err
    monkeypatch.setattr(submission, "record", real)
    code, out, err = run_main(_argv(ws) + ["--finalize"])
    assert code == 2 and "the input is now" in err, err
    assert published(ws / "out") == {}


# --------------------------------------------------------------------------- finalize twice at once

def _finalize_child(argv, hold: float, queue):
    """A finalizing process; with ``hold``, it sleeps inside its turn before publishing (a
    concurrent finalizer would overtake it there)."""
    from pipelines.release import lifecycle

    if hold:
        real = lifecycle.publish

        def slow(ruled):
            time.sleep(hold)
            return real(ruled)

        lifecycle.publish = slow
    code, out, err = run_main(argv)
    queue.put((hold, code, out, err))


def test_two_finalizers_at_once_take_turns(ws):
    assert run_main(_argv(ws) + ["--submit_only"])[0] == 0
    charged = spent(ws)
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    argv = _argv(ws) + ["--finalize"]
    first = ctx.Process(target=_finalize_child, args=(argv, 4.0, queue))
    first.start()
    time.sleep(1.5)  # the first holds its turn, sleeping before it publishes
    second = ctx.Process(target=_finalize_child, args=(argv, 0.0, queue))
    second.start()
    results = {hold: (code, out, err) for hold, code, out, err in
               (queue.get(timeout=300) for _ in range(2))}
    for process in (first, second):
        process.join(60)
    assert results[4.0][0] == 0 and "(released)" in results[4.0][1], results[4.0][2]
    assert results[0.0][0] == 0 and "(reproduced)" in results[0.0][1], results[0.0][2]
    assert record(ws)["state"] == "committed" and spent(ws) == pytest.approx(charged)
    assert record(ws).get("finalizing") is None


def _claim_and_die(ws):
    """A finalizer that took its turn and was killed (the claim stays in the ledger)."""
    from accounting.ledger import BudgetLedger
    from pipelines.centralnotice import job as centralnotice
    from pipelines.release import cli as release_cli
    from pipelines.release import lifecycle

    request = release_cli.parse_request(centralnotice.JOB, _argv(ws) + ["--finalize"])
    reserved = lifecycle.find_submitted(lifecycle.preflight(centralnotice.JOB, request))
    ledger = BudgetLedger(str(ws / "private" / "ledger.json"), str(ws / "private" / "keys"))
    held = ledger.claim(reserved.reservations[RELEASE], "killed", 300)
    os._exit(0 if held is None else 1)


def test_a_claim_of_a_process_that_is_gone_is_taken_over(ws):
    """A finalizer killed inside its turn leaves its claim; the next one on this host sees that
    its holder is gone and finishes the release at once (not after the claim's lease)."""
    assert run_main(_argv(ws) + ["--submit_only"])[0] == 0
    child = multiprocessing.get_context("fork").Process(target=_claim_and_die, args=(ws,))
    child.start()
    child.join(120)
    assert child.exitcode == 0
    claim = record(ws)["finalizing"]
    assert claim["token"] == "killed" and claim["until"] > time.time() + 200
    started = time.time()
    code, out, err = run_main(_argv(ws) + ["--finalize"])
    assert code == 0 and "(released)" in out, err
    assert time.time() - started < 60 and record(ws)["finalizing"] is None


# --------------------------------------------------------------------------- Dataflow

JOB_ID = "2026-11-28_02_30_07-1234567890123456789"


class StandInDataflow:
    """The Dataflow service's answers to Beam's client calls, for one job (the service cannot
    run here): its states in turn, its error messages, its counters."""

    def __init__(self, states, errors=(), counters=None):
        self.states, self.errors, self.counters = list(states), list(errors), counters or {}

    def get_job(self, job_id):
        from google.cloud import dataflow

        assert job_id == JOB_ID
        state = self.states.pop(0) if len(self.states) > 1 else self.states[0]
        return dataflow.Job(id=job_id, current_state=getattr(dataflow.JobState, state))

    def list_messages(self, job_id, page_token=None, start_time=None, **_):
        from google.cloud import dataflow

        error = int(dataflow.JobMessageImportance.JOB_MESSAGE_ERROR)
        messages = [SimpleNamespace(time=f"t{i}", message_importance=error, message_text=text)
                    for i, text in enumerate(self.errors)]
        self.errors = []
        return messages, None

    def get_job_metrics(self, job_id):
        def update(name, value, tentative):
            context = {"namespace": "centralnotice", **({"tentative": "true"} if tentative else {})}
            return SimpleNamespace(name=SimpleNamespace(origin="user", name=name, context=context),
                                   scalar=value, distribution=None)
        return SimpleNamespace(metrics=[update(n, v, t) for n, v in self.counters.items()
                                        for t in (True, False)])


@pytest.fixture
def dataflow(monkeypatch):
    from runners import dataflow_jobs

    service = {}
    monkeypatch.setattr(dataflow_jobs, "_client", lambda options: service["now"])
    monkeypatch.setattr(time, "sleep", lambda seconds: None)  # Beam's polling pauses
    return service


def _dataflow_options():
    from runners.profiles import pipeline_options_for

    return pipeline_options_for(["--runner=DataflowRunner", "--project=p", "--region=europe-west1",
                                 "--temp_location=gs://b/tmp"])


def test_a_dataflow_job_is_awaited_until_it_is_done(dataflow):
    """Polled through Beam's own loop until done (the counters themselves are staged by the
    pipeline, as on every runner: finalize reads them from staging, not from the job)."""
    from apache_beam.runners.runner import PipelineState

    from runners.execution import JobHandle
    from runners.seam import wait

    dataflow["now"] = StandInDataflow(["JOB_STATE_RUNNING", "JOB_STATE_DONE"],
                                      counters={"impressions.read": 223})
    handle = JobHandle(runner="DataflowRunner", job_id=JOB_ID, state="PENDING")
    result = wait(_dataflow_options(), handle)
    assert result.state == PipelineState.DONE


@pytest.mark.parametrize("state", ["JOB_STATE_FAILED", "JOB_STATE_CANCELLED"])
def test_a_failed_or_cancelled_dataflow_job_raises_the_runners_message(dataflow, state):
    from runners.execution import JobFailed, JobHandle
    from runners.seam import wait

    dataflow["now"] = StandInDataflow([state], errors=[
        "Traceback (most recent call last):\n  ...\nOSError: [Errno 28] No space left on device"])
    handle = JobHandle(runner="DataflowRunner", job_id=JOB_ID, state="PENDING")
    with pytest.raises(JobFailed) as raised:
        wait(_dataflow_options(), handle)
    expected = state.replace("JOB_STATE_", "")
    assert f"the DataflowRunner job {JOB_ID} ended in state {expected}" in str(raised.value)
    if state == "JOB_STATE_FAILED":
        assert str(raised.value).endswith(": OSError: [Errno 28] No space left on device")


def _record_dataflow_submission(ws):
    """A submission recorded as Dataflow's (the job ran here: its staging is real)."""
    from pipelines.centralnotice import job as centralnotice
    from pipelines.release import cli as release_cli
    from pipelines.release import lifecycle, submission
    from runners.execution import JobHandle

    assert run_main(_argv(ws) + ["--submit_only"])[0] == 0
    request = release_cli.parse_request(centralnotice.JOB, _argv(ws) + ["--finalize"])
    reserved = lifecycle.find_submitted(lifecycle.preflight(centralnotice.JOB, request))
    staging, _ = submission.submitted(reserved)
    submission.record(reserved, staging, JobHandle(runner="DataflowRunner", job_id=JOB_ID,
                                                   state="RUNNING", project="p",
                                                   region="europe-west1"))


DATAFLOW_FLAGS = ["--runner", "DataflowRunner", "--project", "p", "--region", "europe-west1",
                  "--temp_location", "gs://b/tmp", "--finalize"]


def test_finalize_of_a_failed_dataflow_job_exits_3_with_its_message(ws, dataflow):
    _record_dataflow_submission(ws)
    dataflow["now"] = StandInDataflow(["JOB_STATE_RUNNING", "JOB_STATE_FAILED"],
                                      errors=["Workflow failed. Causes: S01: a worker was lost"])
    code, out, err = run_main(_argv(ws) + DATAFLOW_FLAGS)
    assert code == 3, err
    assert f"the DataflowRunner job {JOB_ID} ended in state FAILED: Workflow failed." in err
    assert "the reservation stays" in err and published(ws / "out") == {}
    failure = read_json(ws / "private" / "reports" / RELEASE / "v1" / "failure.json")
    assert "a worker was lost" in failure["detail"]
    # Resubmitted and done; finalize needs no Beam option: the job's project and region are
    # the handle's.
    _record_dataflow_submission(ws)
    dataflow["now"] = StandInDataflow(["JOB_STATE_DONE"])
    code, out, err = run_main(_argv(ws) + ["--finalize"])
    assert code == 0 and "(released)" in out, err


def test_a_flex_template_launch_is_a_submission_not_a_template():
    from pipelines.release import lifecycle
    from runners.dataflow_jobs import flex_launch_job_id

    launch = f"gs://b/staging/template_launches/{JOB_ID}/job_object"
    assert flex_launch_job_id(launch) == JOB_ID
    for other in ("gs://b/templates/cn.json", f"/tmp/template_launches/{JOB_ID}/job_object",
                  f"gs://b/template_launches/{JOB_ID}/job_object/x", None):
        assert flex_launch_job_id(other) is None
    args = ["--runner=DataflowRunner", "--project=p", "--region=r", "--temp_location=gs://b/t",
            f"--template_location={launch}"]
    assert lifecycle._pipeline_options(args, submit_only=True)[1] is False
    assert lifecycle._pipeline_options(args, submit_only=False)[1] is True
    assert lifecycle._pipeline_options(args[:-1] + ["--template_location=gs://b/t.json"],
                                       submit_only=True)[1] is True


def test_a_flex_launch_without_submit_only_is_refused(ws):
    launch = f"gs://b/staging/template_launches/{JOB_ID}/job_object"
    code, out, err = run_main(_argv(ws) + ["--runner", "DataflowRunner", "--project", "p",
                                           "--region", "r", "--temp_location", "gs://b/t",
                                           "--template_location", launch])
    assert code == 2 and "a Flex Template launch is --submit_only" in err
    assert not (ws / "private" / "ledger.json").exists()


# --------------------------------------------------------------------------- Dask

@pytest.mark.runners
def test_submit_and_finalize_on_a_local_dask_cluster(ws):
    """The submission runs the job on a 2-worker dask.distributed cluster (worker processes);
    another process finalizes it."""
    pytest.importorskip("distributed")
    done = cli(ws, "--runner", "DaskRunner", "--submit_only")
    assert done.returncode == 0, done.stderr
    assert "(DaskRunner, DONE)" in done.stdout
    assert record(ws)["submission"]["runner"] == "DaskRunner"
    done = cli(ws, "--runner", "DaskRunner", "--finalize")
    assert done.returncode == 0 and "(released)" in done.stdout, done.stderr
    assert (ws / "out" / RELEASE / "v1" / "centralnotice.parquet").exists()
    again = cli(ws, "--runner", "DaskRunner", "--finalize")
    assert again.returncode == 0 and "(reproduced)" in again.stdout, again.stderr
