"""What a job gives the release layer, and what the release layer gives a job.

A job is a :class:`Job` subclass with a frozen, keyword-only request type (its parameters plus an
``options: ReleaseOptions`` field). It prepares the request once per run (:meth:`Job.prepare`: its
configuration read and validated, its targets and parameters resolved, into a frozen
:class:`Prepared`), declares its inputs (:class:`~pipelines.release.inputs.InputSpec`), plans its
releases (:class:`PlannedRelease`: id, measures, budget scopes, outputs, configuration) and builds
the Beam graph of one release from Arrow-table PCollections and the release's keys
(:class:`ReleaseContext`). Every hook gets the same :class:`Prepared`, so nothing is loaded
twice. Everything else -- preflight, ledger, keys, staging, publication, reports, the CLI -- is
the release layer's.
"""
from __future__ import annotations

import logging
import math
import sys
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

import pyarrow as pa

from accounting import guarantee
from accounting.keys import ReleaseKey
from accounting.ledger import Scope
from accounting.measures import Measure
from accounting.shared_budget import SharedBudget
from pipelines.release import names
from pipelines.release.errors import ALERT_EXIT_CODES, ReleaseRefused


@dataclass(frozen=True, kw_only=True)
class ReleaseOptions:
    """The options every job shares (the CLI's ``--output``, ``--ledger``, ...)."""

    output: Optional[str] = field(default=None, metadata={
        "help": "output root (local or gs://): a release is published under "
                "OUTPUT/<release id>/v<version>/; required (except with --explain)"})
    ledger: Optional[str] = field(default=None, metadata={
        "help": "budget ledger file (local or gs://); required for a release"})
    key_store: Optional[str] = field(default=None, metadata={
        "help": "where release keys are kept (local folder or gs:// prefix, private); required "
                "for a release"})
    testing_seed: Optional[int] = field(default=None, metadata={
        "help": "NOT A RELEASE: a public, non-secret key from this seed; no ledger; output goes "
                "under OUTPUT/testing-not-a-release/"})
    exact_testing: bool = field(default=False, metadata={
        "cli": False,
        "help": "TESTS ONLY (no CLI flag): with testing_seed, a noise-free testing key "
                "(ReleaseKey.for_exact_testing) for the neighbouring-pair audits' exact mode"})
    new_release: bool = field(default=False, metadata={
        "help": "the input of a published release changed: charge a new version with a fresh key"})
    report_dir: Optional[str] = field(default=None, metadata={
        "help": "where the operator's report.json/report.txt go (default: reports/ beside the "
                "ledger; they hold raw-data counts, keep them private)"})
    staging_dir: Optional[str] = field(default=None, metadata={
        "help": "private staging root (default: the ledger's folder/staging; must not be public)"})
    max_dropped_fraction: float = field(default=0.5, metadata={
        "help": "alert the operator when more than this share of an input's eligible rows was "
                "dropped by the row rules (also alerted: all dropped, no eligible rows, no "
                "counters). An alert never stops a release: it is published, and the alert "
                "goes to the operator report and stderr only"})
    alert_exit_code: Optional[int] = field(default=None, metadata={
        "help": "exit with this code (4..125) instead of 0 when a release was published with "
                "an operator alert: a DATA-DEPENDENT signal (it comes from raw row counts) for "
                "the scheduler only -- never publish it, never decide a publication from it "
                "(default: exit 0)"})
    explain: bool = field(default=False, metadata={
        "help": "print each planned release's budget split, measures and guarantee (the "
                "SharedBudget explain) and exit: no input is read, nothing is charged or "
                "published; needs no --output, --ledger or --key_store"})
    submit_only: bool = field(default=False, metadata={
        "help": "reserve, stage and submit the pipeline, record its job handle with the "
                "reservation and exit 0 ('submitted'): on Dataflow at once with the job id, on a "
                "local runner once the job ran; nothing is published until --finalize"})
    finalize: bool = field(default=False, metadata={
        "help": "with the flags of a --submit_only run: find its reservation, wait for its job, "
                "apply the row rules, publish and commit (safe to repeat or run twice at once: "
                "a published release is reproduced, nothing more is spent)"})
    log_level: Optional[str] = field(default=None, metadata={
        "help": "the console's log level (DEBUG, INFO, WARNING, ERROR, CRITICAL; default: "
                "LOGLEVEL, else WARNING); the runners' and libraries' loggers (Beam, Arrow, "
                "...: runners.seam.LIBRARIES) stay at WARNING unless it asks for more"})
    pipeline_args: tuple = field(default=(), metadata={"cli": False})

    def __post_init__(self):
        if not self.explain and (not isinstance(self.output, str) or not self.output):
            raise ReleaseRefused("--output is required")
        if self.testing_seed is not None:
            if isinstance(self.testing_seed, bool) or not isinstance(self.testing_seed, int):
                raise ReleaseRefused("--testing_seed must be an integer")
            if self.ledger or self.key_store or self.new_release:
                raise ReleaseRefused("--testing_seed makes no release: give it without --ledger, "
                                     "--key_store and --new_release")
        elif self.exact_testing:
            raise ReleaseRefused("exact_testing (noise-free) is a testing mode: it needs "
                                 "testing_seed and can never make a release")
        elif not (self.ledger and self.key_store) and not self.explain:
            raise ReleaseRefused("a release needs --ledger and --key_store (or --testing_seed "
                                 "for a run that is not a release)")
        if self.submit_only and self.finalize:
            raise ReleaseRefused("--submit_only and --finalize are two runs: submit first, then "
                                 "finalize with the same flags")
        if (self.submit_only or self.finalize) and self.testing_seed is not None:
            raise ReleaseRefused("--submit_only and --finalize make a release in two runs; a "
                                 "--testing_seed run is not a release: run it whole")
        if not (isinstance(self.max_dropped_fraction, (int, float))
                and 0 <= self.max_dropped_fraction < 1):
            raise ReleaseRefused("--max_dropped_fraction must be in [0, 1)")
        if self.alert_exit_code is not None and (
                isinstance(self.alert_exit_code, bool) or not isinstance(self.alert_exit_code, int)
                or not ALERT_EXIT_CODES[0] <= self.alert_exit_code <= ALERT_EXIT_CODES[1]):
            raise ReleaseRefused(f"--alert_exit_code must be an integer in "
                                 f"{ALERT_EXIT_CODES[0]}..{ALERT_EXIT_CODES[1]} (0-4 have their "
                                 "own meanings; 126 and above are the shell's)")
        if self.log_level is not None:
            if not isinstance(self.log_level, str) \
                    or not isinstance(logging.getLevelName(self.log_level.upper()), int):
                raise ReleaseRefused("--log_level must be DEBUG, INFO, WARNING, ERROR or CRITICAL")
            object.__setattr__(self, "log_level", self.log_level.upper())
        object.__setattr__(self, "pipeline_args", tuple(self.pipeline_args))

    @property
    def testing(self) -> bool:
        return self.testing_seed is not None


@dataclass(frozen=True, kw_only=True)
class OutputSpec:
    """One released file: its name (the extension gives the format: .parquet, .csv, .jsonl), the
    public order of its rows, its schema, and which columns hold noisy values.

    ``errors``: per noisy value column, a public statement of its error, published in
    ``RELEASE.json`` and the catalog: its error columns (``<c>_std``, ``<c>_ci95_low``,
    ``<c>_ci95_high``: :mod:`transforms.error_columns`) and how they follow from the stated
    noise, or why the guarantee gives no interval from public information alone."""

    name: str
    sort_by: Sequence[str]
    schema: pa.Schema
    noisy: Sequence[str] = ()
    description: str = ""
    errors: Any = ()  # {column: statement}, kept as sorted (column, statement) pairs

    def __post_init__(self):
        names.check_segment(self.name, "output file name")
        if not self.name.endswith((".parquet", ".csv", ".jsonl")):
            raise ValueError(f"output {self.name!r}: use .parquet, .csv or .jsonl")
        object.__setattr__(self, "errors", tuple(sorted(dict(self.errors).items())))
        missing = [c for c in [*self.sort_by, *self.noisy, *dict(self.errors)]
                   if c not in self.schema.names]
        if missing:
            raise ValueError(f"output {self.name!r}: {missing} not in its schema")
        object.__setattr__(self, "sort_by", tuple(self.sort_by))
        object.__setattr__(self, "noisy", tuple(self.noisy))

    @property
    def format(self) -> str:
        return self.name.rsplit(".", 1)[1]


@dataclass(frozen=True, kw_only=True)
class PlannedRelease:
    """One release a run makes.

    ``measures``: what it spends (each states mechanism, neighbouring relation, sensitivity and
    cost); ``budget``: a job with several measures splits its budget through an
    :class:`~accounting.shared_budget.SharedBudget` whose parts are spent before planning: the
    release's measures and accountant are then the budget's, and its guarantee is the budget's
    ``guarantee()`` (one explain/guarantee path for library users and jobs); a release that spends nothing (post-processing of published releases, or a simulation
    that publishes no statistic) has no measures, composes to (0, 0)
    (``accounting.guarantee.compose([])``) and must say why in ``spends_nothing`` (its
    ``scopes`` may then be empty); ``scopes``: the ledger budgets it is charged to;
    ``accountant``: how its measures are composed in reports and in the ledger; ``config``:
    everything that shapes the release, hashed with the input files into the digest its keys are
    bound to; ``parameters``: the
    public parameters stated in the published release metadata; ``inputs``: the inputs it reads
    (default: all); ``key_names``: independent keys it needs.
    """

    release_id: str
    scopes: Sequence[Scope]
    outputs: Sequence[OutputSpec]
    config: Mapping[str, Any]
    measures: Sequence[Measure] = ()
    budget: Optional[SharedBudget] = field(default=None, repr=False, compare=False)
    parameters: Mapping[str, Any] = field(default_factory=dict)
    accountant: Optional[str] = None
    inputs: Optional[Sequence[str]] = None
    key_names: Sequence[str] = ("release",)
    guarantee_covers: str = ""
    spends_nothing: str = ""

    def __post_init__(self):
        names.check_release_id(self.release_id)
        if self.budget is not None:
            if not isinstance(self.budget, SharedBudget):
                raise TypeError(f"release {self.release_id!r}: budget must be a SharedBudget")
            spent = tuple(self.budget.measures())
            if self.measures and tuple(self.measures) != spent:
                raise ValueError(f"release {self.release_id!r}: measures differ from its budget's "
                                 "(give the SharedBudget alone)")
            if self.accountant is not None and self.accountant != self.budget.accountant:
                raise ValueError(f"release {self.release_id!r}: accountant {self.accountant!r} "
                                 f"differs from its budget's {self.budget.accountant!r}")
            object.__setattr__(self, "measures", spent)
            object.__setattr__(self, "accountant", self.budget.accountant)
        elif self.accountant is None:
            object.__setattr__(self, "accountant", "basic")
        if not self.measures and not self.spends_nothing:
            raise ValueError(f"release {self.release_id!r} has no measures: a release that "
                             "spends nothing says why in spends_nothing")
        if self.measures and self.spends_nothing:
            raise ValueError(f"release {self.release_id!r} has measures and spends_nothing")
        if self.measures and not self.scopes:
            raise ValueError(f"release {self.release_id!r} spends budget but has no scopes")
        guarantee.check_accountant(self.accountant)
        object.__setattr__(self, "measures", tuple(self.measures))
        object.__setattr__(self, "scopes", tuple(self.scopes))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "key_names", tuple(self.key_names))

    def guarantee(self):
        """This release's (epsilon, delta): its SharedBudget's guarantee (at the budget's
        delta), else its measures composed at the delta they declare."""
        return self.stated().guarantee

    def stated(self) -> guarantee.Stated:
        """:meth:`guarantee` with the accountant its figure comes from (``pure``, ``basic``,
        ``zcdp`` or ``pld``; ``accountant`` is the rule the job chose)."""
        if self.budget is not None:
            return self.budget.stated()
        return guarantee.stated(self.measures, self.accountant)

    def explain(self) -> str:
        """The release's budget and measures, readable (the SharedBudget's explain when it has
        one; else one line per measure and the guarantee)."""
        if self.budget is not None:
            return self.budget.explain()
        g = self.guarantee()
        lines = [f"{m.name}: {m.mechanism}, epsilon={m.epsilon:.4g}, delta={m.delta:.3g}"
                 for m in self.measures]
        return "\n".join(lines + [f"release: {guarantee.describe(g, self.accountant)}"])

    def guarantee_json(self) -> dict:
        g = self.stated()
        rho = [m.rho for m in self.measures if m.rho is not None]
        return {"accountant": self.accountant, "figure_accountant": g.accountant,
                "epsilon": g.epsilon, "delta": g.delta,
                "rho_of_zcdp_measures": math.fsum(rho) if rho else None,
                "covers": self.guarantee_covers or (
                    f"nothing: this release spends no budget ({self.spends_nothing})"
                    if self.spends_nothing else "this release (its measures composed)"),
                **({"spends_nothing": self.spends_nothing} if self.spends_nothing else {}),
                "ledger_scopes": [{"name": s.name, "epsilon": s.budget.epsilon,
                                   "delta": s.budget.delta, "description": s.description}
                                  for s in self.scopes]}


@dataclass(frozen=True, kw_only=True)
class ReleaseContext:
    """What ``Job.build`` gets for one release: its plan, keys and mode."""

    planned: PlannedRelease
    keys: Mapping[str, ReleaseKey] = field(repr=False)
    versioned_id: str
    testing: bool
    #: {namespace: pipelines.release.consumption.Consumed}: the rows to remove and the budgets
    #: granted for what the release consumes (see ``Job.consumes``).
    consumed: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @property
    def release_id(self) -> str:
        return self.planned.release_id

    @property
    def key(self) -> ReleaseKey:
        return self.keys["release"]

    def label(self, name: str) -> str:
        """A transform label unique to this release (one pipeline may build several)."""
        return f"{name}[{self.release_id}]"

    def counters(self, job: str, input_name: str):
        """Row counters of ``input_name`` for this release (see pipelines.release.counters), for
        a :class:`transforms.counting.CountingDoFn` to hold and count on, applied with
        :class:`transforms.counting.Counted` (counted anywhere else, they raise)."""
        from pipelines.release.counters import RowCounters

        return RowCounters(job, input_name, release_id=self.release_id)


@dataclass(frozen=True, kw_only=True)
class Prepared:
    """A request as a job's hooks read it: made once per run by :meth:`Job.prepare` (by the
    release lifecycle and by ``--explain``) and passed to every hook.

    A job with a configuration subclasses it (frozen, keyword-only) with typed fields -- the
    loaded configuration, the releases it targets, parameters derived from the flags -- so no
    hook loads or parses anything again. Preparing reads configuration files only, never input
    data, and raises ReleaseRefused (or ValueError) for what it cannot accept."""

    request: Any = field(repr=False)

    @property
    def options(self) -> ReleaseOptions:
        return self.request.options


class Job:
    """Base class of a job (see the module docstring). Subclasses set ``name`` and
    ``request_type`` and implement ``inputs``, ``plan`` and ``build`` (or ``build_all``); a job
    with a configuration overrides ``prepare``. Every hook gets the run's :class:`Prepared`."""

    name: str = ""
    request_type: type = None
    description: str = ""
    #: Counter namespaces of library transforms the job uses that count raw-data facts in a
    #: namespace of their own (e.g. ``("ara",)``): read into the run's counters as
    #: ``<namespace>.<name>`` (see pipelines.release.counters.select).
    counter_namespaces: Sequence[str] = ()

    @property
    def command(self) -> str:
        """The module ``python -m`` runs for this job: the job's module, or its package when the
        module is a product package's ``job`` (``pipelines.centralnotice``). The name in the
        ledger stays :attr:`name`: moving a module never renames a job."""
        module = type(self).__module__
        if module == "__main__":  # run as ``python -m pipelines.PRODUCT.NAME``
            module = getattr(sys.modules["__main__"].__spec__, "name", module)
        return module[:-len(".job")] if module.endswith(".job") else module

    def prepare(self, request) -> Prepared:
        """Read and validate what the request names (configuration files, parameters): once
        per run. The default keeps the request alone."""
        return Prepared(request=request)

    def check(self, prepared: Prepared) -> None:
        """Checks a run needs beyond its plan, before any charge (input files' schemas, records
        a job holds in memory); ``--explain`` skips them (it reads no input). Raise
        ReleaseRefused / ValueError."""

    def inputs(self, prepared: Prepared) -> Sequence:
        raise NotImplementedError

    def plan(self, prepared: Prepared) -> Sequence[PlannedRelease]:
        raise NotImplementedError

    def build(self, pipeline, prepared: Prepared, inputs: Mapping[str, Any],
              release: ReleaseContext) -> Mapping[str, Any]:
        """The Beam graph of one release: {output file name: PCollection of released tables}.

        ``inputs``: {input name: PCollection of Arrow tables with the declared columns}. Label
        transforms with ``release.label(...)``: one pipeline may build several releases.
        """
        raise NotImplementedError

    def build_all(self, pipeline, prepared: Prepared, inputs: Mapping[str, Any],
                  releases: Sequence[ReleaseContext]) -> Mapping[str, Mapping[str, Any]]:
        """{release id: outputs} of every release of the run; by default ``build`` per release.
        Override when the releases share one computation (e.g. one pass over the rows)."""
        out = {}
        for release in releases:
            wanted = {n: inputs[n] for n in (release.planned.inputs or sorted(inputs))}
            out[release.release_id] = self.build(pipeline, prepared, wanted, release)
        return out

    def content_key(self, prepared: Prepared, planned: PlannedRelease,
                    inputs: Mapping[str, Any]):
        """A digest of content that may be released only once under any id (default: none).
        ``inputs``: {input name: its preflighted ``ResolvedInput`` (files, formats, compression,
        columns)}; read files with ``pipelines.release.inputs.open_input``."""
        return None

    def consumes(self, prepared: Prepared, planned: PlannedRelease,
                 inputs: Mapping[str, Any]) -> Sequence:
        """What the release aggregates that may be aggregated at most once across all batches
        (report ids, sources, clients): ``pipelines.release.consumption.Consumes`` per namespace
        (default: nothing). Read from ``inputs`` (as for ``content_key``) before the charge; the
        release layer refuses repeats and ids earlier batches consumed, or hands the rows to
        remove to ``build`` in ``release.consumed`` (see pipelines/release/consumption.py)."""
        return ()

    def dropped_rows(self, prepared: Prepared, counters: Mapping[str, int]) -> Mapping[str, dict]:
        """Per input: eligible rows, dropped rows, share and ``reasons`` (the counters that
        dropped them): the dropped-rows rule's input. The default reads the counter convention
        of pipelines.release.counters; a job whose transforms count otherwise overrides it."""
        from pipelines.release.counters import dropped_share

        return dropped_share(counters)

    def public_summary(self, prepared: Prepared, planned: PlannedRelease,
                       tables: Mapping[str, pa.Table]) -> dict:
        """Public facts of the released tables for the release metadata (e.g. keys released)."""
        return {name: {"rows": table.num_rows} for name, table in tables.items()}

    def report_lines(self, summary: Mapping) -> list[str]:
        """Extra lines for the operator's report.txt, rendered from the public ``summary``
        alone (a stored report is re-rendered without a run)."""
        return []

    def planned(self, request) -> list[PlannedRelease]:
        """The releases ``request`` would make (prepared once, checked, planned): for callers
        that want a job's plan without running it (audits, notebooks)."""
        prepared = self.prepare(request)
        self.check(prepared)
        return list(self.plan(prepared))
