"""The release layer every job stands on: validated before the charge, published once, never overwritten.

A job (``pipelines.<name>``) supplies its privacy logic -- inputs, planned releases with their
measures and budget scopes, and the Beam graph of one release (:class:`Job`); the release layer
owns everything else, the same way for every job:

1. **Preflight before any charge** (:mod:`~pipelines.release.inputs`): every input is resolved
   once (that list is both what is read and what the input digest covers) and checked -- it
   opens, its format and compression are known, its columns exist with usable types, a CSV's
   last line is whole, it is not a release key; every planned measure is computable (its
   noise samplable, its error and guarantee finite: no epsilon extreme fails after the charge).
   ``--runner`` is resolved as Beam resolves it and what it needs is checked (a Prism binary).
   Bad flags, runner, configuration or input: exit 2, nothing charged.
2. **Reserve, compute, rule, publish, commit** (:mod:`~pipelines.release.lifecycle`: a run is
   these named phases after preflight, each with its failure policy beside it): the ledger
   reserves every release of the run, all or nothing, with fresh keys bound to the input digest
   (:mod:`accounting.ledger`: its records chained and verified on every read), and the run holds
   them until it ends (a concurrent run of one of them is refused, exit 2, leaving nothing);
   the pipeline writes each release, and its row counters, to private staging; the counters are
   read back from staging and the dropped-rows rule applied; each release is published
   atomically with its marker last
   (:mod:`~pipelines.release.publish`), then committed.
   A release may also be made by two processes (:mod:`~pipelines.release.submission`):
   ``--submit_only`` reserves, stages and submits the pipeline and records its job handle with
   the reservation (exit 0, "submitted"); ``--finalize`` with the same flags finds the
   reservation again (exit 2 without one), waits for the job (exit 3 if it failed), applies the
   row rules, publishes and commits -- safe to repeat or to run twice at once.
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
6. **Row faults are counted and shown** (:mod:`~pipelines.release.counters`, pipeline output on
   every runner): in the console summary and the operator's report, never in released files; an
   input that lost all, or more than ``--max_dropped_fraction``, of its eligible rows, or had
   none, is an operator alert -- never a reason not to publish (below).
7. **Safe names and messages** (:mod:`~pipelines.release.names`): one pattern for every id that
   becomes a path; messages name files and columns, never file content (configuration and list
   files are read by :mod:`~pipelines.release.textfiles`, which refuses a key file by name).
8. **One CLI convention and a Python API** (:mod:`~pipelines.release.cli`): each job is
   ``run(Request(...))`` from Python; the CLI is a thin layer that parses the same request, its
   flags Beam pipeline options (:mod:`~pipelines.release.flags`): an unknown or abbreviated flag
   is refused (exit 2).
   Exit codes (:mod:`~pipelines.release.errors`): 0 released (or an identical re-run), 2
   refused before any charge, 3 failed after the reservation, 4 published but the ledger commit
   that follows failed (re-run the same command: it completes the record, spending nothing),
   1 internal error; anything but 0 and 4 means nothing new was published, except a
   multi-release run whose publication failed part-way (exit 3 names the releases that are
   out; the same command finishes the rest) and ``--alert_exit_code N`` (5..125: released,
   with an operator alert).

**Publication decisions.** Nothing but noisy values and public information may decide *whether*
a release is published: a rule that reads exact raw rows and withholds a release lets one
privacy unit's rows flip it (all of one unit's rows faulty, and the dropped share crosses the
threshold: published one day, refused the next), deterministically. Each rule of this layer and
of the jobs, and what it is:

* **Operator-only** (the release is published; the operator is alerted: the alert and the row
  counters it comes from in the operator report and console summary, a stderr line, the run's
  log; exit 0, or ``--alert_exit_code N``, a data-dependent signal for the scheduler only,
  :mod:`~pipelines.release.errors`) -- the rule phase of
  :mod:`~pipelines.release.lifecycle`, :func:`~pipelines.release.counters.alerts`:

  - more than ``--max_dropped_fraction`` of an input's eligible rows dropped by row rules;
  - all of an input's eligible rows dropped;
  - an input without eligible rows: empty, header-only, or holding only other releases' rows;
  - a release whose staging holds no counters (the pipeline wrote none), so the rules above
    cannot be read.

  They were refusals (exit 3) until issue 30; ``--allow_dropped_rows`` went with them (given,
  it is refused naming its replacement). The neighbouring-pair audit checks that one unit's
  faulty rows change neither the outcome, nor the files, nor the public marker
  (tests/pipelines/release/test_publication_decisions.py).
* **Refused before the charge, from public facts** (exit 2): flags and configuration; a file's
  format -- that it opens, its compression, its header, columns and column types -- which its
  producer fixes whatever the rows hold; and counts the job's neighbouring relation holds
  public: where one unit *replaces* its values and every unit, report or share stays (Masked
  LARk's report set and k, shuffle_sum's shares against ``--num_clients``, a LARk training set
  against ``--batch_size``), a count cannot move between neighbours.
* **One row's content** (a value that does not parse, a missing value, a value out of its
  domain, bytes that are not UTF-8) never refuses or fails a run: the row is dropped by a
  documented rule and counted (``<input>.dropped.<reason>``: the operator report, the console,
  the dropped-rows alert above) -- a malformed CSV line of any job, a Masked LARk record without
  a record id, key or batch. A value whose bytes are not UTF-8 is read as missing (counted,
  ``<input>.values_not_utf8``) and the job's rule for a missing value applies
  (:mod:`~pipelines.release.inputs`).
  Where the relation holds the number of records public (Masked LARk share and train: "replace
  one report's values", k-anonymity on report counts) a record with bad *content* is not
  dropped, which would let it move a key across k, but *neutralised* -- shared with a documented
  default value, or as a strictly fake record -- and counted the same way
  (transforms/lark/browser.py, "Faults"). Checked with the neighbouring-pair audits
  (tests/pipelines/release/test_publication_decisions.py).
* **A protocol violation is refused before the charge** (exit 2): shuffle_sum's missing share or
  share outside [0, q) comes from no client following the protocol, whatever its value, so the
  refusal is the same on both sides of every neighbouring pair; dropping a share would garble its
  client's value (transforms/ldp/shuffle.py, "Malformed shares").
* **A DP decision**, when a release should be withheld on data: a noisy count (each unit's
  contribution bounded) against a threshold, planned as a measure of the release and charged,
  its cost part of the stated guarantee. None exists yet; the rule phase is where one goes,
  reading counters computed as pipeline output.
"""
#: The release layer's public names, each with its module: imported on first use (PEP 562), so
#: that importing one Beam-free module of the layer (``storage``, ``names``, ``layout``,
#: ``textfiles``, ``errors``: what the catalog reads releases with) does not import the Beam side.
_EXPORTS = {
    "RowCounters": "counters", "ReleaseFailed": "errors", "ReleaseRefused": "errors",
    "InputSpec": "inputs", "Job": "job", "OutputSpec": "job", "PlannedRelease": "job",
    "Prepared": "job", "ReleaseContext": "job", "ReleaseOptions": "job",
    "ReleaseOutcome": "lifecycle", "RunResult": "lifecycle", "run": "lifecycle",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(f"pipelines.release.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
