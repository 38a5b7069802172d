"""Local frequency oracles: parameters, realised probabilities, unbiased estimator and its variance.

One frozen value object per oracle says *what happens* on a client (which probabilities, on which
grid) and *how a server counts it* (the support probabilities and the estimator's variance). The
client code is in :mod:`transforms.ldp.randomizers`, report schemas in
:mod:`transforms.ldp.reports`, server-side counting in :mod:`transforms.ldp.estimators`.

Sources: Warner (1965) for binary randomized response; Wang, Blocki, Li & Jha, "Locally
Differentially Private Protocols for Frequency Estimation" (USENIX Security 2017) for GRR
(direct encoding), SUE/OUE (unary encoding) and OLH; Erlingsson, Pihur & Korolova, "RAPPOR"
(CCS 2014) for basic one-time RAPPOR; seeds ``002_8efe61bb3e32549d.txt`` and
``000_015430204a1d6d17.txt``.

Every oracle is a *pure* epsilon-LDP randomizer: for any two values v, v' and any report r,
P[r | v] <= e^epsilon P[r | v']. Probabilities are realised exactly on the 2^-32 grid, rounded
in the direction that keeps the realised epsilon (``realised_epsilon``) at or below the nominal
one; the estimator uses the realised probabilities, so it is exactly unbiased.

The estimator and its variance, derived once for all oracles
------------------------------------------------------------
Each report j "supports" a value v or not (GRR: report == v; unary: bit v set; OLH: the
report's bucket equals the bucket its hash function gives v; binary RR: bit == 1). Let
p* = P[supports v | client holds v] and q* = P[supports v | client holds some u != v]. With n
reports of which c hold v, the support count I_v is a sum of independent Bernoullis: c with
mean p*, n - c with mean q*. Hence

    E[I_v] = c p* + (n - c) q*            =>  c_hat = (I_v - n q*) / (p* - q*)  is unbiased,
    Var[c_hat] = (c p*(1-p*) + (n - c) q*(1-q*)) / (p* - q*)^2
               = n q*(1-q*)/(p*-q*)^2 + c (1 - p* - q*)/(p* - q*).

Per oracle (q* in terms of realised p, q; the papers' closed forms at c = 0 in brackets):

* binary RR, p = e^e/(1+e^e), q = 1-p: per-user variance e^e/(e^e-1)^2 exactly, whatever c
  (1-p-q = 0). [The seed prints e^e/(e^{2e}-1)^2 -- garbled; n e^e/(e^e-1)^2 for the sum.]
* GRR over d values: p = e^e/(e^e+d-1), q = (1-p)/(d-1); [n (e^e+d-2)/(e^e-1)^2].
* SUE (= basic one-time RAPPOR with f = 2/(1+e^{e/2})): p = e^{e/2}/(1+e^{e/2}), q = 1-p;
  [n e^{e/2}/(e^{e/2}-1)^2]. (The seed prints the RAPPOR entry MSE as n e^{e/2}/(e^e - 1)^2:
  also garbled; the flip probability of each bit is that of RR at e/2.)
* OUE: p = 1/2, q = 1/(e^e+1) [n 4e^e/(e^e-1)^2]. (The seed prints q = 1/(e^{e/2}+1): that is
  SUE's q, and with p = 1/2 it would only spend e/2.)
* OLH with g buckets: y = GRR_g(bucket(H(v))), p = e^e/(e^e+g-1); a non-holder supports v when
  its bucket collides with v's (probability kappa, :func:`transforms.ldp.hashing.
  collision_probability`) and y stays, or they differ and y moves onto v's bucket:
  q* = kappa p + (1-kappa)(1-p)/(g-1) (= 1/g when kappa = 1/g); with g = e^e+1,
  [n 4e^e/(e^e-1)^2]. (The seed prints p = e^e/(e^e+d'+1): its p and q do not sum to one over
  d' outcomes; the paper's denominator is e^e+d'-1.)
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import ClassVar, Mapping

import numpy as np

from transforms.ldp import hashing
from transforms.ldp.randomness import TWO32, threshold_ceil, threshold_floor

#: Local epsilons outside this range are refused: below, estimates are useless; above, the
#: 2^-32 probability grid cannot realise the mechanism faithfully.
EPSILON_MIN = 1e-3
EPSILON_MAX = 16.0
MAX_GRR_DOMAIN = 1 << 32
MAX_UNARY_DOMAIN = 1 << 20


def check_local_epsilon(epsilon) -> float:
    if isinstance(epsilon, bool) or not isinstance(epsilon, (int, float, np.integer, np.floating)):
        raise ValueError(f"epsilon must be a number, got {epsilon!r}")
    epsilon = float(epsilon)
    if not (EPSILON_MIN <= epsilon <= EPSILON_MAX):
        raise ValueError(f"local epsilon must be in [{EPSILON_MIN:g}, {EPSILON_MAX:g}], got "
                         f"{epsilon!r}")
    return epsilon


def check_domain_size(domain_size, low: int, high: int, oracle: str) -> int:
    if isinstance(domain_size, bool) or not isinstance(domain_size, (int, np.integer)):
        raise ValueError(f"{oracle}: domain_size must be an integer, got {domain_size!r}")
    domain_size = int(domain_size)
    if not low <= domain_size <= high:
        raise ValueError(f"{oracle}: domain_size must be in [{low}, {high}], got {domain_size}")
    return domain_size


@dataclass(frozen=True, kw_only=True)
class Oracle:
    """A local frequency oracle over values ``0 .. domain_size-1`` at local ``epsilon``."""

    epsilon: float
    domain_size: int

    name: ClassVar[str] = ""

    @property
    def oracle_name(self) -> str:
        """The name reports and configurations use ("grr", "oue", "rappor", ...)."""
        return self.name

    # -- what subclasses provide ------------------------------------------------------------
    def support_probabilities(self) -> tuple[float, float]:
        """(p*, q*): P[a report supports v] when its client holds v / holds another value."""
        raise NotImplementedError

    @property
    def realised_epsilon(self) -> float:
        """The epsilon the realised (grid) probabilities achieve; <= ``epsilon``."""
        raise NotImplementedError

    def paper_variance(self, n) -> float:
        """The published closed form of Var[c_hat] for a value nobody holds (c = 0)."""
        raise NotImplementedError

    def parameters(self) -> dict:
        """The realised randomization parameters, for reports and release metadata."""
        raise NotImplementedError

    # -- shared estimator ---------------------------------------------------------------------
    def estimate(self, support, n):
        """Unbiased count estimates c_hat = (I - n q*) / (p* - q*) from support counts I."""
        p, q = self.support_probabilities()
        return (np.asarray(support, dtype=np.float64) - float(n) * q) / (p - q)

    def variance(self, n, true_count=0):
        """Exact Var[c_hat] for a value held by ``true_count`` of ``n`` clients (vectorised)."""
        p, q = self.support_probabilities()
        c = np.asarray(true_count, dtype=np.float64)
        return (c * p * (1 - p) + (float(n) - c) * q * (1 - q)) / (p - q) ** 2

    def estimated_variance(self, n, estimate):
        """Var[c_hat] at the estimate clipped to [0, n] (the released std uses this)."""
        return self.variance(n, np.clip(np.asarray(estimate, dtype=np.float64), 0.0, float(n)))

    def describe(self) -> dict:
        p, q = self.support_probabilities()
        return {
            "oracle": self.oracle_name,
            "epsilon": self.epsilon,
            "realised_epsilon": self.realised_epsilon,
            "domain_size": self.domain_size,
            "support_probability_holder": p,
            "support_probability_other": q,
            "parameters": self.parameters(),
            "estimator": "c_hat = (I_v - n q*) / (p* - q*)",
            "variance": "Var[c_hat] = (c p*(1-p*) + (n-c) q*(1-q*)) / (p*-q*)^2",
            "privacy": (f"each report is {self.realised_epsilon:.6g}-LDP (pure local differential "
                        "privacy of the client's value against any other value)"),
        }

    def metadata(self) -> str:
        """JSON identifying the oracle (stored in report files' schema metadata)."""
        return json.dumps({"oracle": self.oracle_name, "epsilon": self.epsilon,
                           "domain_size": self.domain_size, **self._metadata_options()},
                          sort_keys=True)

    def _metadata_options(self) -> dict:
        return {}


def _grr_keep_threshold(epsilon: float, choices: int) -> int:
    e = math.exp(epsilon)
    return threshold_floor(e / (e + choices - 1))


@dataclass(frozen=True, kw_only=True)
class GRR(Oracle):
    """Generalized randomized response (direct encoding): keep v w.p. p, else a uniform other."""

    name: ClassVar[str] = "grr"
    keep_threshold: int = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "epsilon", check_local_epsilon(self.epsilon))
        object.__setattr__(self, "domain_size",
                           check_domain_size(self.domain_size, 2, MAX_GRR_DOMAIN, self.name))
        object.__setattr__(self, "keep_threshold",
                           _grr_keep_threshold(self.epsilon, self.domain_size))
        p, q = self.support_probabilities()
        if not p > q:
            raise ValueError(f"{self.name}: epsilon {self.epsilon} is too small for domain "
                             f"{self.domain_size} on the 2^-32 grid")

    def support_probabilities(self):
        p = self.keep_threshold / TWO32
        return p, (1.0 - p) / (self.domain_size - 1)

    @property
    def realised_epsilon(self):
        p, q = self.support_probabilities()
        return math.log(p / q)

    def paper_variance(self, n):
        e = math.exp(self.epsilon)
        return n * (e + self.domain_size - 2) / (e - 1) ** 2

    def parameters(self):
        p, q = self.support_probabilities()
        return {"keep_probability": p, "other_value_probability": q,
                "keep_threshold_of_2^32": self.keep_threshold}


@dataclass(frozen=True, kw_only=True)
class BinaryRR(GRR):
    """Warner's randomized response on one bit: GRR with d = 2 (reports are booleans)."""

    name: ClassVar[str] = "binary_rr"
    domain_size: int = 2

    def __post_init__(self):
        if self.domain_size != 2:
            raise ValueError("binary_rr: domain_size is 2 (a bit)")
        super().__post_init__()

    def paper_variance(self, n):
        e = math.exp(self.epsilon)
        return n * e / (e - 1) ** 2


@dataclass(frozen=True, kw_only=True)
class UnaryEncoding(Oracle):
    """Unary encoding: one-hot vector, bit v kept at 1 w.p. p, every other bit set w.p. q.

    ``variant`` "oue" (optimized: p = 1/2, q = 1/(e^e+1)) or "sue" (symmetric:
    p = e^{e/2}/(1+e^{e/2}), q = 1 - p).
    """

    name: ClassVar[str] = "unary"
    variant: str = "oue"
    one_threshold: int = field(init=False, repr=False)
    zero_threshold: int = field(init=False, repr=False)

    def _nominal(self) -> tuple[float, float]:
        if self.variant == "oue":
            return 0.5, 1.0 / (math.exp(self.epsilon) + 1.0)
        if self.variant == "sue":
            h = math.exp(self.epsilon / 2)
            return h / (1.0 + h), 1.0 / (1.0 + h)
        raise ValueError(f"unary encoding variant must be 'oue' or 'sue', got {self.variant!r}")

    def __post_init__(self):
        object.__setattr__(self, "epsilon", check_local_epsilon(self.epsilon))
        object.__setattr__(self, "domain_size",
                           check_domain_size(self.domain_size, 2, MAX_UNARY_DOMAIN,
                                             self.oracle_name))
        p, q = self._nominal()
        # p rounded down and q rounded up: p(1-q)/((1-p)q) can only shrink.
        object.__setattr__(self, "one_threshold", threshold_floor(p))
        object.__setattr__(self, "zero_threshold", threshold_ceil(q))

    @property
    def oracle_name(self) -> str:
        return self.variant

    def support_probabilities(self):
        return self.one_threshold / TWO32, self.zero_threshold / TWO32

    @property
    def realised_epsilon(self):
        p, q = self.support_probabilities()
        return math.log(p * (1 - q) / ((1 - p) * q))

    def paper_variance(self, n):
        if self.variant == "oue":
            e = math.exp(self.epsilon)
            return n * 4 * e / (e - 1) ** 2
        h = math.exp(self.epsilon / 2)
        return n * h / (h - 1) ** 2

    def parameters(self):
        p, q = self.support_probabilities()
        return {"variant": self.variant, "p_one_stays_one": p, "q_zero_becomes_one": q,
                "report_bits": self.domain_size}



@dataclass(frozen=True, kw_only=True)
class BasicRappor(UnaryEncoding):
    """Basic one-time RAPPOR (Erlingsson et al. 2014): one-hot "Bloom filter" with one hash
    (the value itself) and permanent randomized response with parameter
    f = 2 / (1 + e^{e/2}) (each bit becomes 1 or 0 w.p. f/2 each, else kept) -- the same
    distribution as SUE, reported as RAPPOR's f."""

    variant: str = "sue"

    def __post_init__(self):
        if self.variant != "sue":
            raise ValueError("rappor: basic one-time RAPPOR is the symmetric unary encoding")
        super().__post_init__()

    @property
    def oracle_name(self) -> str:
        return "rappor"

    @property
    def f(self) -> float:
        return 2.0 * self.support_probabilities()[1]

    def parameters(self):
        out = super().parameters()
        out.update({"variant": "rappor", "f": self.f,
                    "permanent_rr": "bit -> 1 w.p. f/2, -> 0 w.p. f/2, kept w.p. 1-f"})
        return out


@dataclass(frozen=True, kw_only=True)
class OLH(Oracle):
    """Optimized local hashing: hash to g = round(e^e) + 1 buckets, then GRR over the buckets.

    g follows Wang et al. 2017 (g = e^e + 1 minimises the variance; rounded to an integer as in
    their implementation). ``buckets`` overrides g (BLH is ``buckets=2``); ``hash_digits``
    fixes the number of 16-bit digits hashed (PEM keeps one report format for every round).
    """

    name: ClassVar[str] = "olh"
    buckets: int = 0
    hash_digits: int = 0
    keep_threshold: int = field(init=False, repr=False)
    digits: int = field(init=False, repr=False)
    collision: float = field(init=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "epsilon", check_local_epsilon(self.epsilon))
        object.__setattr__(self, "domain_size",
                           check_domain_size(self.domain_size, 2, 1 << 64, self.name))
        g = self.buckets or int(round(math.exp(self.epsilon))) + 1
        if not 2 <= g <= hashing.MAX_BUCKETS:
            raise ValueError(f"olh: buckets must be in [2, {hashing.MAX_BUCKETS}], got {g} "
                             f"(epsilon {self.epsilon})")
        object.__setattr__(self, "buckets", g)
        object.__setattr__(self, "keep_threshold", _grr_keep_threshold(self.epsilon, g))
        needed = hashing.digits_for_bits(max(1, (self.domain_size - 1).bit_length()))
        if self.hash_digits and not needed <= self.hash_digits <= 4:
            raise ValueError(f"olh: hash_digits must be in [{needed}, 4] for domain "
                             f"{self.domain_size}, got {self.hash_digits}")
        object.__setattr__(self, "digits", self.hash_digits or needed)
        object.__setattr__(self, "collision", hashing.collision_probability(g))

    def _metadata_options(self):
        options = {"buckets": self.buckets}
        if self.hash_digits:
            options["hash_digits"] = self.hash_digits
        return options

    def bucket_probabilities(self) -> tuple[float, float]:
        p = self.keep_threshold / TWO32
        return p, (1.0 - p) / (self.buckets - 1)

    def support_probabilities(self):
        p, other = self.bucket_probabilities()
        kappa = self.collision
        return p, kappa * p + (1.0 - kappa) * other

    @property
    def realised_epsilon(self):
        p, other = self.bucket_probabilities()
        return math.log(p / other)

    def paper_variance(self, n):
        e = math.exp(self.epsilon)
        g = self.buckets
        return n * (e - 1 + g) ** 2 / ((e - 1) ** 2 * (g - 1))

    def parameters(self):
        p, other = self.bucket_probabilities()
        return {"buckets": self.buckets, "keep_probability": p,
                "other_bucket_probability": other, "collision_probability": self.collision,
                "hash_family": "vector multiply-add-shift over 16-bit digits, 32-bit words "
                               "(strongly universal), bucket = (h * g) >> 16",
                "hash_digits": self.digits}


ORACLES: Mapping[str, type] = {
    "binary_rr": BinaryRR, "grr": GRR, "sue": UnaryEncoding, "oue": UnaryEncoding,
    "rappor": BasicRappor, "olh": OLH,
}


def make_oracle(name: str, *, epsilon: float, domain_size: int, **options) -> Oracle:
    """The oracle called ``name`` (see :data:`ORACLES`) at local ``epsilon`` over a domain."""
    if not isinstance(name, str) or name.lower() not in ORACLES:
        raise ValueError(f"unknown oracle {name!r}; choose one of {sorted(ORACLES)}")
    name = name.lower()
    if name in ("sue", "oue"):
        options.setdefault("variant", name)
    if name == "binary_rr":
        if domain_size != 2:
            raise ValueError("binary_rr: domain_size is 2 (a bit)")
        return BinaryRR(epsilon=epsilon, **options)
    return ORACLES[name](epsilon=epsilon, domain_size=domain_size, **options)


def oracle_from_metadata(text) -> Oracle:
    """Rebuild an oracle from :meth:`Oracle.metadata` JSON (bytes or str)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    try:
        spec = json.loads(text)
        options = {k: v for k, v in spec.items() if k not in ("oracle", "epsilon", "domain_size")}
        return make_oracle(spec["oracle"], epsilon=spec["epsilon"],
                           domain_size=spec["domain_size"], **options)
    except (KeyError, TypeError, json.JSONDecodeError) as err:
        raise ValueError(f"report metadata does not describe an oracle: {text!r}") from err
