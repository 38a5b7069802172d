"""Configuration, list and input files pointed at the wrong file: a release key or a file of
secret-looking text. Every reader refuses by file (and line), and no message holds the content."""
from __future__ import annotations

import json
import logging
import types

import pytest

from accounting.keys import ReleaseKey
from accounting.keystore import KeyStore
from pipelines.ldp import frequencies as ldp_frequencies
from pipelines.masked_lark import config as masked_lark_config
from pipelines.ara import summary_reports
from pipelines.centralnotice.config import ConfigError, load_config, parse_protected_countries
from pipelines.release import ReleaseRefused, textfiles
from pipelines.release.inputs import InputSpec, preflight
from transforms.lark.params import GradientParams

SECRETS = ("wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY", "hunter2-correct-horse",
           "sk_live_4eC39HqLyjWDarjtT1zdp7dc")
SECRET_TEXT = (f"aws_secret_access_key = {SECRETS[0]}\npassword: {SECRETS[1]}\n"
               f"stripe {SECRETS[2]}\n")


def _valid_cn_config(protected_file: str) -> dict:
    from release_testkit import cn_config

    return {**cn_config(), "protected_countries_file": protected_file}


def _gradient_params():
    return GradientParams(num_features=2, clip_norm=1.0, epsilon=None, k=1)


#: Every reader of a configuration, list or data file: a function of the path.
READERS = {
    "centralnotice --config": load_config,
    "centralnotice protected_countries_file": None,  # through a valid configuration (below)
    "summary_reports --config": lambda p: summary_reports._contribution_config(
        types.SimpleNamespace(config=p)),
    "summary_reports --output_domain": lambda p: summary_reports._buckets(
        types.SimpleNamespace(output_domain=p), None),
    "ldp_frequencies --candidates": lambda p: ldp_frequencies.read_candidates(p, "--candidates", 64),
    "masked_lark --params": lambda p: masked_lark_config.load_params(p, testing=True),
    "masked_lark --model": lambda p: masked_lark_config.load_model(p, _gradient_params()),
    "input (csv)": lambda p: preflight(InputSpec(name="rows", paths=[p], columns={"a": "text"},
                                                 format="csv")),
    "input (parquet)": lambda p: preflight(InputSpec(name="rows", paths=[p], columns={"a": "any"},
                                                     format="parquet")),
    "input (jsonl)": lambda p: preflight(InputSpec(name="rows", paths=[p], columns={},
                                                   format="jsonl")),
    "input (format from the name)": lambda p: preflight(InputSpec(name="rows", paths=[p],
                                                                  columns={"a": "text"})),
}


def _wrong_files(tmp_path):
    key = ReleaseKey.generate()
    key_path = KeyStore(str(tmp_path / "keys")).save(key, "day").uri
    secret = tmp_path / "notes.txt"
    secret.write_text(SECRET_TEXT)
    secret_json = tmp_path / "token.json"
    secret_json.write_text(json.dumps(SECRETS[2] * 2))  # valid JSON: one long string
    return {"key": (key_path, [key.secret_bytes().hex()]),
            "secret text": (str(secret), list(SECRETS) + SECRET_TEXT.splitlines()),
            "secret JSON string": (str(secret_json), [SECRETS[2]])}


@pytest.mark.parametrize("kind", ["key", "secret text", "secret JSON string"])
@pytest.mark.parametrize("reader", sorted(READERS))
def test_a_wrong_file_is_refused_by_name_and_never_quoted(tmp_path, caplog, reader, kind):
    path, hidden = _wrong_files(tmp_path)[kind]
    read = READERS[reader]
    if read is None:  # the protection list of a valid configuration
        config = tmp_path / "config.json"
        config.write_text(json.dumps(_valid_cn_config(path)))
        read = lambda p: load_config(str(config))  # noqa: E731
    caplog.set_level(logging.DEBUG)
    with pytest.raises((ReleaseRefused, ConfigError)) as info:
        read(path)
    message = str(info.value)
    assert path in message, message
    if kind == "key":
        assert "release key file" in message, message
    for text in hidden:
        assert text not in message and text not in caplog.text, (reader, message)


def test_a_bad_list_line_is_named_by_file_and_number(tmp_path):
    listed = tmp_path / "protected.txt"
    listed.write_text("RU\n# a comment\n\nXX secret-ish\n")
    with pytest.raises(ConfigError) as info:
        parse_protected_countries(listed.read_text(), str(listed))
    assert f"{listed}:4: must be an ISO 3166-1 alpha-2 country code" in str(info.value)
    assert "XX" not in str(info.value) and "secret" not in str(info.value)
    with pytest.raises(ConfigError, match="the United Kingdom is GB"):
        parse_protected_countries("UK\n", "list.txt")
    candidates = tmp_path / "candidates.txt"
    candidates.write_text("1\n2 # two\n\n70\n")
    with pytest.raises(ReleaseRefused, match=rf"--candidates {candidates}:4: not an integer in "
                                             r"\[0, 64\)$"):
        ldp_frequencies.read_candidates(str(candidates), "--candidates", 64)
    candidates.write_text("1\n2 # two\n")
    assert list(ldp_frequencies.read_candidates(str(candidates), "--candidates", 64)) == [1, 2]


@pytest.mark.parametrize("data, reason", [
    (b"", None),
    (b"\xff\xfe not utf-8\n", "1: not UTF-8 text"),
    (b"ok\nbinary\0zone\n", "2: a NUL byte: not a text file"),
    (b"{\n \"a\": [1,\n}", "not valid JSON: Expecting value at line 3 column 1"),
])
def test_the_reader_names_what_is_wrong(tmp_path, data, reason):
    path = tmp_path / "file.json"
    path.write_bytes(data)
    if reason is None:
        assert textfiles.read(str(path), "--config").text == ""
        return
    with pytest.raises(textfiles.TextFileError) as info:
        textfiles.read(str(path), "--config").json()
    assert str(info.value).startswith(f"--config {path}")
    assert str(info.value).endswith(reason)
    with pytest.raises(textfiles.TextFileError, match="does not exist"):
        textfiles.read(str(tmp_path / "missing"), "--config")
    with pytest.raises(textfiles.TextFileError, match="a folder, not a file"):
        textfiles.read(str(tmp_path), "--config")


def test_key_files_are_recognised_in_every_stored_form():
    secret = ReleaseKey.generate().secret_bytes().hex()
    issued = ReleaseKey.generate().to_text(issued_for="centralnotice/C1/2026-11-01#1")
    for data in (secret + "\n", secret, secret.upper() + "\r\n", issued):
        assert textfiles.is_key_file(data.encode()[:textfiles.KEY_PROBE_BYTES])
    for data in (secret[:-1] + "\n", secret + "0\n", "key: " + secret, secret + "\n\n"):
        assert not textfiles.is_key_file(data.encode())


def test_configuration_values_are_shown_short_or_described():
    assert textfiles.shown("UK") == "'UK'" and textfiles.shown(1.5) == "1.5"
    assert textfiles.shown("x" * 40) == "a string of 40 characters"
    assert textfiles.shown([1, 2]) == "an array of 2 item(s)"
    assert textfiles.shown({"a": 1}) == "an object of 1 field(s)"
