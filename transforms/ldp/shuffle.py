"""Summation in the shuffle model: split-and-mix with distributed binomial noise, amplification by
shuffling, and the error of each trust model at the same epsilon (pure numpy/scipy).

Seed ``000_015430204a1d6d17.txt`` ("Summation in Shuffle DP Model", split-and-mix). Each of n
clients holds an integer x_i in [0, B].

Protocol (:class:`SplitAndMix`). Client i adds its noise share Z_i ~ Binomial(k, rho) -- k
exact Bernoulli(rho) trials, rho = T/2^32 on the grid (rho = 1/2: the popcount of k secure random
bits) -- and splits z_i = x_i + Z_i into m shares, m - 1 of them uniform in Z_q and the last one
z_i minus their sum mod q (q a power of two above n·(B + k)). A secure shuffler mixes all n·m
shares; the analyzer adds them mod q, which is exactly sum_i x_i + Z with Z ~ Binomial(n·k, rho),
and subtracts the public mean n·k·rho. k and rho are the least noise that meets the target:
k = 1 and the smallest grid rho when n clients suffice, else rho = 1/2 and the fewest k. (So the
total noise does not grow with n, as it would with a whole fair coin per client.)

Privacy, stated and derived here:

1. *Ideal sum.* sum x_i + Binomial(N, rho), N = n·k, changing one client's value by up to B:
   the (epsilon, delta_noise) guarantee is computed exactly from the binomial's hockey-stick
   divergences in both directions, delta(eps) = max over s = +-B of
   sum_y max(0, P(y) - e^eps P(y - s)) (:func:`binomial_delta`; the largest shift is the worst
   case for this log-concave law; no asymptotic formula is used).
2. *Secure summation from shuffling* (Ishai, Kushilevitz, Ostrovsky & Sahai, FOCS 2006; the
   analysis of Balle, Bell, Gascón & Nissim, "Improved Summation from Shuffling", 2019): with
   m > (2·sigma + log2 q) / log2(n / e) + 2 messages per client, the shuffled shares of any two
   input vectors with the same sum are within statistical distance 2^-sigma. (Their worked
   example, n = 10^4, 32-bit q, sigma = 40 -> 12 messages, is reproduced by
   :func:`ikos_messages`.)
3. *Composition* (a simulation argument): the analyzer's view is within 2^-sigma of a
   post-processing of the ideal noisy sum, so the protocol is
   (epsilon, delta_noise + (1 + e^epsilon)·2^-sigma)-DP against the analyzer, provided all n
   clients add their share (a client who skips it lowers N; plan with the number of honest
   clients you can count on).

Malformed shares (:func:`share_faults`). Every share an honest client sends lies in [0, q) --
the encoder reduces mod q -- and none is missing. A share outside [0, q), or missing, comes from
no honest client whatever its value, so whether a collection holds one is the same in both
collections of every neighbouring pair (one client's value replaced): a protocol violation (a
foreign or corrupted file, other parameters, a faulty or hostile sender), not a fact about any
client's value. It is *not* a row to drop and count: a share is one of m additive pieces of a
client's noisy value, so summing without it leaves that client's value plus a uniform element
of Z_q -- the estimate would be garbage at full confidence -- and the message count stops being
a whole number of clients; reducing it mod q would sum a value the protocol never made against
noise planned for honest clients. The seed (split-and-mix, after Balle et al. 2019) says nothing
more on it. So the aggregator refuses such a collection before anything is charged, naming the
file and how many shares, never a value (``pipelines.ldp.shuffle_sum``), and :class:`ShuffleSum`
keeps the same check as a guard. (A hostile client can also poison the sum with in-range
shares, undetectably: the guarantee assumes the planned clients follow the protocol.)

Single-message amplification (:func:`amplified_epsilon`; Feldman, McMillan & Talwar, "Hiding
Among the Clones", FOCS 2021, Theorem 3.1): n shuffled reports of an epsilon_0-LDP randomizer are
(epsilon, delta)-DP with

    epsilon <= log(1 + (e^e0 - 1)/(e^e0 + 1) · (8 sqrt(e^e0 log(4/delta)) / sqrt(n) + 8 e^e0 / n))

for e0 <= log(n / (16 log(2/delta))). :func:`compare_models` puts the resulting errors side by
side: central discrete Laplace, split-and-mix, single-message shuffle (local randomizer at the
amplifiable epsilon_0) and the local model (every client at epsilon).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import numpy as np
import pyarrow as pa
from scipy import stats

from accounting.validation import check_delta, check_epsilon, check_positive_int
from transforms.ldp.randomness import TWO32, u32_stream
from transforms.randomness import RandomSource

SHARE_COLUMN = "share"
SHARES_METADATA_KEY = b"ldp.split_and_mix"


# ---------------------------------------------------------------------------- amplification

def amplified_epsilon(epsilon0: float, n: int, delta: float) -> float:
    """FMT21 Theorem 3.1: the central epsilon of n shuffled epsilon0-LDP reports at ``delta``.

    Raises ValueError when epsilon0 exceeds the theorem's range log(n / (16 log(2/delta))).
    """
    epsilon0 = check_epsilon(epsilon0, "epsilon0")
    n = check_positive_int(n, "n")
    delta = check_delta(delta, allow_zero=False)
    ceiling = amplification_ceiling(n, delta)
    if epsilon0 > ceiling:
        raise ValueError(f"amplification by shuffling (FMT21) needs epsilon0 <= "
                         f"log(n / (16 log(2/delta))) = {ceiling:.4g} for n={n}, delta={delta:g}")
    e0 = math.exp(epsilon0)
    inner = 8 * math.sqrt(e0 * math.log(4 / delta)) / math.sqrt(n) + 8 * e0 / n
    return math.log1p((e0 - 1) / (e0 + 1) * inner)


def amplification_ceiling(n: int, delta: float) -> float:
    value = n / (16 * math.log(2 / delta))
    return math.log(value) if value > 1 else -math.inf


def local_epsilon_for(epsilon: float, n: int, delta: float) -> Optional[float]:
    """The largest epsilon0 whose FMT21 amplification is at most ``epsilon`` (None if none)."""
    epsilon = check_epsilon(epsilon)
    ceiling = amplification_ceiling(n, delta)
    if ceiling <= 0:
        return None
    low, high = 0.0, ceiling
    if amplified_epsilon(high, n, delta) <= epsilon:
        return high
    for _ in range(200):
        mid = (low + high) / 2
        if amplified_epsilon(mid, n, delta) <= epsilon:
            low = mid
        else:
            high = mid
    return low if low > 0 else None


# ------------------------------------------------------------------------------ binomial noise

def binomial_delta(trials: int, sensitivity: int, epsilon: float, probability: float = 0.5) -> float:
    """delta(epsilon) of adding Binomial(trials, probability) to an integer sum that one client
    can move by up to ``sensitivity`` (both directions; exact up to tails below 1e-300)."""
    trials = check_positive_int(trials, "trials")
    shift = check_positive_int(sensitivity, "sensitivity")
    if not 0 < probability <= 0.5:
        raise ValueError("probability must be in (0, 1/2]")
    mean = trials * probability
    sd = math.sqrt(trials * probability * (1 - probability))
    lo = max(0, int(mean - 40 * sd - 40)) - shift
    hi = min(trials, int(mean + 40 * sd + 40)) + shift
    y = np.arange(lo, hi + 1, dtype=np.float64)
    log_p = stats.binom.logpmf(y, trials, probability)
    worst = 0.0
    for s in (shift, -shift):
        log_q = stats.binom.logpmf(y - s, trials, probability)
        with np.errstate(invalid="ignore", over="ignore"):
            gap = np.exp(log_p) * -np.expm1(np.minimum(log_q + epsilon - log_p, 700.0))
        gap = np.where(np.isneginf(log_p), 0.0, gap)
        worst = max(worst, float(np.sum(np.clip(gap, 0.0, None))))
    return worst


def binomial_trials_for(epsilon: float, delta: float, sensitivity: int) -> int:
    """The fewest trials N for which Binomial(N, 1/2) noise gives (epsilon, delta)."""
    epsilon = check_epsilon(epsilon)
    delta = check_delta(delta, allow_zero=False)
    # Gaussian heuristic sigma = B sqrt(2 ln(1.25/delta)) / epsilon, N = 4 sigma^2, then bisect.
    guess = 4 * (sensitivity * math.sqrt(2 * math.log(1.25 / delta)) / epsilon) ** 2
    high = max(4, int(guess))
    while binomial_delta(high, sensitivity, epsilon) > delta:
        high *= 2
        if high > 1 << 62:
            raise ValueError("no binomial noise gives this (epsilon, delta)")
    low = max(1, high // 16)
    while low > 1 and binomial_delta(low, sensitivity, epsilon) <= delta:
        low //= 2
    while high - low > max(1, high // 10_000):
        mid = (low + high) // 2
        if binomial_delta(mid, sensitivity, epsilon) <= delta:
            high = mid
        else:
            low = mid
    return high


def binomial_share_for(num_clients: int, epsilon: float, delta: float,
                       sensitivity: int) -> tuple[int, int]:
    """Per-client noise Binomial(k, T/2^32): the (k, T) with the least total variance meeting
    (epsilon, delta) when all ``num_clients`` clients add a share."""
    n = check_positive_int(num_clients, "num_clients")
    trials = binomial_trials_for(epsilon, delta, sensitivity)
    if trials > n:
        return -(-trials // n), 1 << 31
    low, high = 1, 1 << 31  # grid thresholds: rho = T / 2^32; high meets the target
    while high - low > 1:
        mid = (low + high) // 2
        if binomial_delta(n, sensitivity, epsilon, mid / TWO32) <= delta:
            high = mid
        else:
            low = mid
    return 1, high


# ------------------------------------------------------------------------------ split-and-mix

#: The most clients a split-and-mix collection plans for (the calibration's binomial tails are
#: evaluated over about 80 standard deviations of the clients' summed noise).
MAX_CLIENTS = 1 << 32


def ikos_messages(num_clients: int, modulus_bits: int, sigma: float) -> int:
    """Messages per client for 2^-sigma-secure summation (Balle, Bell, Gascón & Nissim 2019)."""
    n = check_positive_int(num_clients, "num_clients")
    if n < 20:
        raise ValueError("split-and-mix: the message bound used here is for populations of at "
                         "least 20 clients")
    return max(2, math.floor((2 * sigma + modulus_bits) / math.log2(n / math.e) + 2) + 1)


def _popcount(words: np.ndarray) -> np.ndarray:
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(words).astype(np.int64)
    return np.unpackbits(words.view(np.uint8), axis=-1).reshape(*words.shape, 64).sum(-1)


@dataclass(frozen=True, kw_only=True)
class SplitAndMix:
    """Parameters of one split-and-mix summation (see the module docstring).

    ``num_clients``: the number n of clients that will report (noise is split over them; more
    clients only add noise). ``value_bound``: B, values in [0, B]. ``epsilon``, ``delta``: the
    target central guarantee; ``sigma``: statistical security of the secure summation (the
    shuffle's share of delta is (1 + e^epsilon) 2^-sigma).
    """

    num_clients: int
    value_bound: int
    epsilon: float
    delta: float
    sigma: float = 40.0
    noise_trials_per_client: int = field(init=False)
    noise_threshold: int = field(init=False)
    modulus_bits: int = field(init=False)
    messages: int = field(init=False)
    noise_delta: float = field(init=False)

    def __post_init__(self):
        n = check_positive_int(self.num_clients, "num_clients")
        bound = check_positive_int(self.value_bound, "value_bound")
        if n > MAX_CLIENTS:
            raise ValueError(f"num_clients must be at most {MAX_CLIENTS} (the binomial noise "
                             "is calibrated over the clients' shares in memory)")
        epsilon = check_epsilon(self.epsilon)
        delta = check_delta(self.delta, allow_zero=False)
        if not self.sigma >= 20:
            raise ValueError("sigma (secure summation security, in bits) must be >= 20")
        shuffle_delta = (1 + math.exp(epsilon)) * 2.0 ** -self.sigma
        if shuffle_delta >= delta / 2:
            raise ValueError(f"delta {delta:g} is too small for sigma {self.sigma}: raise sigma")
        k, threshold = binomial_share_for(n, epsilon, delta - shuffle_delta, bound)
        q_bits = max(2, (n * (bound + k)).bit_length() + 1)
        if q_bits > 63:
            raise ValueError("the sum does not fit 63 bits")
        object.__setattr__(self, "noise_trials_per_client", k)
        object.__setattr__(self, "noise_threshold", threshold)
        object.__setattr__(self, "modulus_bits", q_bits)
        object.__setattr__(self, "messages", ikos_messages(n, q_bits, self.sigma))
        object.__setattr__(self, "noise_delta",
                           binomial_delta(n * k, bound, epsilon, threshold / TWO32))

    @property
    def modulus(self) -> int:
        return 1 << self.modulus_bits

    @property
    def noise_probability(self) -> float:
        return self.noise_threshold / TWO32

    @property
    def noise_trials(self) -> int:
        return self.num_clients * self.noise_trials_per_client

    def noise_mean(self, num_clients: int) -> float:
        return num_clients * self.noise_trials_per_client * self.noise_probability

    def noise_variance(self, num_clients: int) -> float:
        rho = self.noise_probability
        return num_clients * self.noise_trials_per_client * rho * (1 - rho)

    @property
    def total_delta(self) -> float:
        return self.noise_delta + (1 + math.exp(self.epsilon)) * 2.0 ** -self.sigma

    @property
    def variance(self) -> float:
        """Var of the estimated sum with the planned clients: N rho (1 - rho)."""
        return self.noise_variance(self.num_clients)

    def encode(self, values, *, source: RandomSource, ids) -> np.ndarray:
        """``(n, m)`` uint64 shares of each client's noisy value (client side)."""
        values = np.asarray(values)
        if values.dtype.kind not in "iu" or (values.size and (values.min() < 0
                                                               or values.max() > self.value_bound)):
            raise ValueError(f"values must be integers in [0, {self.value_bound}]")
        n = values.size
        k = self.noise_trials_per_client
        if self.noise_threshold == 1 << 31:  # fair coins: popcount of k random bits
            noise_words = -(-k // 64)
        else:  # k uniforms of 32 bits against the threshold
            noise_words = -(-k // 2)
        words = source.words(ids, noise_words + self.messages - 1, "split-and-mix")
        noise_part = words[:, :noise_words]
        if self.noise_threshold == 1 << 31:
            noise_part = noise_part.copy()
            spare = noise_words * 64 - k
            if spare:
                noise_part[:, -1] >>= np.uint64(spare)  # keep exactly k random bits
            noise = _popcount(noise_part).sum(axis=1)
        else:
            uniforms = u32_stream(np.ascontiguousarray(noise_part))[:, :k]
            noise = (uniforms < np.uint32(self.noise_threshold)).sum(axis=1)
        mask = np.uint64(self.modulus - 1)
        shares = np.empty((n, self.messages), dtype=np.uint64)
        shares[:, :-1] = words[:, noise_words:] & mask
        z = (values.astype(np.uint64) + noise.astype(np.uint64)) & mask
        shares[:, -1] = (z - shares[:, :-1].sum(axis=1, dtype=np.uint64)) & mask
        return shares

    def sum_shares(self, shares) -> int:
        """The sum of shares mod q (uint64 wrap-around is exact: q divides 2^64)."""
        total = np.asarray(shares, dtype=np.uint64).sum(dtype=np.uint64)
        return int(total) & (self.modulus - 1)

    def estimate(self, share_sum: int, num_clients: int) -> float:
        """The estimated sum of values from the sum of all shares mod q and the client count."""
        return float(int(share_sum) % self.modulus) - self.noise_mean(num_clients)

    def metadata(self) -> str:
        """The protocol parameters as JSON (the shares' schema metadata)."""
        import json

        return json.dumps({"num_clients": self.num_clients, "value_bound": self.value_bound,
                           "epsilon": self.epsilon, "delta": self.delta, "sigma": self.sigma},
                          sort_keys=True)

    def describe(self) -> dict:
        return {
            "protocol": "split-and-mix (IKOS 2006) with distributed Binomial(k, rho) noise",
            "num_clients": self.num_clients, "value_bound": self.value_bound,
            "epsilon": self.epsilon, "delta_target": self.delta,
            "delta_noise": self.noise_delta, "delta_secure_sum": self.total_delta - self.noise_delta,
            "delta_total": self.total_delta, "sigma": self.sigma,
            "noise_trials_per_client": self.noise_trials_per_client,
            "noise_probability": self.noise_probability,
            "noise_trials_total": self.noise_trials, "modulus": f"2^{self.modulus_bits}",
            "messages_per_client": self.messages, "estimate_std": math.sqrt(self.variance),
            "model": ("shuffle model: a trusted shuffler hides which share came from whom; the "
                      "analyzer sees only the multiset of shares. Guarantee against the analyzer "
                      f"({self.epsilon:g}, {self.total_delta:.3g})-DP for changing one client's "
                      f"value within [0, {self.value_bound}], if all clients add their noise"),
        }


def _dlap_variance(epsilon: float, sensitivity: float) -> float:
    alpha = math.exp(-epsilon / sensitivity)
    return 2 * alpha / (1 - alpha) ** 2


def compare_models(num_clients: int, value_bound: int, epsilon: float, delta: float,
                   sigma: float = 40.0) -> list[dict]:
    """Mean squared error of the summed values under each trust model at the same epsilon."""
    n, bound = num_clients, value_bound
    rows = [{"model": "central", "mechanism": f"discrete Laplace, scale {bound}/eps",
             "epsilon": epsilon, "delta": 0.0, "mse": _dlap_variance(epsilon, bound)}]
    sam = SplitAndMix(num_clients=n, value_bound=bound, epsilon=epsilon, delta=delta, sigma=sigma)
    rows.append({"model": "shuffle, split-and-mix", "mechanism":
                 f"{sam.messages} shares/client, Binomial({sam.noise_trials_per_client}, "
                 f"{sam.noise_probability:.3g}) noise/client", "epsilon": epsilon, "delta": sam.total_delta,
                 "mse": sam.variance})
    e0 = local_epsilon_for(epsilon, n, delta)
    if e0 is not None:
        rows.append({"model": "shuffle, single message (FMT21)", "mechanism":
                     f"local discrete Laplace at epsilon0 = {e0:.3g}", "epsilon": epsilon,
                     "delta": delta, "mse": n * _dlap_variance(e0, bound)})
    else:
        rows.append({"model": "shuffle, single message (FMT21)", "mechanism":
                     "not applicable: n too small for the theorem", "epsilon": epsilon,
                     "delta": delta, "mse": math.nan})
    rows.append({"model": "local", "mechanism": f"local discrete Laplace, scale {bound}/eps",
                 "epsilon": epsilon, "delta": 0.0, "mse": n * _dlap_variance(epsilon, bound)})
    if bound == 1:
        e = math.exp(epsilon)
        rows.append({"model": "local", "mechanism": "binary randomized response",
                     "epsilon": epsilon, "delta": 0.0, "mse": n * e / (e - 1) ** 2})
    for row in rows:
        row["rmse"] = math.sqrt(row["mse"]) if row["mse"] == row["mse"] else math.nan
    return rows


def shares_table(shares: np.ndarray, spec: Optional[SplitAndMix] = None) -> pa.Table:
    """Shares as the shuffler would hand them over: one column, in sorted order (the sorted
    multiset carries exactly what a uniformly random order would). With ``spec``, the schema's
    ``ldp.split_and_mix`` metadata says which protocol parameters made them (an aggregator
    configured otherwise refuses them: :func:`check_shares_schema`)."""
    table = pa.table({SHARE_COLUMN: pa.array(np.sort(np.asarray(shares).reshape(-1)), pa.uint64())})
    if spec is not None:
        table = table.replace_schema_metadata({SHARES_METADATA_KEY: spec.metadata().encode()})
    return table


def share_faults(spec: SplitAndMix, column) -> tuple[int, int]:
    """(missing, outside [0, q)) among the shares of ``column`` (an Arrow integer array or
    chunked array): shares no honest client sends (module docstring, "Malformed shares")."""
    missing = column.null_count
    values = column.fill_null(0).to_numpy() if missing else column.to_numpy()
    if not len(values):
        return 0, 0
    negative = values < 0 if values.dtype.kind == "i" else np.zeros(len(values), dtype=bool)
    large = values.astype(np.uint64) >= np.uint64(spec.modulus)  # a negative one wraps: large
    return int(missing), int(np.count_nonzero(negative | large))


def check_shares_schema(spec: SplitAndMix, schema: pa.Schema) -> None:
    """Raise ValueError if ``schema`` cannot hold ``spec``'s shares (column, type, parameters)."""
    declared = (schema.metadata or {}).get(SHARES_METADATA_KEY)
    if declared is not None and declared.decode() != spec.metadata():
        raise ValueError(f"these shares were made with split-and-mix parameters "
                         f"{declared.decode()}, not {spec.metadata()}")
    if SHARE_COLUMN not in schema.names:
        raise ValueError(f"shuffled shares need a {SHARE_COLUMN!r} column; the input has "
                         f"{schema.names}")
    if not pa.types.is_integer(schema.field(SHARE_COLUMN).type):
        raise ValueError(f"column {SHARE_COLUMN!r} must be an unsigned integer, got "
                         f"{schema.field(SHARE_COLUMN).type}")

