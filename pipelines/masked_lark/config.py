"""The public parameters and model files the Masked LARk jobs share (``--params``, ``--model``).

The paper (Masked LARk, seed 004, Section 3.2) has the ad server declare k, epsilon and the value
bounds publicly; browsers and every helper use the same declaration. Here it is one JSON file
given to every job, so that the share, helper and combine runs cannot disagree (helpers bind its
digest into their outputs and the combine refuses a mismatch):

    {"kind": "aggregation", "value_columns": ["value"], "lower": 0, "upper": 100,
     "epsilon": 1.0, "k": 10, "fraction_bits": 0, "num_helpers": 2}
    {"kind": "gradient", "num_features": 8, "clip_norm": 1.0, "epsilon": 1.0, "k": 50,
     "fraction_bits": 16, "num_helpers": 2}

``epsilon`` may be null only in testing mode (exact sums, to check the system, never released).
A gradient run also needs the model the ad server sends (``--model``):
``{"weights": [...], "bias": 0, "feature_scale": 0.03125, "feature_offset": 128}``.
Errors name the file and the field, never the file's content. :func:`prepare_lark` is what every
Masked LARk job's ``Job.prepare`` starts with (the run id, ``--params`` and ``--model``, read once).

:func:`record_ids_once` and :func:`remove_repeated_records` are the browsers' rule both jobs
that share records apply: each record is shared once per batch.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Union

from pipelines.release import Prepared, ReleaseRefused, textfiles
from pipelines.release.names import check_segment
from pipelines.release.textfiles import shown
from transforms.lark.model import LogisticModel
from transforms.lark.params import AggregationParams, GradientParams

Params = Union[AggregationParams, GradientParams]


def record_ids_once(job: str, inputs) -> list:
    """``Job.consumes`` of the jobs that share records (browsers, training driver): the records'
    ids, each shared once per batch -- every copy of a repeated id is removed, counted (each
    copy would get a fresh report id, invisible to the helpers' replay check; which records are
    shared then depends on their public identities only, never on a value). Not recorded
    across batches."""
    from pipelines.release.consumption import Consumes, canonical_ids

    # No content digest: a record's identity is public and its values are private (the
    # helpers' relation replaces values), so whether two copies agree must not decide which
    # records are shared -- every copy of a repeated id is removed (rule 1 of
    # pipelines.release.consumption, public-identity jobs).
    ids, faults = canonical_ids(inputs["records"], "record_id")
    return [Consumes(namespace=f"{job}/record", ids=ids, noun="record ids", label="--input",
                     skip=None, across_batches=False, faults=faults)]


def remove_repeated_records(job: str, tables, pipeline, release):
    """``tables`` without the records :func:`record_ids_once` removes (counters
    ``records_removed_repeated_in_batch``, ``records_dropped_id_without_canonical_form``)."""
    from pipelines.release.consumption import remove_consumed

    return remove_consumed(tables, pipeline, release, f"{job}/record", "record_id",
                           counter=(job, "records"), label="records")
_FIELDS = {"aggregation": {"value_columns", "lower", "upper", "epsilon", "k", "fraction_bits",
                           "num_helpers", "max_batch_records"},
           "gradient": {"num_features", "clip_norm", "epsilon", "k", "fraction_bits",
                        "num_helpers", "max_batch_records"}}


def _read_json(path: str, flag: str) -> dict:
    configuration = textfiles.read(path, flag)
    obj = configuration.json()
    if not isinstance(obj, dict):
        raise configuration.error(None, "expected a JSON object")
    return obj


def params_from_json(obj: dict, where: str = "--params") -> Params:
    kind = obj.get("kind")
    if kind not in _FIELDS:
        raise ReleaseRefused(f"{where}: 'kind' must be 'aggregation' or 'gradient'")
    unknown = sorted(set(obj) - _FIELDS[kind] - {"kind"})
    if unknown:
        raise ReleaseRefused(f"{where}: unknown field(s) {', '.join(map(shown, unknown))} for "
                             f"kind {kind!r}")
    fields = {k: v for k, v in obj.items() if k != "kind"}
    if "value_columns" in fields:
        if not isinstance(fields["value_columns"], list):
            raise ReleaseRefused(f"{where}: 'value_columns' must be a list of column names")
        fields["value_columns"] = tuple(fields["value_columns"])
    try:
        return (AggregationParams if kind == "aggregation" else GradientParams)(**fields)
    except TypeError as err:
        raise ReleaseRefused(f"{where}: missing or invalid field ({err})")
    except ValueError as err:
        raise ReleaseRefused(f"{where}: {err}")


def params_to_json(params: Params) -> dict:
    if isinstance(params, AggregationParams):
        return {"kind": "aggregation", "value_columns": list(params.value_columns),
                "lower": params.lower, "upper": params.upper, "epsilon": params.epsilon,
                "k": params.k, "fraction_bits": params.fraction_bits,
                "num_helpers": params.num_helpers, "max_batch_records": params.max_batch_records}
    return {"kind": "gradient", "num_features": params.num_features,
            "clip_norm": params.clip_norm, "epsilon": params.epsilon, "k": params.k,
            "fraction_bits": params.fraction_bits, "num_helpers": params.num_helpers,
            "max_batch_records": params.max_batch_records}


def load_params(path: str, *, testing: bool) -> Params:
    """``--params``; exact (epsilon null) parameters only in testing mode."""
    params = params_from_json(_read_json(path, "--params"), f"--params {path}")
    if params.epsilon is None and not testing:
        raise ReleaseRefused(f"--params {path}: epsilon is null (exact sums): only with "
                             "--testing_seed, never a release")
    return params


def load_model(path, params: Params) -> LogisticModel:
    """``--model`` for gradient parameters (refused for aggregation, required for gradients)."""
    if isinstance(params, AggregationParams):
        if path:
            raise ReleaseRefused("--model is for gradient parameters only")
        return None
    if not path:
        raise ReleaseRefused("gradient parameters need --model (the model the ad server sends)")
    obj = _read_json(path, "--model")
    try:
        model = LogisticModel.from_json(obj)
    except (KeyError, TypeError, ValueError) as err:
        raise ReleaseRefused(f"--model {path}: missing or invalid field ({type(err).__name__})")
    if model.num_features != params.num_features:
        raise ReleaseRefused(f"--model {path}: {model.num_features} weights, --params declares "
                             f"{params.num_features} features")
    return model


@dataclass(frozen=True, kw_only=True)
class LarkPrepared(Prepared):
    """A Masked LARk request with its public parameters and model (gradients) read once."""

    params: Params
    model: Optional[LogisticModel] = None


def prepare_lark(request, *, run_id: str, flag: str, model: bool = True) -> LarkPrepared:
    """The run id checked as a path segment (``flag`` names it), ``--params`` read (exact
    parameters only in testing mode) and, with ``model``, ``--model`` (required for gradient
    parameters, refused for aggregation ones)."""
    try:
        check_segment(run_id, flag)
    except ValueError as err:
        raise ReleaseRefused(str(err))
    params = load_params(request.params, testing=request.options.testing)
    return LarkPrepared(request=request, params=params,
                        model=load_model(request.model, params) if model else None)
