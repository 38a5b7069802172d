"""Frequency oracle estimates from local-DP client reports (GRR, binary RR, SUE/OUE, RAPPOR, OLH).

    python -m pipelines.ldp.frequencies --input reports.parquet --oracle oue --epsilon 2 \\
        --domain_size 32 --collection_id 2026-11-23 --output out/ldp \\
        --ledger private/ledger.json --key_store private/keys

Input: Parquet report files of one oracle (``transforms/ldp/reports.py``: ``report``, ``bits``
or ``hash_a``/``hash_b``/``report``; the schema's ``ldp.oracle`` metadata must match the declared
``--oracle``/``--epsilon``/``--domain_size``), checked before the charge. GRR and binary RR
reports (one flat ``report`` column) may also be CSV: a value that is not an integer (binary RR:
0/1/true/false) counts as a null report, dropped and counted.

Output: release ``ldp_frequencies/<collection_id>`` (``estimates.csv``): one row per candidate
value (``--candidates``, one integer per line, or the whole domain; OLH counts support against
candidates, never the whole of a large domain), sorted by value: ``value, estimate`` (unbiased
count), ``frequency`` (estimate / n), ``estimate_ci95_low, estimate_ci95_high, estimate_std``
(the square root of the exact variance of the estimator at the estimate, stated per oracle in
``transforms/ldp/oracles.py``, and the approximate 95% interval estimate -/+ 1.96 estimate_std
clipped to [0, n]: plug-in variance and normal approximation, post-processing of the estimates;
its coverage is approximate, as ``RELEASE.json`` states:
``transforms.ldp.estimators.APPROXIMATE_INTERVAL``).

Privacy: the clients' local epsilon (each report is epsilon-LDP; the estimates are
post-processing); the release is charged to the collection's ledger scope (see
:mod:`pipelines.ldp.collection`). No server-side randomness is used. A client's report is counted
once per collection (its ``--id_column``; a replayed report is refused, or removed with
``--skip_consumed``: :mod:`pipelines.ldp.collection`).
"""
from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

import apache_beam as beam
import numpy as np
import pyarrow as pa

from pipelines.ldp import collection as ldp_release
from pipelines.release import (InputSpec, Job, OutputSpec, PlannedRelease, Prepared,
                               ReleaseOptions, ReleaseRefused, cli, textfiles)
from pipelines.release import run as run_release
from pipelines.release.consumption import SKIP_HELP
from pipelines.release.names import check_segment
from transforms import error_columns
from transforms.ldp.estimators import APPROXIMATE_INTERVAL

NAME = "ldp_frequencies"
OUTPUT = "estimates.csv"
SCHEMA = pa.schema([("value", pa.uint64()), ("estimate", pa.float64()),
                    ("frequency", pa.float64()), *[(c, pa.float64()) for c in error_columns.names("estimate")]])
ORACLE_CHOICES = ["binary_rr", "grr", "sue", "oue", "rappor", "olh"]
#: Oracles whose reports are one flat column, so CSV can carry them.
FLAT_ORACLES = ("binary_rr", "grr")


@dataclass(frozen=True, kw_only=True)
class FrequenciesRequest:
    """One frequency-oracle aggregation (the CLI flags are these fields)."""

    input: tuple = field(metadata={"help": "Parquet report files (GRR / binary RR: also CSV): "
                                           "paths, globs or folders, comma-separated (local or "
                                           "gs://)"})
    oracle: str = field(metadata={"choices": ORACLE_CHOICES,
                                  "help": "the oracle the clients used"})
    epsilon: float = field(metadata={"help": "the clients' local epsilon (as in the reports' "
                                             "metadata)"})
    domain_size: int = field(metadata={"help": "d: values are 0..d-1 (2 for binary_rr)"})
    collection_id: str = field(metadata={
        "help": "the report collection (release id ldp_frequencies/COLLECTION_ID; ledger scope "
                "ldp-collection:COLLECTION_ID)"})
    candidates: Optional[str] = field(default=None, metadata={
        "help": "public candidate values to estimate, one integer per line (default: the whole "
                "domain; required for OLH above 4096 values)"})
    olh_buckets: int = field(default=0, metadata={
        "help": "OLH hash range g (default 0: round(e^epsilon) + 1, Wang et al. 2017)"})
    id_column: str = field(default="client_id", metadata={"help": ldp_release.ID_HELP})
    skip_consumed: bool = field(default=False, metadata={"help": SKIP_HELP})
    options: ReleaseOptions = field(metadata={"cli": False})


def oracle_of(request):
    from transforms.ldp.oracles import make_oracle

    options = {"buckets": request.olh_buckets} if request.oracle == "olh" else {}
    try:
        return make_oracle(request.oracle, epsilon=request.epsilon,
                           domain_size=request.domain_size, **options)
    except (ValueError, TypeError) as err:
        raise ReleaseRefused(f"--oracle {request.oracle}: {err}")


def read_candidates(path: str, flag: str, domain_size: int) -> np.ndarray:
    """A public candidate list: one non-negative integer per line (blank lines and ``#``
    comments ignored); a bad line is named, never quoted."""
    listed = textfiles.read(path, flag)
    values = []
    for number, text in listed.lines():
        if not text.isdigit() or int(text) >= domain_size:
            raise listed.error(number, f"not an integer in [0, {domain_size})")
        values.append(int(text))
    if not values:
        raise listed.error(None, "lists no candidate")
    return np.unique(np.asarray(values, dtype=np.uint64))


def parse_text_reports(table: pa.Table) -> pa.Table:
    """A flat report column read as text (CSV) -> int64; a value that is not an integer
    (binary RR also: true/false) becomes null, which the estimator drops and counts."""
    column = table.column("report")
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        return table
    words = {"true": 1, "false": 0}
    values = []
    for text in column.to_pylist():
        text = None if text is None else text.strip().lower()
        if text in words:
            values.append(words[text])
        elif text and (text.isdigit() or (text[0] == "-" and text[1:].isdigit())):
            values.append(int(text) if len(text) < 19 else -1)  # out of any domain: dropped
        else:
            values.append(None)
    return table.set_column(table.column_names.index("report"), "report",
                            pa.array(values, pa.int64()))


@dataclass(frozen=True, kw_only=True)
class FrequenciesPrepared(Prepared):
    """The clients' oracle and the candidate values estimated (``--candidates``, read once)."""

    oracle: object
    candidates: np.ndarray = field(compare=False)


def _candidates(request, oracle) -> np.ndarray:
    from transforms.ldp.estimators import candidate_values

    if request.candidates:
        return read_candidates(request.candidates, "--candidates", request.domain_size)
    try:
        return candidate_values(oracle, None)
    except ValueError as err:
        raise ReleaseRefused(f"{err} (--candidates)")


class FrequenciesJob(Job):
    name = NAME
    request_type = FrequenciesRequest
    description = __doc__.split("\n\n")[0]
    counter_namespaces = ("ldp",)

    def prepare(self, request) -> FrequenciesPrepared:
        try:
            check_segment(request.collection_id, "--collection_id")
        except ValueError as err:
            raise ReleaseRefused(str(err))
        oracle = oracle_of(request)
        return FrequenciesPrepared(request=request, oracle=oracle,
                                   candidates=_candidates(request, oracle))

    def check(self, prepared: FrequenciesPrepared) -> None:
        from transforms.ldp.reports import check_schema

        ldp_release.check_files(self.inputs(prepared)[0],
                                lambda s: check_schema(prepared.oracle, s),
                                text_ok=prepared.request.oracle in FLAT_ORACLES)

    def inputs(self, prepared: FrequenciesPrepared):
        from transforms.ldp.reports import report_fields

        request = prepared.request
        columns = {f.name: "any" for f in report_fields(prepared.oracle)}
        ids, optional = ldp_release.id_columns(request)
        fmt = None if request.oracle in FLAT_ORACLES else "parquet"
        return [InputSpec(name="reports", paths=request.input, format=fmt,
                          columns={**columns, **ids}, optional=optional, flag="--input")]

    def consumes(self, prepared, planned, inputs):
        return ldp_release.client_consumes(NAME, prepared.request, inputs)

    def dropped_rows(self, prepared, counters):
        return ldp_release.dropped_reports(counters, "reports")

    def plan(self, prepared: FrequenciesPrepared):
        request, oracle, candidates = prepared.request, prepared.oracle, prepared.candidates
        described = oracle.describe()
        measure = ldp_release.local_measure(
            "client_reports", oracle.oracle_name, oracle.realised_epsilon,
            f"{oracle.oracle_name} frequency oracle; {ldp_release.LOCAL_MODEL}")
        return [PlannedRelease(
            release_id=f"{NAME}/{request.collection_id}", measures=[measure],
            scopes=[ldp_release.collection_scope(request.collection_id, oracle.realised_epsilon)],
            outputs=[OutputSpec(name=OUTPUT, sort_by=["value"], schema=SCHEMA,
                                noisy=["estimate", "frequency", *error_columns.names("estimate")],
                                errors={"estimate": APPROXIMATE_INTERVAL},
                                description="unbiased estimate per candidate value")],
            config={"oracle": oracle.metadata(), "candidates": candidates.tolist(),
                    **({"skip_consumed": True} if request.skip_consumed else {})},
            parameters={"model": ldp_release.LOCAL_MODEL, "oracle": described,
                        "candidates": int(candidates.size)},
            guarantee_covers="the clients' reports of this collection (local model)")]

    def build(self, pipeline, prepared: FrequenciesPrepared, inputs, release):
        from transforms.ldp.beam import EstimateFrequencies

        oracle, candidates = prepared.oracle, prepared.candidates
        reports = ldp_release.remove_replayed(inputs["reports"], pipeline, release, NAME,
                                              prepared.request)
        if prepared.request.oracle in FLAT_ORACLES:
            reports = reports | release.label("ParseText") >> beam.Map(parse_text_reports)
        return {OUTPUT: reports | release.label("Estimate") >> EstimateFrequencies(
            oracle, candidates=candidates)}


JOB = FrequenciesJob()


def run(request: FrequenciesRequest):
    """Estimate one collection's frequencies (Python API); see pipelines.release.run."""
    return run_release(JOB, request)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.main(JOB, argv)


if __name__ == "__main__":
    sys.exit(main())
