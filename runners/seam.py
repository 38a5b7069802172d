"""The one seam between this project's pipelines and a runner: options, checks, run, submit, wait.

Every run of the project (each job through the release layer, the runner check, the benchmarks)
goes through this module, and only this module asks the runner profiles
(:mod:`runners.profiles`) which :class:`~runners.execution.Execution` owns a run: the release
layer imports nothing else of ``runners/`` but the interface's value types
(:mod:`runners.execution`: ``JobHandle``, ``JobFailed``, ``RunnerUnavailable``), never a
specific runner's module. What differs between runners is each profile's ``Execution``:

* :func:`options_for`: Beam's options of a run, its runner profile applied, its runner resolved
  as Beam will resolve it and what it needs here checked (:func:`check_runner`);
* :func:`run`: build, run to the end, clean up (the profile's ``session``, ``prepare``,
  ``run_to_end``);
* :func:`submit` and :func:`wait`: a run split between two processes (Dataflow returns at once
  with the job id; a local engine runs the job to the end in ``submit``);
* :func:`only_translates`: whether the run writes a job description instead of running it
  (``--dry_run``, a Dataflow template; a Flex Template launcher's job object is a submission);
* :func:`register_options`: every runner's pipeline options known to Beam, for flag checks;
* :func:`library_logging`: the runners' and libraries' loggers quiet (WARNING) unless the
  run's ``--log_level`` asks for more, so that a run's console is its summary.
"""
from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Callable, Optional, Sequence

from runners.execution import JobHandle, RunnerUnavailable

_LOGGER = logging.getLogger(__name__)

#: Modules whose import registers runner-specific pipeline options with Beam (Beam parses, and
#: pipelines.release.flags accepts, only the flags of option classes it has seen): Beam's Dask
#: runner's (``--dask_client_address``, ...) and its render runner's. This project's own
#: (:mod:`runners.dask_cluster`, :class:`transforms.parallel.ExecutionOptions`) are imported by
#: :mod:`runners.profiles`.
OPTION_MODULES = ("apache_beam.runners.dask.dask_runner", "apache_beam.runners.render")


def register_options() -> None:
    """Import every module that registers a pipeline option a run on some profile may take.
    A module whose runner is not installed (Beam's Dask runner without the ``dask`` extra: the
    base install of ``make demo``) registers nothing: its flags are then unknown, as its runner
    is unusable."""
    import runners.profiles  # noqa: F401  (the profiles' own option classes)

    for module in OPTION_MODULES:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as err:
            _LOGGER.debug("pipeline options of %s not registered: %s", module, err)


def check_runner(options) -> None:
    """Resolve the runner of ``options`` as Beam will when the pipeline is made
    (``apache_beam.runners.runner.create_runner``: a known name, or the full name of a
    ``PipelineRunner`` class that imports), then let its profile check what it needs here
    (:meth:`~runners.execution.Execution.check`), all without starting a job. Raises
    :class:`~runners.execution.RunnerUnavailable` with Beam's message: a caller can refuse the
    run before it commits to anything."""
    from apache_beam.options.pipeline_options import StandardOptions
    from apache_beam.runners.runner import PipelineRunner, create_runner

    from runners.profiles import profile_of

    name = options.view_as(StandardOptions).runner or "DirectRunner"
    try:
        runner = name if isinstance(name, PipelineRunner) else create_runner(name)
    except (ValueError, ImportError, AttributeError, TypeError) as err:
        raise RunnerUnavailable(f"--runner {name}: {err}") from None
    profile_of(options).execution.check(options, runner)


def options_for(argv: Sequence[str]):
    """Beam's options for ``argv`` with its runner profile applied
    (:func:`runners.profiles.pipeline_options_for`), the runner checked (:func:`check_runner`).
    Raises RunnerUnavailable, or ValueError / SystemExit for options Beam refuses."""
    from runners.profiles import pipeline_options_for

    options = pipeline_options_for(list(argv))
    check_runner(options)
    return options


def only_translates(options, submitting: bool = False) -> bool:
    """Whether a run of ``options`` only writes a job description (``--dry_run``, a template)
    instead of running the job; ``submitting``: the run is a submission, for which a Flex
    Template launcher's job object is the job itself (the profile's
    :meth:`~runners.execution.Execution.launches_job`)."""
    from runners.profiles import profile_of

    every = options.get_all_options()
    if every.get("dry_run"):
        return True
    if not every.get("template_location"):
        return False
    return not (submitting and profile_of(options).execution.launches_job(options))


def run(options, build: Callable) -> object:
    """Build a pipeline with ``build(pipeline)`` on ``options``, run it to the end on its runner
    profile's :class:`~runners.execution.Execution` and return the finished result. Raises what
    the run raised, or RuntimeError when it ended in a state other than done."""
    import apache_beam as beam

    from runners.profiles import profile_of

    execution = profile_of(options).execution
    with execution.session(options) as run_options:
        pipeline = beam.Pipeline(options=run_options)
        build(pipeline)
        execution.prepare(pipeline)
        return execution.run_to_end(pipeline)


def submit(options, build: Callable):
    """Build a pipeline with ``build(pipeline)`` on ``options`` and start it on its runner
    profile's :class:`~runners.execution.Execution` without waiting where the runner allows it
    (module docstring); returns its :class:`~runners.execution.JobHandle` and result."""
    import apache_beam as beam

    from runners.profiles import profile_of

    profile = profile_of(options)
    with profile.execution.session(options) as run_options:
        pipeline = beam.Pipeline(options=run_options)
        build(pipeline)
        profile.execution.prepare(pipeline)
        return profile.execution.submit(pipeline, profile.name)


def wait(options, handle: JobHandle):
    """The finished result of a job :func:`submit` started (possibly in another process), or
    None where the runner has none to give (a local engine); raises
    :class:`~runners.execution.JobFailed`."""
    from runners.profiles import PROFILES, profile_of

    execution = (PROFILES.get(handle.runner) or profile_of(options)).execution
    return execution.wait(options, handle)


#: The loggers of runners and libraries whose INFO chatter (a Dask cluster's 70-odd lines per
#: run, Beam's stage notices, Arrow's and absl's) would bury a run's summary.
LIBRARIES = ("distributed", "dask", "apache_beam", "pyarrow", "absl", "urllib3", "google")

def library_level(level: Optional[str] = None) -> str:
    """The level of :data:`LIBRARIES`' loggers: WARNING, unless ``level`` (``--log_level``)
    asks for more (DEBUG, INFO). ``LOGLEVEL`` sets the project's own loggers only (the root
    logger): ``LOGLEVEL=DEBUG`` shows a failed run's traceback without the runners' chatter.
    Raises ValueError on an unknown level."""
    wanted = logging.getLevelName((level or "WARNING").upper())
    if not isinstance(wanted, int):
        raise ValueError(f"unknown log level {level!r}: DEBUG, INFO, WARNING, ERROR or CRITICAL")
    return logging.getLevelName(min(wanted, logging.WARNING))


def library_logging(level: Optional[str] = None) -> None:
    """:data:`LIBRARIES`' loggers at :func:`library_level`, and Dask's ``logging.distributed``
    setting with them: ``distributed`` sets its logger from that setting when it is imported
    (INFO by default), and a local cluster's worker processes read it too (from the
    environment, or from the configuration their nanny hands them)."""
    name = library_level(level)
    for logger in LIBRARIES:
        logging.getLogger(logger).setLevel(name)
    if level is not None or "DASK_LOGGING__DISTRIBUTED" not in os.environ:
        os.environ["DASK_LOGGING__DISTRIBUTED"] = name.lower()
    dask = sys.modules.get("dask")  # None: not imported, or not installed (the base install)
    if dask is not None:  # imported already: its setting is read, not the environment
        dask.config.set({"logging.distributed": name.lower()})
