"""How a run goes on a runner: the interface each runner profile's execution implements.

Every run goes through the seam (:mod:`runners.seam`), which asks the runner profile of the
run's options (:func:`runners.profiles.profile_of`) for its :class:`Execution`: what differs
between runners. This module imports nothing of ``runners/`` (the profiles and each runner's
module import it, never the other way round):

* ``session``: what must exist around the run (a local Dask cluster started for it and shut
  down after it, failed or not) and the options the run then uses;
* ``prepare``: what the built pipeline needs before it is submitted: refusing transforms the
  runner would run wrongly without an error, and one final leaf depending on every other leaf
  where the runner computes only the last-applied transform;
* ``close``: what the finished result holds open (the Dask runner's client, closed before its
  cluster);
* ``submit`` and ``wait``: a run split between two processes (``submit`` starts the job and
  returns its :class:`JobHandle`; ``wait``, in another process, waits for the job the handle
  names). A local engine's job lives in the process that runs it, so its ``submit`` runs it to
  the end and its ``wait`` only checks the recorded end; Dataflow's returns at once with the job
  id and its ``wait`` polls the Dataflow service (:mod:`runners.dataflow_jobs`).
* ``check``: what the runner needs on this machine, checked before anything runs (Prism's
  binary), after :func:`runners.seam.check_runner` resolved the runner's name as Beam will;
* ``launches_job``: whether a template location the run writes to is a job's launch (a Flex
  Template launcher's job object), not a template.

What DoFns need to know of the runner (threads, batch sizes) the profile states in the options
(:class:`transforms.parallel.ExecutionOptions`), not here: transforms never ask which runner
they are on.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator, Optional

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

    def launches_job(self, options) -> bool:
        """Whether the ``--template_location`` of ``options`` is where a launcher asks for the
        one job it creates (a submission), not a template (never here)."""
        return False


class RunnerUnavailable(ValueError):
    """The run's ``--runner`` cannot run here; the message is the runner's own (Beam's)."""


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
