"""How a release run ends when it does not publish, and the exit code a scheduler sees.

* :class:`ReleaseRefused` -- exit 2: refused before any charge (bad flags, configuration or
  input, a budget or ownership refusal). Nothing was charged and nothing was published.
* :class:`ReleaseFailed` -- exit 3: failed after the reservation (a fault found while computing,
  a publication conflict, a full disk -- *any* fault after the charge, whatever its class: see
  ``lifecycle.after_reservation``). Nothing was published; the reservation stays charged and a
  corrected re-run takes it over without spending again. Its message, and the operator's
  ``failure.json``, name the root cause (:func:`root_cause`) and never quote a file.

So exit 2 always means "nothing charged, nothing stored": everything checkable is checked before
the charge (flags, configuration, inputs, every measure's noise and guarantee, the ledger's
structure and chain, the key store), and a fault after it can never come out as a refusal.

Exit 0 means released (or an identical re-run); any other code means nothing new was published,
with two stated exceptions: a run of several releases whose publication fails part-way (an I/O
fault after the checks that precede every publication) exits 3 naming the releases that are out
(re-running the same command reproduces those byte for byte and publishes the rest); and a run
given ``--alert_exit_code N`` exits N when its releases were published with an operator alert.
After a release is published, a failing ledger commit exits 4 (``EXIT_NOT_COMMITTED``): the
release is out and the budget was charged at the reservation, but the ledger's record is not
complete -- the scheduler must re-run the same command, which completes the record without
spending (until then the release's ids are recorded as the reservation's). A failing operator
report alone is a warning (exit 0).

**The alert exit code is a data-dependent signal.** Alerts (dropped rows, an input without
eligible rows, a release without staged counters: see :mod:`pipelines.release`) come from exact
raw row counts, so whether a run exits N can depend on one person's rows. It is for the operator's
scheduler only (retry, page someone): never publish it, and never use it to decide whether
this or another release is published -- that would turn an operator-only fact into a
publication decision taken from private data. Without the flag an alerted release exits 0.
"""
from __future__ import annotations

EXIT_RELEASED = 0
EXIT_INTERNAL = 1
EXIT_REFUSED = 2
EXIT_FAILED = 3
#: Published, but the ledger commit that follows publication failed: re-run the same command.
EXIT_NOT_COMMITTED = 4
#: The codes ``--alert_exit_code`` may take (0-4 mean the above; 126 and up are the shell's).
ALERT_EXIT_CODES = (5, 125)


class ReleaseRefused(ValueError):
    """Refused before any budget was charged (exit 2)."""

    exit_code = EXIT_REFUSED


class ReleaseFailed(RuntimeError):
    """Failed after the reservation; nothing was published (exit 3)."""

    exit_code = EXIT_FAILED


class ShownError(RuntimeError):
    """Base of errors whose messages name files, columns, counts and steps only -- never file
    content -- so that :func:`root_cause` may show them to the operator. Any exception with a
    true ``shown`` attribute counts alike: a runner profile (runners/, which imports nothing of
    the jobs) sets it on the errors it raises with the runner's own message (a worker lost, a
    job cancelled)."""

    shown = True


def exception_chain(err: BaseException) -> list:
    """``err`` and the exceptions it was raised from or while handling (outermost first)."""
    out, seen = [], set()
    while err is not None and id(err) not in seen and len(out) < 16:
        out.append(err)
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return out


def _step(err: BaseException) -> str:
    """The Beam step an error was raised in (Beam appends "[while running 'STEP']")."""
    text = str(err)
    at = text.rfind("[while running '")
    return text[at + len("[while running '"):].split("'", 1)[0] if at >= 0 else ""


def root_cause(err: BaseException, shown: tuple = ()) -> str:
    """What made a run fail, in words that quote no file: the errno text of an OS error in the
    chain (and the file it names), the message of a :class:`ShownError` (or any error marked
    ``shown``: a runner's own message) or of one of ``shown`` (classes whose messages name
    files, columns and counts only); else the class of the innermost error -- an error raised
    while parsing a value may quote it -- and the Beam step it was raised in."""
    chain = exception_chain(err)
    step = next((s for s in map(_step, chain) if s), "")
    where = f" in step '{step}'" if step else ""
    for e in chain:
        if isinstance(e, OSError) and e.errno and e.strerror:
            name = f": {e.filename}" if isinstance(e.filename, str) else ""
            return f"{type(e).__name__}: [Errno {e.errno}] {e.strerror}{name}{where}"
    for e in chain:
        if isinstance(e, shown) or getattr(e, "shown", False) is True:
            text = str(e).split(" [while running", 1)[0].strip().splitlines()
            return (text[0] if text else type(e).__name__) + where
    return f"{type(chain[-1]).__name__}{where}"
