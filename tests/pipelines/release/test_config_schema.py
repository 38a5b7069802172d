"""Configuration checked against a published JSON Schema: every violation named by file and field
path in document order, what is wrong in the schema's words, and never the offending value."""
from __future__ import annotations

import json

import pytest

from pipelines.release import config_schema

SCHEMA = {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object",
          "additionalProperties": False, "required": ["name"],
          "properties": {"name": {"type": "string", "minLength": 1},
                         "size": {"type": "integer", "minimum": 1},
                         "url": {"type": "string", "pattern": "^https://",
                                 "description": "an https URL"},
                         "items": {"type": "object", "additionalProperties": {
                             "type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 2}}}}


@pytest.fixture
def schema(tmp_path):
    path = tmp_path / "thing.schema.json"
    path.write_text(json.dumps(SCHEMA))
    return str(path)


def test_a_valid_file_passes_and_the_schema_itself_is_checked(schema, tmp_path):
    config_schema.validate({"name": "x", "items": {"k y": ["a"]}}, schema, "--thing f.json")
    bad = tmp_path / "bad.schema.json"
    bad.write_text(json.dumps({"type": "no-such-type"}))
    with pytest.raises(Exception):
        config_schema.load(str(bad))


@pytest.mark.parametrize("data, expected", [
    ({}, "(the whole file): missing name"),
    ({"name": ""}, "name: must not be empty"),
    ({"name": 3}, "name: must be string (got a number)"),
    ({"name": "x", "size": 0}, "size: must be >= 1"),
    ({"name": "x", "url": "http://secret-token-123"}, "url: an https URL"),
    ({"name": "x", "colour": "secret-token-123"},
     "(the whole file): unknown field(s); the fields are items, name, size, url"),
    ({"name": "x", "items": {"k y": ["c"]}}, 'items["k y"][0]: must be one of "a", "b"'),
    ({"name": "x", "items": {"k": ["a", "a", "a"]}}, "items.k: holds at most 2 item(s)"),
])
def test_violations_name_file_and_field_never_the_value(schema, data, expected):
    with pytest.raises(config_schema.ConfigSchemaError) as err:
        config_schema.validate(data, schema, "--thing conf/f.json")
    message = str(err.value)
    assert message.startswith("--thing conf/f.json: does not follow thing.schema.json: ")
    assert expected in message, message
    assert "secret-token" not in message


def test_many_violations_are_listed_in_document_order_and_counted(schema):
    data = {"name": 1, "size": "x", "url": 2, "items": {"a": 1, "b": 2, "c": 3}}
    with pytest.raises(config_schema.ConfigSchemaError) as err:
        config_schema.validate(data, schema, "f")
    assert err.value.fields == ("items.a", "items.b", "items.c", "name", "size", "url")
    assert "(and 1 more)" in str(err.value) and "url:" not in str(err.value)  # the 6th: counted
