"""Dataflow Flex Template metadata (runners/deploy/flex_template.py) matches each job's CLI exactly."""
from __future__ import annotations

import importlib
import json
import re

import pytest

from pipelines.release import cli
from pipelines.release import flags as release_flags
from runners.deploy import flex_template


@pytest.mark.parametrize("module", flex_template.JOB_MODULES)
def test_metadata_lists_every_flag_of_the_cli(module):
    data = flex_template.metadata(module)
    parser, flags = cli.build_parser(importlib.import_module(module).JOB)
    actions = {a.dest: a for a in parser._actions if a.option_strings}
    names = [p["name"] for p in data["parameters"]]
    assert names == [f[2:] for f in flags] and len(set(names)) == len(names)
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
    assert written == sorted(f"{m.rsplit('.', 1)[1]}.metadata.json"
                             for m in flex_template.JOB_MODULES)


@pytest.mark.parametrize("value,expected", [("true", True), ("false", False)])
def test_a_switch_passed_as_a_template_parameter_parses(value, expected):
    from pipelines.reach_frequency import JOB

    request = cli.parse_request(JOB, [
        "--input=in.csv", "--output=out", "--campaigns=c1", "--publishers=p",
        "--epsilon=1", "--testing_seed=7", f"--explain={value}", "--runner=dask"])
    assert request.options.explain is expected
    assert "--runner=dask" in request.options.pipeline_args
    with pytest.raises(cli.FlagError, match="--explain: ignored explicit argument 'yes'"):
        cli.parse_request(JOB, ["--input=in.csv", "--output=out", "--campaigns=c1",
                                "--publishers=p", "--epsilon=1", "--explain=yes"])
