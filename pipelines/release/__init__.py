"""The release layer every job stands on: validated before the charge, published once, never overwritten.

A job (``pipelines.<name>``) supplies its privacy logic -- inputs, planned releases with their
measures and budget scopes, and the Beam graph of one release (:class:`Job`); the release layer
owns everything else, the same way for every job:

1. **Preflight before any charge** (:mod:`~pipelines.release.inputs`): every input is resolved
   once (that list is both what is read and what the input digest covers) and checked -- it
   opens, its format and compression are known, its columns exist with usable types, a CSV's
   last line is whole, it is not a release key. Bad flags, configuration or input: exit 2,
   nothing charged.
2. **Reserve, compute, publish, commit** (:mod:`~pipelines.release.lifecycle`): the ledger
   reserves every release of the run, all or nothing, with fresh keys bound to the input digest
   (:mod:`accounting.ledger`); the pipeline writes to private staging; counters are read and the
   dropped-rows rule applied; each release is published atomically with its marker last
   (:mod:`~pipelines.release.publish`), then committed.
3. **Take-over.** A run that fails after its reservation published nothing (exit 3). A later
   run takes the reservation over -- on corrected input, i.e. a new digest -- with fresh keys
   and without spending again. Why this is sound: a release's privacy loss is the loss of what
   is published; what is published comes from exactly one computation, the last, whose input and
   keys the ledger record holds. The failed computation's outputs stayed in private staging and
   are deleted; its error reached only the operator. Once publication has started the record is
   pinned (key and input fixed): a changed input then needs ``--new_release`` (a new version,
   charged afresh), because the same key on other data would leak the difference.
4. **Publication is owned**: markers, ledger binding of the output root, testing runs under
   ``testing-not-a-release/`` only, never replacing published bytes, never through a symbolic
   link inside the output tree (:mod:`~pipelines.release.publish`).
5. **One key policy**: every real release of every job gets its keys from the ledger; a stored
   key is never applied to other input; ``--testing_seed`` is the only other key source.
6. **Row faults are counted and shown** (:mod:`~pipelines.release.counters`): in the console
   summary and the operator's report, never in released files; a release that dropped all, or
   more than ``--max_dropped_fraction``, of an input's rows is refused unless
   ``--allow_dropped_rows``.
7. **Safe names and messages** (:mod:`~pipelines.release.names`): one pattern for every id that
   becomes a path; messages name files and columns, never file content (configuration and list
   files are read by :mod:`~pipelines.release.textfiles`, which refuses a key file by name).
8. **One CLI convention and a Python API** (:mod:`~pipelines.release.cli`): each job is
   ``run(Request(...))`` from Python; the CLI is a thin layer that parses the same request, its
   flags Beam pipeline options (:mod:`~pipelines.release.flags`): an unknown or abbreviated flag
   is refused (exit 2).
   Exit codes (:mod:`~pipelines.release.errors`): 0 released (or an identical re-run), 2
   refused before any charge, 3 failed after the reservation, 1 internal error; anything but 0
   means nothing new was published, except a multi-release run whose publication failed part-way
   (exit 3 names the releases that are out; the same command finishes the rest).
"""
from pipelines.release.counters import RowCounters
from pipelines.release.errors import ReleaseFailed, ReleaseRefused
from pipelines.release.inputs import InputSpec
from pipelines.release.job import (Job, OutputSpec, PlannedRelease, ReleaseContext,
                                   ReleaseOptions)
from pipelines.release.lifecycle import ReleaseOutcome, RunResult, run

__all__ = ["Job", "InputSpec", "OutputSpec", "PlannedRelease", "ReleaseContext",
           "ReleaseOptions", "ReleaseRefused", "ReleaseFailed", "RowCounters", "RunResult",
           "ReleaseOutcome", "run"]
