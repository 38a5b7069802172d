"""Every local randomizer through the statistical DP tester, next to a deliberately broken variant
(a realistic bug) that the tester must catch.

Neighbours for a local randomizer are two values of one client: sample_a randomizes v, sample_b
v'. Outputs are post-processed to what distinguishes them (DP is closed under post-processing, so
a violation found there is a violation of the randomizer).
"""
import math

import numpy as np
import pytest

from accounting.verification.dp_tester import DPTester
from transforms.ldp import KeyedRandomness, make_oracle
from transforms.ldp import hashing
from transforms.ldp.labels import LabelRandomizer, randomize_label_indices
from transforms.ldp.randomizers import randomize
from transforms.ldp.randomness import threshold_floor, u32_stream, uniform_below, retry_u32
from transforms.ldp.reports import report_arrays
from transforms.ldp.shuffle import SplitAndMix

EPSILON = 1.0
TESTER = DPTester(n_samples=200_000)


def _source(seed):
    return KeyedRandomness.for_testing(seed, purpose="dp-test")


def _sampler(oracle, value, seed, view):
    def sample(n):
        reports = randomize(oracle, np.full(n, value), source=_source(seed), ids=np.arange(n))
        return view(report_arrays(oracle, reports))
    return sample


def _report(arrays):
    return arrays.report.astype(np.int64)


def _bits(v1, v2):
    def view(arrays):
        bits = np.unpackbits(arrays.bits, axis=1, bitorder="little")
        return np.stack([bits[:, v1], bits[:, v2]], axis=1).astype(np.int64)
    return view


def _olh_support(oracle, v1, v2):
    def view(arrays):
        out = []
        for v in (v1, v2):
            h = hashing.hash16(arrays.hash_a, arrays.hash_b, np.full(arrays.n, v, np.uint64))
            out.append(hashing.bucket_of(h, oracle.buckets) == arrays.report)
        return np.stack(out, axis=1).astype(np.int64)
    return view


PAIRS = {"x[0] - x[1]": lambda x: x[:, 0] - x[:, 1], "x[0]": lambda x: x[:, 0],
         "x[1]": lambda x: x[:, 1]}


def _check(sample_a, sample_b, epsilon=EPSILON, projections=None, delta=0.0):
    tester = DPTester(n_samples=200_000, projections=projections) if projections else TESTER
    return tester.run(sample_a, sample_b, epsilon=epsilon, delta=delta)


# ---------------------------------------------------------------------------------- randomizers

def test_binary_rr_passes():
    oracle = make_oracle("binary_rr", epsilon=EPSILON, domain_size=2)
    assert _check(_sampler(oracle, 0, 1, _report), _sampler(oracle, 1, 2, _report)).passed


def test_grr_passes():
    oracle = make_oracle("grr", epsilon=EPSILON, domain_size=5)
    assert _check(_sampler(oracle, 0, 1, _report), _sampler(oracle, 3, 2, _report)).passed


@pytest.mark.parametrize("name", ["sue", "oue", "rappor"])
def test_unary_encodings_pass(name):
    oracle = make_oracle(name, epsilon=EPSILON, domain_size=6)
    view = _bits(0, 4)
    assert _check(_sampler(oracle, 0, 1, view), _sampler(oracle, 4, 2, view),
                  projections=PAIRS).passed


def test_olh_passes():
    oracle = make_oracle("olh", epsilon=EPSILON, domain_size=1000)
    view = _olh_support(oracle, 3, 777)
    assert _check(_sampler(oracle, 3, 1, view), _sampler(oracle, 777, 2, view),
                  projections=PAIRS).passed


# ------------------------------------------------------------------------------ broken variants

def _broken_grr(value, seed, d):
    """Bug: keep probability computed as for a bit (e^e/(e^e+1)), ignoring the d-1 others."""
    def sample(n):
        source = _source(seed)
        ids = np.arange(n)
        words = source.words(ids, 1, "grr")[:, 0]
        keep = (words & np.uint64(0xFFFFFFFF)) < np.uint64(
            threshold_floor(math.exp(EPSILON) / (math.exp(EPSILON) + 1)))
        other = uniform_below(words >> np.uint64(32), d - 1, retry_u32(source, ids, "x"))
        other += other >= value
        return np.where(keep, value, other).astype(np.int64)
    return sample


def test_dp_tester_catches_grr_that_ignores_the_domain_size():
    result = _check(_broken_grr(0, 1, 5), _broken_grr(3, 2, 5))
    assert not result.passed and result.epsilon_lower_bound > EPSILON


def _broken_binary_rr(value, seed):
    """Bug: 'otherwise report a fair coin' -- the true bit also comes out of the coin, so the
    keep probability is p + (1-p)/2, not p."""
    def sample(n):
        words = _source(seed).words(np.arange(n), 1, "binary_rr")[:, 0]
        keep = (words & np.uint64(0xFFFFFFFF)) < np.uint64(
            threshold_floor(math.exp(EPSILON) / (1 + math.exp(EPSILON))))
        coin = (words >> np.uint64(63)).astype(np.int64)
        return np.where(keep, value, coin)
    return sample


def test_dp_tester_catches_binary_rr_whose_lie_is_a_fair_coin():
    result = _check(_broken_binary_rr(0, 1), _broken_binary_rr(1, 2))
    assert not result.passed and result.epsilon_lower_bound > EPSILON


def _broken_oue(value, seed, d):
    """Bug: OUE's q, but the client's own bit kept with SUE's 1 - q instead of 1/2 (spends
    2 epsilon: p(1-q)/((1-p)q) = ((1-q)/q)^2)."""
    def sample(n):
        u = u32_stream(_source(seed).words(np.arange(n), -(-d // 2), "oue"))[:, :d]
        q = threshold_floor(1 / (math.exp(EPSILON) + 1))
        bits = u < q
        bits[:, value] = u[:, value] >= q
        return np.stack([bits[:, 0], bits[:, 4]], axis=1).astype(np.int64)
    return sample


def test_dp_tester_catches_oue_with_the_symmetric_keep_probability():
    result = _check(_broken_oue(0, 1, 6), _broken_oue(4, 2, 6), projections=PAIRS)
    assert not result.passed and result.epsilon_lower_bound > EPSILON


def _broken_sue(value, seed, d):
    """Bug: every bit flipped as randomized response at epsilon instead of epsilon/2 (a one-hot
    vector differs in two bits, so the report spends 2 epsilon)."""
    def sample(n):
        u = u32_stream(_source(seed).words(np.arange(n), -(-d // 2), "sue"))[:, :d]
        stay = threshold_floor(math.exp(EPSILON) / (1 + math.exp(EPSILON)))
        onehot = np.zeros((n, d), dtype=bool)
        onehot[:, value] = True
        bits = np.where(u < stay, onehot, ~onehot)
        return np.stack([bits[:, 0], bits[:, 4]], axis=1).astype(np.int64)
    return sample


def test_dp_tester_catches_sue_or_rappor_at_the_per_bit_epsilon():
    """Basic RAPPOR is SUE with f = 2/(1 + e^{eps/2}); the classic bug is f from eps itself."""
    result = _check(_broken_sue(0, 1, 6), _broken_sue(4, 2, 6), projections=PAIRS)
    assert not result.passed and result.epsilon_lower_bound > EPSILON


def _broken_olh(value, seed, v1, v2):
    """Bug: the 'other' bucket drawn from all g buckets (the true one included)."""
    oracle = make_oracle("olh", epsilon=EPSILON, domain_size=1000)
    g = oracle.buckets

    def sample(n):
        source = _source(seed)
        ids = np.arange(n)
        u = u32_stream(source.words(ids, 2, "olh"))
        a, b = np.ascontiguousarray(u[:, :1]), np.ascontiguousarray(u[:, 1])
        bucket = hashing.bucket_of(hashing.hash16(a, b, np.full(n, value, np.uint64)), g)
        keep = u[:, 2] < np.uint32(oracle.keep_threshold)
        anyone = uniform_below(u[:, 3].astype(np.uint64), g, retry_u32(source, ids, "x"))
        y = np.where(keep, bucket, anyone)
        out = [hashing.bucket_of(hashing.hash16(a, b, np.full(n, v, np.uint64)), g) == y
               for v in (v1, v2)]
        return np.stack(out, axis=1).astype(np.int64)
    return sample


def test_dp_tester_catches_olh_that_may_redraw_the_true_bucket():
    result = _check(_broken_olh(3, 1, 3, 777), _broken_olh(777, 2, 3, 777), projections=PAIRS)
    assert not result.passed and result.epsilon_lower_bound > EPSILON


# ------------------------------------------------------------------------------------- labels

def _labels(randomizer, index, seed):
    def sample(n):
        return randomize_label_indices(randomizer, np.full(n, index), source=_source(seed),
                                       ids=np.arange(n))
    return sample


@pytest.mark.parametrize("prior", [None, (0.6, 0.3, 0.05, 0.05)])
def test_label_randomization_passes_including_undeclared_labels(prior):
    randomizer = LabelRandomizer(epsilon=EPSILON, labels=("a", "b", "c", "d"), prior=prior)
    assert _check(_labels(randomizer, 0, 1), _labels(randomizer, 1, 2)).passed
    # A null / undeclared label (index -1) against a declared one.
    assert _check(_labels(randomizer, -1, 3), _labels(randomizer, 0, 4)).passed
    if prior is not None:
        assert len(randomizer.support) < 4
        assert _check(_labels(randomizer, 3, 5), _labels(randomizer, 0, 6)).passed


def test_dp_tester_catches_label_rr_keyed_on_the_label():
    """Bug: the 'randomized' label keeps the true one whenever the uniform pick lands on it
    twice in a row (an extra keep chance), i.e. p is larger than stated."""
    randomizer = LabelRandomizer(epsilon=EPSILON, labels=("a", "b", "c", "d"))

    def broken(index, seed):
        def sample(n):
            first = randomize_label_indices(randomizer, np.full(n, index), source=_source(seed),
                                            ids=np.arange(n))
            second = randomize_label_indices(randomizer, np.full(n, index),
                                             source=_source(seed + 100), ids=np.arange(n))
            return np.where(second == index, index, first)
        return sample

    result = _check(broken(0, 1), broken(1, 2))
    assert not result.passed and result.epsilon_lower_bound > EPSILON


# ---------------------------------------------------------------------------- split-and-mix

def _shuffle_sum(spec, clients, last_value, seed):
    """The analyzer's sum of all shares mod q when ``clients`` clients report, the last one
    holding ``last_value`` and the others 0."""
    def sample(n):
        values = np.zeros(clients, dtype=np.int64)
        values[-1] = last_value
        out = np.empty(n)
        source = _source(seed)
        chunk = 1000
        for i in range(n // chunk):
            ids = np.arange(i * chunk * clients, (i + 1) * chunk * clients)
            shares = spec.encode(np.tile(values, chunk), source=source, ids=ids)
            total = shares.reshape(chunk, -1).sum(axis=1, dtype=np.uint64)
            out[i * chunk:(i + 1) * chunk] = (total & np.uint64(spec.modulus - 1)).astype(float)
        return out
    return sample


def test_split_and_mix_sum_is_epsilon_delta_dp_and_fewer_clients_than_planned_are_caught():
    tester = DPTester(n_samples=20_000)
    spec = SplitAndMix(num_clients=20, value_bound=8, epsilon=EPSILON, delta=1e-3, sigma=20)
    assert tester.run(_shuffle_sum(spec, 20, 0, 1), _shuffle_sum(spec, 20, 8, 2),
                      epsilon=EPSILON, delta=spec.total_delta).passed
    # Bug: noise split over 400 planned clients, but only 20 report (ShuffleSum refuses this).
    planned = SplitAndMix(num_clients=400, value_bound=8, epsilon=EPSILON, delta=1e-3, sigma=20)
    result = tester.run(_shuffle_sum(planned, 20, 0, 3), _shuffle_sum(planned, 20, 8, 4),
                        epsilon=EPSILON, delta=planned.total_delta)
    assert not result.passed and result.epsilon_lower_bound > EPSILON


@pytest.mark.parametrize("clients", [20, 10_000])
def test_split_and_mix_meets_the_requested_delta_by_an_independent_computation(clients):
    """The requested (epsilon, delta) holds for the summed noise all clients add: the binomial's
    hockey-stick divergence at epsilon against its shift by the value bound B (both directions,
    from scipy's pmf) plus the secure summation's (1 + e^epsilon) 2^-sigma. Few clients: each
    adds many fair coins; many clients: one biased coin each (the threshold's fine grid)."""
    from scipy import stats

    bound = 8
    spec = SplitAndMix(num_clients=clients, value_bound=bound, epsilon=EPSILON, delta=1e-5, sigma=20)
    trials = clients * spec.noise_trials_per_client
    y = np.arange(-bound, trials + bound + 1)
    pmf = stats.binom.pmf(y, trials, spec.noise_probability)
    noise_delta = 0.0
    for shift in (bound, -bound):
        moved = stats.binom.pmf(y - shift, trials, spec.noise_probability)
        noise_delta = max(noise_delta, float(np.clip(pmf - math.exp(EPSILON) * moved, 0, None).sum()))
    summation_delta = (1 + math.exp(EPSILON)) * 2.0 ** -spec.sigma
    assert noise_delta + summation_delta <= spec.delta * (1 + 1e-9), (noise_delta, summation_delta)


@pytest.mark.parametrize("clients", [20, 10_000])
def test_each_client_adds_the_planned_binomial_noise(clients):
    """Client side: what one client's shares sum to, less its value, is the Binomial(k, rho) the
    calibration planned (mean and variance within 5 standard errors over 20,000 clients), so
    that the clients' noise together is the binomial whose delta the calibration computed."""
    spec = SplitAndMix(num_clients=clients, value_bound=8, epsilon=EPSILON, delta=1e-5, sigma=20)
    n = 20_000
    values = np.arange(n) % 9
    shares = spec.encode(values, source=_source(7), ids=np.arange(n))
    noise = ((shares.sum(axis=1, dtype=np.uint64) & np.uint64(spec.modulus - 1)).astype(np.int64)
             - values)
    k, rho = spec.noise_trials_per_client, spec.noise_probability
    mean, var = k * rho, k * rho * (1 - rho)
    assert abs(noise.mean() - mean) <= 5 * math.sqrt(var / n) + 1e-12
    assert noise.var() == pytest.approx(var, rel=5 * math.sqrt(2 / n) + 1e-9, abs=1e-9)
