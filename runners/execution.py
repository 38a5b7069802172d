"""The one seam between this project's pipelines and a runner: build, run, wait, clean up.

Every run of the project (each job through the release layer's ``run_pipeline``, the runner
check, the benchmarks) goes through :func:`run`, and the runner profile of the run's options
(:func:`runners.profiles.profile_of`) owns what differs between runners, as an
:class:`Execution`:

* ``session``: what must exist around the run (a local Dask cluster started for it and shut
  down after it, failed or not) and the options the run then uses;
* ``prepare``: what the built pipeline needs before it is submitted: refusing transforms the
  runner would run wrongly without an error, and one final leaf depending on every other leaf
  where the runner computes only the last-applied transform;
* ``close``: what the finished result holds open (the Dask runner's client, closed before its
  cluster);
* ``submit`` and ``wait``: a run split between two processes (:func:`submit` starts the job and
  returns its :class:`JobHandle`; :func:`wait`, in another process, waits for the job the handle
  names). A local engine's job lives in the process that runs it, so its ``submit`` runs it to
  the end and its ``wait`` only checks the recorded end; Dataflow's returns at once with the job
  id and its ``wait`` polls the Dataflow service (:mod:`runners.dataflow_jobs`).
* ``check``: what the runner needs on this machine, checked before anything runs (Prism's
  binary), after :func:`check_runner` resolved the runner's name as Beam will.

What DoFns need to know of the runner (threads, batch sizes) the profile states in the options
(:class:`transforms.parallel.ExecutionOptions`), not here: transforms never ask which runner
they are on.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Callable, Iterator, Optional

#: The state of a job that ran to the end (Beam's ``PipelineState.DONE``).
DONE = "DONE"


@dataclass(frozen=True, kw_only=True)
class JobHandle:
    """What another process needs to find a submitted job again: the runner profile, the job's
    id on the service (None for a local engine) and its state when it was last seen; for
    Dataflow, the project and region the job runs in."""

    runner: str
    job_id: Optional[str] = None
    state: str = DONE
    project: Optional[str] = None
    region: Optional[str] = None

    def to_json(self) -> dict:
        return {k: v for k, v in vars(self).items() if v is not None}

    @classmethod
    def from_json(cls, data) -> "JobHandle":
        return cls(**{k: data.get(k) for k in ("runner", "job_id", "project", "region")},
                   state=data.get("state") or DONE)


class JobFailed(RuntimeError):
    """A submitted job that ended in a state other than done, with the runner's message."""

    def __init__(self, handle: JobHandle, state: str, message: str = ""):
        job = f"the {handle.runner} job" + (f" {handle.job_id}" if handle.job_id else "")
        lines = [line.strip() for line in str(message or "").splitlines() if line.strip()]
        said = f": {lines[-1][:300]}" if lines else ""
        super().__init__(f"{job} ended in state {state}{said}")
        self.handle, self.state, self.detail = handle, state, str(message or "")


class Execution:
    """How a run goes on a runner that needs nothing around Beam's own ``run`` (the base of every
    profile's execution)."""

    @contextlib.contextmanager
    def session(self, options) -> Iterator[object]:
        """The options of a run, valid inside the block (nothing to start or stop here)."""
        yield options

    def prepare(self, pipeline) -> None:
        """Check or complete the built ``pipeline`` before it is submitted (nothing here)."""

    def close(self, result) -> None:
        """Release what the finished ``result`` holds (nothing here)."""

    def run_to_end(self, pipeline):
        """Run the built ``pipeline`` to its end and release what its result holds; returns the
        result (RuntimeError when it ended in a state other than done)."""
        from apache_beam.runners.runner import PipelineState

        result = pipeline.run()
        try:
            state = result.wait_until_finish()
        finally:
            self.close(result)
        if state not in (None, PipelineState.DONE):
            raise RuntimeError(f"the pipeline ended in state {state}")
        return result

    def submit(self, pipeline, name: str):
        """Start the built ``pipeline``; returns its :class:`JobHandle` and result. Here (a
        local engine, whose job lives in this process) it runs to the end first."""
        return JobHandle(runner=name, state=DONE), self.run_to_end(pipeline)

    def wait(self, options, handle: JobHandle):
        """The finished result of the job ``handle`` names, waited for (raises
        :class:`JobFailed` if it did not end done). A local engine's job ended in the process
        that submitted it: only its recorded state is checked, and there is no result."""
        if handle.state != DONE:
            raise JobFailed(handle, handle.state)
        return None

    def check(self, options, runner) -> None:
        """What ``runner`` (the resolved runner object of ``options``) needs on this machine,
        checked without starting a job; raise :class:`RunnerUnavailable` (nothing here)."""


class RunnerUnavailable(ValueError):
    """The run's ``--runner`` cannot run here; the message is the runner's own (Beam's)."""


def check_runner(options) -> None:
    """Resolve the runner of ``options`` as Beam will when the pipeline is made
    (``apache_beam.runners.runner.create_runner``: a known name, or the full name of a
    ``PipelineRunner`` class that imports), then let its profile check what it needs here
    (:meth:`Execution.check`), all without starting a job. Raises :class:`RunnerUnavailable`
    with Beam's message: a caller can refuse the run before it commits to anything."""
    from apache_beam.options.pipeline_options import StandardOptions
    from apache_beam.runners.runner import PipelineRunner, create_runner

    from runners.profiles import profile_of

    name = options.view_as(StandardOptions).runner or "DirectRunner"
    try:
        runner = name if isinstance(name, PipelineRunner) else create_runner(name)
    except (ValueError, ImportError, AttributeError, TypeError) as err:
        raise RunnerUnavailable(f"--runner {name}: {err}") from None
    profile_of(options).execution.check(options, runner)


def leaves(pipeline) -> list:
    """The PCollections of ``pipeline`` that no transform reads (as a main or a side input), in
    the order their producers were applied."""
    from apache_beam import pvalue
    from apache_beam.pipeline import PipelineVisitor

    produced, read = [], set()

    class Visitor(PipelineVisitor):
        def visit_transform(self, node):
            read.update(id(p) for p in node.inputs)
            read.update(id(s.pvalue) for s in node.side_inputs)
            produced.extend(p for p in node.outputs.values() if isinstance(p, pvalue.PCollection))

    pipeline.visit(Visitor())
    return [p for p in produced if id(p) not in read]


def join_leaves(pipeline, label: str = "AllLeaves") -> None:
    """Apply one ``Flatten`` of every leaf of ``pipeline`` (when there are several) as its last
    transform: a runner that computes only the last-applied transform's graph then computes all
    of them."""
    import apache_beam as beam

    found = leaves(pipeline)
    if len(found) > 1:
        _ = tuple(found) | label >> beam.Flatten()


def run(options, build: Callable) -> object:
    """Build a pipeline with ``build(pipeline)`` on ``options``, run it to the end on its runner
    profile's :class:`Execution` and return the finished result. Raises what the run raised, or
    RuntimeError when it ended in a state other than done."""
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
    profile's :class:`Execution` without waiting where the runner allows it (module docstring);
    returns its :class:`JobHandle` and result."""
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
    None where the runner has none to give (a local engine); raises :class:`JobFailed`."""
    from runners.profiles import PROFILES, profile_of

    execution = (PROFILES.get(handle.runner) or profile_of(options)).execution
    return execution.wait(options, handle)
