"""How a release run ends when it does not publish, and the exit code a scheduler sees.

* :class:`ReleaseRefused` -- exit 2: refused before any charge (bad flags, configuration or
  input, a budget or ownership refusal). Nothing was charged and nothing was published.
* :class:`ReleaseFailed` -- exit 3: failed after the reservation (a fault found while computing,
  a publication conflict). Nothing was published; the reservation stays charged and a corrected
  re-run takes it over without spending again.

Exit 0 means released (or an identical re-run); any other code means nothing new was published,
with two stated exceptions: a run of several releases whose publication fails part-way (an I/O
fault after the checks that precede every publication) exits 3 naming the releases that are out
(re-running the same command reproduces those byte for byte and publishes the rest); and a run
given ``--alert_exit_code N`` exits N when its releases were published with an operator alert.
After a release is published, a failing ledger commit or operator report is a warning (exit 0):
the budget was charged at the reservation, and the next run of the same command completes the
record.

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
#: The codes ``--alert_exit_code`` may take (0-3 mean the above; 126 and up are the shell's).
ALERT_EXIT_CODES = (4, 125)


class ReleaseRefused(ValueError):
    """Refused before any budget was charged (exit 2)."""

    exit_code = EXIT_REFUSED


class ReleaseFailed(RuntimeError):
    """Failed after the reservation; nothing was published (exit 3)."""

    exit_code = EXIT_FAILED
