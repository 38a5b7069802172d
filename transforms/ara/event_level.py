"""Attribution Reporting event-level reports: the browser's randomized response per source.

Source: the Attribution Reporting API's event-level explainer (WICG, "Differential privacy" and
"Data limits and noise") and its noise documentation; seed 000 ("ARA event-level reports",
event-level statistics: per impression, whether it led to conversions and their value class).

A source (an impression) can be attributed at most ``max_reports`` (R) triggers; each attributed
trigger becomes a report carrying ``trigger_data`` (one of T values, e.g. a conversion value class)
and the reporting window (one of w) it falls in. A source's *output* is the multiset of its
reports, i.e. a multiset of at most R cells out of the N = T w (window, trigger data) cells. By
"stars and bars" there are

    k = C(N + R, R)

possible outputs (multisets of exactly R symbols over the N cells plus one "no report" symbol):
2925 for the API's click default (T = 8, w = 3, R = 3), 3 for its view default (T = 2, w = 1,
R = 1). The browser applies k-ary randomized response: with probability

    p = k / (k + e^epsilon - 1)

the output is drawn uniformly from all k states (possibly the true one), otherwise it is the true
one. Then ``P(o | v) / P(o | v') <= (1 - p + p/k) / (p/k) = e^epsilon`` for any two true outputs:
epsilon-DP for one source's triggers (the API's privacy unit is the source, not the user; the set
of registered sources is public to the ad tech that registered them).

Sampling (``randomized_response``): per source, one keyed random stream (``RandomStreams`` under
a ``ReleaseKey``, lane = the canonical source id), so the outcome depends on the key, the purpose
and the source only -- never on batching. The coin is a 53-bit uniform compared with
``ceil(p 2^53) / 2^53 >= p`` (rounding p *up* can only lower the privacy loss), the uniform state
an exact keyed integer in [0, k).

States are numbered by the combinatorial number system: a sorted tuple of R symbols
``a_0 <= ... <= a_{R-1}`` in [0, N] (0 = no report, ``1 + window * T + trigger_data`` = a report)
maps to the R-combination ``b_j = a_j + j`` of [0, N + R) and to the rank ``sum_j C(b_j, j + 1)``.

Pure numpy; the Beam wiring is ``transforms.ara.event_beam``; debiasing is ``event_debias``.
"""
from __future__ import annotations

import dataclasses
import math

import numpy as np

#: The API's largest settable event-level epsilon.
MAX_EVENT_LEVEL_EPSILON = 14.0
#: The API's limits on the configuration (trigger data, windows, reports) and on k.
MAX_TRIGGER_DATA = 32
MAX_REPORT_WINDOWS = 5
MAX_REPORTS = 20
MAX_STATES = 2 ** 32 - 1
_COIN_BITS = 53


def num_states(trigger_data_cardinality: int, report_windows: int, max_reports: int) -> int:
    """k = C(T w + R, R): the number of possible outputs of one source."""
    return math.comb(trigger_data_cardinality * report_windows + max_reports, max_reports)


def flip_probability(states: int, epsilon: float) -> float:
    """p = k / (k + e^epsilon - 1): the probability that the output is drawn uniformly."""
    if states < 1:
        raise ValueError("the number of states must be positive")
    return states / (states + math.expm1(epsilon))


def _positive_int(value, name: str, upper: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an integer")
    if not 1 <= value <= upper:
        raise ValueError(f"{name} must be in [1, {upper}]")
    return int(value)


@dataclasses.dataclass(frozen=True, kw_only=True)
class EventLevelConfig:
    """The public parameters of a source's event-level reports.

    trigger_data_cardinality: T, values of trigger data (``trigger_data`` in [0, T)).
    report_windows: w, reporting windows (``window`` in [0, w)).
    max_reports: R, attributed triggers per source (the first R by trigger order are reported).
    epsilon: the randomized response's epsilon per source (0 < epsilon <= 14, the API's limit).
    """

    trigger_data_cardinality: int
    report_windows: int
    max_reports: int
    epsilon: float

    def __post_init__(self):
        _positive_int(self.trigger_data_cardinality, "trigger_data_cardinality", MAX_TRIGGER_DATA)
        _positive_int(self.report_windows, "report_windows", MAX_REPORT_WINDOWS)
        _positive_int(self.max_reports, "max_reports", MAX_REPORTS)
        eps = self.epsilon
        if isinstance(eps, bool) or not isinstance(eps, (int, float)) or not math.isfinite(eps) \
                or not 0 < eps <= MAX_EVENT_LEVEL_EPSILON:
            raise ValueError(f"epsilon must be in (0, {MAX_EVENT_LEVEL_EPSILON:g}]")
        if self.states > MAX_STATES:
            raise ValueError(f"trigger_data_cardinality, report_windows and max_reports give "
                             f"{self.states} output states, above the API's limit {MAX_STATES}")

    @property
    def cells(self) -> int:
        """N = T w: the (window, trigger data) cells a report can fall in."""
        return self.trigger_data_cardinality * self.report_windows

    @property
    def states(self) -> int:
        return num_states(self.trigger_data_cardinality, self.report_windows, self.max_reports)

    @property
    def flip_probability(self) -> float:
        return flip_probability(self.states, self.epsilon)

    def information_gain(self) -> float:
        """Bits: capacity of the k-ary symmetric channel the randomized response is (the API
        bounds it per source type)."""
        k, p = self.states, self.flip_probability
        keep, other = 1.0 - p + p / k, p / k
        return math.log2(k) + keep * math.log2(keep) + (k - 1) * other * math.log2(other)

    def cell(self, trigger_data, window) -> np.ndarray:
        """Cell index ``window * T + trigger_data`` (ValueError naming the field when outside)."""
        t = np.asarray(trigger_data)
        w = np.asarray(window)
        for name, v, bound in (("trigger_data", t, self.trigger_data_cardinality),
                               ("window", w, self.report_windows)):
            if not np.issubdtype(v.dtype, np.integer):
                raise ValueError(f"{name} must be integers")
            if v.size and (v.min() < 0 or v.max() >= bound):
                raise ValueError(f"{name} must be in [0, {bound})")
        return w.astype(np.int64) * self.trigger_data_cardinality + t.astype(np.int64)

    def _binomials(self) -> np.ndarray:
        """C(b, j) for b in [0, N + R], j in [0, R] (int64: every entry used is below k)."""
        n, r = self.cells + self.max_reports, self.max_reports
        table = np.zeros((n + 1, r + 1), dtype=np.int64)
        for b in range(n + 1):
            for j in range(min(b, r) + 1):
                table[b, j] = math.comb(b, j)
        return table

    def encode(self, cells: np.ndarray, counts: np.ndarray | None = None) -> np.ndarray:
        """State rank of each source from its reports' cells.

        cells: (n, R) int array, the cells of each source's reports, padded with -1 where a
        source has fewer than R reports; ``counts`` (optional, (n,)): reports per source, checked
        against R. Raises ValueError (naming the field) for a cell outside [0, N) or more than R
        reports.
        """
        cells = np.asarray(cells, dtype=np.int64)
        r = self.max_reports
        if counts is not None and np.any(np.asarray(counts) > r):
            raise ValueError(f"a source has more reports than max_reports = {r}")
        if cells.ndim != 2 or cells.shape[1] != r:
            raise ValueError(f"cells must have shape (sources, max_reports = {r})")
        if cells.size and (cells.min() < -1 or cells.max() >= self.cells):
            raise ValueError(f"report cells must be in [0, {self.cells}) (or -1 for none)")
        symbols = np.sort(cells + 1, axis=1)                 # 0 = no report
        b = symbols + np.arange(r)[None, :]
        table = self._binomials()
        return table[b, np.arange(1, r + 1)[None, :]].sum(axis=1)

    def decode(self, ranks: np.ndarray) -> np.ndarray:
        """Inverse of ``encode``: (n, R) cells (-1 for no report), ascending per source."""
        ranks = np.asarray(ranks, dtype=np.int64).copy()
        if ranks.size and (ranks.min() < 0 or ranks.max() >= self.states):
            raise ValueError(f"state ranks must be in [0, {self.states})")
        r = self.max_reports
        table = self._binomials()
        b = np.empty((ranks.size, r), dtype=np.int64)
        for j in range(r - 1, -1, -1):
            column = table[:, j + 1]                       # non-decreasing in b
            b[:, j] = np.searchsorted(column, ranks, side="right") - 1
            ranks -= column[b[:, j]]
        return b - np.arange(r)[None, :] - 1


def randomized_response(true_states: np.ndarray, states: int, flip: float, streams) -> np.ndarray:
    """k-ary randomized response: lane i keeps ``true_states[i]`` unless its coin (probability
    ``ceil(flip 2^53) / 2^53``) says to draw a uniform state in [0, states)."""
    true_states = np.asarray(true_states, dtype=np.int64)
    if len(streams) != true_states.size:
        raise ValueError("one random lane per source is required")
    if not 0.0 <= flip <= 1.0:
        raise ValueError("flip probability must be in [0, 1]")
    threshold = np.uint64(min(math.ceil(flip * 2 ** _COIN_BITS), 2 ** _COIN_BITS))
    coin = (streams.uniform_uint64() >> np.uint64(64 - _COIN_BITS)) < threshold
    uniform = streams.randint(np.uint64(states)).astype(np.int64)
    return np.where(coin, uniform, true_states)


def randomize_states(true_states: np.ndarray, config: EventLevelConfig, streams) -> np.ndarray:
    """The browser's noise on one state per source (``streams``: one lane per source)."""
    return randomized_response(true_states, config.states, config.flip_probability, streams)
