"""A release made by two processes: what ``--submit_only`` leaves and how ``--finalize`` finds it.

:func:`pipelines.release.lifecycle.submit` reserves, stages and starts the pipeline, then
:func:`record`\\ s with every reservation the job's handle (runner, job id, state) and the release's
staging attempt; :func:`pipelines.release.lifecycle.finalize`, given the same flags in another
process, finds the reservation again and reads them back (:func:`submitted`), waits for the job,
then publishes. Why this is as sound as one run: the reservation, its keys and its input digest
are the ledger's, exactly as for a run that was killed after computing and is resumed; finalize
recomputes the input digest from the inputs, so inputs changed since the submission are refused.

Finalize may run twice, or twice at once (a retried scheduler task): :func:`turn` makes two
finalizing processes take turns through a claim in the ledger record (a transaction on both
ledger stores), so the second sees the release published and reproduces it. A claim lapses after
:data:`LEASE_SECONDS`, or at once when its holder was a process of this host that is gone.

Counters: the pipeline itself writes each release's row counters into its private staging folder
(pipelines.release.counters), on every runner, so finalize reads them there whichever process or
runner computed the release.
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import socket
import time
from typing import Mapping, Optional

from accounting.ledger import LedgerError
from pipelines.release import storage
from pipelines.release.errors import ReleaseFailed, ReleaseRefused

_LOG = logging.getLogger(__name__)

#: How long a finalizing process holds a release before another may take it over.
LEASE_SECONDS = 300.0
#: The counters a local engine's submitted job counted, beside its staging attempt.


def record(reserved, staging: Mapping[str, str], handle) -> None:
    """The job's handle and each release's staging attempt, recorded with its reservation.
    A ledger that refuses (another run took the reservation over meanwhile) is ReleaseFailed
    (exit 3: charged, nothing published; submit again)."""
    for context in reserved.releases:
        rid = context.release_id
        try:
            reserved.ledger.record_submission(reserved.reservations[rid],
                                              {**handle.to_json(), "staging": staging[rid]})
        except LedgerError as err:
            raise ReleaseFailed(f"{context.versioned_id}: the job was submitted but its handle "
                                f"could not be recorded ({err}); nothing was published: submit "
                                "it again") from None


def submitted(reserved):
    """(staging folder per release id, job handle) of the submission the reservations hold.

    Raises ReleaseRefused (exit 2; finalize charges nothing) when a release was reserved but never
    submitted, was taken over by another run since (other keys: its staged outputs are not the
    reservation's), or was submitted with another staging root."""
    from runners.execution import JobHandle

    places = reserved.pre.places
    roots = (places.staging.rstrip("/") + "/",) if reserved.pre.options.staging_dir else \
        (places.staging.rstrip("/") + "/", storage.join(places.output, ".staging") + "/")
    staging, handles = {}, set()
    for context in reserved.releases:
        reservation = reserved.reservations[context.release_id]
        found = reservation.record.get("submission")
        if not found:
            raise ReleaseRefused(f"{context.versioned_id} is reserved but was never submitted: "
                                 "run --submit_only with these flags first")
        if found.get("key_fingerprints") != {n: r.fingerprint
                                             for n, r in reservation.key_refs.items()}:
            raise ReleaseRefused(f"{context.versioned_id} was taken over by another run after "
                                 "it was submitted: submit it again")
        if not str(found.get("staging", "")).startswith(roots):  # or OUTPUT/.staging, before
            raise ReleaseRefused(f"{context.versioned_id} was submitted with staging "
                                 f"{found.get('staging')}, not under {roots[0]}: finalize with "
                                 "the flags it was submitted with")
        staging[context.release_id] = found["staging"]
        handles.add(json.dumps(JobHandle.from_json(found).to_json(), sort_keys=True))
    if len(handles) != 1:
        raise ReleaseRefused("the releases of these flags were submitted by different runs: "
                             "submit them again together")
    return staging, JobHandle.from_json(json.loads(handles.pop()))


# --------------------------------------------------------------------------- taking turns

def _gone(claim: Mapping) -> bool:
    """Whether a claim's holder was a process of this host that no longer runs."""
    if claim.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(claim["pid"]), 0)
    except ProcessLookupError:
        return True
    except (PermissionError, ValueError, KeyError, TypeError):
        return False
    return False


@contextlib.contextmanager
def turn(reserved, *, lease: float = LEASE_SECONDS, poll: float = 0.5):
    """Hold every release of ``reserved`` (in id order, so two processes never wait on each
    other) while the block finishes them; another finalizing process waits its turn."""
    token, held = secrets.token_hex(8), []
    try:
        for context in sorted(reserved.releases, key=lambda c: c.release_id):
            reservation, replacing = reserved.reservations[context.release_id], None
            while True:
                try:
                    other = reserved.ledger.claim(reservation, token, lease, replacing=replacing)
                except LedgerError as err:
                    raise ReleaseRefused(f"--finalize: {err}; submit it again") from None
                if other is None:
                    break
                replacing = other["token"] if _gone(other) else None
                if replacing is None:
                    _LOG.info("%s is being finalized by process %s on %s: waiting",
                              context.versioned_id, other.get("pid"), other.get("host"))
                    time.sleep(poll)
            held.append(reservation)
        yield
    finally:
        for reservation in held:
            with contextlib.suppress(Exception):
                reserved.ledger.claim(reservation, token, 0)
