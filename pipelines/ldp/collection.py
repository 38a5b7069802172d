"""What the local- and shuffle-DP jobs share: the trust model in the ledger, report-file checks
before the charge, and the dropped-reports rule.

The jobs (``python -m pipelines.NAME``):

* :mod:`pipelines.ldp.frequencies` -- frequency oracle estimates from client reports;
* :mod:`pipelines.ldp.heavy_hitters` -- PEM heavy hitters from client reports;
* :mod:`pipelines.ldp.shuffle_sum` -- split-and-mix summation of shuffled shares;
* :mod:`pipelines.ldp.label_dp` -- a label-randomized training export.

**Trust model in the ledger.** In the local model each client randomized its own value with an
epsilon-LDP randomizer before the report left its device; the server sees only reports, and
every estimate is post-processing of them. The release's measure is therefore the clients' local
epsilon (a randomized-response style measure: epsilon and delta, no NoiseSpec), and the
neighbouring relation says so: *replace one client's value* (its report's law changes by at most
e^epsilon). The ledger scope is the report collection (``ldp-collection:<id>``), budgeted at that
epsilon: one collection's reports are released once.

**Checks before the charge.** Report files are Parquet (unary and OLH reports hold binary and
list columns; flat GRR / binary RR reports may also be CSV); Parquet footers are read before the
ledger is touched and checked against the declared oracle (the schema's ``ldp.oracle`` /
``ldp.pem`` metadata, column types and widths).
Messages name the file and the column, never a report.

**Dropped reports.** A null or out-of-domain report depends only on its own client, so dropping
it is post-processing; such reports are Beam counters (namespace ``ldp``) and count towards the
release layer's dropped-rows rule.

**A client's report counted once per collection.** Report files carry each report's client id
(``--id_column``, default ``client_id``; required in real releases, optional in testing runs).
A client id repeated within a collection -- a replayed report batch, a file given twice -- is
counted once when its reports are identical (``ldp.reports_dropped_identical_copies_in_batch``)
and has every report removed when they differ (a client that randomized twice would count twice
at epsilon each; keeping one would choose between its reports by content or arrival), counted as
``ldp.reports_removed_conflicting_copies_in_batch`` (rule 1 of
``pipelines/release/consumption.py``; comparing reports already randomized on the device is
post-processing); in a real release a report without a
client id, or with one that has no canonical form, is dropped and counted too
(``pipelines/release/consumption.py``): one replayed report never refuses a collection. A collection is
released once: its ledger scope is budgeted at the clients' epsilon, so no second version and no
second job can release it again, and nothing needs recording across collections. Different
collections (e.g. one per day) are different scopes: a client reports once in each; a report
replayed into another collection is post-processing of what that client sent once (it adds no
loss), though it biases that collection's estimate -- keep report batches apart per collection.
``shuffle_sum`` has no client ids (the shuffler hides who sent a share): it refuses any share
count other than ``--num_clients`` times the messages per client, so a replayed batch cannot be
summed.
"""
from __future__ import annotations

from typing import Callable, Mapping

from accounting.budget import PrivacyBudget
from accounting.ledger import Scope
from accounting.measures import Measure
from pipelines.release import InputSpec, ReleaseRefused
from pipelines.release.consumption import Consumes, remove_consumed, scan_ids
from pipelines.release.inputs import preflight

#: Counters (namespace ``ldp``) that drop a report or row for a fault of its own.
FAULT_COUNTERS = ("ldp.reports_dropped_",)
LOCAL_MODEL = ("local model: each client randomized its own value on its device; the server "
               "sees only reports and the estimates are post-processing of them")


def local_measure(name: str, mechanism: str, epsilon: float, description: str) -> Measure:
    """The measure of a local-DP release: the clients' (realised) local epsilon, no NoiseSpec."""
    return Measure(name=name, mechanism=mechanism, epsilon=epsilon, delta=0.0,
                   neighbouring=("replace one client's value (local model: each report is "
                                 f"{epsilon:.6g}-LDP; the release is post-processing)"),
                   description=description)


ID_HELP = ("column of the reports holding each report's client id (required in a real release: "
           "a client's report is counted once per collection)")


def id_columns(request) -> tuple[dict, dict]:
    """(required, optional) columns for the client ids: required in a real release."""
    column = {request.id_column: "id"}
    return ({}, column) if request.options.testing else (column, {})


def client_namespace(job: str, collection_id: str) -> str:
    return f"{job}/{collection_id}/client"


def client_consumes(job: str, request, inputs, input_name: str = "reports") -> list:
    """The collection's client ids (``Job.consumes`` of the local-DP jobs)."""
    scanned = scan_ids(inputs[input_name], request.id_column,
                       required=not request.options.testing)
    return [Consumes(namespace=client_namespace(job, request.collection_id), ids=scanned.ids,
                     content=scanned.content, noun="clients", label="--input",
                     skip=request.skip_consumed, across_batches=False, faults=scanned.faults)]


def remove_replayed(tables, pipeline, release, job: str, request):
    """``tables`` without the reports of clients the release must not count (see above)."""
    return remove_consumed(tables, pipeline, release,
                           client_namespace(job, request.collection_id), request.id_column,
                           counter=("ldp", "reports"), label="clients",
                           drop_missing=not request.options.testing)


def collection_scope(collection_id: str, epsilon: float) -> Scope:
    return Scope(name=f"ldp-collection:{collection_id}", budget=PrivacyBudget(epsilon=epsilon),
                 description="one collection of client reports (released once, at the clients' "
                             "local epsilon)")


def parquet_schemas(spec: InputSpec, *, text_ok: bool = False) -> dict:
    """{file: Arrow schema (with metadata), row count} of a Parquet input, after the release
    layer's preflight (which refuses unreadable files by name). ``text_ok``: CSV files are
    allowed too (flat reports; preflight checked their header) and skipped here."""
    from transforms import parquet_files
    from apache_beam.io.filesystem import CompressionTypes
    from apache_beam.io.filesystems import FileSystems

    resolved = preflight(spec)
    out = {}
    for path in resolved.files:
        if resolved.formats[path] == "csv" and text_ok:
            continue
        if resolved.formats[path] != "parquet":
            raise ReleaseRefused(f"{spec.label}: {path} is not Parquet; client reports are read "
                                 "from Parquet files only")
        with FileSystems.open(path, compression_type=CompressionTypes.UNCOMPRESSED) as handle:
            parquet = parquet_files.open_file(handle)
            out[path] = (parquet.schema_arrow, parquet.metadata.num_rows)
    return out


def check_files(spec: InputSpec, check: Callable, *, text_ok: bool = False) -> dict:
    """Run ``check(schema)`` on every Parquet file of ``spec``; a ValueError becomes a refusal
    naming the file (the checks' messages name columns and types, never values)."""
    schemas = parquet_schemas(spec, text_ok=text_ok)
    for path, (schema, _) in schemas.items():
        try:
            check(schema)
        except ValueError as err:
            raise ReleaseRefused(f"{spec.label}: {path}: {err}; nothing was charged")
    return schemas


def dropped_reports(counters: Mapping[str, int], input_name: str) -> dict:
    """The release layer's dropped-rows input with the ``ldp`` fault counters added to
    ``input_name``'s dropped rows."""
    from pipelines.release.counters import dropped_share

    faults = {k: v for k, v in counters.items() if v and k.startswith(FAULT_COUNTERS)}
    out = dropped_share(counters)
    share = out.get(input_name, {"eligible": 0, "dropped": 0, "reasons": {}})
    dropped = share["dropped"] + sum(faults.values())
    out[input_name] = {"eligible": share["eligible"], "dropped": dropped,
                       "share": dropped / share["eligible"] if share["eligible"] > 0 else 0.0,
                       "reasons": {**share["reasons"], **faults}}
    return out
