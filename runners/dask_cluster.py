"""A Dask cluster for one Beam run: a remote scheduler, or local worker processes we own.

Beam's Dask runner (``apache_beam.runners.dask.dask_runner.DaskRunner``, Beam >= 2.60) turns the
pipeline into a Dask bag graph and submits it through a ``dask.distributed.Client`` it makes
itself from ``--dask_client_address``. The profile runs it as :data:`DASK_RUNNER`, Beam's runner
with side inputs computed once as dependencies in the graph (:mod:`runners.dask_runner`). It
never closes that client, and without an address the client would start a local cluster sized
by Dask's defaults that lives until interpreter exit.
So every Dask run of this project goes through :func:`cluster_for_run`:

* with ``--dask_client_address=tcp://host:8786`` (or ``--dask_scheduler_file``) the run uses that
  cluster, which belongs to its operator (Kubernetes, YARN, an HPC allocation: ``dask-scheduler``
  plus ``dask-worker`` processes with this project installed);
* otherwise it starts a :class:`distributed.LocalCluster` of ``--dask_local_workers`` worker
  *processes* (default 2, ``--dask_threads_per_worker`` threads each, default 1) — elements and
  DoFns are pickled across process boundaries exactly as on a remote cluster — and shuts it down
  when the run ends, failed or not.

Beam's Dask runner makes one bag partition per 128 elements of a ``Create`` unless told otherwise,
and every later step keeps the partitioning it inherits (a ``GroupByKey`` has as many partitions
as its input). A job's ``Create`` holds a few file names, so the whole run would be one partition
on one worker thread, however many workers the cluster has. When the run gives neither
``--dask_npartitions`` nor ``--dask_partition_size``, :func:`cluster_for_run` sets
``--dask_npartitions`` to :data:`PARTITIONS_PER_THREAD` per worker thread of the cluster (counted
from the local cluster's settings, or asked of a remote scheduler). One per thread, not more:
with Beam's translation, which evaluates a side input inside every partition that reads it,
extra partitions cost more than they balanced; with the project's runner, which computes it
once, two per thread were no faster, and slower with 2 workers at the largest keyset
(benchmarks/scale.py; the runs are in benchmarks/RESULTS.md).
Partitioning changes no released byte: bounding and noise never depend on batching
(tests/runners/test_dask_runner.py).

The local cluster's workers keep glibc's own ``malloc`` tuning. Dask sets
``MALLOC_TRIM_THRESHOLD_=65536`` in every worker it spawns (``distributed.nanny.pre-spawn-environ``)
so that freed memory goes back to the operating system at once; setting it also switches off
glibc's sliding ``mmap`` threshold, so every array above 128 KiB is mapped afresh and its pages
fault in again each time. The jobs allocate such arrays per batch (Arrow columns turned into numpy,
sort orders, AES buffers), so the page faults took a large share of a leg's time, against a
little more peak memory without the setting (benchmarks/RESULTS.md).
``--dask_trim_worker_memory`` keeps Dask's setting; a ``MALLOC_TRIM_THRESHOLD_`` in the
environment is inherited either way. A remote cluster's workers get what their operator
configured (runners/README.md, Dask).

After the run the runner's client is closed before the cluster (a client left open on a closed
scheduler keeps reconnecting and logs errors at exit). Nothing here imports Dask until a Dask run
starts.
"""
from __future__ import annotations

import contextlib
import logging
from typing import Iterator

from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions

from runners.execution import Execution, join_leaves

_LOG = logging.getLogger(__name__)

#: The runner a Dask run of the project uses: Beam's, with side inputs as graph dependencies
#: (runners/dask_runner.py); Beam's own stays available by its full name.
DASK_RUNNER = "runners.dask_runner.DaskRunner"
BEAM_DASK_RUNNER = "apache_beam.runners.dask.dask_runner.DaskRunner"
DEFAULT_LOCAL_WORKERS = 2
#: Dask bag partitions per worker thread when a run sets no partitioning of its own.
PARTITIONS_PER_THREAD = 1
#: Dask's config of the environment its nannies give the worker processes they spawn, and the
#: variable in it this module unsets for local workers (module docstring).
PRE_SPAWN_ENVIRON = "distributed.nanny.pre-spawn-environ"
MALLOC_TRIM = "MALLOC_TRIM_THRESHOLD_"


class DaskClusterOptions(PipelineOptions):
    """The local cluster a Dask run starts when no scheduler is given (this project's options;
    Beam's own are ``--dask_client_address``, ``--dask_npartitions``, ...)."""

    @classmethod
    def _add_argparse_args(cls, parser) -> None:
        parser.add_argument(
            "--dask_local_workers", type=int, default=DEFAULT_LOCAL_WORKERS,
            help="worker processes of the local Dask cluster started for this run when neither "
                 "--dask_client_address nor --dask_scheduler_file is given")
        parser.add_argument(
            "--dask_threads_per_worker", type=int, default=1,
            help="threads per local Dask worker process")
        parser.add_argument(
            "--dask_trim_worker_memory", action="store_true", default=False,
            help="keep Dask's MALLOC_TRIM_THRESHOLD_=65536 in the local workers: freed memory "
                 "goes back to the system at once, at the cost of a page fault for every page "
                 "of every array above 128 KiB (slower; see runners/dask_cluster.py)")
        parser.add_argument(
            "--dask_worker_memory_limit", default="auto",
            help="memory limit per local Dask worker ('auto': the machine's memory shared out "
                 "equally among the workers; "
                 "'0': none; or e.g. '4GiB')")


def is_dask(options: PipelineOptions) -> bool:
    runner = options.view_as(StandardOptions).runner or ""
    return runner in (DASK_RUNNER, BEAM_DASK_RUNNER, "DaskRunner") or runner.endswith(".DaskRunner")


@contextlib.contextmanager
def local_cluster(workers: int = DEFAULT_LOCAL_WORKERS, threads_per_worker: int = 1,
                  memory_limit: str | int = "auto", trim_memory: bool = False) -> Iterator[str]:
    """A :class:`distributed.LocalCluster` of ``workers`` processes; yields the scheduler
    address and closes the cluster (and its processes) on exit. ``memory_limit`` per worker:
    ``"auto"``, the machine's memory over ``workers``; ``"0"``, none; else Dask's forms ("4GiB",
    a fraction of the machine's memory). ``trim_memory``: keep Dask's
    ``MALLOC_TRIM_THRESHOLD_`` in the workers (module docstring); otherwise glibc's default."""
    if workers < 1 or threads_per_worker < 1:
        raise ValueError("a local Dask cluster needs at least one worker and one thread")
    import dask
    import distributed

    # Dask's own "auto" gives a worker the share of the machine's memory that its threads are of
    # the machine's cores: 1 worker of 1 thread on 2 cores got half, paused at 80% of it and hung
    # on the largest keyset of benchmarks/scale.py. A cluster made for one run shares out all of it.
    memory = 0 if str(memory_limit) == "0" else 1 / workers if memory_limit == "auto" else memory_limit
    environ = {} if trim_memory else {f"{PRE_SPAWN_ENVIRON}.{MALLOC_TRIM}": None}  # None: unset
    with dask.config.set(environ):  # read when the nannies are made, inside the constructor
        cluster = distributed.LocalCluster(
            n_workers=workers, threads_per_worker=threads_per_worker, processes=True,
            memory_limit=memory, dashboard_address=":0", host="127.0.0.1")  # any free port
    try:
        yield cluster.scheduler_address
    finally:
        cluster.close()


def unsupported(pipeline, beams_own: bool = False) -> list[str]:
    """Transforms of ``pipeline`` that the Dask runner runs wrongly *without an error*:
    ``WindowInto`` other than the global window (not translated: every element stays in the
    global window, so a windowed combine sums across windows); with ``beams_own`` (Beam 2.77's
    own DaskRunner, not the project's :data:`DASK_RUNNER`) also ParDos with tagged outputs
    (``with_outputs``: the outputs are not kept apart; the release layer's row counters are one)
    and ``BatchElements`` (its last batch, emitted in ``finish_bundle``, is dropped). Found by
    running every job on a 2-process cluster (tests/runners/test_dask_runner.py)."""
    import apache_beam as beam
    from apache_beam.pipeline import PipelineVisitor
    from apache_beam.transforms.window import GlobalWindows

    found = []

    class Visitor(PipelineVisitor):
        def _check(self, node):
            transform = node.transform
            if isinstance(transform, beam.WindowInto) \
                    and not isinstance(transform.windowing.windowfn, GlobalWindows):
                found.append(f"{node.full_label} (WindowInto)")
            elif beams_own and isinstance(transform, beam.BatchElements):
                found.append(f"{node.full_label} (BatchElements)")
            elif beams_own and isinstance(transform, beam.ParDo) \
                    and getattr(transform, "output_tags", None):
                found.append(f"{node.full_label} (ParDo with tagged outputs)")

        def enter_composite_transform(self, node):
            self._check(node)

        def visit_transform(self, node):
            self._check(node)

    pipeline.visit(Visitor())
    return found


def check_supported(pipeline, beams_own: bool = False) -> None:
    """Refuse to run ``pipeline`` on Dask when it holds a transform the runner gets wrong
    (``beams_own``: on Beam's own DaskRunner, :func:`unsupported`)."""
    found = unsupported(pipeline, beams_own)
    if found:
        raise NotImplementedError(
            f"{'Beam' if beams_own else 'the project'}'s DaskRunner would run these transforms "
            "wrongly without an error: " + "; ".join(found) + " (see runners/README.md, Dask); "
            + ("use --runner DaskRunner (the project's)" if beams_own else "use another runner"))


def close_client(result) -> None:
    """Close the client Beam's Dask runner opened for ``result`` (a no-op for other runners)."""
    client = getattr(result, "client", None)
    if client is not None and hasattr(client, "close"):
        with contextlib.suppress(Exception):
            client.close()


def scheduler_threads(address: str = None, scheduler_file: str = None, timeout: float = 30) -> int:
    """Worker threads of the cluster behind a scheduler (0 if it cannot be asked)."""
    import distributed

    try:
        with distributed.Client(address=address, scheduler_file=scheduler_file, timeout=timeout,
                                set_as_default=False) as client:
            return int(sum(client.nthreads().values()))
    except (OSError, TimeoutError) as error:
        _LOG.warning("Dask: could not count the cluster's worker threads (%s); Beam's default "
                     "partitioning is used: give --dask_npartitions", error)
        return 0


def _partitioning_given(dask) -> bool:
    return bool(dask.npartitions or dask.partition_size)


@contextlib.contextmanager
def _partitioned(dask, threads: int) -> Iterator[None]:
    """``--dask_npartitions`` for this run from the cluster's worker threads, unless the run set
    its partitioning itself (module docstring)."""
    if _partitioning_given(dask) or threads < 1:
        yield
        return
    dask.npartitions = threads * PARTITIONS_PER_THREAD
    _LOG.info("Dask: %d bag partitions (%d per worker thread)", dask.npartitions,
              PARTITIONS_PER_THREAD)
    try:
        yield
    finally:
        dask.npartitions = None


@contextlib.contextmanager
def cluster_for_run(options: PipelineOptions) -> Iterator[PipelineOptions]:
    """``options`` for one run: unchanged for a non-Dask runner; for a Dask run, pointed at a
    local cluster that lives as long as this block unless a scheduler is given, and partitioned
    for the cluster's worker threads unless the run says how (module docstring)."""
    if not is_dask(options):
        yield options
        return
    from apache_beam.runners.dask.dask_runner import DaskOptions

    dask = options.view_as(DaskOptions)  # Beam stores --dask_client_address as ``address``
    if dask.address or dask.scheduler_file:
        threads = 0 if _partitioning_given(dask) else \
            scheduler_threads(dask.address, dask.scheduler_file)
        with _partitioned(dask, threads):
            yield options
        return
    local = options.view_as(DaskClusterOptions)
    with local_cluster(local.dask_local_workers, local.dask_threads_per_worker,
                       local.dask_worker_memory_limit, local.dask_trim_worker_memory) as address:
        _LOG.info("Dask: local cluster of %d worker processes at %s",
                  local.dask_local_workers, address)
        dask.address = address
        try:
            with _partitioned(dask, local.dask_local_workers * local.dask_threads_per_worker):
                yield options
        finally:
            dask.address = None


class DaskExecution(Execution):
    """How a run goes on Dask (the DaskRunner profile's :class:`~runners.execution.Execution`):
    a cluster for the run (:func:`cluster_for_run`), the transforms the runner gets wrong
    refused (:func:`check_supported`; more on Beam's own runner), one final leaf depending on
    every other leaf (Beam's Dask translation computes only the last-applied transform's graph:
    a write on any other branch would never run), and the runner's client closed before the
    cluster."""

    def session(self, options):
        return cluster_for_run(options)

    def check(self, options, runner) -> None:
        """Beam's own DaskRunner, asked for by its full name, is refused before anything runs
        where the checks are made (a release's preflight): it loses what ``finish_bundle`` emits
        and mixes tagged outputs, and a release's row counters are both."""
        from runners.execution import RunnerUnavailable

        if options.view_as(StandardOptions).runner == BEAM_DASK_RUNNER:
            raise RunnerUnavailable(
                f"--runner {BEAM_DASK_RUNNER}: Beam's own DaskRunner drops what a DoFn emits in "
                "finish_bundle and does not keep tagged outputs apart, which a release's row "
                f"counters need; use --runner DaskRunner ({DASK_RUNNER})")

    def prepare(self, pipeline) -> None:
        runner = pipeline.options.view_as(StandardOptions).runner
        check_supported(pipeline, beams_own=runner == BEAM_DASK_RUNNER)
        join_leaves(pipeline, "AllLeavesForDask")

    def close(self, result) -> None:
        close_client(result)
