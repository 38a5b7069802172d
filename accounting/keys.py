"""Per-release secret keys (accounting: the ledger and key store hold them; the noise engine uses them).

Every random choice of a release (noise, which rows contribution bounding keeps, randomized
rounding) is a deterministic function of one secret :class:`ReleaseKey` and of *what* the choice is
about, so re-running a release on the same input reproduces it exactly, on any runner and with any
bundling. A fresh key per release comes from the OS's CSPRNG; it is never logged (``repr`` hides
it) and is stored only where the operator keeps release secrets (``save`` writes a 0600 file).

``ReleaseKey.for_testing(seed)`` is the only non-secret source: a key derived from a public seed,
flagged ``is_testing`` so that a real release (the budget ledger) can refuse it.

``ReleaseKey.for_exact_testing(seed)`` is a testing key that is also flagged ``noise_free``: the
noise engine adds zero noise and selection is deterministic under it (the exact mode of the
neighbouring-pair audits, accounting/verification/audit.py, which bound how much exact outputs move). It is a
testing key in every respect (never stored, refused by every real release), and a key cannot be
noise-free without being a testing key.

One secret, one use
-------------------
The same key and purpose on a second input repeat the noise: the difference of the two outputs
is noise-free. So every transform holding a key *claims* its purposes when it is applied
(:meth:`ReleaseKey.claim`), and a claim is held for the whole process per (secret fingerprint,
purpose) -- not per key object: a key loaded twice, unpickled, copied or rebuilt from the same
bytes is the same secret and shares its claims. The rules:

* a second claim of a purpose is refused (:class:`KeyReuseError`), whichever object makes it;
* :meth:`ReleaseKey.derive` hands a child key to another holder (a part of a
  :class:`~accounting.shared_budget.SharedBudget`, a helper): it claims ``derive/<label>`` on the
  parent, so the same label cannot be derived twice, and the child's claims are those of its own
  secret, which is a function of the parent's -- deriving it again (in any object) yields the same
  claims. :meth:`ReleaseKey.subkey` is the same derivation for the key's own holder *inside* one
  transform or mechanism (keyed streams, ciphers): it claims nothing, runs on workers, and its
  result shares its secret's claims like any key;
* the remedy for a second release is a fresh key per release from the key store
  (:meth:`accounting.keystore.KeyStore.issue`, or the budget ledger, which issues one per
  release); for several aggregations of one release, one part each of a SharedBudget.

Claims are a pipeline-construction guard (transforms claim in ``expand``); keys pickled to
workers carry no claims and workers never claim. Two kinds of key re-run one computation on
purpose, and are scoped by a *binding* and a *session* instead: a claim repeated under the same
binding from another session is a re-run, from the same session a reuse.

* Testing keys (binding ``testing``): each ``for_testing`` / ``for_exact_testing`` call (or
  construction) is a session, so tests and the neighbouring-pair audits build the same public key
  per run; one key object (and its unpickled copies and derived children) still drives each
  purpose once.
* Keys the budget ledger issued (:meth:`bound`, binding: ledger, release version and input
  digest): a re-run of a release on the same input gets the same key, bound in a new session,
  and reproduces the release. Loaded from its file by anything but the ledger, such a key drives
  nothing (:meth:`claim` refuses it): it belongs to its release.

Across processes the key store binds a stored key to its release and input digest, durably: the
ledger's keys by a use record beside the key (:meth:`accounting.keystore.KeyStore.bind_use`),
:meth:`~accounting.keystore.KeyStore.issue`'s by its issue record; a second process asking for
the key for another release or input is refused (:class:`KeyReuseError`).

Audit worlds (tests only)
-------------------------
A neighbouring-pair audit of two-batch *sequences* runs a job through the real budget ledger
twice, once per world (with and without a unit), and needs the same ledger keys in both worlds
so that their outputs can be compared byte for byte; in production the two worlds would be two
processes. :meth:`ReleaseKey.from_public_seed` makes such a key -- a real key in every respect
(stored by the key store, issued by the ledger, never noise-free) whose secret is a public
function of a seed -- and :func:`audit_world` runs one world as if in a process of its own: the
claims of public-seed keys (and of everything derived from them, however reloaded) made inside
are held for that world only. Every other key claims process-wide inside a world as outside it:
a CSPRNG key (or one loaded from a key store) driving an input in one world and another input in
the next is refused as anywhere, so the scope cannot exempt a secret key.
"""
from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import os
import secrets
import threading
from typing import Optional

KEY_BYTES = 32
_TESTING_PREFIX = b"beam-dp-release/testing-key/v1"
_EXACT_TESTING_PREFIX = b"beam-dp-release/exact-testing-key/v1"
_PUBLIC_SEED_PREFIX = b"beam-dp-release/public-seed-key/v1/"
_TESTING = "testing"
_DERIVE = "derive/"
#: Labels of the noise engine's and bounding's own sub-keys: never handed out by ``derive``.
_INTERNAL_LABELS = ("stream:", "key-mac:", "bound:")
#: The key file line naming the release the budget ledger issued a key for (after the secret).
ISSUED_FOR = "issued-for: "

REMEDY = ("Use a fresh key per release from the key store (KeyStore.issue(name), or the budget "
          "ledger, which issues one per release); for several aggregations of one release, give "
          "each a part of one SharedBudget")


class KeyReuseError(RuntimeError):
    """A release key asked to drive the same random choices a second time (see ReleaseKey.claim)."""


class _Claim:
    """Who holds one (fingerprint, purpose) claim: mutable registry state, not a value."""

    __slots__ = ("owner", "binding", "sessions")

    def __init__(self, owner: str, binding: Optional[str], sessions: set):
        self.owner, self.binding, self.sessions = owner, binding, sessions


# (secret fingerprint, purpose) -> _Claim, for the whole process.
_CLAIMS: dict = {}
_CLAIMS_LOCK = threading.Lock()
# Fingerprints of keys whose secret is a public function of a seed (from_public_seed and their
# children), and the open audit world's registry of their claims (audit_world; None: none open).
_PUBLIC_SEEDED: set = set()
_WORLD: Optional[dict] = None


def _new_session() -> str:
    return secrets.token_hex(8)


class ReleaseKey:
    __slots__ = ("_secret", "is_testing", "noise_free", "_binding", "_session", "_issued_for")

    def __init__(self, secret: bytes, *, is_testing: bool = False, noise_free: bool = False):
        if not isinstance(secret, (bytes, bytearray)) or len(secret) != KEY_BYTES:
            raise ValueError(f"a release key is exactly {KEY_BYTES} bytes")
        if noise_free and not is_testing:
            raise ValueError("only a testing key can be noise-free (ReleaseKey.for_exact_testing)")
        self._secret = bytes(secret)
        self.is_testing = bool(is_testing)
        self.noise_free = bool(noise_free)
        self._binding = _TESTING if self.is_testing else None
        self._session = _new_session()
        self._issued_for = None

    @classmethod
    def generate(cls) -> "ReleaseKey":
        """A fresh secret key from the operating system's CSPRNG."""
        return cls(secrets.token_bytes(KEY_BYTES))

    @classmethod
    def for_testing(cls, seed: int) -> "ReleaseKey":
        """A reproducible, NON-secret key for tests and benchmarks only."""
        digest = hashlib.sha256(_TESTING_PREFIX + str(int(seed)).encode()).digest()
        return cls(digest, is_testing=True)

    @classmethod
    def for_exact_testing(cls, seed: int) -> "ReleaseKey":
        """TESTS ONLY: a public testing key under which no noise is added (``noise_free``): the
        exact mode of the neighbouring-pair audits. Bounding and every other keyed choice are as
        under any key; outputs are the exact (bounded) answers."""
        digest = hashlib.sha256(_EXACT_TESTING_PREFIX + str(int(seed)).encode()).digest()
        return cls(digest, is_testing=True, noise_free=True)

    @classmethod
    def from_public_seed(cls, seed: str) -> "ReleaseKey":
        """TESTS ONLY (the two-batch sequence audits, :func:`audit_world`): a key that behaves
        as a real release key -- the key store stores it, the ledger issues it, it adds noise --
        but whose secret is a public function of ``seed``, so two worlds of an audit pair draw
        the same keys. Inside an audit world its claims (and its children's) are the world's."""
        if not isinstance(seed, str) or not seed:
            raise ValueError("from_public_seed needs a non-empty seed string")
        key = cls(hashlib.sha256(_PUBLIC_SEED_PREFIX + seed.encode("utf-8")).digest())
        with _CLAIMS_LOCK:
            _PUBLIC_SEEDED.add(key.fingerprint())
        return key

    # ------------------------------------------------------------------ derivation

    def _child(self, label: str) -> "ReleaseKey":
        sub = hmac.new(self._secret, label.encode("utf-8"), hashlib.sha256).digest()
        child = ReleaseKey(sub, is_testing=self.is_testing, noise_free=self.noise_free)
        child._binding, child._session, child._issued_for = \
            self._binding, self._session, self._issued_for
        if _PUBLIC_SEEDED and self.fingerprint() in _PUBLIC_SEEDED:
            with _CLAIMS_LOCK:
                _PUBLIC_SEEDED.add(child.fingerprint())
        return child

    def derive(self, label: str, owner: str = "ReleaseKey.derive") -> "ReleaseKey":
        """An independent child key for another holder (HMAC-SHA256 as a PRF), once per label.

        Claims ``derive/<label>`` on this key (:meth:`claim`): deriving the same label again --
        from this object, a copy or a reloaded key -- is refused, since the child would be the
        same secret. The child's claims are its secret's, in this key's binding and session.
        """
        if not isinstance(label, str) or not label:
            raise ValueError("derive needs a non-empty label")
        if label.startswith(_INTERNAL_LABELS):
            raise ValueError(f"derive label {label!r}: labels starting with "
                             f"{', '.join(_INTERNAL_LABELS)} name the noise engine's own sub-keys")
        self.claim(_DERIVE + label, owner=owner)
        return self._child(label)

    def subkey(self, label: str) -> "ReleaseKey":
        """The sub-key of ``label`` for this key's own holder, inside one transform or mechanism
        whose purposes are claimed (keyed streams and ciphers; per batch, on workers): the same
        derivation as :meth:`derive` without claiming the label. It shares its secret's claims.
        """
        if not isinstance(label, str) or not label:
            raise ValueError("subkey needs a non-empty label")
        return self._child(label)

    def bound(self, binding: str, issued_for: Optional[str] = None) -> "ReleaseKey":
        """THE BUDGET LEDGER ONLY: this key bound to one release and input (``binding``) in a new
        session, so that a re-run of that release in this process may claim its purposes again
        (it reproduces the release). ``issued_for``: the release id the key was issued for."""
        if self.is_testing:
            raise ValueError("a testing key is never bound to a release")
        if not isinstance(binding, str) or not binding:
            raise ValueError("a key binding is a non-empty string")
        if self._issued_for is not None and issued_for is not None and \
                self._issued_for != issued_for:
            raise KeyReuseError(f"this key was issued for release {self._issued_for!r}, not "
                                f"{issued_for!r}: one key, one release")
        key = ReleaseKey(self._secret)
        key._binding = "ledger:" + binding
        key._issued_for = issued_for or self._issued_for or binding
        return key

    # ------------------------------------------------------------------ claims

    def claim(self, purpose: str, owner: str = "a transform") -> None:
        """Record that ``owner`` draws the randomness of ``purpose`` from this key's secret.

        Held for the whole process per (secret fingerprint, purpose): a second claim raises
        :class:`KeyReuseError`, whichever object makes it (a copy, an unpickled or reloaded key,
        a child derived again), except a re-run of a testing or ledger-bound key in a new
        session (module docstring). Every transform holding a key claims its purposes when it
        is applied, so one instance cannot be applied twice, two transforms cannot share a
        stream, and one key cannot drive two releases. Thread-safe; pipeline construction only
        (workers never claim).
        """
        if not isinstance(purpose, str) or not purpose:
            raise ValueError("a key claim needs a non-empty purpose")
        if self._issued_for is not None and self._binding is None:
            raise KeyReuseError(
                f"{owner}: this key was issued for release {self._issued_for!r} (by the budget "
                f"ledger or KeyStore.issue); it drives that release only, bound to it (a re-run "
                f"of the same input gets it from BudgetLedger.reserve or KeyStore.use). Loaded "
                f"from its file it cannot drive {purpose!r}. {REMEDY}")
        slot = (self.fingerprint(), purpose)
        with _CLAIMS_LOCK:
            claims = _WORLD if _WORLD is not None and slot[0] in _PUBLIC_SEEDED else _CLAIMS
            held = claims.get(slot)
            if held is None:
                claims[slot] = _Claim(owner=owner, binding=self._binding,
                                      sessions={self._session})
                return
            rerun = (held.binding is not None and held.binding == self._binding
                     and self._session not in held.sessions)
            if not rerun:
                raise KeyReuseError(
                    f"{owner}: this release key (fingerprint {slot[0]}) already drives "
                    f"{purpose!r} in this process (claimed by {held.owner}); applying it again "
                    "(another input, another day, a second application of the same transform, "
                    "the same key loaded, copied or derived again) would repeat its noise, and "
                    f"the difference of the two outputs would be exact. {REMEDY}")
            held.owner = owner
            held.sessions.add(self._session)

    # ------------------------------------------------------------------ secret and storage

    def secret_bytes(self) -> bytes:
        """The raw key. Only the noise engine and ``save`` should call this."""
        return self._secret

    def fingerprint(self) -> str:
        """A public reference to the key (safe to log and to record in a ledger)."""
        return hmac.new(self._secret, b"fingerprint", hashlib.sha256).hexdigest()[:16]

    def to_text(self, issued_for: Optional[str] = None) -> str:
        """The key file's text: the hex secret, and the release the ledger issued it for."""
        text = self._secret.hex() + "\n"
        if issued_for is not None:
            text += ISSUED_FOR + json.dumps(str(issued_for)) + "\n"
        return text

    @classmethod
    def from_text(cls, text: str, where: str) -> "ReleaseKey":
        """A key from :meth:`to_text`'s format (``where`` names the file in errors)."""
        lines = text.strip().splitlines() or [""]
        try:
            key = cls(bytes.fromhex(lines[0].strip()))
        except ValueError:
            raise ValueError(f"{where} does not hold a hex release key")
        for line in lines[1:]:
            if line.startswith(ISSUED_FOR):
                try:
                    key._issued_for = str(json.loads(line[len(ISSUED_FOR):]))
                except ValueError:
                    raise ValueError(f"{where}: unreadable issued-for line")
            elif line.strip():
                raise ValueError(f"{where} does not hold a release key (unknown line)")
        return key

    def save(self, path: str, issued_for: Optional[str] = None) -> None:
        """Write the key to a new file readable by its owner only; refuses to overwrite."""
        if self.is_testing:
            raise ValueError("refusing to store a testing key as a release secret")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "w") as handle:
                handle.write(self.to_text(issued_for))
        except OSError as err:  # a full disk: no partial key file left behind (it is ours: O_EXCL)
            os.unlink(path)
            raise OSError(err.errno, err.strerror, path) from None

    @classmethod
    def load(cls, path: str) -> "ReleaseKey":
        """The key in ``path``. A key issued for a release (by the budget ledger or
        ``KeyStore.issue``) loads (e.g. to check a keyed binding) but drives no transform
        (:meth:`claim`)."""
        with open(path) as handle:
            return cls.from_text(handle.read(), path)

    @property
    def issued_for(self) -> Optional[str]:
        """The release the budget ledger issued this key for (None for other keys)."""
        return self._issued_for

    def __eq__(self, other):
        return isinstance(other, ReleaseKey) and hmac.compare_digest(self._secret, other._secret)

    def __hash__(self):
        return hash(self.fingerprint())

    def __repr__(self):
        kind = ("exact-testing" if self.noise_free else "testing") if self.is_testing else "secret"
        return f"ReleaseKey({kind}, fingerprint={self.fingerprint()})"

    def __reduce__(self):
        # Beam pickles DoFns holding the key to ship them to workers; an unpickled copy is the
        # same key in the same session (it shares the original's claims, in-process too).
        return (_restore, (self._secret, self.is_testing, self.noise_free, self._binding,
                           self._session, self._issued_for))


@contextlib.contextmanager
def audit_world():
    """TESTS ONLY: run one world of a neighbouring-pair sequence audit as if in a process of its
    own (module docstring, "Audit worlds"). Inside, claims of keys made by
    :meth:`ReleaseKey.from_public_seed` (their copies, reloads, ledger bindings and children) go
    to a registry of this world, discarded when it closes; every other key claims process-wide
    as always. Worlds do not nest (one process at a time)."""
    global _WORLD
    with _CLAIMS_LOCK:
        if _WORLD is not None:
            raise RuntimeError("audit worlds do not nest: one world (one simulated process) at a time")
        _WORLD = {}
    try:
        yield
    finally:
        with _CLAIMS_LOCK:
            _WORLD = None


def _restore(secret, is_testing, noise_free, binding, session, issued_for) -> ReleaseKey:
    key = ReleaseKey(secret, is_testing=is_testing, noise_free=bool(noise_free) and is_testing)
    key._binding, key._session, key._issued_for = binding, session, issued_for
    return key
