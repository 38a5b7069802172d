"""The release keys of a reservation: fresh ones stored before the charge, existing ones loaded
inside it, each bound to its release version and input digest.

* **Fresh keys** (a new release or a take-over) are generated and saved in the key store once
  per ``reserve`` call (reused when a GCS write conflict re-runs the transaction) and deleted
  again unless the ledger written references them: a refusal leaves no key behind.
* **Existing keys** (a re-run on the same input) are loaded inside the transaction, so that a key
  that cannot be loaded refuses the reservation before the ledger changes.
* **Resolved in the key store** (:func:`load_key`): a key the ledger names is looked up inside the
  configured key store under its own name (the release id, and the key's fingerprint); a
  reference to another path or ``gs://`` URI -- a key someone who can write only the ledger put
  elsewhere -- is refused.
* **Bound** (:func:`bind`): a reservation's key is bound to its ledger, release version and
  input digest, durably (a use record in the key store: a second process using the key for
  another release or input is refused) and in a new session of this process: a re-run of the
  same input reproduces the release (it may claim the key's purposes again); nothing else can
  draw from it (:mod:`accounting.keys`, "One secret, one use").
"""
from __future__ import annotations

from accounting.keys import KeyReuseError, ReleaseKey
from accounting.keystore import KeyRef, KeyStore
from accounting.ledger.records import LedgerError, ReleaseRequest
from accounting.ledger.sealing import error_text


def label(release_id: str, name: str) -> str:
    """The key-store name of a release's key ``name`` (``release``: the release id itself)."""
    return release_id if name == "release" else f"{release_id}/{name}"


def bind(key_store: KeyStore, key: ReleaseKey, ref: KeyRef, ledger_id: str, record: dict,
         name: str) -> ReleaseKey:
    """A reservation's key, bound to its release version and input digest: durably, by its use
    record in the key store (:meth:`~accounting.keystore.KeyStore.bind_use`: another process
    using it for another release or input is refused), and in a new session of this process."""
    try:
        return key_store.bind_use(key, ref, release=label(record["release_id"], name),
                                  input_digest=record["input_digest"],
                                  binding=f"{ledger_id}/{record['versioned_id']}/{name}")
    except KeyReuseError as err:
        raise LedgerError(f"release {record['versioned_id']!r}: {err}. Nothing was charged; "
                          "the ledger and the key store disagree about this key (was the ledger "
                          "restored or copied?)") from None
    except OSError as err:
        raise LedgerError(f"release {record['versioned_id']!r}: the use record of its key "
                          f"{ref.uri} cannot be written ({error_text(err)})") from None


def load_key(key_store: KeyStore, record: dict, name: str) -> ReleaseKey:
    """The record's key ``name``, resolved inside the key store under its own name
    (:meth:`~accounting.keystore.KeyStore.resolve`: a reference elsewhere is refused), or a
    LedgerError naming the key that cannot be used."""
    ref = record["keys"][name]
    try:
        return key_store.load(key_store.resolve(KeyRef.from_json(ref),
                                                label(record["release_id"], name)))
    except (OSError, ValueError) as err:
        raise LedgerError(
            f"release {record['versioned_id']!r} (ledger record {record.get('seq')}): "
            f"its key {ref['uri']} cannot be loaded ("
            f"{err if isinstance(err, ValueError) else error_text(err)}); without it "
            "the release cannot be reproduced or completed. Nothing was charged or "
            "changed; restore the key store (or point --key_store at it)") from None


class ReservationKeys:
    """The release keys of one ``reserve`` call (see the module docstring)."""

    def __init__(self, key_store: KeyStore):
        self.key_store = key_store
        self.pending: dict = {}   # (release id, key name) -> (key, ref)
        self.loaded: dict = {}    # (versioned id, key name) -> key

    def fresh(self, request: ReleaseRequest) -> dict:
        """References to fresh keys for ``request`` (saved once per call)."""
        refs = {}
        for name in request.key_names:
            slot = (request.release_id, name)
            if slot not in self.pending:
                key = ReleaseKey.generate()
                issued = label(request.release_id, name)
                self.pending[slot] = (key, self.key_store.save(key, issued, issued_for=issued))
            refs[name] = self.pending[slot][1].to_json()
        return refs

    def load(self, record: dict) -> dict:
        """The record's keys (LedgerError naming a key that cannot be loaded)."""
        out = {}
        for name in record["keys"]:
            slot = (record["versioned_id"], name)
            if slot not in self.loaded:
                self.loaded[slot] = load_key(self.key_store, record, name)
            out[name] = self.loaded[slot]
        return out

    def of(self, record: dict, kind: str) -> dict:
        """The keys of a decided record: fresh for a new release or a take-over, else loaded."""
        if kind in ("new", "takeover"):
            return {name: self.pending[(record["release_id"], name)][0] for name in record["keys"]}
        return self.load(record)

    def abandon(self) -> None:
        """The reservation was refused: every fresh key goes."""
        for _, ref in self.pending.values():
            self.key_store.delete(ref)

    def settle(self, outcomes) -> None:
        """Fresh keys that no decided record took are deleted."""
        used = {(o[1]["release_id"], name) for o in outcomes if o[0] in ("new", "takeover")
                for name in o[1]["keys"]}
        for slot, (_, ref) in self.pending.items():
            if slot not in used:
                self.key_store.delete(ref)
