"""Flex Templates: the metadata (runners/deploy/flex_template.py) matches each job's CLI
exactly; the launcher image (runners/deploy/launcher.Dockerfile, read statically: no Docker
engine here) is Google's Python launcher base running runners/deploy/flex_launcher.py, which only
submits; the documented gcloud commands use only flag combinations gcloud accepts."""
from __future__ import annotations

import importlib
import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.release import cli
from pipelines.release import flags as release_flags
from runners.deploy import flex_launcher, flex_template


@pytest.mark.parametrize("module", flex_template.JOB_MODULES)
def test_metadata_lists_every_flag_of_the_cli(module):
    data = flex_template.metadata(module)
    parser, flags = cli.build_parser(importlib.import_module(module).JOB)
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    names = [p["name"] for p in data["parameters"]]
    # Every flag but the two the launcher decides (it only submits: flex_launcher.py).
    assert names == [f[2:] for f in flags if f not in flex_template.LAUNCHER_FLAGS]
    assert len(set(names)) == len(names) and {"submit_only", "finalize"}.isdisjoint(names)
    for param in data["parameters"]:
        action = actions[param["name"]]
        assert param["isOptional"] is (not action.required)
        assert param["helpText"] == (action.help or action.dest)
        assert re.fullmatch(r"[a-zA-Z][a-zA-Z0-9_]*", param["name"])  # Dataflow's rule
    required = {p["name"] for p in data["parameters"] if not p["isOptional"]}
    assert "output" in required or "output" in names
    json.dumps(data)  # serialisable as written by main()


@pytest.mark.parametrize("module", flex_template.JOB_MODULES)
def test_example_values_pass_the_regexes_and_parse(module):
    """Every parameter given as Dataflow passes it (``--name=value``) parses to the same request
    as the ordinary command line."""
    data = flex_template.metadata(module)
    job = importlib.import_module(module).JOB
    parser, _ = cli.build_parser(job)
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    switches = [p for p in data["parameters"] if p.get("regexes") == [flex_template._BOOL]]
    assert switches and all(actions[p["name"]].nargs == 0 for p in switches)
    for param in data["parameters"]:
        for regex in param.get("regexes", []):
            action = actions[param["name"]]
            example = ("true" if action.nargs == 0 else str(action.choices[0]) if action.choices
                       else "3" if action.type in (int, float) else None)
            if example is not None:
                assert re.fullmatch(regex, example), (param["name"], regex)
    flags = [a.option_strings[0] for a in parser._actions if a.option_strings]
    switch_flags = [f"--{p['name']}" for p in switches]
    argv = ["--x=1", f"{switch_flags[0]}=true", f"{switch_flags[-1]}=false"]
    assert release_flags.normalise(argv, flags, switch_flags) == ["--x=1", switch_flags[0]]


def test_main_writes_one_file_per_job(tmp_path):
    assert flex_template.main(["--output", str(tmp_path)]) == 0
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == sorted(f"{name}.metadata.json" for name in flex_template.JOBS)


@pytest.mark.parametrize("value,expected", [("true", True), ("false", False)])
def test_a_switch_passed_as_a_template_parameter_parses(value, expected):
    from pipelines.reach_frequency.job import JOB

    request = cli.parse_request(JOB, [
        "--input=in.csv", "--output=out", "--campaigns=c1", "--publishers=p",
        "--epsilon=1", "--testing_seed=7", f"--explain={value}", "--runner=dask"])
    assert request.options.explain is expected
    assert "--runner=dask" in request.options.pipeline_args
    with pytest.raises(cli.FlagError, match="--explain: ignored explicit argument 'yes'"):
        cli.parse_request(JOB, ["--input=in.csv", "--output=out", "--campaigns=c1",
                                "--publishers=p", "--epsilon=1", "--explain=yes"])


# --------------------------------------------------------------------------- the launcher

ROOT = Path(__file__).resolve().parents[2]
LAUNCHER = (ROOT / "runners" / "deploy" / "launcher.Dockerfile").read_text()
WORKER = (ROOT / "Dockerfile").read_text()


def _instructions(dockerfile: str) -> list[tuple[str, str]]:
    """(instruction, arguments) of a Dockerfile, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n\s*", " ", "\n".join(
        line for line in dockerfile.splitlines() if not line.lstrip().startswith("#")))
    return [(m[1].upper(), m[2].strip()) for m in
            re.finditer(r"^\s*([A-Za-z]+)\s+(.*)$", text, re.M)]


def _env(dockerfile: str) -> dict:
    return dict(arg.split("=", 1) for kind, arg in _instructions(dockerfile) if kind == "ENV")


def test_the_launcher_image_is_googles_python_launcher_base_not_the_worker_image():
    (base,) = [arg for kind, arg in _instructions(LAUNCHER) if kind == "FROM"]
    # Pinned by digest: the build argument BASE_DIGEST, declared before FROM, no default, so an
    # unpinned build fails; never a tag (a tag moves).
    assert re.fullmatch(r"gcr\.io/dataflow-templates-base/python(\d)(\d+)-template-launcher-base"
                        r"@\$\{BASE_DIGEST\}", base), base
    assert LAUNCHER.index("ARG BASE_DIGEST\n") < LAUNCHER.index("FROM ")
    assert not re.search(r"ARG BASE_DIGEST=", LAUNCHER)
    lock_python = re.search(r"--python-version (\S+)", (ROOT / "Makefile").read_text())[1]
    assert re.match(r"gcr\.io/dataflow-templates-base/python(\d+)", base)[1] == \
        lock_python.replace(".", "")  # the launcher's Python is the lock's
    (worker,) = [arg for kind, arg in _instructions(WORKER) if kind == "FROM"]
    assert worker.startswith("apache/beam_python") and worker != base
    # Google's launcher stays the entrypoint: it runs FLEX_TEMPLATE_PYTHON_PY_FILE.
    assert not [kind for kind, _ in _instructions(LAUNCHER) if kind in ("ENTRYPOINT", "CMD")]


def test_the_launcher_runs_the_job_submit_only_with_the_locked_project():
    instructions = _instructions(LAUNCHER)
    workdir = [arg for kind, arg in instructions if kind == "WORKDIR"][-1]
    env = _env(LAUNCHER)
    py_file = env["FLEX_TEMPLATE_PYTHON_PY_FILE"]
    assert py_file == f"{workdir}/runners/deploy/flex_launcher.py"
    assert (ROOT / py_file[len(workdir) + 1:]).is_file()
    copied = {arg.split()[0].rstrip("/") for kind, arg in instructions if kind == "COPY"}
    assert {"accounting", "pipelines", "runners", "transforms"} <= copied
    assert {"requirements.lock", "setup.py"} <= set(" ".join(
        arg for kind, arg in instructions if kind == "COPY").split())
    (install,) = [arg for kind, arg in instructions if kind == "RUN" and "pip install" in arg]
    assert "--constraint requirements.lock" in install and '".[gcp]"' in install
    args = dict((arg.split("=", 1) + [""])[:2] for kind, arg in instructions if kind == "ARG")
    assert args['JOB'] in flex_template.JOBS
    assert env["BEAM_DP_JOB"] == "${JOB}" and env["BEAM_DP_WORKER_IMAGE"] == "${WORKER_IMAGE}"
    from runners import profiles

    assert profiles.WORKER_IMAGE_ENV == "BEAM_DP_WORKER_IMAGE"
    assert flex_launcher.JOB_ENV == "BEAM_DP_JOB"


def test_the_launcher_program_submits_and_refuses_to_finalize(tmp_path):
    """Run as Google's launcher runs it (``python <FLEX_TEMPLATE_PYTHON_PY_FILE> --flag=value``):
    the job is submitted only; the release is then finished by a second process."""
    sample = ROOT / "pipelines" / "sample_data" / "centralnotice"
    flags = [f"--config={sample / 'campaigns.json'}", f"--impressions={sample / 'impressions.csv'}",
             f"--clicks={sample / 'clicks.csv'}", "--release=C2026_000_fr/2026-11-28",
             f"--output={tmp_path / 'out'}", f"--ledger={tmp_path / 'ledger.json'}",
             f"--key_store={tmp_path / 'keys'}"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), BEAM_DP_JOB="centralnotice")
    launcher = str(ROOT / "runners" / "deploy" / "flex_launcher.py")

    def run(*argv, job_env=env):
        return subprocess.run([sys.executable, *argv], cwd=tmp_path, env=job_env,
                              capture_output=True, text=True, timeout=600)

    done = run(launcher, *flags)
    assert done.returncode == 0 and "submitted C2026_000_fr/2026-11-28" in done.stdout, done.stderr
    assert not (tmp_path / "out" / "C2026_000_fr").exists()
    refused = run(launcher, *flags, "--finalize=true")
    assert refused.returncode == 2 and "--finalize=true is not a template parameter" in refused.stderr
    unknown = run(launcher, *flags, job_env=dict(env, BEAM_DP_JOB="nope"))
    assert unknown.returncode == 2 and "BEAM_DP_JOB='nope' is not a job" in unknown.stderr
    done = run("-m", "pipelines.centralnotice", *flags, "--finalize")
    assert done.returncode == 0 and "(released)" in done.stdout, done.stderr


def test_launcher_argv_adds_submit_only_and_refuses_the_launchers_own_flags():
    assert flex_launcher.launcher_argv(["--a=1"]) == ["--a=1", "--submit_only"]
    for own in ("--submit_only", "--submit-only=true", "--finalize", "--finalize=false"):
        with pytest.raises(ValueError, match="not a template parameter"):
            flex_launcher.launcher_argv(["--a=1", own])


# --------------------------------------------------------------------------- gcloud's flags
# gcloud's groups of flags, from the synopses of the gcloud reference pages "gcloud dataflow
# flex-template build" and "gcloud dataflow flex-template run" (GCLOUD_WIDE_FLAGs left out).

GCLOUD = {
    "build": {
        "positionals": 1, "required": {"--sdk-language"},
        # exactly one of these ways to name the launcher image
        "one_of": [{"--image"},
                   {"--env", "--flex-template-base-image", "--image-gcr-path",
                    "--go-binary-path", "--jar", "--py-path"},
                   {"--yaml-pipeline-path", "--yaml-image"}],
        "group_requires": {"--image-gcr-path": [{"--flex-template-base-image"},
                                                {"--go-binary-path", "--jar", "--py-path"}],
                           "--yaml-pipeline-path": [{"--yaml-image"}]},
        "at_most_one": [{"--go-binary-path", "--jar", "--py-path"},
                        {"--worker-region", "--worker-zone"}],
        "optional": {"--additional-experiments", "--additional-user-labels",
                     "--cloud-build-service-account", "--dataflow-kms-key", "--disable-public-ips",
                     "--enable-streaming-engine", "--gcs-log-dir", "--image-repository-cert-path",
                     "--image-repository-password-secret-id",
                     "--image-repository-username-secret-id", "--max-workers", "--metadata-file",
                     "--network", "--num-workers", "--print-only", "--service-account-email",
                     "--staging-location", "--subnetwork", "--temp-location",
                     "--worker-machine-type", "--worker-region", "--worker-zone"},
        "switches": {"--disable-public-ips", "--enable-streaming-engine", "--print-only"},
    },
    "run": {
        "positionals": 1, "required": {"--template-file-gcs-location"}, "one_of": [],
        "group_requires": {"--transform-name-mappings": [{"--update"}]},
        "at_most_one": [{"--worker-region", "--worker-zone"}, {"--update", "--no-update"}],
        "optional": {"--additional-experiments", "--additional-pipeline-options",
                     "--additional-user-labels", "--dataflow-kms-key", "--disable-public-ips",
                     "--enable-streaming-engine", "--flexrs-goal", "--launcher-machine-type",
                     "--max-workers", "--network", "--num-workers", "--parameters", "--region",
                     "--service-account-email", "--staging-location", "--subnetwork",
                     "--temp-location", "--worker-machine-type", "--update", "--no-update",
                     "--transform-name-mappings", "--worker-region", "--worker-zone"},
        "switches": {"--disable-public-ips", "--enable-streaming-engine", "--update",
                     "--no-update"},
    },
}


def gcloud_problems(argv: list[str]) -> list[str]:
    """What gcloud would refuse in ``gcloud dataflow flex-template build|run ...`` (by the
    table above): unknown or missing flags, mutually exclusive groups mixed."""
    assert argv[:3] == ["gcloud", "dataflow", "flex-template"], argv
    rules, rest = GCLOUD[argv[3]], argv[4:]
    used, positionals, i = [], [], 0
    while i < len(rest):
        token = rest[i]
        if token.startswith("--"):
            name = token.split("=", 1)[0]
            used.append(name)
            if "=" not in token and name not in rules["switches"]:
                i += 1  # its value
        else:
            positionals.append(token)
        i += 1
    given = set(used)
    known = rules["required"] | rules["optional"] | set().union(*rules["one_of"])
    problems = [f"unknown flag {f}" for f in used if f not in known]
    problems += [f"missing {f}" for f in rules["required"] - given]
    if len(positionals) != rules["positionals"]:
        problems.append(f"{len(positionals)} positional arguments")
    if rules["one_of"]:
        groups = [g for g in rules["one_of"] if g & given]
        if len(groups) != 1:
            problems.append(f"exactly one of {rules['one_of']} is required, got {groups}")
    for group in rules["at_most_one"]:
        if len(group & given) > 1:
            problems.append(f"at most one of {sorted(group)}")
    for flag, needs in rules["group_requires"].items():
        for need in needs:
            if flag in given and not need & given:
                problems.append(f"{flag} needs one of {sorted(need)}")
    return problems


def _gcloud_commands(guide: str) -> list[list[str]]:
    text = (ROOT / guide).read_text()
    blocks = re.findall(r"```(?:bash|sh)\n(.*?)```", text, re.S)
    commands = []
    for block in blocks:
        for command in block.replace("\\\n", " ").splitlines():
            if command.strip().startswith("gcloud dataflow flex-template"):
                commands.append(shlex.split(command))
    return commands


def test_the_documented_gcloud_commands_are_ones_gcloud_accepts():
    commands = _gcloud_commands("runners/README.md")
    assert sorted(c[3] for c in commands) == ["build", "run"]
    for command in commands:
        assert gcloud_problems(command) == [], command
    (build,) = [c for c in commands if c[3] == "build"]
    assert build[build.index("--sdk-language") + 1] == "PYTHON"
    # --image is the launcher image the guide builds from launcher.Dockerfile
    text = (ROOT / "runners" / "README.md").read_text().replace("\\\n", " ")
    launcher = re.search(r"docker build -f runners/deploy/launcher\.Dockerfile .*?-t (\S+) \.",
                         text)
    assert launcher and build[build.index("--image") + 1] == launcher[1]


@pytest.mark.parametrize("command, problem", [
    # the command documented before: --image mixed with --env (another way to build an image)
    ("gcloud dataflow flex-template build gs://B/t.json --image R/i:1 --sdk-language PYTHON "
     "--metadata-file m.json --env FLEX_TEMPLATE_PYTHON_PY_FILE=/x.py", "exactly one of"),
    ("gcloud dataflow flex-template build gs://B/t.json --image R/i:1", "missing --sdk-language"),
    ("gcloud dataflow flex-template build gs://B/t.json --sdk-language PYTHON --image-gcr-path "
     "R/i:1 --env A=B", "--image-gcr-path needs one of ['--flex-template-base-image']"),
    ("gcloud dataflow flex-template run job --template-file-gcs-location gs://B/t.json "
     "--worker-region r --worker-zone z", "at most one of"),
    ("gcloud dataflow flex-template run job --template-file-gcs-location gs://B/t.json "
     "--parameter a=b", "unknown flag --parameter"),
])
def test_the_gcloud_table_refuses_what_gcloud_refuses(command, problem):
    assert any(problem in p for p in gcloud_problems(shlex.split(command))), \
        gcloud_problems(shlex.split(command))
