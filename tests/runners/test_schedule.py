"""What a scheduled run releases (runners/deploy/schedule.py): each campaign's own schedule for the
data interval's day, from the schedule file the cron script and the Airflow DAG share."""
from __future__ import annotations

import copy
import datetime as dt
import json
import shlex
import sys
from pathlib import Path

import pytest

from runners.deploy import schedule as sched

ROOT = Path(__file__).resolve().parents[2]
SAMPLE_CONFIG = ROOT / "pipelines" / "sample_data" / "centralnotice" / "campaigns.json"


def _config(tmp_path, edit=None) -> Path:
    data = json.loads(SAMPLE_CONFIG.read_text())
    if edit:
        edit(data)
    path = tmp_path / "campaigns.json"
    path.write_text(json.dumps(data))
    if "protected_countries_file" in data:
        (tmp_path / data["protected_countries_file"]).write_text(
            (SAMPLE_CONFIG.parent / data["protected_countries_file"]).read_text())
    return path


def _schedule(tmp_path, config: Path = SAMPLE_CONFIG, **fields) -> sched.ScheduleFile:
    data = {"config": str(config), "data": "/in", "output": "/out", "ledger": "/l.json",
            "key_store": "/keys", **fields}
    path = tmp_path / "schedule.json"
    path.write_text(json.dumps(data))
    return sched.read_schedule(str(path))


def _due(schedule, day: str) -> list[str]:
    return [r.release_id for r in sched.due_releases(schedule, dt.date.fromisoformat(day))]


def test_a_daily_campaign_releases_each_of_its_days_and_nothing_else(tmp_path):
    schedule = _schedule(tmp_path, campaigns=["C2026_000_fr"])  # daily, 2026-11-28..30
    assert {day: _due(schedule, day) for day in
            ("2026-11-27", "2026-11-28", "2026-11-29", "2026-11-30", "2026-12-01")} == {
        "2026-11-27": [], "2026-11-28": ["C2026_000_fr/2026-11-28"],
        "2026-11-29": ["C2026_000_fr/2026-11-29"], "2026-11-30": ["C2026_000_fr/2026-11-30"],
        "2026-12-01": []}


def test_a_whole_campaign_release_is_due_on_its_last_day_with_every_day_s_input(tmp_path):
    schedule = _schedule(tmp_path, campaigns=["C2026_001_ed"])  # one release, 2026-11-01..03
    assert [_due(schedule, d) for d in ("2026-11-01", "2026-11-02", "2026-11-04")] == [[], [], []]
    (release,) = sched.due_releases(schedule, dt.date(2026, 11, 3))
    assert release.release_id == "C2026_001_ed/2026-11-01_2026-11-03"
    command = sched.release_command(schedule, release)
    assert f"--release={release.release_id}" in command
    assert ("--impressions=/in/2026-11-01/impressions/,/in/2026-11-02/impressions/,"
            "/in/2026-11-03/impressions/") in command
    assert "--clicks=/in/2026-11-01/clicks/,/in/2026-11-02/clicks/,/in/2026-11-03/clicks/" \
        in command


def test_a_multi_day_period_is_released_once_on_its_last_day(tmp_path):
    """A campaign whose one release spans a longer period (here a week) is asked for on its last
    day only: no run of another day names it, so none is refused for it."""
    def week(data):
        campaign = copy.deepcopy(data["campaigns"][1])
        campaign.update(campaign_id="C2026_week", start_date="2026-12-01",
                        end_date="2026-12-07", schedule="campaign")
        data["campaigns"].append(campaign)

    schedule = _schedule(tmp_path, _config(tmp_path, week))
    days = [dt.date(2026, 12, 1) + dt.timedelta(days=i) for i in range(10)]
    due = {d.isoformat(): _due(schedule, d.isoformat()) for d in days}
    assert {d: ids for d, ids in due.items() if ids} == {
        "2026-12-07": ["C2026_week/2026-12-01_2026-12-07"]}
    (release,) = sched.due_releases(schedule, dt.date(2026, 12, 7))
    assert len(release.dates) == 7


def test_every_campaign_by_default_and_each_its_own_schedule(tmp_path):
    schedule = _schedule(tmp_path)
    assert _due(schedule, "2026-11-03") == ["C2026_001_ed/2026-11-01_2026-11-03"]
    assert _due(schedule, "2026-11-21") == ["C2026_002_wlm/2026-11-21"]


def test_the_plan_has_submit_finalize_and_the_check_as_of_the_next_morning(tmp_path):
    schedule = _schedule(tmp_path, runner="DataflowRunner", grace=2,
                         runner_options={"project": "p", "region": "europe-west1"})
    planned = sched.plan(schedule, dt.date(2026, 11, 29))
    assert planned["releases"] == ["C2026_000_fr/2026-11-29"]
    submit, finalize, run = (shlex.split(planned[k][0]) for k in ("submit", "finalize", "run"))
    assert submit[:3] == [sys.executable, "-m", "pipelines.centralnotice"]
    assert submit[-1] == "--submit_only" and finalize[-1] == "--finalize"
    assert submit[:-1] == finalize[:-1] == run
    assert "--job_name=centralnotice-c2026-000-fr-20261129" in run
    assert "--project=p" in run and "--runner=DataflowRunner" in run
    assert shlex.split(planned["check"]) == [
        sys.executable, "-m", "pipelines.catalog", "--ledger=/l.json", "--releases=/out",
        f"--config={SAMPLE_CONFIG}", "--check", "--as_of=2026-11-30", "--grace=2"]


@pytest.mark.parametrize("fields, message", [
    ({"dat": "x"}, r"unknown field\(s\) \['dat'\]"),
    ({"grace": -1}, "grace: must be a whole number"),
    ({"runner_options": {"Bad-Name": 1}}, "runner_options: must map option names"),
    ({"campaigns": []}, "campaigns: must be a non-empty list"),
    ({"campaigns": ["nope"]}, "campaigns: no campaign 'nope'"),
    ({"output": ""}, "output: must be a non-empty string"),
])
def test_a_bad_schedule_file_is_refused_naming_the_file_and_field(tmp_path, fields, message):
    with pytest.raises(sched.ScheduleError, match=message) as err:
        sched.due_releases(_schedule(tmp_path, **fields), dt.date(2026, 11, 29))
    assert "schedule.json" in str(err.value)


def test_the_cli_refuses_a_bad_day_or_file_with_exit_2_and_prints_json(tmp_path, capsys):
    _schedule(tmp_path)
    path = str(tmp_path / "schedule.json")
    assert sched.main(["--schedule", path, "--day", "29-11-2026"]) == 2
    assert "YYYY-MM-DD" in capsys.readouterr().err
    assert sched.main(["--schedule", str(tmp_path / "missing.json"), "--day", "2026-11-29"]) == 2
    assert "missing.json: cannot read" in capsys.readouterr().err
    assert sched.main(["--schedule", path, "--day", "2026-11-29", "--bogus"]) == 2
    capsys.readouterr()
    assert sched.main(["--schedule", path, "--day", "2026-11-29", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["releases"] == ["C2026_000_fr/2026-11-29"]
    assert sched.main(["--schedule", path, "--day", "2026-11-02", "--dry_run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "-m pipelines.catalog" in lines[0]  # nothing due: only the check


def test_local_paths_are_relative_to_the_schedule_file_not_the_working_directory(tmp_path):
    """A scheduler's task runs in a folder of its own (Airflow's BashOperator: a temporary one),
    so a relative path means the schedule file's folder; URLs are kept as given."""
    (tmp_path / "conf").mkdir()
    path = tmp_path / "conf" / "schedule.json"
    path.write_text(json.dumps({"config": "campaigns.json", "data": "../in", "output": "gs://b/out",
                                "ledger": "l.json", "key_store": "/keys"}))
    schedule = sched.read_schedule(str(path))
    assert schedule.config == str(tmp_path / "conf" / "campaigns.json")
    assert Path(schedule.data).resolve() == tmp_path / "in"
    assert (schedule.output, schedule.ledger, schedule.key_store) == (
        "gs://b/out", str(tmp_path / "conf" / "l.json"), "/keys")


def test_the_first_run_s_check_before_any_ledger_exists(tmp_path):
    """The first scheduled run's check, run as the scheduler runs it: no ledger and no release
    yet is a first run, not a bad input (exit 0, said so); a day due and never run is late
    (exit 1), never the exit 2 of a bad file."""
    import subprocess

    config = _config(tmp_path, lambda data: data.update(campaigns=data["campaigns"][:1]))
    schedule = _schedule(tmp_path, config, output=str(tmp_path / "releases"),
                         ledger=str(tmp_path / "private" / "ledger.json"))
    first = subprocess.run(shlex.split(sched.plan(schedule, dt.date(2026, 11, 28))["check"]),
                           capture_output=True, text=True, cwd=ROOT)
    assert first.returncode == 0, first.stderr
    assert "no ledger yet at" in first.stdout and "OVERDUE" not in first.stdout
    late = subprocess.run(shlex.split(sched.plan(schedule, dt.date(2026, 11, 30))["check"]),
                          capture_output=True, text=True, cwd=ROOT)
    assert late.returncode == 1, late.stderr
    assert "OVERDUE C2026_000_fr/2026-11-28" in late.stdout
