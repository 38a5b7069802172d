"""Dataflow jobs started by one process and awaited by another (the DataflowRunner profile's
:class:`~runners.execution.Execution`).

A release on Dataflow is submitted (``--submit_only``: the job is created and the process exits)
and finished later by another process (``--finalize``), as a Flex Template launcher and a
scheduler's second task need: a launcher must only build and submit, never wait for the job
(Google's Flex Template guide: the program must exit after ``run``).

* :meth:`DataflowExecution.submit` runs the pipeline without waiting and returns the job's
  :class:`~runners.execution.JobHandle` (job id, project, region). Inside a Flex Template launcher
  the program is given ``--template_location=gs://.../template_launches/<job id>/job_object``:
  Beam writes the job there and the launcher creates the job with that id, so the id is read
  from that path (:func:`flex_launch_job_id`, :meth:`DataflowExecution.launches_job`); any
  other template location stays a template, which the release layer refuses for a release.
* :meth:`DataflowExecution.wait` finds the job again through the Dataflow client (Beam's
  ``DataflowApplicationClient``, from the finishing process's own ``--project``/``--region``
  options, falling back to the handle's), polls it with Beam's own loop
  (``DataflowRunner.poll_for_job_completion``, which also collects the job's error messages) and
  returns Beam's ``DataflowPipelineResult`` with the job's metrics; a job that failed, was
  cancelled or drained raises :class:`~runners.execution.JobFailed` with the runner's message.
"""
from __future__ import annotations

import re
from typing import Optional

from runners.execution import Execution, JobFailed, JobHandle

#: Where a Flex Template launcher asks the program to write the job it creates (the Dataflow
#: job id is the folder's name, e.g. 2026-11-27_02_30_07-1234567890123456789).
FLEX_JOB_OBJECT = re.compile(
    r"^gs://.+/template_launches/(\d{4}-\d{2}-\d{2}_\d{2}_\d{2}_\d{2}-\d+)/job_object$")


def flex_launch_job_id(template_location: Optional[str]) -> Optional[str]:
    """The Dataflow job id of a Flex Template launch's job object, or None if
    ``template_location`` is not one (module docstring)."""
    match = FLEX_JOB_OBJECT.match(template_location or "")
    return match[1] if match else None


def _client(options):
    """Beam's Dataflow API client for ``options`` (its project, region and credentials)."""
    from apache_beam.runners.dataflow.internal import apiclient

    return apiclient.DataflowApplicationClient(options)


def _with_location(options, handle: JobHandle):
    """``options`` with the handle's project and region where the finishing process gave none."""
    from apache_beam.options.pipeline_options import GoogleCloudOptions

    cloud = options.view_as(GoogleCloudOptions)
    cloud.project = cloud.project or handle.project
    cloud.region = cloud.region or handle.region
    return options


class DataflowExecution(Execution):
    """How a submitted Dataflow job is started and awaited (module docstring)."""

    def submit(self, pipeline, name: str):
        from apache_beam.options.pipeline_options import GoogleCloudOptions

        cloud = pipeline.options.view_as(GoogleCloudOptions)
        result = pipeline.run()  # creates the job (or writes a launcher's job object)
        if getattr(result, "has_job", False):
            job_id, state = result.job_id(), str(result.state).rsplit(".", 1)[-1]
        else:
            job_id, state = flex_launch_job_id(cloud.template_location), "LAUNCHING"
        if not job_id:
            raise RuntimeError("Dataflow returned no job id for the submitted job")
        return JobHandle(runner=name, job_id=job_id, state=state, project=cloud.project,
                         region=cloud.region), result

    def launches_job(self, options) -> bool:
        """A Flex Template launcher's job object (``.../template_launches/<job id>/job_object``)
        is the job it creates, not a template."""
        from apache_beam.options.pipeline_options import GoogleCloudOptions

        return flex_launch_job_id(options.view_as(GoogleCloudOptions).template_location) is not None

    def wait(self, options, handle: JobHandle):
        from apache_beam.runners.dataflow.dataflow_metrics import DataflowMetrics
        from apache_beam.runners.dataflow.dataflow_runner import (DataflowPipelineResult,
                                                                  DataflowRunner)
        from apache_beam.runners.runner import PipelineState

        if not handle.job_id:
            raise JobFailed(handle, handle.state, "no Dataflow job id was recorded")
        options = _with_location(options, handle)
        runner = DataflowRunner()
        runner.dataflow_client = _client(options)
        result = DataflowPipelineResult(runner.dataflow_client.get_job(handle.job_id), runner,
                                        options)
        result.metric_results = DataflowMetrics(runner.dataflow_client, result, None)
        DataflowRunner.poll_for_job_completion(runner, result, None)
        state = result.state
        if state != PipelineState.DONE:
            raise JobFailed(handle, str(state).rsplit(".", 1)[-1],
                            getattr(runner, "last_error_msg", None) or "")
        return result

