"""One way to put any pipeline of this project on a runner: ``--runner`` plus Beam's own options.

Every pipeline main passes the arguments it does not know itself to :func:`pipeline_options_for`
and runs through the runner seam (:func:`runners.seam.run`)::

    known, beam_args = parser.parse_known_args(argv)
    result = runners.seam.run(pipeline_options_for(beam_args), build)

which applies the profile of the chosen runner: defaults that make that runner work here (local
engines, no Docker, cached jars and binaries), checks that what a remote runner needs is there,
fills the options DoFns take their threads and batch sizes from
(:class:`transforms.parallel.ExecutionOptions`) and owns how a run goes on the runner (its
:class:`~runners.execution.Execution`: a cluster for the run, checks of the built pipeline, what
to close). Anything given explicitly on the command line wins over a profile default. The
profiles:

* ``DirectRunner`` (the default) — deterministic: Beam's DirectRunner tries Prism first and
  silently falls back to the FnApiRunner, so this profile picks one itself: the FnApiRunner (the
  embedded runner), or PrismRunner when ``--prism_location`` is given.
* ``FnApiRunner`` — the embedded runner, as is. With one worker (``--direct_num_workers=1``, Beam's
  default) it runs a job on one core, so its DoFns run their per-element work on the cores, at
  most :data:`transforms.parallel.MAX_THREADS` (:func:`transforms.parallel.default_threads`:
  chosen for any pipeline on the in-process engine, a profile's or a user's plain one).
* ``PrismRunner`` — LOOPBACK workers; ``--prism_location`` defaults to the binary built by
  ``python -m runners.fetch prism`` if it is there (otherwise Beam downloads a release binary);
  the binary is found before anything runs (:mod:`runners.prism`: a missing one is refused with
  Beam's message);
  each run gets its own Prism job server (``disable_prism_server_singleton``: Beam's
  per-process server keeps the options of the first Prism attempt, even a failed one).
* ``FlinkRunner`` — embedded mini cluster (``--flink_master=[local]``), LOOPBACK, parallelism 2,
  ``--flink_version`` defaulting to the newest cached job server jar and ``--flink_job_server_jar``
  to that jar (``python -m runners.fetch flink``).
* ``SparkRunner`` — ``--spark_master_url=local[2]``, LOOPBACK, ``--spark_job_server_jar`` from
  the cache (``python -m runners.fetch spark``).
* ``DaskRunner`` — Beam's Dask runner (``apache_beam.runners.dask.dask_runner.DaskRunner``, which
  Beam does not know by its short name) on the scheduler at ``--dask_client_address``, or on a
  local cluster of ``--dask_local_workers`` worker processes (default 2) started and shut down
  around the run (:mod:`runners.dask_cluster`). The project's translation
  (:mod:`runners.dask_runner`) keeps what a DoFn emits in ``finish_bundle`` and its tagged
  outputs apart (the release layer's row counters are both); Beam's own runner, by its full name,
  does neither and is refused for a pipeline that needs them. DoFns get one thread
  (``--dofn_threads=1``: the workers' threads run partitions in parallel).
* Remote Flink and Spark masters and Dataflow get ``--sdk_container_image`` from
  ``$BEAM_DP_WORKER_IMAGE`` when it is set (the image the repository's Dockerfile builds).
* ``DataflowRunner`` — requires ``--project``, ``--region`` and a ``gs://`` ``--temp_location``;
  ships this project to the workers with ``--setup_file`` (the repository's setup.py) unless a
  custom ``--sdk_container_image`` is given; ``--sdk_location=default`` (the container's SDK);
  ``save_main_session`` off (the pipelines live in importable modules). A job submitted here is
  awaited by another process through the Dataflow client (:mod:`runners.dataflow_jobs`).

``python -m runners.profiles --runner FlinkRunner`` prints the options a run would get.
"""
from __future__ import annotations

import dataclasses
import logging
import os
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

from runners import cache
from runners.dask_cluster import DASK_RUNNER, DaskExecution, is_dask
from runners.dataflow_jobs import DataflowExecution
from runners.execution import Execution
from runners.prism import PrismExecution
# The options view the profiles fill (--dofn_threads, --dofn_batch_rows): defined where the DoFns
# read it, imported here so that Beam knows its flags wherever options are built.
from transforms.parallel import ExecutionOptions  # noqa: F401

_LOGGER = logging.getLogger(__name__)

REPO_SETUP_FILE = Path(__file__).resolve().parent.parent / "setup.py"

_ALIASES = {
    "direct": "DirectRunner", "directrunner": "DirectRunner",
    "fnapi": "FnApiRunner", "fnapirunner": "FnApiRunner",
    "prism": "PrismRunner", "prismrunner": "PrismRunner",
    "flink": "FlinkRunner", "flinkrunner": "FlinkRunner",
    "spark": "SparkRunner", "sparkrunner": "SparkRunner",
    "dataflow": "DataflowRunner", "dataflowrunner": "DataflowRunner",
    "dask": "DaskRunner", "daskrunner": "DaskRunner",
}


def canonical_runner(name: str | None) -> str:
    """The profile name for ``name`` (case-insensitive, "Runner" suffix optional)."""
    if not name:
        return "DirectRunner"
    return _ALIASES.get(name.lower(), name)


def given_options(argv: Sequence[str]) -> dict[str, str | None]:
    """Options present on a command line, ``--a_b=v`` / ``--a-b v`` / ``--flag`` alike.

    The value is the one written after ``=`` or as the next token (None for a bare flag); the last
    occurrence wins, as in argparse.
    """
    found: dict[str, str | None] = {}
    tokens = list(argv)
    for i, token in enumerate(tokens):
        if not token.startswith("--") or token == "--":
            continue
        name, eq, value = token[2:].partition("=")
        name = name.replace("-", "_")
        if eq:
            found[name] = value
        elif i + 1 < len(tokens) and not tokens[i + 1].startswith("--"):
            found[name] = tokens[i + 1]
        else:
            found[name] = None
    return found


@dataclasses.dataclass(frozen=True, kw_only=True)
class Resolved:
    """The outcome of a profile: the Beam runner to use and the full argument list."""
    profile: str
    runner: str
    argv: list[str]
    notes: list[str]


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunnerProfile:
    name: str
    summary: str
    # (option, default, why): default may be a callable of the given options returning a value
    # or None (no default applies).
    defaults: tuple[tuple[str, object, str], ...] = ()
    required: tuple[str, ...] = ()
    choose_runner: Callable[[dict], str] | None = None
    check: Callable[[dict], None] | None = None
    # arguments added whenever the chosen runner is one of these keys (e.g. experiments)
    always: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    # how a run goes on this runner (runners.execution)
    execution: Execution = Execution()

    def resolve(self, argv: Sequence[str], extra_defaults: Mapping[str, object] = ()) -> Resolved:
        given = given_options(argv)
        missing = [opt for opt in self.required if not given.get(opt)]
        if missing:
            raise ValueError(f"{self.name} needs {', '.join('--' + m for m in missing)}")
        if self.check:
            self.check(given)
        runner = self.choose_runner(given) if self.choose_runner else self.name
        args = [a for a in _strip_option(argv, "runner")]
        added, notes = [], []
        for option, default, why in tuple(self.defaults) + tuple(
                (k, v, "pipeline default") for k, v in dict(extra_defaults).items()):
            if option in given:
                continue
            value = default(given) if callable(default) else default
            if value is None:
                continue
            given[option] = value
            added.append(f"--{option}" if value is True else f"--{option}={value}")
            notes.append(f"--{option}={value}: {why}")
        for arg in self.always.get(runner, ()):
            if arg not in args:
                added.append(arg)
                notes.append(f"{arg}: {_ALWAYS_WHY.get(arg, '')}")
        return Resolved(profile=self.name, runner=runner,
                        argv=[f"--runner={runner}"] + added + args, notes=notes)


def _strip_option(argv: Sequence[str], option: str) -> list[str]:
    out, skip = [], False
    tokens = list(argv)
    for i, token in enumerate(tokens):
        if skip:
            skip = False
            continue
        name, eq, _ = token[2:].partition("=") if token.startswith("--") else ("", "", "")
        if name.replace("-", "_") == option:
            skip = not eq and i + 1 < len(tokens) and not tokens[i + 1].startswith("--")
            continue
        out.append(token)
    return out


def _cached_prism(_given) -> str | None:
    path = cache.cached_prism()
    return str(path) if path else None


def _flink_version(given) -> str | None:
    cached = cache.cached_flink_versions()
    return cached[-1] if cached else None


def _flink_jar(given) -> str | None:
    version = given.get("flink_version") or cache.DEFAULT_FLINK_VERSION
    path = cache.cached_jar(cache.flink_artifact(version))
    return str(path) if path else None


def _spark_jar(_given) -> str | None:
    path = cache.cached_jar(cache.SPARK_ARTIFACT)
    return str(path) if path else None


def _jar_cache_dir(_given) -> str:
    return str(cache.jar_dir())


WORKER_IMAGE_ENV = "BEAM_DP_WORKER_IMAGE"


def _worker_image(local: Callable[[dict], bool] | None = None):
    """``--sdk_container_image`` from $BEAM_DP_WORKER_IMAGE (the image the repository's
    Dockerfile builds), for remote workers only: a local engine runs LOOPBACK workers."""
    def default(given) -> str | None:
        if local is not None and local(given):
            return None
        return os.environ.get(WORKER_IMAGE_ENV) or None
    return default


def _setup_file(given) -> str | None:
    if given.get("sdk_container_image") or given.get("worker_harness_container_image"):
        return None  # a custom container already holds the project
    if not REPO_SETUP_FILE.is_file():
        raise ValueError("DataflowRunner: this project's setup.py is not next to the installed "
                         "package; pass --setup_file=PATH/setup.py or --sdk_container_image")
    return str(REPO_SETUP_FILE)


def _check_dataflow(given) -> None:
    temp = given.get("temp_location") or ""
    if not temp.startswith("gs://"):
        raise ValueError(f"DataflowRunner needs --temp_location on gs:// (got {temp!r})")


def _dask_runner(_given) -> str:
    return DASK_RUNNER


def _no_scheduler(given) -> bool:
    return not (given.get("dask_client_address") or given.get("dask_scheduler_file"))


def _direct_runner(given) -> str:
    return "PrismRunner" if given.get("prism_location") else "FnApiRunner"


# Beam keeps one Prism job server per process, made from the options of the first PrismRunner
# run, including the one Beam's own DirectRunner attempts. After a DirectRunner run without
# network, a later run with --prism_location would reuse the failed server (and try to download
# Prism), so every Prism run of ours gets its own server.
_PRISM_OWN_SERVER = "--experiments=disable_prism_server_singleton"
_ALWAYS_WHY = {_PRISM_OWN_SERVER: "own Prism job server (Beam's per-process one may be stale)"}

_LOOPBACK = ("environment_type", "LOOPBACK",
             "workers run in the submitting process (no Docker); use EXTERNAL with "
             "--environment_config=host:port for a worker pool")


def _local_flink(given) -> bool:
    return given.get("flink_master", "[local]") in ("[local]", "[auto]")


def _local_spark(given) -> bool:
    return given.get("spark_master_url", "local[2]").startswith("local")


def _if(condition, value):
    """A default that applies only when ``condition(given)`` holds: local engines get LOOPBACK
    and two slots; a remote cluster keeps Beam's defaults (its workers cannot reach this
    process), so pass --environment_type / --parallelism for it."""
    return lambda given: value if condition(given) else None


_LOCAL_ONLY = " (local master only)"
_FLINK_LOOPBACK = (_LOOPBACK[0], _if(_local_flink, "LOOPBACK"), _LOOPBACK[2] + _LOCAL_ONLY)
_SPARK_LOOPBACK = (_LOOPBACK[0], _if(_local_spark, "LOOPBACK"), _LOOPBACK[2] + _LOCAL_ONLY)

_IMAGE_WHY = (f"${WORKER_IMAGE_ENV}: the worker image built from the repository's Dockerfile "
              "(this project and its locked dependencies on Beam's SDK image)")

PROFILES: dict[str, RunnerProfile] = {p.name: p for p in (
    RunnerProfile(
        name="DirectRunner",
        summary="Embedded and deterministic: the FnApiRunner, or PrismRunner if --prism_location is given "
        "(Beam's own DirectRunner would try Prism and fall back silently).",
        choose_runner=_direct_runner, always={"PrismRunner": (_PRISM_OWN_SERVER,)}),
    RunnerProfile(name="FnApiRunner", summary="Beam's embedded Python runner, unchanged."),
    RunnerProfile(
        name="PrismRunner",
        summary="Beam's Go runner on this machine; LOOPBACK workers; a Prism job server per run.",
        always={"PrismRunner": (_PRISM_OWN_SERVER,)}, execution=PrismExecution(),
        defaults=(("prism_location", _cached_prism,
                   "binary built by `python -m runners.fetch prism`"),
                  _LOOPBACK)),
    RunnerProfile(
        name="FlinkRunner",
        summary="Embedded Flink mini cluster through Beam's Flink job server jar.",
        defaults=(("flink_master", "[local]", "embedded mini cluster"),
                  ("flink_version", _flink_version, "newest cached job server jar"),
                  ("flink_job_server_jar", _flink_jar, "cached by `python -m runners.fetch flink`"),
                  ("jar_cache_dir", _jar_cache_dir, "where runners.fetch puts jars"),
                  ("parallelism", _if(_local_flink, 2), "one task slot per core" + _LOCAL_ONLY),
                  _FLINK_LOOPBACK,
                  ("sdk_container_image", _worker_image(_local_flink), _IMAGE_WHY))),
    RunnerProfile(
        name="SparkRunner",
        summary="Local Spark through Beam's Spark 3 job server jar.",
        defaults=(("spark_master_url", "local[2]", "local Spark, two threads"),
                  ("spark_job_server_jar", _spark_jar, "cached by `python -m runners.fetch spark`"),
                  ("jar_cache_dir", _jar_cache_dir, "where runners.fetch puts jars"),
                  _SPARK_LOOPBACK,
                  ("sdk_container_image", _worker_image(_local_spark), _IMAGE_WHY))),
    RunnerProfile(
        name="DaskRunner",
        summary="Beam's Dask runner (side inputs computed once as graph tasks: runners/dask_runner.py) "
        "on a Dask cluster: --dask_client_address, or a local cluster of worker processes started "
        "and shut down around the run.",
        choose_runner=_dask_runner, execution=DaskExecution(),
        defaults=(("dask_local_workers", _if(_no_scheduler, 2),
                   "local cluster of 2 worker processes for the run (no scheduler given)"),
                  ("dofn_threads", 1, "the cluster runs partitions on every worker thread "
                   "already"))),
    RunnerProfile(
        name="DataflowRunner",
        summary="Google Cloud Dataflow; this project is staged to the workers through setup.py.",
        defaults=(("sdk_container_image", _worker_image(), _IMAGE_WHY),
                  ("setup_file", _setup_file, "ships this project's packages to the workers "
                   "(not with a worker image: it holds them)"),
                  ("sdk_location", "default", "the worker container's Beam SDK")),
        required=("project", "region", "temp_location"),
        check=_check_dataflow, execution=DataflowExecution()),
)}


def resolve(argv: Sequence[str], defaults: Mapping[str, object] = ()) -> Resolved:
    """Apply the profile of ``--runner`` in ``argv`` (DirectRunner if absent) to ``argv``.

    ``defaults`` are a pipeline's own option defaults (``{"option": value}``); like the profile's,
    they apply only when the option is not given.
    """
    runner = canonical_runner(given_options(argv).get("runner"))
    profile = PROFILES.get(runner)
    if profile is None:  # a runner we have no profile for (e.g. a dotted class path): pass through
        profile = RunnerProfile(name=runner, summary="no profile")
    return profile.resolve(argv, defaults)


def pipeline_options_for(argv: Sequence[str] | None = None,
                         defaults: Mapping[str, object] = ()):
    """PipelineOptions for ``argv`` with the runner profile and ``defaults`` applied."""
    from apache_beam.options.pipeline_options import PipelineOptions, SetupOptions

    resolved = resolve(list(sys.argv[1:] if argv is None else argv), defaults)
    for note in resolved.notes:
        _LOGGER.info("%s profile: %s", resolved.profile, note)
    options = PipelineOptions(resolved.argv)
    if resolved.profile == "DataflowRunner":
        # Pipelines are importable modules: nothing from __main__ needs pickling, and pickling it
        # drags the submitter's globals to the workers.
        options.view_as(SetupOptions).save_main_session = False
    return options


def profile_of(options) -> RunnerProfile:
    """The profile of the runner ``options`` run on (a pass-through profile for a runner without
    one): what the seam (:mod:`runners.seam`) asks how a run goes."""
    from apache_beam.options.pipeline_options import StandardOptions

    if is_dask(options):
        return PROFILES["DaskRunner"]
    runner = options.view_as(StandardOptions).runner
    name = runner if isinstance(runner, str) or runner is None else type(runner).__name__
    name = canonical_runner(name.rsplit(".", 1)[-1] if name else None)
    return PROFILES.get(name) or RunnerProfile(name=name, summary="no profile")


def describe_profiles() -> str:
    """The profiles as Markdown, for the docs; cached artifacts are shown as found now."""
    lines = []
    for profile in PROFILES.values():
        lines.append(f"### {profile.name}\n\n{profile.summary}")
        if profile.required:
            lines.append("\nRequired: " + ", ".join(f"`--{r}`" for r in profile.required) + "\n")
        if profile.defaults or profile.always:
            lines.append("")
        for option, default, why in profile.defaults:
            shown = "(decided at run time)" if callable(default) else f"`{default}`"
            lines.append(f"- `--{option}` {shown}: {why}")
        for runner, args in profile.always.items():
            for arg in args:
                lines.append(f"- `{arg}` always (when running on {runner}): {_ALWAYS_WHY[arg]}")
        lines.append("")
    return "\n".join(lines)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "-h" in argv or "--help" in argv:
        print("usage: python -m runners.profiles [--describe] [--runner RUNNER] [BEAM_OPTION ...]\n\n"
              "Print the options a run would get from its runner profile (defaults added, checks "
              "made);\n--describe prints every profile as Markdown. See runners/README.md.")
        return 0
    if "--describe" in argv:
        print(describe_profiles())
        return 0
    resolved = resolve(argv)
    print(f"profile {resolved.profile} -> runner {resolved.runner}")
    for note in resolved.notes:
        print("  " + note)
    print("argv: " + " ".join(resolved.argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
