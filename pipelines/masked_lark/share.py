"""Masked LARk browsers, simulated: records in, one stream of secret-shared reports per helper out.

    python -m pipelines.masked_lark.share \\
        --input pipelines/sample_data/masked_lark/conversions.csv \\
        --params pipelines/sample_data/masked_lark/aggregation_params.json --batch_id b1 \\
        --output out/lark --ledger private/ledger.json --key_store private/keys

For testing and simulation: in production every browser shares its own record (Algorithm 1 of
Masked LARk, seed 004) and sends each helper its share; this job does it for a table of records
so that helper and combine runs can be exercised end to end. Input (CSV or Parquet):

  aggregation (``--params`` kind aggregation)  record_id, key, one column per declared value
                                               column, optionally batch_id
  gradient (kind gradient)                     record_id, x_0..x_{d-1} (bytes 0..255), label
                                               (0/1), optionally fake (true/false: strictly
                                               fake records) and batch_id

Faulty records (one record's content never decides the run): a record without a
``record_id``, ``key`` (aggregation) or ``batch_id`` value is removed -- the public identity
of a report; a record whose value, feature, label or ``fake`` is missing, not a number, not
finite or outside its byte / label domain is *neutralised*, not removed: its report is still
sent, with the default value ``clip(0, lower, upper)`` (aggregation) or as a strictly fake
record (gradients, adding nothing), because under the helpers' relation the number of reports
per key is public and fixed, and a removed record could move a key across k. Both are counted
for the operator as ``records.dropped.<reason>`` (their content is lost to the aggregate; the
dropped-rows alert and the operator report show them) and never fail the run; the rules and
reasons are those of transforms/lark/browser.py ("Faults"); a CSV value whose bytes are not
UTF-8 is read as missing (``records.values_not_utf8``), so its record is removed or neutralised
by the same rules. A fault of the input itself
-- a missing column, a file that does not read, a Parquet column type without numbers -- is
refused before the charge.

Output: release ``masked_lark_share/<batch_id>`` with ``reports_helper_<h>.parquet`` for each
helper h (the wire format of transforms/lark/reports.py), rows sorted by (batch_id, report_id):
report ids are uniformly random, so the order reveals nothing about the records. Give each file
to its helper only: any H - 1 of them are uniform and independent of the values, all H recover
them.

Privacy: the reports are not a statistic; the job spends nothing (its guarantee is
compose([]) = (0, 0)) -- the helpers' releases carry the guarantee. Each record is shared once:
a ``record_id`` that appears twice in the input (also under different ``batch_id`` values) has
every copy removed, alike or not (counted: ``records_removed_repeated_in_batch``; its identity
is public and its values private, so whether copies agree must not decide what is shared) -- each
copy would get a fresh report id, so no helper's replay check could see it, and the record
would count twice in an aggregate; one repeated record never refuses the batch. With
``--local_noise_epsilon e`` (gradients; Section 4.2.3) every byte feature gets discrete Laplace
noise with scale 255 / e before sharing: the features of a record are (d * e)-local-DP against
every party, charged to the scope ``masked-lark-local-features:<batch_id>``.

Randomness: each record's report id, shares, masks and blinding come from an AES stream keyed by
the run's release key (reserved in the ledger, kept in ``--key_store``) and the record's
content, so a re-run reproduces the published bytes and the helpers -- who never see the key
-- get uniform shares. Whoever holds that key and one helper's reports can test guesses of a
record's values: the key store stays with the party that holds the records (the browsers' side
of the simulation), never with a helper. Real browsers draw from their OS CSPRNG
(``transforms.randomness.SystemRandomness``).
"""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from typing import Optional, Sequence

import apache_beam as beam
import pyarrow as pa

from accounting.budget import PrivacyBudget
from accounting.ledger import Scope
from accounting.measures import Measure
from pipelines.masked_lark.config import (LarkPrepared, params_to_json, prepare_lark,
                                          record_ids_once, remove_repeated_records)
from pipelines.release import (InputSpec, Job, OutputSpec, PlannedRelease, ReleaseOptions,
                               ReleaseRefused, cli)
from pipelines.release import run as run_release
from transforms.counting import Counted, CountingDoFn
from transforms.lark.beam import NAMESPACE, ShareRecords
from transforms.lark.browser import check_aggregation_records, check_gradient_records
from transforms.lark.local_dp import LocalFeatureNoise
from transforms.lark.params import AggregationParams
from transforms.lark.randomness import BrowserRandomness
from transforms.lark.reports import (LarkInputError, blind_columns, feature_columns,
                                     share_column)

NAME = "masked_lark_share"
LOCAL_NEIGHBOURING = "replace one record's features (local DP: against every party)"


def output_name(helper: int) -> str:
    return f"reports_helper_{helper}.parquet"


def report_schema(params) -> pa.Schema:
    head = [("batch_id", pa.string()), ("report_id", pa.string()), ("helper", pa.int32())]
    if isinstance(params, AggregationParams):
        return pa.schema(head + [("key", pa.string())]
                         + [(share_column(c), pa.uint64()) for c in params.value_columns])
    d = params.num_features
    return pa.schema(head + [(c, pa.uint8()) for c in feature_columns(d)]
                     + [("label_a", pa.int8()), ("label_b", pa.int8()),
                        ("mask_a", pa.uint64()), ("mask_b", pa.uint64())]
                     + [(c, pa.uint64()) for c in blind_columns(d + 1)])


@dataclass(frozen=True, kw_only=True)
class ShareRequest:
    """One simulated batch of browsers (the CLI flags are these fields)."""

    input: tuple = field(metadata={"help": "records: paths, globs or folders, comma-separated "
                                           "(local or gs://)"})
    params: str = field(metadata={"help": "the public parameters JSON (see "
                                          "pipelines/masked_lark/config.py)"})
    batch_id: str = field(metadata={"help": "the batch the ad server assigns (release id "
                                            "masked_lark_share/BATCH_ID; a batch_id column of "
                                            "the records, if any, takes precedence per row)"})
    input_format: Optional[str] = field(default=None, metadata={
        "choices": ["csv", "parquet"], "help": "default: from the file names"})
    local_noise_epsilon: Optional[float] = field(default=None, metadata={
        "help": "gradients only: local DP epsilon per byte feature (Section 4.2.3)"})
    options: ReleaseOptions = field(metadata={"cli": False})


class CountRecordFaults(CountingDoFn):
    """Counts each table's faulty records for the operator (``records.dropped.<reason>``: see
    "Faulty records" in the module docstring) and passes the table on unchanged: the browser
    (transforms/lark/browser.py) removes or neutralises the same records when it shares them."""

    def __init__(self, check, counters):
        self._check, self._counters = check, counters

    def process(self, table: pa.Table):
        try:
            faults = self._check(table).faults
        except LarkInputError as err:  # a fault of the table (its column types), not of a row
            raise ReleaseRefused(str(err)) from None
        for reason, count in faults.items():
            self._counters.dropped(reason, count)
        if table.num_rows:
            yield table


def record_check(params, num_features: Optional[int] = None):
    """The browser's per-record check for ``params`` (transforms/lark/browser.py)."""
    if isinstance(params, AggregationParams):
        return functools.partial(check_aggregation_records, params=params)
    return functools.partial(check_gradient_records, num_features=num_features or
                             params.num_features)


class ShareJob(Job):
    name = NAME
    request_type = ShareRequest
    description = __doc__.split("\n\n")[0]
    counter_namespaces = (NAMESPACE,)

    def prepare(self, request) -> LarkPrepared:
        prepared = prepare_lark(request, run_id=request.batch_id, flag="--batch_id", model=False)
        if request.local_noise_epsilon is not None:
            if isinstance(prepared.params, AggregationParams):
                raise ReleaseRefused("--local_noise_epsilon is for gradient parameters only")
            try:
                LocalFeatureNoise(epsilon_per_feature=request.local_noise_epsilon)
            except ValueError as err:
                raise ReleaseRefused(f"--local_noise_epsilon: {err}")
        return prepared

    def inputs(self, prepared: LarkPrepared):
        request, params = prepared.request, prepared.params
        if isinstance(params, AggregationParams):
            columns = {"record_id": "any", "key": "any",
                       **{c: "number" for c in params.value_columns}}
            optional = {"batch_id": "any"}
        else:
            columns = {"record_id": "any", **{c: "number" for c in
                                              feature_columns(params.num_features)},
                       "label": "number"}
            optional = {"batch_id": "any", "fake": "any"}
        return [InputSpec(name="records", paths=request.input, format=request.input_format,
                          columns=columns, optional=optional, flag="--input")]

    def consumes(self, prepared: LarkPrepared, planned, inputs):
        return record_ids_once(NAME, inputs)

    def plan(self, prepared: LarkPrepared):
        request, params = prepared.request, prepared.params
        measures, scopes = [], []
        if request.local_noise_epsilon is not None:
            noise = LocalFeatureNoise(epsilon_per_feature=request.local_noise_epsilon)
            epsilon = noise.vector_epsilon(params.num_features)
            measures = [Measure(
                name="local_feature_noise", mechanism="discrete_laplace (local, per feature)",
                epsilon=epsilon, neighbouring=LOCAL_NEIGHBOURING,
                description=f"{params.num_features} byte features, each discrete Laplace "
                            f"scale 255/{request.local_noise_epsilon:g}, clipped to [0, 255]")]
            scopes = [Scope(name=f"masked-lark-local-features:{request.batch_id}",
                            budget=PrivacyBudget(epsilon=epsilon),
                            description="the local DP of this batch's features")]
        schema = report_schema(params)
        return [PlannedRelease(
            release_id=f"{NAME}/{request.batch_id}", measures=measures, scopes=scopes,
            outputs=[OutputSpec(name=output_name(h), sort_by=["batch_id", "report_id"],
                                schema=schema, description=f"reports for helper {h} only")
                     for h in range(params.num_helpers)],
            config={"params": params_to_json(params), "batch_id": request.batch_id,
                    "local_noise_epsilon": request.local_noise_epsilon},
            parameters={"params_digest": params.digest(), "num_helpers": params.num_helpers,
                        "local_noise_epsilon": request.local_noise_epsilon},
            spends_nothing="" if measures else (
                "secret shares are not a statistic: any H - 1 helpers' reports are uniform and "
                "independent of the records; the helpers' noisy releases carry the guarantee"),
            guarantee_covers="the local DP of the shared features" if measures else "")]

    def build(self, pipeline, prepared: LarkPrepared, inputs, release):
        request, params = prepared.request, prepared.params
        # Keyed by the run's ledger key (see the module docstring): a re-run reproduces the
        # published bytes, as the release layer requires.
        randomness = BrowserRandomness.keyed(release.key)
        if isinstance(params, AggregationParams):
            share = ShareRecords(randomness=randomness, aggregation=params,
                                 batch_id=request.batch_id)
        else:
            local = (None if request.local_noise_epsilon is None else
                     LocalFeatureNoise(epsilon_per_feature=request.local_noise_epsilon))
            share = ShareRecords(randomness=randomness, num_features=params.num_features,
                                 num_helpers=params.num_helpers, local_noise=local,
                                 batch_id=request.batch_id)
        records = remove_repeated_records(NAME, inputs["records"], pipeline, release)
        streams = (records
                   | release.label("Faults") >> Counted(CountRecordFaults(
                       record_check(params), release.counters(NAME, "records")))
                   | release.label("Share") >> share)
        return {output_name(h): streams[h] for h in range(params.num_helpers)}


JOB = ShareJob()


def run(request: ShareRequest):
    """Share one batch of records (Python API); see pipelines.release.run."""
    return run_release(JOB, request)


def main(argv: Optional[Sequence[str]] = None) -> int:
    return cli.main(JOB, argv)


if __name__ == "__main__":
    sys.exit(main())
