"""Holds: which run is working on a release, so that a concurrent run is refused, not raced.

The ledger's rules alone keep two concurrent runs of one release safe (one charge, one key per
input, a take-over invalidates the other run's reservation before it publishes). But the loser
of such a race would learn it only after computing: it resumes the winner's reservation and
publishes the same bytes, or it takes the reservation over (a fresh key: the winner's key is
left behind) and one of the two fails at publication. A *hold* makes the outcome honest and
early: a run that reserves a release holds its record until the run ends; another run that
reserves the same release meanwhile is refused before anything is charged or stored
(:class:`~accounting.ledger.records.ReleaseHeld`, exit 2: "held by another run").

A hold names its run (a random token), host, process id and that process's start time, and
expires after :data:`TTL_SECONDS`. It is *live* while it has not expired and, on the same host,
while its process is still running (a run killed with ``kill -9`` leaves a hold that the next
run on the same host recognises as dead at once; on another host it lapses at expiry). The run
releases its holds when it ends, whatever the outcome. Holds are advisory for progress only:
the ledger's checks keep the budget safe without them.
"""
from __future__ import annotations

import datetime as _dt
import os
import secrets
import socket
from dataclasses import dataclass
from typing import Optional

from accounting.ledger.records import ReleaseHeld

#: How long a hold of a run on another host lasts (a run longer than this may be taken over
#: by another; the ledger then refuses the first run's publication, exit 3).
TTL_SECONDS = 24 * 3600


def host_id() -> str:
    """This host: its name and boot id (a reboot ends every process of the host)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as handle:
            boot = handle.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}" if boot else socket.gethostname()


def _started(pid: int) -> Optional[str]:
    """The process's start time (clock ticks since boot; Linux), to tell a reused pid apart."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _now() -> _dt.datetime:
    return _dt.datetime.now(_dt.timezone.utc)


@dataclass(frozen=True, kw_only=True)
class Hold:
    """One run's claim on the releases it reserves (see the module docstring)."""

    run: str
    host: str
    pid: int
    started: Optional[str]

    @classmethod
    def new(cls) -> "Hold":
        pid = os.getpid()
        return cls(run=secrets.token_hex(8), host=host_id(), pid=pid, started=_started(pid))

    def to_json(self) -> dict:
        since = _now()
        until = since + _dt.timedelta(seconds=TTL_SECONDS)
        return {"run": self.run, "host": self.host, "pid": self.pid, "started": self.started,
                "since": since.isoformat(timespec="seconds"),
                "until": until.isoformat(timespec="seconds")}


def is_live(data) -> bool:
    """Whether a record's hold (``record["hold"]``) still holds."""
    if not isinstance(data, dict):
        return False
    try:
        if _now() >= _dt.datetime.fromisoformat(str(data.get("until"))):
            return False
    except ValueError:
        return False
    if data.get("host") != host_id():
        return True
    pid = data.get("pid")
    if not isinstance(pid, int):
        return False
    started = _started(pid)
    return started is not None and started == data.get("started")


def describe(data: dict) -> str:
    return (f"run {data.get('run')} on {str(data.get('host')).split('/')[0]}, process "
            f"{data.get('pid')}, since {data.get('since')}; the hold lapses when that process "
            f"ends or at {data.get('until')}")


def check(record: dict, hold: Optional[Hold]) -> None:
    """Refuse a release another live run holds (:class:`ReleaseHeld`: nothing charged or
    stored); a dead run's hold is removed from ``record``."""
    held = record.get("hold")
    if held is None or (hold is not None and held.get("run") == hold.run):
        return
    if is_live(held):
        raise ReleaseHeld(
            f"release {record['versioned_id']!r} is held by another run ({describe(held)}). "
            "Nothing was charged or stored; run again once it has ended")
    del record["hold"]  # a dead run's hold


def take(record: dict, hold: Optional[Hold]) -> None:
    """The run holds ``record`` (no hold: nothing changes)."""
    if hold is not None:
        record["hold"] = hold.to_json()


def claim_finalizing(record: dict, token: str, seconds: float, replacing: Optional[str],
                     now: float) -> tuple[bool, Optional[dict]]:
    """A finalizing process's claim on a submitted release (``seconds`` <= 0: let go of it):
    ``(changed, other holder's claim or None)``. Another live claim is taken only by naming it
    in ``replacing`` (its holder is known to be gone)."""
    held = record.get("finalizing")
    if seconds <= 0:
        if held and held.get("token") == token:
            record["finalizing"] = None
            return True, None
        return False, None
    if held and held.get("token") not in (token, replacing) and held["until"] > now:
        return False, dict(held)
    record["finalizing"] = {"token": token, "until": now + seconds,
                            "host": socket.gethostname(), "pid": os.getpid()}
    return True, None
