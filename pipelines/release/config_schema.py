"""Configuration files checked against a published JSON Schema, with messages naming the file and
the field, never quoting the file.

A schema is a ``.json`` file in the repository, beside the code that reads the configuration, so
editors (VS Code, JetBrains, ``check-jsonschema``) validate a file as it is typed. The same
schema is what the job checks (``jsonschema``, draft 2020-12): no second, hand-written copy of
the rules to drift from it. A violation is reported as ``FILE: FIELD: what is wrong``, where
FIELD is the path of the offending value (``datasets["centralnotice/C1"].license.url``) and
what is wrong comes from the schema (the expected type, the allowed fields, a field's own
``description`` for a pattern, or the rule's ``errorMessage``), never from the value, which may
be a secret pasted into the wrong field: a message says what kind of value it found (a string,
an object), never the value.

``errorMessage`` is the message a schema gives a rule in its own words (the keyword VS Code's
JSON editor and ``ajv-errors`` read; validators ignore it): an enum of 250 country codes reads
"must be an ISO 3166-1 alpha-2 country code", an ``if``/``then`` rule says why a field is
required. Formats are checked (``"format": "date"`` is a real calendar day), and a number that
is not finite (``NaN``, ``Infinity``: Python's JSON reader accepts them, JSON does not) is a
violation of every schema.
"""
from __future__ import annotations

import functools
import json
import math
import os
from typing import Any, Mapping

#: How many violations one message lists (the first ones, in document order).
MAX_LISTED = 5


class ConfigSchemaError(ValueError):
    """A configuration that does not follow its schema; ``fields`` are the offending paths."""

    def __init__(self, message: str, fields: tuple, problems: tuple = (), schema: str = ""):
        super().__init__(message)
        self.fields = fields
        #: ((field path, what is wrong), ...) in document order (every violation, not only
        #: the listed ones); ``schema``: the schema file's name.
        self.problems, self.schema = problems, schema


@functools.lru_cache(maxsize=None)
def load(path: str) -> Mapping:
    """A schema file of the repository (read once; checked to be a valid 2020-12 schema)."""
    from jsonschema import Draft202012Validator

    with open(path, encoding="utf-8") as handle:
        schema = json.load(handle)
    Draft202012Validator.check_schema(schema)
    return schema


def field_path(parts) -> str:
    """``datasets["centralnotice/C1"].columns.impressions`` from a jsonschema path."""
    out = ""
    for part in parts:
        if isinstance(part, int):
            out += f"[{part}]"
        elif part.isidentifier():
            out += f".{part}" if out else part
        else:
            out += f"[{json.dumps(part)}]"
    return out or "(the whole file)"


def _kind(value: Any) -> str:
    """What a value is, never what it holds."""
    if isinstance(value, bool):
        return "true or false"
    return {str: "a string", int: "a number", float: "a number", dict: "an object",
            list: "an array", type(None): "null"}.get(type(value), "a value")


def _problem(error) -> str:
    """What is wrong, in the schema's terms (never the offending value's content)."""
    kind, expected, schema = error.validator, error.validator_value, error.schema
    told = schema.get("errorMessage") if isinstance(schema, dict) else None
    if kind == "type":
        return "must be " + (" or ".join(expected) if isinstance(expected, list) else expected)
    if kind == "required":
        missing = [name for name in expected if isinstance(error.instance, dict)
                   and name not in error.instance]
        return "missing " + ", ".join(missing) + (f" ({told})" if told else "")
    if told and kind != "additionalProperties":
        return told
    if kind == "additionalProperties":
        allowed = sorted(schema.get("properties", {}))
        return "unknown field(s); the fields are " + ", ".join(allowed) if allowed else \
            "unknown field(s)"
    if kind == "const":
        return f"must be {json.dumps(expected)}"
    if kind == "enum":
        return "must be one of " + ", ".join(json.dumps(v) for v in expected)
    if kind in ("pattern", "format", "propertyNames"):
        return schema.get("description") or f"is not of the expected form ({kind})"
    if kind in ("minLength", "maxLength"):
        return "must not be empty" if kind == "minLength" and expected == 1 else \
            f"must be {'at least' if kind == 'minLength' else 'at most'} {expected} characters"
    bounds = {"minimum": ">=", "maximum": "<=", "exclusiveMinimum": ">", "exclusiveMaximum": "<"}
    if kind in bounds:
        return f"must be {bounds[kind]} {expected}"
    if kind in ("minItems", "maxItems", "uniqueItems"):
        return {"minItems": "must not be empty" if expected == 1 else
                f"needs at least {expected} item(s)",
                "maxItems": f"holds at most {expected} item(s)",
                "uniqueItems": "must not repeat an item"}[kind]
    return f"does not follow the schema ({kind})"


def validate(data: Any, schema_path: str, source: str) -> None:
    """Raise :class:`ConfigSchemaError` unless ``data`` follows the schema at ``schema_path``;
    ``source`` names the file (or flag and file) in the message."""
    from jsonschema import Draft202012Validator

    validator = Draft202012Validator(load(os.path.abspath(schema_path)),
                                     format_checker=Draft202012Validator.FORMAT_CHECKER)
    found = [(tuple(path), "must be a finite number (NaN and Infinity are not JSON)")
             for path in _not_finite(data, ())]
    found += [(tuple(err.absolute_path), _problem(err)
               + (f" (got {_kind(err.instance)})" if err.validator == "type" else ""))
              for err in validator.iter_errors(data)]
    if not found:
        return
    found.sort(key=lambda item: [str(p) for p in item[0]])
    # jsonschema reports a missing field per name; the message lists them all once.
    problems = tuple(dict.fromkeys((field_path(path), problem) for path, problem in found))
    lines = [f"{where}: {problem}" for where, problem in problems[:MAX_LISTED]]
    more = f" (and {len(problems) - MAX_LISTED} more)" if len(problems) > MAX_LISTED else ""
    schema = os.path.basename(schema_path)
    raise ConfigSchemaError(f"{source}: does not follow {schema}{more}: " + "; ".join(lines),
                            tuple(where for where, _ in problems), problems, schema)


def _not_finite(value: Any, path: tuple):
    """The paths of the numbers that are not finite (a schema's bounds cannot catch NaN)."""
    if isinstance(value, float) and not math.isfinite(value):
        yield path
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _not_finite(item, path + (key,))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _not_finite(item, path + (index,))
