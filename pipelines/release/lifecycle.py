"""One run of a job: validate, preflight, reserve, compute to staging, check, publish, commit, report.

See :mod:`pipelines.release` for the guarantees; this module is the sequence:

1. the job checks its request and plans its releases; every input is resolved once and
   preflighted; Beam options are built (runner profile) -- any fault here: nothing charged;
2. the output, staging, report, ledger and key-store locations are checked writable (local
   paths), and the output root's ownership (ledger binding, markers of the release ids);
3. the ledger reserves every release of the run, all or nothing, with fresh keys bound to the
   input digest (testing runs: a public key from the seed, no ledger);
4. one Beam pipeline reads each input once and builds every release; outputs are written, sorted
   by their public order, to a private staging folder per release;
5. counters are read from the pipeline result; the dropped-rows rule is applied;
6. every release is checked publishable (never replacing different bytes), then pinned in the
   ledger, published atomically with its marker last, and committed;
7. the operator's report (counters included) is written beside the ledger, and summarised on
   the console.
"""
from __future__ import annotations

import json
import logging
import os
import secrets
import time
import traceback
from dataclasses import dataclass, field
from typing import Mapping, Optional, Sequence

from accounting.keys import ReleaseKey
from accounting.ledger import (BudgetLedger, LedgerError, ReleaseRequest, input_digest,
                               keyed_binding)
from pipelines.release import consumption as release_consumption
from pipelines.release import counters as row_counters
from pipelines.release import inputs as release_inputs
from pipelines.release import outputs as release_outputs
from pipelines.release import publish, report, storage
from pipelines.release.errors import ReleaseFailed, ReleaseRefused
from pipelines.release.job import Job, PlannedRelease, ReleaseContext
from transforms.noise.mechanisms import IntegerSumOverflowError

_LOG = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class ReleaseOutcome:
    """One release of a run: where it is and what happened."""

    release_id: str
    versioned_id: str
    version: int
    folder: str
    status: str  # "released", "reproduced" (identical re-run), "testing"
    files: Mapping[str, str]
    marker: Mapping
    report_path: str
    report: Mapping = field(repr=False)


@dataclass(frozen=True, kw_only=True)
class RunResult:
    job: str
    releases: Sequence[ReleaseOutcome]
    counters: Mapping[str, int]
    exit_code: int = 0
    warnings: Sequence[str] = ()


def _pipeline_options(args: Sequence[str]):
    from runners.profiles import pipeline_options_for

    try:
        options = pipeline_options_for(list(args))
    except (ValueError, SystemExit) as err:
        raise ReleaseRefused(f"pipeline options: {err}")
    every = options.get_all_options()
    return options, bool(every.get("dry_run")) or bool(every.get("template_location"))


def _testing_keys(seed: int, names: Sequence[str], exact: bool = False) -> dict:
    base = ReleaseKey.for_exact_testing(seed) if exact else ReleaseKey.for_testing(seed)
    return {name: base if name == "release" else base.derive(f"key:{name}") for name in names}


def _digest(job: Job, planned: PlannedRelease, resolved: Mapping) -> str:
    names = planned.inputs or sorted(resolved)
    files = sorted(f for n in names for f in resolved[n].files)
    config = {"job": job.name, "release_id": planned.release_id, "config": planned.config}
    return input_digest(files, config, open_chunks=storage.size_and_chunks)


def _report_root(options, output: str) -> str:
    if options.report_dir:
        return storage.absolute(options.report_dir)
    if options.testing:
        return storage.join(output, publish.TESTING_PREFIX, ".reports")
    return storage.join(storage.parent(storage.absolute(options.ledger)), "reports")


def run_pipeline(options, build) -> object:
    """Build and run one Beam pipeline; returns its finished result (raises on failure). How a
    run goes on the chosen runner (a cluster for the run, checks of the built pipeline, what to
    close) is its runner profile's (runners.execution)."""
    from runners.execution import run as run_on_runner

    return run_on_runner(options, build)


def run(job: Job, request) -> RunResult:
    """Make the releases ``request`` asks for (see the module docstring); raises ReleaseRefused
    (nothing charged) or ReleaseFailed (reserved, nothing published)."""
    started = time.time()
    options = request.options
    job.check(request)
    planned = list(job.plan(request))
    if not planned:
        raise ReleaseRefused(f"{job.name}: the request plans no release")
    ids = [p.release_id for p in planned]
    if len(set(ids)) != len(ids):
        raise ReleaseRefused(f"{job.name}: release ids repeat: {ids}")
    resolved = {spec.name: release_inputs.preflight(spec) for spec in job.inputs(request)}
    for p in planned:
        unknown = set(p.inputs or ()) - set(resolved)
        if unknown:
            raise ValueError(f"release {p.release_id} reads unknown inputs {sorted(unknown)}")
    pipeline_options, translate_only = _pipeline_options(options.pipeline_args)
    if translate_only and not options.testing:
        raise ReleaseRefused("--dry_run and --template_location only translate the job: give "
                             "--testing_seed. A release is never a template: a template would "
                             "hold one release's key and could run again on other data")
    output = storage.absolute(options.output)
    publish.check_output_root(output, options.testing)
    staging_root = storage.absolute(options.staging_dir) if options.staging_dir else \
        storage.join(output, publish.STAGING)
    folders = [("--output", output), ("--staging_dir", staging_root),
               ("--report_dir", _report_root(options, output))]
    if not options.testing:
        ledger_path = storage.absolute(options.ledger)
        if not storage.is_gcs(ledger_path) and os.path.isdir(ledger_path):
            raise ReleaseRefused(f"--ledger {ledger_path} is a folder, not a ledger file; nothing "
                                 "was charged")
        folders += [("--ledger", storage.parent(ledger_path)),
                    ("--key_store", storage.absolute(options.key_store))]
    for flag, folder in folders:
        reason = storage.unwritable(folder)
        if reason:
            raise ReleaseRefused(f"{flag}: cannot write {folder} ({reason}); nothing was charged")

    # ----------------------------------------------------------------- reserve
    ledger, reservations = None, {}
    consumed = release_consumption.preflight(job, request, planned, resolved)
    if options.testing:
        contexts = [ReleaseContext(planned=p, keys=_testing_keys(options.testing_seed, p.key_names,
                                                                  options.exact_testing),
                                   versioned_id=p.release_id, testing=True,
                                   consumed=release_consumption.views(consumed[p.release_id]))
                    for p in planned]
        versions = {p.release_id: 1 for p in planned}
    else:
        accountants = {p.accountant for p in planned}
        if len(accountants) != 1:
            raise ReleaseRefused(f"one run's releases must share an accountant, got {accountants}")
        try:
            ledger = BudgetLedger(options.ledger, options.key_store, accountant=accountants.pop())
            publish.check_binding(output, ledger)
            for p in planned:
                publish.check_markers_in_ledger(output, p.release_id, ledger)
            requests = [ReleaseRequest(
                release_id=p.release_id, measures=p.measures, input_digest=_digest(job, p, resolved),
                scopes=p.scopes, key_names=p.key_names, content_key=job.content_key(
                    request, p, {n: resolved[n] for n in (p.inputs or sorted(resolved))}),
                consumes=release_consumption.for_ledger(consumed[p.release_id]),
                metadata={"job": job.name}) for p in planned]
            reserved = ledger.reserve(requests, new_release=options.new_release)
            publish.bind(output, ledger)
        except LedgerError as err:
            raise ReleaseRefused(str(err))
        reservations = {r.release_id: r for r in reserved}
        if any(k.is_testing or k.noise_free for r in reserved for k in r.keys.values()):
            raise ReleaseFailed("the ledger issued a testing key for a release")  # never: defence in depth
        contexts = [ReleaseContext(planned=p, keys=reservations[p.release_id].keys,
                                   versioned_id=reservations[p.release_id].versioned_id,
                                   testing=False, consumed=release_consumption.views(
                                       consumed[p.release_id], reservations[p.release_id]))
                    for p in planned]
        versions = {rid: r.version for rid, r in reservations.items()}

    # ----------------------------------------------------------------- compute to staging
    attempt = secrets.token_hex(4)
    staging = {}
    for context in contexts:
        rid = context.release_id
        for old in publish.staging_attempts(staging_root, rid, versions[rid]):
            storage.delete_tree(old)  # an abandoned attempt's outputs never survive
        staging[rid] = publish.staging_folder(staging_root, rid, versions[rid], attempt)
        storage.make_private_dir(staging[rid])

    def build(pipeline):
        import apache_beam as beam

        read = {name: pipeline | f"Read[{name}]" >> release_inputs.ReadInput(r, job.name)
                for name, r in resolved.items()}
        built = job.build_all(pipeline, request, read, contexts)
        written = []
        for context in contexts:
            p = context.planned
            released = built[p.release_id]
            for spec in p.outputs:
                if spec.name not in released:
                    raise ValueError(f"{job.name}: build() released no {spec.name!r}")
                written.append(
                    released[spec.name]
                    | f"Stage[{p.release_id}/{spec.name}]" >> release_outputs.WriteStaged(
                        staging[p.release_id], spec))
        # One leaf that depends on every staged write, applied last: Beam's DaskRunner computes
        # only the last-applied transform's graph, so a write on any other branch would never
        # run there (the publish step would then refuse: "was not written").
        if len(written) > 1:
            tuple(written) | "AllStaged" >> beam.Flatten()

    try:
        result = run_pipeline(pipeline_options, build)
    except Exception as err:  # noqa: BLE001 -- any fault of the computation: nothing published
        detail = "".join(traceback.format_exception_only(type(err), err)).strip()
        _LOG.debug("pipeline failure", exc_info=True)
        _write_failure(options, output, contexts, versions, detail)
        cause = type(err).__name__
        if isinstance(err, (release_inputs.InputReadError, IntegerSumOverflowError)):
            # Their messages name files, columns and counts, never content.
            cause = str(err).split(" [while running")[0].strip()
        raise ReleaseFailed(
            f"{job.name}: the computation failed ({cause}); nothing was published"
            + ("" if options.testing else "; the reservation stays and a corrected re-run takes "
               "it over without spending again") + f". Details: the operator report under "
            f"{_report_root(options, output)}") from None
    if translate_only:
        return RunResult(job=job.name, releases=[], counters={})
    all_counts = row_counters.query(result, job.name, job.counter_namespaces)
    unchecked = None
    if all_counts is None:
        # e.g. Beam's DaskRunner: its result has no metrics, and counters incremented on its
        # workers are lost. Without them the dropped-rows rule cannot be applied: refuse, unless
        # the operator accepts publishing without the rule (runners/README.md, "Dask").
        unchecked = (f"the runner returned no Beam counters ({type(result).__name__}.metrics() "
                     "is not implemented), so the dropped-rows rule could not be checked")
        if not options.allow_dropped_rows:
            _write_failure(options, output, contexts, versions, unchecked)
            raise ReleaseFailed(
                f"{job.name}: refusing to publish: {unchecked}. Run on a runner that reports "
                "counters, or pass --allow_dropped_rows to publish without the rule "
                "(the operator report records it)")
        all_counts = {}
    counts = {c.release_id: row_counters.of_release(all_counts, job.name, c.release_id)
              for c in contexts}

    # ----------------------------------------------------------------- dropped-rows rule
    shares = {rid: job.dropped_rows(c) for rid, c in counts.items()}
    problems = [f"{rid}: {name}: {s['dropped']} of {s['eligible']} eligible rows dropped"
                for rid, per_input in shares.items() for name, s in per_input.items()
                if s["eligible"] > 0 and (s["dropped"] == s["eligible"]
                                          or s["share"] > options.max_dropped_fraction)]
    if unchecked:
        problems.append(unchecked)
    if problems and not options.allow_dropped_rows:
        reasons = "; ".join(f"{rid}: {_dropped_reasons(s)}" for rid, s in shares.items())
        _write_failure(options, output, contexts, versions, "; ".join(problems), all_counts)
        raise ReleaseFailed(
            f"{job.name}: refusing to publish: {'; '.join(problems)} (rule: all dropped, or more "
            f"than {options.max_dropped_fraction:.0%}; the counters say which rule dropped them: "
            f"{reasons}). Fix the input (a re-run takes the reservation over) "
            "or pass --allow_dropped_rows")

    # ----------------------------------------------------------------- publish
    finals, markers, staged_files = {}, {}, {}
    for context in contexts:
        p, rid = context.planned, context.release_id
        folder = staging[rid]
        tables, files = {}, {}
        for spec in p.outputs:
            data = storage.read_bytes(storage.join(folder, spec.name))
            if data is None:
                raise ReleaseFailed(f"{job.name}: {spec.name} of {rid} was not written")
            tables[spec.name] = release_outputs.decode(data, spec)
            files[spec.name] = storage.sha256_of(storage.join(folder, spec.name))
        marker = report.marker(job, request, context, versions[rid], files, tables,
                               ledger=ledger, reservation=reservations.get(rid))
        storage.write_bytes(storage.join(folder, publish.MARKER), publish.marker_bytes(marker))
        finals[rid] = publish.release_folder(output, rid, versions[rid], context.testing)
        markers[rid], staged_files[rid] = marker, files
    outcomes = {rid: publish.check_publishable(staging[rid], finals[rid], testing=options.testing)
                for rid in finals}
    results, published, warnings = [], [], []
    for context in contexts:
        rid = context.release_id
        reservation = reservations.get(rid)
        try:
            if reservation is not None:
                ledger.begin_publish(reservation)
            outcome = publish.publish(staging[rid], finals[rid], testing=options.testing)
        except Exception as err:  # noqa: BLE001
            if not published:
                raise
            # Exit 0 means released, anything else nothing new: with part of a multi-release run
            # out, the operator is told exactly which releases are out and how to finish.
            raise ReleaseFailed(
                f"{job.name}: published {', '.join(published)}, but {rid} could not be published "
                f"({type(err).__name__}); re-run the same command: it reproduces what is published "
                "byte for byte and publishes the rest without spending again") from None
        published.append(rid)
        status = "testing" if options.testing else \
            ("reproduced" if outcome == "identical" else "released")
        # After publication the release is out: a failing ledger commit or operator report must
        # not turn it into a failure (the budget was charged at the reservation; the next run of
        # the same command completes the record without spending).
        try:
            if reservation is not None:
                ledger.commit(reservation, finals[rid], staged_files[rid])
        except Exception as err:  # noqa: BLE001
            _LOG.debug("ledger commit failed", exc_info=True)
            warnings.append(f"{rid} is published but its ledger record was not committed "
                            f"({type(err).__name__}); re-run the same command to complete it "
                            "(nothing more is spent)")
        operator = path = None
        try:
            operator = report.operator_report(
                job, context, markers[rid], status, finals[rid], counts[rid], shares[rid], ledger,
                reservation, started, dropped_rule_overridden=bool(problems))
            path = report.write(operator, _report_root(options, output), rid, versions[rid], job)
        except Exception as err:  # noqa: BLE001
            _LOG.debug("operator report failed", exc_info=True)
            warnings.append(f"{rid} is published but its operator report could not be written "
                            f"({type(err).__name__})")
        results.append(ReleaseOutcome(release_id=rid, versioned_id=context.versioned_id,
                                      version=versions[rid], folder=finals[rid], status=status,
                                      files=staged_files[rid], marker=markers[rid],
                                      report_path=path, report=operator))
    for warning in warnings:
        _LOG.warning("%s", warning)
    _LOG.info("%s: %d release(s) in %.1f s", job.name, len(results), time.time() - started)
    return RunResult(job=job.name, releases=results, counters=all_counts,
                     warnings=tuple(warnings))


def _dropped_reasons(shares: Mapping[str, Mapping]) -> str:
    reasons = {k: v for s in shares.values() for k, v in s.get("reasons", {}).items() if v}
    return ", ".join(f"{k}={v}" for k, v in sorted(reasons.items())) or "none recorded"


def _write_failure(options, output, contexts, versions, detail: str, counts=None) -> None:
    """The operator's record of a run that published nothing (raw details stay private)."""
    root = _report_root(options, output)
    for context in contexts:
        body = {"release_id": context.release_id, "versioned_id": context.versioned_id,
                "status": "failed: nothing published", "detail": detail,
                "counters": dict(counts or {})}
        try:
            report.write_failure(body, root, context.release_id, versions[context.release_id])
        except Exception:  # noqa: BLE001 -- the failure itself is what the operator must see
            _LOG.warning("could not write the failure report", exc_info=True)
