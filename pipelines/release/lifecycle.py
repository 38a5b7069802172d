"""One run of a job, in named phases: preflight, reserve, compute, rule, publish, commit.

See :mod:`pipelines.release` for the guarantees. A run is the composition of six phases
(:func:`run`); each takes the small frozen state the one before returned and states its own
failure policy in its docstring, implemented beside it:

==========  ===================================================  ===============================
phase       what it does                                         a fault in it
==========  ===================================================  ===============================
preflight   the job prepares (once), checks and plans; every     ReleaseRefused (exit 2):
            measure computable; inputs resolved and checked;     nothing charged
            Beam options, the runner resolved and checked;
            locations writable
reserve     output root ownership; the ledger (verified)         ReleaseRefused (exit 2):
            reserves every release, all or nothing, with fresh   nothing charged or stored
            keys bound to the input digest, held by this run     (another run's hold too)
            (testing runs: a public key from the seed)
compute     one Beam pipeline reads each input once and writes   ReleaseFailed (exit 3): the
            every release, and its row counters, to private      failure recorded for the
            staging; the counters read back from staging         operator, the reservation kept
rule        the row rules over each release's counters: alerts   never refuses (operator-only:
            for the operator (dropped rows, empty inputs)        the release is published)
publish     markers staged; every release checked publishable,   ReleaseFailed (exit 3) before
            pinned in the ledger, published atomically, marker   the first is out; part-way:
            last                                                 those out are committed first
commit      ledger records completed, operator reports written   exit 4 (a failed ledger
                                                                 commit; re-run) or a warning
                                                                 (a report): the release is out
==========  ===================================================  ===============================

Each phase change, and every 10 s while the Beam run is waited for, is a progress line on stderr
(:mod:`pipelines.release.progress`: phase, rows read, elapsed time), kept in the operator report.

After the reservation, a fault of any class in any phase is ReleaseFailed (exit 3) naming its
root cause (:func:`after_reservation`), and the run's hold ends with the run (:func:`end_hold`;
a composition of phases that ends a process -- submit, finalize -- ends it too).

The states: :class:`Preflight` -> :class:`Reserved` -> :class:`Computed` -> :class:`Ruled` ->
:class:`Published` -> :class:`RunResult`. ``compute`` is :func:`stage` (fresh private staging
folders), :func:`run_pipeline` (the one place where execution happens) and :func:`collect` (the
counters, read from staging alone, never from the runner's result), so that a release can also
be submitted by one process and finished by another (``--submit_only`` / ``--finalize``, for a
Flex Template launcher and a scheduler's second task), two more compositions of the same phases
(:mod:`pipelines.release.submission`):

* :func:`submit` = preflight + reserve + stage + :func:`start` (the pipeline started on its
  runner: Dataflow returns the job id at once, a local engine runs it to the end), the job handle
  and staging attempt recorded with the reservation;
* :func:`finalize` = the same preflight + :func:`find_submitted` (the reservation found again,
  nothing charged; exit 2 without one) + :func:`await_job` (exit 3 if the job failed), then, one
  finalizing process at a time, :func:`published_before` (an earlier finalize published it:
  reproduced) or :func:`collect` + rule + publish + commit.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import secrets
import time
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from accounting.keys import ReleaseKey
from accounting.ledger import BudgetLedger, LedgerError, ReleaseRequest, holds, input_digest
from pipelines.release import consumption as release_consumption
from pipelines.release import counters as row_counters
from pipelines.release import inputs as release_inputs
from pipelines.release import outputs as release_outputs
from pipelines.release import publish as publication
from pipelines.release import report, storage, submission
from pipelines.release.errors import (EXIT_NOT_COMMITTED, ReleaseFailed, ReleaseRefused,
                                     exception_chain, root_cause)
from pipelines.release.job import Job, PlannedRelease, Prepared, ReleaseContext
from pipelines.release.progress import Progress, rows_read
from transforms.counting import AllCounts
from transforms.noise.mechanisms import IntegerSumOverflowError

_LOG = logging.getLogger(__name__)


# --------------------------------------------------------------------------- results

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
    """What a run did. ``alerts``: operator-only findings of the row rules ("<release id>:
    <input>: ..."; the releases were published); ``exit_code``: 0, or ``--alert_exit_code``
    when there are alerts (a data-dependent signal for the scheduler, see errors)."""

    job: str
    releases: Sequence[ReleaseOutcome]
    counters: Mapping[str, Mapping[str, int]]  # release id -> its row counters
    exit_code: int = 0
    warnings: Sequence[str] = ()
    alerts: Sequence[str] = ()


# --------------------------------------------------------------------------- the states

@dataclass(frozen=True, kw_only=True)
class Places:
    """Where a run writes: the output root, private staging, the operator's reports."""

    output: str
    staging: str
    reports: str


@dataclass(frozen=True, kw_only=True)
class Preflight:
    """What preflight established: the job's prepared request and plan, every input resolved
    and checked, the Beam options, the places."""

    job: Job
    prepared: Prepared
    planned: tuple
    inputs: Mapping[str, Any]          # input name -> inputs.ResolvedInput
    beam_options: Any = field(repr=False)
    translate_only: bool
    places: Places
    started: float
    #: {release id: [consumption.BatchConsumption]}: what each release consumes (Job.consumes),
    #: repeats within the batch already found; the ledger checks it across batches in reserve.
    consumed: Mapping[str, Sequence] = field(default_factory=dict, repr=False)
    #: the run's progress lines on stderr (pipelines.release.progress)
    progress: Progress = field(repr=False, compare=False)

    @property
    def options(self):
        return self.prepared.options


@dataclass(frozen=True, kw_only=True)
class Reserved:
    """The run's releases with their keys and versions (and, for a release, its ledger and
    reservations; a testing run has neither)."""

    pre: Preflight
    releases: tuple                    # ReleaseContext per planned release, in plan order
    versions: Mapping[str, int]
    ledger: Optional[BudgetLedger] = field(default=None, repr=False)
    reservations: Mapping[str, Any] = field(default_factory=dict, repr=False)
    #: this run's hold on its releases (accounting.ledger.holds), ended by end_hold
    hold: Optional[holds.Hold] = field(default=None, repr=False)


@dataclass(frozen=True, kw_only=True)
class Computed:
    """Every release written to its private staging folder; each release's row counters, as
    staged beside it (release id -> counters; None: its staging holds none)."""

    reserved: Reserved
    staging: Mapping[str, str]
    counters: Mapping[str, Optional[Mapping[str, int]]]


@dataclass(frozen=True, kw_only=True)
class Ruled:
    """Each release's counters, dropped-rows shares and operator alerts (release id ->)."""

    computed: Computed
    counts: Mapping[str, Mapping[str, int]]
    shares: Mapping[str, Mapping[str, dict]]
    alerts: Mapping[str, tuple]


@dataclass(frozen=True, kw_only=True)
class PublishedRelease:
    context: ReleaseContext
    folder: str
    status: str
    files: Mapping[str, str]
    marker: Mapping


@dataclass(frozen=True, kw_only=True)
class Published:
    """The releases that are out (all of them, unless publication failed part-way)."""

    ruled: Ruled
    releases: tuple


# --------------------------------------------------------------------------- the run

def run(job: Job, request, *, progress: Optional[Progress] = None) -> RunResult:
    """Make the releases ``request`` asks for (see the module docstring); raises ReleaseRefused
    (nothing charged) or ReleaseFailed (reserved, nothing published).

    The exit codes hold whatever goes wrong: a fault before the reservation is a refusal
    (:func:`preflight`), any fault after it -- whatever its class --
    is a failure naming its root cause (:func:`after_reservation`), and the run's hold on its
    releases ends with the run (:func:`end_hold`). ``progress``: where the phase lines go
    (:mod:`pipelines.release.progress`; default: stderr every 10 s)."""
    pre = preflight(job, request, progress=progress)
    reserved = reserve(pre)
    try:
        computed = compute(reserved)
        if pre.translate_only:
            return RunResult(job=job.name, releases=[], counters={})
        result = commit(publish(rule(computed)))
        pre.progress.phase("done")
        return result
    except Exception as err:  # noqa: BLE001 -- after the charge, every fault is exit 3
        raise after_reservation(reserved, err) from None
    finally:
        end_hold(reserved)


@dataclass(frozen=True, kw_only=True)
class Submitted:
    """What :func:`submit` did: the releases reserved and staged, the job computing them
    (``runners.execution.JobHandle``)."""

    job: str
    releases: Sequence[str]
    handle: Any
    exit_code: int = 0


def submit(job: Job, request, *, progress: Optional[Progress] = None) -> Submitted:
    """The first half of a release made by two processes (module docstring); raises
    ReleaseRefused (nothing charged) or ReleaseFailed (reserved, nothing staged for finalize).
    The exit codes, the hold and ``progress`` as for :func:`run`."""
    pre = preflight(job, request, progress=progress)
    reserved = reserve(pre)
    try:
        staging = stage(reserved)
        handle = start(reserved, staging)
        submission.record(reserved, staging, handle)
    except Exception as err:  # noqa: BLE001 -- after the charge, every fault is exit 3
        raise after_reservation(reserved, err) from None
    finally:
        end_hold(reserved)
    pre.progress.phase("done")
    return Submitted(job=job.name, releases=tuple(c.versioned_id for c in reserved.releases),
                     handle=handle)


def finalize(job: Job, request, *, progress: Optional[Progress] = None) -> RunResult:
    """The second half, in another process with the same flags (module docstring); safe to
    repeat or to run twice at once: a published release is reproduced, nothing is spent.
    ``progress`` as for :func:`run`."""
    pre = preflight(job, request, progress=progress)
    reserved = find_submitted(pre)
    try:
        staging, handle = submission.submitted(reserved)
        await_job(reserved, handle)
        with submission.turn(reserved):
            out, rest = published_before(reserved, staging)
            done = commit(publish(rule(collect(rest, staging)))) if rest else None
    except (ReleaseRefused, ReleaseFailed):
        raise
    except Exception as err:  # noqa: BLE001 -- a reserved release: every fault is exit 3
        raise after_reservation(reserved, err) from None
    pre.progress.phase("done")
    if done is None:
        return RunResult(job=job.name, releases=out, counters={})
    return dataclasses.replace(done, releases=[*out, *done.releases])


# --------------------------------------------------------------------------- 1. preflight

def preflight(job: Job, request, *, progress: Optional[Progress] = None) -> Preflight:
    """The job prepares its request (once), checks it and plans its releases; every input is
    resolved once and preflighted; Beam options are built (runner profile) and the runner
    resolved and checked (``--runner``); the output, staging, report, ledger and key-store
    locations are checked writable.

    Failure policy: everything here raises ReleaseRefused (or ValueError: exit 2), an
    arithmetic fault of the parameters (an overflow, a huge size) included; nothing has been
    charged or written. ``progress``: the run's progress lines (default: a new one, on stderr)."""
    progress = progress if progress is not None else Progress(job.name)
    progress.phase("preflight")
    try:
        return _preflight(job, request, progress)
    except (ArithmeticError, MemoryError) as err:  # a parameter the computation cannot hold
        raise ReleaseRefused(f"{job.name}: a parameter is outside what the computation can hold "
                             f"({type(err).__name__}: {str(err)[:120]}); nothing was charged"
                             ) from None


def _preflight(job: Job, request, progress: Progress) -> Preflight:
    """preflight's work (its docstring)."""
    started = time.time()
    if request.options.explain:
        raise ReleaseRefused(f"{job.name}: --explain makes no release: it is answered by the "
                             "command line (pipelines.release.cli), or use Job.planned(request)")
    prepared = job.prepare(request)
    job.check(prepared)
    planned = tuple(job.plan(prepared))
    if not planned:
        raise ReleaseRefused(f"{job.name}: the request plans no release")
    ids = [p.release_id for p in planned]
    if len(set(ids)) != len(ids):
        raise ReleaseRefused(f"{job.name}: release ids repeat: {ids}")
    resolved = {spec.name: release_inputs.preflight(spec) for spec in job.inputs(prepared)}
    for p in planned:
        unknown = set(p.inputs or ()) - set(resolved)
        if unknown:
            raise ValueError(f"release {p.release_id} reads unknown inputs {sorted(unknown)}")
    options = prepared.options
    beam_options, translate_only = _pipeline_options(options.pipeline_args, options.submit_only)
    if translate_only and not options.testing:
        raise ReleaseRefused("--dry_run and --template_location only translate the job: give "
                             "--testing_seed. A release is never a template: a template would "
                             "hold one release's key and could run again on other data (a Flex "
                             "Template launch is --submit_only: runners/deploy/flex_launcher.py)")
    _check_measures(job, planned)
    places = _places(options)
    publication.check_tree(places.output, places.staging, ids, options.testing,
                           reports=places.reports)
    consumed = release_consumption.preflight(job, prepared, planned, resolved)
    return Preflight(job=job, prepared=prepared, planned=planned, inputs=resolved,
                     beam_options=beam_options, translate_only=translate_only,
                     places=places, started=started, consumed=consumed, progress=progress)


def _check_measures(job: Job, planned: Sequence[PlannedRelease]) -> None:
    """Every measure computable before the charge: its noise one the exact samplers draw and
    whose error can be stated, the release's guarantee composable -- so that no epsilon or delta
    extreme (tiny, huge) can make the noise engine or the release's report fail after the
    reservation."""
    from transforms.noise.mechanisms import check_samplable

    for p in planned:
        for m in p.measures:
            try:
                if m.noise is not None:
                    check_samplable(m.noise)
                    if not 0 < m.to_dict()["std"] < float("inf"):
                        raise ValueError("its noise has no positive finite deviation")
                else:
                    m.to_dict()
            except (ValueError, ArithmeticError) as err:
                raise ReleaseRefused(
                    f"{job.name}: release {p.release_id}: measure {m.name!r} (epsilon="
                    f"{m.epsilon:.3g}, delta={m.delta:.3g}) cannot be released exactly: {err}. "
                    "Nothing was charged") from None
        try:
            p.guarantee_json()
        except (ValueError, ArithmeticError) as err:
            raise ReleaseRefused(f"{job.name}: release {p.release_id}: its guarantee cannot be "
                                 f"composed ({err}). Nothing was charged") from None


def _pipeline_options(args: Sequence[str], submit_only: bool = False):
    """Beam's options of the run (runner profile applied) and whether it only translates. The
    runner is resolved as Beam will resolve it and what it needs here is checked (an unknown
    ``--runner``, a missing Prism binary: refused with the runner's own message). The job object
    a Flex Template launcher asks for (``--template_location=.../template_launches/<job id>/
    job_object``) is a submission when the run is ``--submit_only``: the launcher creates that
    one job from it."""
    from pipelines.release.flags import check_beam_args
    from runners import seam
    from runners.execution import RunnerUnavailable

    args = check_beam_args(args)  # every flag one of Beam's, spelled out (FlagError: exit 2)
    try:
        options = seam.options_for(list(args))
    except RunnerUnavailable as err:
        raise ReleaseRefused(f"{str(err).rstrip('.')}; nothing was charged") from None
    except (ValueError, SystemExit) as err:
        raise ReleaseRefused(f"pipeline options: {err}")
    return options, seam.only_translates(options, submitting=submit_only)


def _places(options) -> Places:
    """The run's places, each checked writable (local paths), and the output root's own rules."""
    output = storage.absolute(options.output)
    publication.check_output_root(output, options.testing)
    staging = storage.absolute(options.staging_dir) if options.staging_dir else \
        default_staging(options, output)
    places = Places(output=output, staging=staging, reports=_report_root(options, output))
    folders = [("--output", output), ("--staging_dir", staging), ("--report_dir", places.reports)]
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
    return places


def default_staging(options, output: str) -> str:
    """Private staging beside the ledger (never in the public output root); a testing run's
    under its testing prefix."""
    if options.testing:
        return storage.join(output, publication.TESTING_PREFIX, publication.STAGING)
    return storage.join(storage.parent(storage.absolute(options.ledger)),
                        publication.PRIVATE_STAGING)


def _report_root(options, output: str) -> str:
    if options.report_dir:
        return storage.absolute(options.report_dir)
    if options.testing:
        return storage.join(output, publication.TESTING_PREFIX, ".reports")
    return storage.join(storage.parent(storage.absolute(options.ledger)), "reports")


# --------------------------------------------------------------------------- 2. reserve

def reserve(pre: Preflight) -> Reserved:
    """The ledger reserves every release of the run, all or nothing, with fresh keys bound to
    the input digest and held by this run (:mod:`accounting.ledger.holds`), after checking the
    output root's ownership (ledger binding, the markers of the release ids); a testing run gets
    a public key from its seed and no ledger.

    Failure policy: a ledger or ownership refusal -- another run holding a release included --
    is ReleaseRefused (exit 2): the ledger reserves all or nothing, so nothing was charged or
    stored. An OS fault while reserving (a full, read-only or immutable ledger folder or key
    store) is exit 2 naming errno and file when the ledger holds no record of this run, else
    exit 3 (:func:`_reserve_fault`). A fault after the reservation (binding a new output root)
    is ReleaseFailed."""
    options = pre.options
    pre.progress.phase("reserve")
    if options.testing:
        contexts = tuple(ReleaseContext(
            planned=p, keys=_testing_keys(options.testing_seed, p.key_names, options.exact_testing),
            versioned_id=p.release_id, testing=True,
            consumed=release_consumption.views(pre.consumed[p.release_id])) for p in pre.planned)
        return Reserved(pre=pre, releases=contexts, versions={p.release_id: 1 for p in pre.planned})
    ledger, requests = _requests(pre)
    hold = holds.Hold.new()
    try:
        reserved = ledger.reserve(requests, new_release=options.new_release, hold=hold)
    except LedgerError as err:
        raise ReleaseRefused(str(err)) from None
    except OSError as err:
        raise _reserve_fault(pre, ledger, hold, err) from None
    reservations = {r.release_id: r for r in reserved}
    contexts = tuple(ReleaseContext(
        planned=p, keys=reservations[p.release_id].keys,
        versioned_id=reservations[p.release_id].versioned_id, testing=False,
        consumed=release_consumption.views(pre.consumed[p.release_id], reservations[p.release_id]))
        for p in pre.planned)
    state = Reserved(pre=pre, releases=contexts, ledger=ledger, reservations=reservations,
                     versions={rid: r.version for rid, r in reservations.items()}, hold=hold)
    try:
        if any(k.is_testing or k.noise_free for r in reserved for k in r.keys.values()):
            raise ReleaseFailed("the ledger issued a testing key for a release")  # never
        publication.bind(pre.places.output, ledger)  # a new ledger has its id from now on
    except Exception as err:  # noqa: BLE001 -- charged: exit 3, whatever the fault
        end_hold(state)
        raise after_reservation(state, err) from None
    return state


def _reserve_fault(pre: Preflight, ledger, hold, err: OSError) -> Exception:
    """The outcome of an OS fault raised while the ledger reserved: read back whether the ledger
    holds a record of this run (its hold). None: the transaction did not commit, nothing was
    charged (the ledger abandons the keys and consumed-id records it made) -- exit 2. One, or a
    ledger that cannot be read back: charged, or maybe -- exit 3, and a re-run takes the
    reservation over without spending again."""
    cause = root_cause(err)
    if not isinstance(err.filename, str):  # a write that names no file: name where it wrote
        cause += f" under the ledger {pre.options.ledger} or the key store {pre.options.key_store}"
    try:
        held = any(isinstance(r.get("hold"), dict) and r["hold"].get("run") == hold.run
                   for r in ledger.records())
    except Exception:  # noqa: BLE001 -- cannot tell: the conservative answer
        held = None
    if held is False:
        return ReleaseRefused(f"{pre.job.name}: the ledger or its key store could not be written "
                              f"while reserving ({cause}); nothing was charged")
    if held:
        try:
            ledger.release_hold(hold)
        except Exception:  # noqa: BLE001 -- the hold lapses when this process ends
            _LOG.debug("could not end the hold", exc_info=True)
    return ReleaseFailed(f"{pre.job.name}: the reservation was recorded but could not be "
                         f"completed ({cause}); nothing was published: re-run the same command "
                         "after fixing the cause (it takes the reservation over, spending nothing "
                         "more)" if held else
                         f"{pre.job.name}: the ledger could not be written nor read back while "
                         f"reserving ({cause}); nothing was published -- if it was charged, a "
                         "re-run of the same command takes the reservation over")


def _requests(pre: Preflight) -> tuple:
    """The run's ledger and its release requests, the output root's ownership checked (before
    the charge: every fault here is ReleaseRefused, exit 2)."""
    accountants = {p.accountant for p in pre.planned}
    if len(accountants) != 1:
        raise ReleaseRefused(f"one run's releases must share an accountant, got {accountants}")
    output, options = pre.places.output, pre.options
    try:
        ledger = BudgetLedger(options.ledger, options.key_store, accountant=accountants.pop())
        publication.check_binding(output, ledger)
        for p in pre.planned:
            publication.check_markers_in_ledger(output, p.release_id, ledger)
        return ledger, [ReleaseRequest(
            release_id=p.release_id, measures=p.measures, input_digest=_digest(pre, p),
            scopes=p.scopes, key_names=p.key_names, content_key=pre.job.content_key(
                pre.prepared, p, {n: pre.inputs[n] for n in (p.inputs or sorted(pre.inputs))}),
            consumes=release_consumption.for_ledger(pre.consumed[p.release_id]),
            metadata={"job": pre.job.name}) for p in pre.planned]
    except LedgerError as err:
        raise ReleaseRefused(str(err)) from None
    except OSError as err:
        raise ReleaseRefused(f"{pre.job.name}: an input or the ledger could not be read before "
                             f"the charge ({root_cause(err)}); nothing was charged") from None


def end_hold(reserved: Reserved) -> None:
    """The run's hold on its releases ends (whatever the outcome of the run; a failure to end
    it is a warning: the hold lapses when this process ends)."""
    if reserved.ledger is None or reserved.hold is None:
        return
    try:
        reserved.ledger.release_hold(reserved.hold)
    except Exception as err:  # noqa: BLE001 -- never hide the run's own outcome
        _LOG.warning("could not end this run's hold on its releases (%s); it lapses when this "
                     "process ends", root_cause(err))


def _testing_keys(seed: int, names: Sequence[str], exact: bool = False) -> dict:
    base = ReleaseKey.for_exact_testing(seed) if exact else ReleaseKey.for_testing(seed)
    return {name: base if name == "release" else base.derive(f"key:{name}") for name in names}


def _digest(pre: Preflight, planned: PlannedRelease) -> str:
    names = planned.inputs or sorted(pre.inputs)
    files = sorted(f for n in names for f in pre.inputs[n].files)
    config = {"job": pre.job.name, "release_id": planned.release_id, "config": planned.config}
    return input_digest(files, config, open_chunks=storage.size_and_chunks)


# --------------------------------------------------------------------------- 3. compute

def compute(reserved: Reserved) -> Computed:
    """One Beam pipeline reads each input once, builds every release and writes each output,
    sorted by its public order, and the release's row counters to the release's private staging
    folder; the counters are read back from staging. ``stage`` + ``run_pipeline`` + ``collect``
    (see the module docstring).

    Failure policy (:func:`_computation_failed`): any fault of the computation publishes
    nothing: the operator's failure record is written, and ReleaseFailed (exit 3) says the
    reservation stays (a corrected re-run takes it over without spending again)."""
    reserved.pre.progress.phase("compute")
    staging = stage(reserved)
    try:
        with reserved.pre.progress.ticking():
            run_pipeline(reserved.pre.beam_options, _graph(reserved, staging))
    except Exception as err:  # noqa: BLE001 -- any fault of the computation: nothing published
        raise _computation_failed(reserved, err) from None
    if reserved.pre.translate_only:
        return Computed(reserved=reserved, staging=staging, counters={})
    return collect(reserved, staging)


def stage(reserved: Reserved) -> Mapping[str, str]:
    """A fresh private staging folder per release (one attempt token for the run); staging of
    abandoned attempts at the same versions is deleted first."""
    root, attempt, staging = reserved.pre.places.staging, secrets.token_hex(4), {}
    for context in reserved.releases:
        rid, version = context.release_id, reserved.versions[context.release_id]
        for old in publication.staging_attempts(root, rid, version):
            storage.delete_tree(old)  # an abandoned attempt's outputs never survive
        staging[rid] = publication.staging_folder(root, rid, version, attempt)
        storage.make_private_dir(staging[rid])
    return staging


def _graph(reserved: Reserved, staging: Mapping[str, str]):
    """The run's Beam graph: every input read once, the job's releases, each output staged, and
    each release's row counters (pipelines.release.counters) staged beside its outputs."""
    pre = reserved.pre

    def build(pipeline):
        read = {name: pipeline | f"Read[{name}]" >> release_inputs.ReadInput(r, pre.job.name)
                for name, r in pre.inputs.items()}
        built = pre.job.build_all(pipeline, pre.prepared, read, reserved.releases)
        for context in reserved.releases:
            p = context.planned
            released = built[p.release_id]
            for spec in p.outputs:
                if spec.name not in released:
                    raise ValueError(f"{pre.job.name}: build() released no {spec.name!r}")
                (released[spec.name]
                 | f"Stage[{p.release_id}/{spec.name}]" >> release_outputs.WriteStaged(
                     staging[p.release_id], spec))
        counts = pipeline | "Counters" >> AllCounts()  # after every counting transform
        for context in reserved.releases:
            rid = context.release_id
            _ = counts | f"StageCounters[{rid}]" >> row_counters.StageCounters(
                staging[rid], pre.job.name, rid, pre.job.counter_namespaces)
    return build


def run_pipeline(options, build) -> object:
    """Build and run one Beam pipeline; returns its finished result (raises on failure). How a
    run goes on the chosen runner (a cluster for the run, checks of the built pipeline, what to
    close) is its runner profile's, through the seam (runners.seam)."""
    from runners.seam import run as run_on_runner

    return run_on_runner(options, build)


def collect(reserved: Reserved, staging: Mapping[str, str]) -> Computed:
    """Each release's row counters, read from its staging folder, where the pipeline wrote them
    (None for a release whose staging holds none). Reads staging and the reservation only,
    never the runner's result: it may run in another process than the pipeline's submitter.
    The rows read go to the run's progress lines."""
    counters = {c.release_id: row_counters.read_staged(staging[c.release_id])
                for c in reserved.releases}
    reserved.pre.progress.rows(rows_read(counters, sorted(reserved.pre.inputs)))
    return Computed(reserved=reserved, staging=staging, counters=counters)


def _computation_failed(reserved: Reserved, err: Exception,
                        what: str = "the computation") -> ReleaseFailed:
    """compute's failure policy (and every phase's after the charge, :func:`after_reservation`):
    record the failure for the operator, and name its root cause (errno text, the file it names,
    the step; the message only of faults whose messages name files, columns and counts, never
    content: :func:`pipelines.release.errors.root_cause`). The full detail goes to the debug
    log only."""
    pre = reserved.pre
    from runners.execution import JobFailed

    _LOG.debug("failure after the reservation", exc_info=err)
    cause = root_cause(err, shown=(release_inputs.InputReadError, IntegerSumOverflowError,
                                   JobFailed))
    _record_failure(reserved, cause, err)
    return ReleaseFailed(
        f"{pre.job.name}: {what} failed ({cause}); nothing was published"
        + ("" if pre.options.testing else "; the reservation stays and a corrected re-run takes "
           "it over without spending again") + f". Details: the operator report under "
        f"{pre.places.reports}")


def after_reservation(reserved: Reserved, err: Exception) -> ReleaseFailed:
    """The failure policy of every phase after the charge: a ReleaseFailed stands; any other
    fault -- whatever its class: a value error while describing a release, a refusal found too
    late -- published nothing new, and is ReleaseFailed (exit 3) naming its root cause, so that
    exit 2 always means "nothing charged"."""
    if isinstance(err, ReleaseFailed):
        return err
    return _computation_failed(reserved, err, what="the release")


def _record_failure(reserved: Reserved, cause: str, err: Exception) -> None:
    """The operator's record of a run that published nothing: the root cause, and the classes
    of the exceptions it came through (no message that could quote a file)."""
    root = reserved.pre.places.reports
    classes = [type(e).__name__ for e in exception_chain(err)]
    runner = getattr(err, "detail", "")  # a runner's own full message (runners.execution.JobFailed)
    for context in reserved.releases:
        body = {"release_id": context.release_id, "versioned_id": context.versioned_id,
                "status": "failed: nothing published", "detail": cause, "exceptions": classes,
                **({"runner_message": runner} if runner else {})}
        try:
            report.write_failure(body, root=root, release_id=context.release_id,
                                 version=reserved.versions[context.release_id])
        except Exception:  # noqa: BLE001 -- the failure itself is what the operator must see
            _LOG.warning("could not write the failure report", exc_info=True)


# --------------------------------------------------------------------------- submit and finalize

def start(reserved: Reserved, staging: Mapping[str, str]):
    """submit's compute: the run's graph started on its runner (``runners.seam.submit``:
    Dataflow creates the job and returns its id without waiting; a local engine runs the job to
    the end). Its counters are staged by the pipeline itself. Returns the job's handle.

    Failure policy: compute's (:func:`_computation_failed`: exit 3, the reservation stays and
    submitting again takes it over without spending)."""
    from runners.seam import submit as submit_on_runner

    reserved.pre.progress.phase("compute")
    try:
        with reserved.pre.progress.ticking():
            handle, _ = submit_on_runner(reserved.pre.beam_options, _graph(reserved, staging))
    except Exception as err:  # noqa: BLE001 -- any fault of the computation: nothing published
        raise _computation_failed(reserved, err) from None
    return handle


def find_submitted(pre: Preflight) -> Reserved:
    """finalize's reserve: the reservations a ``--submit_only`` run with the same flags made,
    found again with their keys after the same ownership checks; nothing is charged or written.

    Failure policy: no reservation for these flags (never submitted, or other input since) is
    ReleaseRefused (exit 2: this run charges nothing)."""
    pre.progress.phase("reserve")
    ledger, requests = _requests(pre)  # the output root's ownership checked there
    try:
        if not ledger.exists():
            raise LedgerError(f"ledger {ledger.path} does not exist")
        found = {r.release_id: r for r in ledger.find(requests)}
    except LedgerError as err:
        raise ReleaseRefused(f"--finalize found no submitted release for these flags ({err}): "
                             "run them with --submit_only first; nothing was charged")
    contexts = tuple(ReleaseContext(planned=p, keys=found[p.release_id].keys,
                                    versioned_id=found[p.release_id].versioned_id,
                                    testing=False) for p in pre.planned)
    return Reserved(pre=pre, releases=contexts, ledger=ledger, reservations=found,
                    versions={rid: r.version for rid, r in found.items()})


def await_job(reserved: Reserved, handle):
    """finalize's wait: the submitted job's finished result (``runners.seam.wait``:
    Dataflow's job polled through the Dataflow client until it ends; a local engine's job ended
    in the submitting process: None).

    Failure policy: a job that failed or was cancelled is compute's failure (exit 3 with the
    runner's message; the reservation stays: submitting again takes it over)."""
    from runners.seam import wait

    reserved.pre.progress.phase("compute")
    try:
        with reserved.pre.progress.ticking():
            return wait(reserved.pre.beam_options, handle)
    except Exception as err:  # noqa: BLE001 -- the job's fault: nothing published
        raise _computation_failed(reserved, err) from None


def published_before(reserved: Reserved, staging: Mapping[str, str]):
    """finalize after an earlier finalize (or a run of the same flags) published some releases:
    their staging attempts are gone and they are out with the reservation's keys. Returns
    (their outcomes, reproduced -- each ledger record completed if it was not; the Reserved of
    the releases still staged, or None).

    Failure policy: a release neither staged nor published (its attempt was replaced by another
    run that published nothing) is ReleaseFailed (exit 3): submit again."""
    out, rest = [], []
    for context in reserved.releases:
        if storage.list_files(staging[context.release_id]):
            rest.append(context)
            continue
        outcome = _reproduced(reserved, context)
        if outcome is None:
            raise ReleaseFailed(f"{context.versioned_id}: the submitted job's staged outputs "
                                f"({staging[context.release_id]}) are gone and it is not "
                                "published: submit it again (nothing more is spent)")
        out.append(outcome)
    return out, (dataclasses.replace(reserved, releases=tuple(rest)) if rest else None)


def _reproduced(reserved: Reserved, context: ReleaseContext) -> Optional[ReleaseOutcome]:
    """The outcome of a release published with the reservation's keys (None if it is not)."""
    pre, rid = reserved.pre, context.release_id
    reservation, version = reserved.reservations[rid], reserved.versions[rid]
    folder = publication.release_folder(pre.places.output, rid, version, False)
    marker = publication.read_marker(folder)
    if marker is None or marker.get("key_fingerprints") != {
            n: r.fingerprint for n, r in reservation.key_refs.items()}:
        return None
    files = {name: output["sha256"] for name, output in marker["outputs"].items()}
    reserved.ledger.begin_publish(reservation)  # no-op once pinned
    reserved.ledger.commit(reservation, folder, files)  # no-op once committed
    path = report.report_path(pre.places.reports, rid, version)
    data = storage.read_bytes(path)
    operator = {**json.loads(data.decode("utf-8")), "status": "reproduced"} if data else None
    return ReleaseOutcome(release_id=rid, versioned_id=context.versioned_id, version=version,
                          folder=folder, status="reproduced", files=files, marker=marker,
                          report_path=path if data else None, report=operator)


# --------------------------------------------------------------------------- 4. rule

def rule(computed: Computed) -> Ruled:
    """The row rules over each release's counters: the job's dropped-rows shares, and the
    operator's alerts made from them (:func:`pipelines.release.counters.alerts`: an input
    without eligible rows, all or more than ``--max_dropped_fraction`` of them dropped; a
    release whose staging holds no counters).

    Failure policy: none -- these rules are operator-only and never refuse or withhold a
    release. They read exact raw counts, so a decision taken from them would let one privacy
    unit's faulty rows decide whether a release is published (pipelines/release/__init__.py,
    "Publication decisions"). A rule that may withhold a release belongs here only as a DP
    decision: counts computed as pipeline output, noised under a measure planned and charged
    with the release, its threshold stated in the guarantee."""
    reserved = computed.reserved
    pre = reserved.pre
    pre.progress.phase("rule")
    counts, shares, alerts = {}, {}, {}
    for context in reserved.releases:
        rid, staged = context.release_id, computed.counters.get(context.release_id)
        counts[rid] = dict(staged or {})
        shares[rid] = pre.job.dropped_rows(pre.prepared, counts[rid]) if staged is not None else {}
        alerts[rid] = (row_counters.NO_COUNTERS,) if staged is None else tuple(row_counters.alerts(
            shares[rid], context.planned.inputs or sorted(pre.inputs),
            pre.options.max_dropped_fraction))
    return Ruled(computed=computed, counts=counts, shares=shares, alerts=alerts)


# --------------------------------------------------------------------------- 5. publish

def publish(ruled: Ruled) -> Published:
    """Every release's marker is staged last in its folder; every release is checked
    publishable (never replacing different bytes) before any is touched; then each is pinned in
    the ledger (:func:`pin`) and published atomically, its marker last.

    Failure policy: before the first release is out, the fault propagates (a publication
    conflict is ReleaseFailed, exit 3; nothing new is published). Part-way through a
    multi-release run, the releases already out are committed (:func:`commit`) and
    ReleaseFailed names them: re-running the same command reproduces them byte for byte and
    publishes the rest without spending again."""
    reserved = ruled.computed.reserved
    reserved.pre.progress.phase("publish")
    staged = [_stage_marker(ruled, context) for context in reserved.releases]
    pre = reserved.pre
    testing = pre.options.testing
    # Again after the computation: a symbolic link planted in the output tree meanwhile.
    publication.check_tree(pre.places.output, pre.places.staging,
                           [c.release_id for c in reserved.releases], testing,
                           reports=pre.places.reports, error=ReleaseFailed)
    for release in staged:
        publication.check_publishable(ruled.computed.staging[release.context.release_id],
                                      release.folder, testing=testing)
    out = []
    for release in staged:
        rid = release.context.release_id
        try:
            pin(reserved, rid)
            outcome = publication.publish(ruled.computed.staging[rid], release.folder,
                                          testing=testing, root=pre.places.output)
        except Exception as err:  # noqa: BLE001
            if not out:
                raise
            raise _published_part_way(Published(ruled=ruled, releases=tuple(out)), rid, err)
        status = "testing" if testing else ("reproduced" if outcome == "identical" else "released")
        out.append(PublishedRelease(context=release.context, folder=release.folder,
                                    status=status, files=release.files, marker=release.marker))
    return Published(ruled=ruled, releases=tuple(out))


def _stage_marker(ruled: Ruled, context: ReleaseContext) -> PublishedRelease:
    """Decode the staged outputs (for the public summary), digest them, write the marker."""
    reserved = ruled.computed.reserved
    pre, rid = reserved.pre, context.release_id
    folder = ruled.computed.staging[rid]
    tables, files = {}, {}
    for spec in context.planned.outputs:
        data = storage.read_bytes(storage.join(folder, spec.name))
        if data is None:
            raise ReleaseFailed(f"{pre.job.name}: {spec.name} of {rid} was not written")
        tables[spec.name] = release_outputs.decode(data, spec)
        files[spec.name] = storage.sha256_of(storage.join(folder, spec.name))
    marker = report.marker(job=pre.job, prepared=pre.prepared, context=context,
                           version=reserved.versions[rid], files=files, tables=tables,
                           ledger=reserved.ledger, reservation=reserved.reservations.get(rid))
    storage.write_bytes(storage.join(folder, publication.MARKER), publication.marker_bytes(marker))
    final = publication.release_folder(pre.places.output, rid, reserved.versions[rid],
                                       context.testing)
    return PublishedRelease(context=context, folder=final, status="staged", files=files,
                            marker=marker)


def pin(reserved: Reserved, release_id: str) -> None:
    """Pin the release's record (its key and input fixed) before its first byte is published
    (a testing run has no record)."""
    reservation = reserved.reservations.get(release_id)
    if reservation is not None:
        reserved.ledger.begin_publish(reservation)


def _published_part_way(published: Published, release_id: str, err: Exception) -> ReleaseFailed:
    """publish's failure policy part-way: exit 0 means released and anything else nothing new,
    so the operator is told exactly which releases are out (and those are committed)."""
    job = published.ruled.computed.reserved.pre.job
    commit(published)
    out = ", ".join(r.context.release_id for r in published.releases)
    return ReleaseFailed(
        f"{job.name}: published {out}, but {release_id} could not be published "
        f"({type(err).__name__}); re-run the same command: it reproduces what is published "
        "byte for byte and publishes the rest without spending again")


# --------------------------------------------------------------------------- 6. commit

def commit(published: Published) -> RunResult:
    """Each published release's ledger record is completed (:func:`commit_record`) and its
    operator report written beside the ledger (:func:`write_report`).

    Failure policy: the releases are out, so nothing is undone: a failing commit exits
    ``EXIT_NOT_COMMITTED`` (4, naming the errno and file of an OS error), and the next run of the
    same command completes the record without spending; a failing operator report is a warning
    (exit 0)."""
    ruled = published.ruled
    pre = ruled.computed.reserved.pre
    pre.progress.phase("commit")
    results, warnings, uncommitted = [], [], False
    for release in published.releases:
        rid = release.context.release_id
        try:
            commit_record(published, release)
        except Exception as err:  # noqa: BLE001
            _LOG.debug("ledger commit failed", exc_info=True)
            uncommitted = True
            warnings.append(f"{rid} is published but its ledger record was not committed "
                            f"({root_cause(err)}); re-run the same command to complete it "
                            f"(nothing more is spent; exit {EXIT_NOT_COMMITTED})")
        operator = path = None
        try:
            operator, path = write_report(published, release)
        except Exception as err:  # noqa: BLE001
            _LOG.debug("operator report failed", exc_info=True)
            warnings.append(f"{rid} is published but its operator report could not be written "
                            f"({type(err).__name__})")
        results.append(ReleaseOutcome(
            release_id=rid, versioned_id=release.context.versioned_id,
            version=ruled.computed.reserved.versions[rid], folder=release.folder,
            status=release.status, files=release.files, marker=release.marker,
            report_path=path, report=operator))
    for warning in warnings:
        _LOG.warning("%s", warning)
    alerts = tuple(f"{r.context.release_id}: {a}" for r in published.releases
                   for a in ruled.alerts[r.context.release_id])
    for alert in alerts:
        _LOG.warning("operator alert (published): %s", alert)
    _LOG.info("%s: %d release(s) in %.1f s", pre.job.name, len(results), time.time() - pre.started)
    code = pre.options.alert_exit_code if alerts and pre.options.alert_exit_code else 0
    if uncommitted:
        code = EXIT_NOT_COMMITTED
    return RunResult(job=pre.job.name, releases=results, counters=dict(ruled.counts),
                     warnings=tuple(warnings), alerts=alerts, exit_code=code)


def commit_record(published: Published, release: PublishedRelease) -> None:
    """The ledger record of a published release completed (a testing run has none)."""
    reserved = published.ruled.computed.reserved
    reservation = reserved.reservations.get(release.context.release_id)
    if reservation is not None:
        reserved.ledger.commit(reservation, release.folder, release.files)


def write_report(published: Published, release: PublishedRelease):
    """The operator's report of a published release: (report, path)."""
    ruled = published.ruled
    reserved = ruled.computed.reserved
    pre, rid = reserved.pre, release.context.release_id
    operator = report.operator_report(
        context=release.context, marker=release.marker, status=release.status,
        folder=release.folder, counters=ruled.counts[rid], shares=ruled.shares[rid],
        alerts=ruled.alerts[rid], ledger=reserved.ledger,
        reservation=reserved.reservations.get(rid), started=pre.started,
        finalized=bool(pre.options.finalize), progress=pre.progress.lines)
    path = report.write(operator, root=pre.places.reports, release_id=rid,
                        version=reserved.versions[rid], job=pre.job)
    return operator, path
