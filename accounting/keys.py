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
neighbouring-pair audits, accounting/audit.py, which bound how much exact outputs move). It is a
testing key in every respect (never stored, refused by every real release), and a key cannot be
noise-free without being a testing key.
"""
from __future__ import annotations

import hashlib
import hmac
import os
import secrets

KEY_BYTES = 32
_TESTING_PREFIX = b"beam-dp-release/testing-key/v1"
_EXACT_TESTING_PREFIX = b"beam-dp-release/exact-testing-key/v1"


class KeyReuseError(RuntimeError):
    """A release key asked to drive the same random choices a second time (see ReleaseKey.claim)."""


class ReleaseKey:
    __slots__ = ("_secret", "is_testing", "noise_free", "_claims")

    def __init__(self, secret: bytes, *, is_testing: bool = False, noise_free: bool = False):
        if not isinstance(secret, (bytes, bytearray)) or len(secret) != KEY_BYTES:
            raise ValueError(f"a release key is exactly {KEY_BYTES} bytes")
        if noise_free and not is_testing:
            raise ValueError("only a testing key can be noise-free (ReleaseKey.for_exact_testing)")
        self._secret = bytes(secret)
        self.is_testing = bool(is_testing)
        self.noise_free = bool(noise_free)
        self._claims = set()

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

    def derive(self, label: str) -> "ReleaseKey":
        """An independent sub-key for one purpose (HMAC-SHA256 as a PRF)."""
        sub = hmac.new(self._secret, label.encode("utf-8"), hashlib.sha256).digest()
        return ReleaseKey(sub, is_testing=self.is_testing, noise_free=self.noise_free)

    def claim(self, purpose: str, owner: str = "a transform") -> None:
        """Record that ``owner`` draws the randomness of ``purpose`` from this key object.

        A second claim of the same purpose raises :class:`KeyReuseError`: the same key and
        purpose on other input would repeat the noise, and the difference of the two outputs
        would be noise-free. Every transform holding a key claims its purposes when it is
        applied, so one instance cannot be applied twice and two transforms cannot share a
        stream. (Across processes a stored key is bound to its input digest by the ledger.)
        Claims belong to this object: they are not pickled to workers.
        """
        if not isinstance(purpose, str) or not purpose:
            raise ValueError("a key claim needs a non-empty purpose")
        if purpose in self._claims:
            raise KeyReuseError(
                f"{owner}: this release key already drives {purpose!r} in this process; applying "
                "it again (another input, another day, a second application of the same "
                "transform) would repeat its noise. Use a fresh key per release (the ledger "
                "issues one), or ReleaseKey.derive(label) for a second, independent aggregation")
        self._claims.add(purpose)

    def secret_bytes(self) -> bytes:
        """The raw key. Only the noise engine and ``save`` should call this."""
        return self._secret

    def fingerprint(self) -> str:
        """A public reference to the key (safe to log and to record in a ledger)."""
        return hmac.new(self._secret, b"fingerprint", hashlib.sha256).hexdigest()[:16]

    def save(self, path: str) -> None:
        """Write the key to a new file readable by its owner only; refuses to overwrite."""
        if self.is_testing:
            raise ValueError("refusing to store a testing key as a release secret")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(self._secret.hex() + "\n")

    @classmethod
    def load(cls, path: str) -> "ReleaseKey":
        with open(path) as handle:
            text = handle.read().strip()
        try:
            secret = bytes.fromhex(text)
        except ValueError:
            raise ValueError(f"{path} does not hold a hex release key")
        return cls(secret)

    def __eq__(self, other):
        return isinstance(other, ReleaseKey) and hmac.compare_digest(self._secret, other._secret)

    def __hash__(self):
        return hash(self.fingerprint())

    def __repr__(self):
        kind = ("exact-testing" if self.noise_free else "testing") if self.is_testing else "secret"
        return f"ReleaseKey({kind}, fingerprint={self.fingerprint()})"

    def __reduce__(self):
        # Beam pickles DoFns holding the key to ship them to workers.
        return (ReleaseKey, (self._secret,), {"is_testing": self.is_testing,
                                               "noise_free": self.noise_free})

    def __setstate__(self, state):
        if isinstance(state, tuple):  # (None, slots-dict) form
            state = state[1]
        self.is_testing = state["is_testing"]
        self.noise_free = bool(state.get("noise_free", False)) and self.is_testing
        self._claims = set()
