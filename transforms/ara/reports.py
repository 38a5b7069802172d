"""Parsing and validation of cleartext JSON aggregatable reports (one report per line).

Format (a cleartext stand-in for the encrypted payload the browser sends)::

    {"report_id": "21abd97f-73e8-4b88-9389-a9fee6abda5e", "source_id": "imp-17", "order": 3,
     "contributions": [{"bucket": "0x0000...01", "value": 12345}, ...]}

* ``report_id`` (string): the id of the report's ``shared_info`` (the browser draws it, one per
  report). The Aggregation Service aggregates a report id at most once; so does the release layer,
  across all batches (``pipelines.ara.summary_reports``). A ``shared_info`` object (or its JSON text,
  as the API sends it) with a ``report_id`` is read too; both given and different is a fault
  (``bad_report_id``). Required in real releases (a report without one is dropped:
  ``missing_report_id``); testing runs accept reports without.

* ``source_id`` (string or integer, required): the source (impression) the report is
  attributed to; algorithm C is (re-)applied per source in the pipeline, so the L1 bound holds
  even for reports that did not come through a browser. Ids are canonicalised
  (``transforms.privacy_units``): ``7``, ``7.0``, ``"7"`` and ``" 007"`` are one source; an id
  without a canonical form (``7.5``, ``true``, an object) drops the report (``bad_source_id``).
* ``order`` (integer >= 0, default 0): trigger time order within the source (C keeps reports in
  this order; ties are broken by the report's content, so the result is deterministic).
* ``bucket``: a 128-bit key as a ``0x`` hex string, a decimal string or a JSON integer;
  ``value``: an integer in [0, 65536].

Row-level rule: a report with any fault (malformed JSON, missing fields, a key wider than 128
bits, a negative, fractional or too large value, a contribution total above 65,536) is dropped
whole and counted under its reason (operator metrics only). Keys outside the declared output
domain are not a parse fault: algorithm S drops those contributions and counts them.
"""
from __future__ import annotations

import dataclasses
import json
import numbers

import numpy as np

from transforms.ara.contribution import CONTRIBUTION_BUDGET, parse_bucket_key
from transforms.privacy_units import UnitIdError, canonical_unit_id

FAULTS = ("malformed_json", "missing_source_id", "bad_source_id", "bad_order", "malformed_contributions",
          "bad_bucket_key", "bad_value", "negative_value", "report_over_budget",
          "missing_report_id", "bad_report_id")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AggregatableReport:
    source_id: str
    order: int
    contributions: tuple[tuple[int, int], ...]  # (bucket key, value), as in the report
    report_id: str | None = None                # canonical shared_info report id

    @property
    def total(self) -> int:
        return sum(v for _, v in self.contributions)

    def sort_key(self) -> tuple:
        """Time order, then content (then the report id): a deterministic order for algorithm C."""
        return (self.order, self.contributions, self.report_id or "")


class ReportFault(ValueError):
    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def _integer(x) -> int | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, numbers.Integral):
        return int(x)
    if isinstance(x, float) and x.is_integer():
        return int(x)
    return None


def parse_report(line: str | bytes, *, require_report_id: bool = False) -> AggregatableReport:
    """One report from one JSON line; raises ``ReportFault`` (with ``.reason``) on a fault.
    ``require_report_id``: a report without a ``report_id`` is a fault (real releases)."""
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ReportFault("malformed_json", f"not valid JSON: {e}") from None
    return report_from_json(obj, require_report_id=require_report_id)


def _report_id(obj: dict):
    """The canonical report id of a report object (None if it has none)."""
    shared = obj.get("shared_info")
    if isinstance(shared, str):
        try:
            shared = json.loads(shared)
        except ValueError:
            raise ReportFault("bad_report_id", "shared_info is not JSON") from None
    ids = [v for v in (obj.get("report_id"),
                       shared.get("report_id") if isinstance(shared, dict) else None)
           if v is not None and v != ""]
    if not ids:
        return None
    try:
        canonical = {canonical_unit_id(v, "report_id") for v in ids}
    except UnitIdError as e:
        raise ReportFault("bad_report_id", str(e)) from None
    if len(canonical) != 1 or None in canonical:
        raise ReportFault("bad_report_id", "report_id and shared_info.report_id differ")
    return canonical.pop()


def report_from_json(obj, *, require_report_id: bool = False) -> AggregatableReport:
    """One report from a decoded JSON value (see :func:`parse_report`)."""
    if not isinstance(obj, dict):
        raise ReportFault("malformed_json", "a report must be a JSON object")
    report_id = _report_id(obj)
    if report_id is None and require_report_id:
        raise ReportFault("missing_report_id", "report_id (the shared_info's id) is required")
    source = obj.get("source_id")
    if source is None or source == "":
        raise ReportFault("missing_source_id", "source_id (string or integer) is required")
    try:
        # One canonical form before grouping: 7, 7.0 and "7" are the same source.
        source = canonical_unit_id(source, "source_id")
    except UnitIdError as e:
        raise ReportFault("bad_source_id", str(e)) from None
    if not source:
        raise ReportFault("missing_source_id", "source_id (string or integer) is required")
    order = _integer(obj.get("order", 0))
    if order is None or order < 0:
        raise ReportFault("bad_order", f"order must be a non-negative integer, got "
                                       f"{obj.get('order')!r}")
    items = obj.get("contributions")
    if not isinstance(items, list):
        raise ReportFault("malformed_contributions", "contributions must be a list")
    contributions = []
    for item in items:
        if not isinstance(item, dict) or "bucket" not in item or "value" not in item:
            raise ReportFault("malformed_contributions",
                              "each contribution needs 'bucket' and 'value'")
        try:
            key = parse_bucket_key(item["bucket"])
        except ValueError as e:
            raise ReportFault("bad_bucket_key", str(e)) from None
        value = _integer(item["value"])
        if value is None:
            raise ReportFault("bad_value", f"value must be an integer, got {item['value']!r}")
        if value < 0:
            raise ReportFault("negative_value", f"value must not be negative, got {value}")
        if value > CONTRIBUTION_BUDGET:
            raise ReportFault("bad_value", f"value {value} exceeds {CONTRIBUTION_BUDGET}")
        contributions.append((key, value))
    report = AggregatableReport(source_id=source, order=order, contributions=tuple(contributions),
                                report_id=report_id)
    if report.total > CONTRIBUTION_BUDGET:
        raise ReportFault("report_over_budget",
                          f"contributions sum to {report.total} > {CONTRIBUTION_BUDGET}")
    return report


def format_report(report: AggregatableReport) -> str:
    head = {} if report.report_id is None else {"report_id": report.report_id}
    return json.dumps({**head, "source_id": report.source_id, "order": report.order,
                       "contributions": [{"bucket": f"{k:#034x}", "value": int(v)}
                                         for k, v in report.contributions]})


def reports_from_vectors(source_ids, orders, keys: np.ndarray, contributions: np.ndarray):
    """Aggregatable reports from algorithm A's output (zero contributions omitted).

    keys: (n, Q) Python-int bucket keys (object array or nested lists); contributions: (n, Q).
    """
    out = []
    for s, o, krow, crow in zip(source_ids, orders, keys, contributions):
        out.append(AggregatableReport(
            source_id=canonical_unit_id(s, "source_id"), order=int(o),
            contributions=tuple((int(k), int(v)) for k, v in zip(krow, crow) if v)))
    return out
