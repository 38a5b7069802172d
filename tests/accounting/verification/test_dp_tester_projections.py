"""The DP tester's multi-key and low-order-bit projections on synthetic mechanisms (numpy only).

Each synthetic leak is one that per-coordinate threshold events cannot see at the claimed
epsilon and the new projection exposes; the samplers are seeded, so every run is the same run.
False failures of a correct mechanism have probability at most 1 - confidence (1e-3 by default)
over the seeds; the broken mechanisms violate their claim by many confidence widths.
"""
from __future__ import annotations

import math

import numpy as np
import pytest

from accounting.verification.dp_tester import (DPTester, ReleaseLayout, default_projections,
                                  difference_projection, exclusion_projection,
                                  grid_residue_projection, indicator_runs_needed, indicator_test,
                                  integer_low_bits_projection, joint_indicator_projection,
                                  low_bits_projection, pairwise_projections)


def rng(seed):
    return np.random.default_rng(seed)


def swapped_bernoulli_pair(p, q, seed):
    """Two keys kept with probabilities (p, q) on D and (q, p) on D': a substitution that moves
    one unit from key 0 to key 1 in a selection calibrated for one changed key."""
    def sampler(first, second, offset):
        def draw(n):
            g = rng(seed + offset)
            return np.stack([g.random(n) < first, g.random(n) < second], axis=1).astype(np.int64)
        return draw
    return sampler(p, q, 0), sampler(q, p, 1)


def test_joint_event_finds_twice_the_per_key_loss():
    # Per key the loss is 0.8 (kept) and 0.52 (dropped); "0 kept and 1 not" carries 1.32.
    q = 0.25
    p = q * math.exp(0.8)
    a, b = swapped_bernoulli_pair(p, q, seed=11)
    per_key = DPTester(n_samples=40_000)
    assert per_key.run(a, b, epsilon=1.0).passed                 # coordinates and their sum
    joint = DPTester(n_samples=40_000, projections=pairwise_projections(["k0", "k1"], indicators=[0, 1]))
    result = joint.run(a, b, epsilon=1.0)
    assert not result.passed, result
    assert result.worst.event.projection in ("k0 and not k1", "k1 and not k0")
    exact = math.log(p * (1 - q) / (q * (1 - p)))
    assert 1.0 < result.epsilon_lower_bound < exact


def test_joint_event_passes_a_selection_calibrated_for_both_keys():
    q = 0.1
    p = q * math.exp(0.5)                                       # epsilon 0.5 per key: 1.0 joint
    a, b = swapped_bernoulli_pair(p, q, seed=12)
    joint = DPTester(n_samples=40_000, projections=pairwise_projections(["k0", "k1"], indicators=[0, 1]))
    assert joint.run(a, b, epsilon=1.0).passed


def test_joint_indicator_spans_several_keys():
    # L0 = 2 under substitution: keys 0, 1 lose the unit and keys 2, 3 gain it.
    q = 0.3
    p = q * math.exp(0.45)      # per key at most 0.45; both kept and both others dropped: 1.46

    def draw(probabilities, seed):
        return lambda n: (rng(seed).random((n, 4)) < np.asarray(probabilities)).astype(np.int64)
    a, b = draw([p, p, q, q], 21), draw([q, q, p, p], 22)
    two_keys = {"0,1 and not 2,3": joint_indicator_projection([0, 1], [2, 3])}
    assert DPTester(n_samples=40_000).run(a, b, epsilon=1.0).passed
    result = DPTester(n_samples=40_000, projections=two_keys).run(a, b, epsilon=1.0)
    assert not result.passed and result.epsilon_lower_bound > 1.0, result


def geometric_on_a_grid(answer, step, seed, scale=40.0):
    """answer + step * two-sided geometric noise of total scale ``scale``."""
    def draw(n):
        g = rng(seed)
        p = math.exp(-step / scale)
        noise = g.geometric(1 - p, n) - g.geometric(1 - p, n)
        return answer + step * noise
    return draw


def test_parity_projection_catches_noise_on_a_grid_of_two():
    # Counts 10 and 11 with noise in steps of 2: the output's parity is the count's.
    a, b = geometric_on_a_grid(10, 2, 31), geometric_on_a_grid(11, 2, 32)
    assert DPTester(n_samples=20_000, max_thresholds=256).run(a, b, epsilon=1.0).passed
    tester = DPTester(n_samples=20_000, projections={"x mod 2": integer_low_bits_projection(0, 1)})
    result = tester.run(lambda n: a(n)[:, None], lambda n: b(n)[:, None], epsilon=1.0)
    assert not result.passed and result.epsilon_lower_bound > 5, result
    # The same noise on the answer's grid leaves nothing in the low bits.
    a, b = geometric_on_a_grid(10, 1, 33), geometric_on_a_grid(11, 1, 34)
    assert tester.run(lambda n: a(n)[:, None], lambda n: b(n)[:, None], epsilon=0.1).passed


def test_integer_low_bits_projection_values():
    x = np.array([[0.0], [1.0], [-1.0], [-8.0], [13.0], [2.0 ** 40 + 5]])
    assert integer_low_bits_projection(0, 1)(x).tolist() == [0, 1, 1, 0, 1, 1]
    assert integer_low_bits_projection(0, 3)(x).tolist() == [0, 1, 7, 0, 5, 5]
    with pytest.raises(ValueError, match="integer outputs"):
        integer_low_bits_projection(0, 1)(np.array([[0.5]]))
    for bits in (0, 53):
        with pytest.raises(ValueError, match="bits"):
            integer_low_bits_projection(0, bits)


def test_float_and_grid_projections():
    x = np.array([[0.25, 3.0], [0.1, -2.5]])
    assert low_bits_projection(0, 8)(x).tolist()[0] == 0.0         # 0.25: mantissa all zero
    assert low_bits_projection(0, 8)(x).tolist()[1] != 0.0         # 0.1 is not on a 2^-k grid
    assert grid_residue_projection(1, 2.0)(x).tolist() == [0.5, 0.75]
    assert exclusion_projection(0, 1)(np.array([[1, 0], [1, 1], [0, 0]])).tolist() == [1, 0, 0]
    assert difference_projection(1, 0)(x).tolist() == pytest.approx([2.75, -2.6])


def test_pairwise_projection_families():
    names = ["a", "b", "c", "va", "vb", "vc"]
    projections = pairwise_projections(names, indicators=[0, 1, 2], values=[3, 4, 5])
    assert sorted(projections) == sorted(
        [f"{i} and not {j}" for i in "abc" for j in "abc" if i != j]
        + ["va - vb", "va - vc", "vb - vc"])


# --------------------------------------------------------------------------------------------
# ReleaseLayout
# --------------------------------------------------------------------------------------------

def test_layout_vectorizes_released_rows():
    layout = ReleaseLayout(keys=("a", "b", "c"), values=("count",), order=True)
    assert layout.width == 9
    assert layout.names()[:4] == ["released[a]", "released[b]", "released[c]", "count[a]"]
    columns = {"replica": np.array([0, 0, 1, 1, 1]), "k": np.array(["c", "a", "b", "a", "c"]),
               "count": np.array([5.0, 2.0, np.nan, 7.0, 1.0])}
    x = layout.vectorize(columns, 3, replica_column="replica")
    m = layout.missing
    assert x[:, :3].tolist() == [[1, 0, 1], [1, 1, 1], [0, 0, 0]]
    assert x[:, 3:6].tolist() == [[2, m, 5], [7, m, 1], [m, m, m]]         # NaN: masked value
    assert x[:, 6:].tolist() == [[1, -1, 0], [1, 0, 2], [-1, -1, -1]]     # emission ranks
    assert layout.value("b", "count") == 4 and layout.rank("c") == 8
    with pytest.raises(ValueError, match="not in the layout"):
        layout.vectorize({"k": np.array(["z"]), "count": np.array([1.0])}, 1)
    with pytest.raises(ValueError, match="twice"):
        layout.vectorize({"k": np.array(["a", "a"]), "count": np.array([1.0, 2.0])}, 1)


def test_layout_projections_by_family():
    layout = ReleaseLayout(keys=("a", "b"), values=("sum",), order=True)
    x = layout.vectorize({"k": np.array(["b"]), "sum": np.array([7.0])}, 1)
    everything = layout.projections(integer_bits=2, grid=4.0)
    assert sorted(everything) == sorted([
        "released[a]", "released[b]", "sum[a]", "sum[b]", "sum[a] released", "sum[b] released",
        "sum[a] mod 2^2", "sum[b] mod 2^2", "residue(sum[a], 4)", "residue(sum[b], 4)",
        "released[a] and not released[b]", "released[b] and not released[a]",
        "sum[a] released and not sum[b]", "sum[b] released and not sum[a]",
        "sum[a] - sum[b]", "rank[a] < rank[b]"])
    values = {name: float(p(x)[0]) for name, p in everything.items()}
    assert values["sum[a] mod 2^2"] == -1 and values["sum[b] mod 2^2"] == 3   # -1: not released
    assert values["residue(sum[b], 4)"] == 0.75 and values["residue(sum[a], 4)"] == -1
    assert values["released[b] and not released[a]"] == 1
    assert values["sum[b] released"] == 1 and values["sum[a] released"] == 0
    assert values["sum[b] released and not sum[a]"] == 1
    assert "sum[a] released" not in layout.projections(indicators=False)
    assert sorted(layout.projections(pairs=False, values=False)) == ["released[a]", "released[b]"]
    assert "low8bits(sum[a])" in layout.projections(mantissa_bits=8)


def test_default_projections_unchanged():
    assert list(default_projections(np.zeros(3))) == ["x"]
    assert list(default_projections(np.zeros((3, 2)))) == ["x[0]", "x[1]", "sum(x)"]


def test_layout_joint_projection():
    layout = ReleaseLayout(keys=("a", "b", "c", "d"))
    x = layout.vectorize({"k": np.array(["a", "b", "d", "a", "b"]), "r": np.array([0, 0, 0, 1, 1])},
                         3, replica_column="r")
    ((name, project),) = layout.joint_projection(["a", "b"], ["c", "d"]).items()
    assert name == "released[a,b] and not [c,d]"
    assert project(x).tolist() == [0, 1, 0]


# --------------------------------------------------------------------------------------------
# Released/suppressed indicators (issue 30): a threshold on the noisy or on the exact value
# --------------------------------------------------------------------------------------------

def thresholded(count, n, seed, *, epsilon=0.5, threshold=2.5, on_exact=False, others=(0, 9)):
    """n releases of key 0 holding ``count`` (and keys 1, 2 holding ``others``): each key's
    count plus Laplace(1 / epsilon) noise is released when it is above ``threshold`` -- the
    noisy value, or (``on_exact``) the exact count. Released indicators, (n, 3)."""
    exact = np.array([count, *others], dtype=float)
    noisy = exact + rng(seed).laplace(0.0, 1.0 / epsilon, size=(n, 3))
    decided = np.broadcast_to(exact, (n, 3)) if on_exact else noisy
    return (decided > threshold).astype(np.int64)


def test_indicator_test_passes_a_noisy_threshold_and_catches_the_exact_one():
    n = indicator_runs_needed(epsilon=0.5, indicators=3)
    assert n == 20
    sound = indicator_test(thresholded(2, n, 1), thresholded(3, n, 2), epsilon=0.5)
    assert sound.passed, sound
    broken = indicator_test(thresholded(2, n, 3, on_exact=True), thresholded(3, n, 4, on_exact=True),
                            epsilon=0.5, names=["k0", "k1", "k2"])
    assert not broken.passed, broken
    assert broken.worst.event.projection == "k0"
    assert (broken.worst.count_numerator, broken.worst.count_denominator) in ((n, 0), (0, n))
    # one sample fewer: a deterministic indicator is still within the claim's bounds
    fewer = indicator_test(thresholded(2, n - 1, 3, on_exact=True),
                           thresholded(3, n - 1, 4, on_exact=True), epsilon=0.5)
    assert fewer.passed
    # many samples of the sound threshold: still within its claim, and a claim far below the
    # true loss (1 / epsilon = 2 per unit of count: loss 0.5) is refuted
    many = thresholded(2, 20_000, 5), thresholded(3, 20_000, 6)
    assert indicator_test(*many, epsilon=0.5).passed
    assert not indicator_test(*many, epsilon=0.3).passed


def test_indicator_test_false_failures_stay_below_one_minus_confidence():
    """Randomized response exactly at its claim (the tightest sound indicator): at confidence
    0.9 at most 10% of independent checks may fail; the union bound makes it far fewer."""
    p = math.exp(1.0) / (1 + math.exp(1.0))
    g = rng(7)
    failures = 0
    for _ in range(200):
        a = (g.random((400, 4)) < p).astype(np.int64)
        b = (g.random((400, 4)) < 1 - p).astype(np.int64)
        failures += not indicator_test(a, b, epsilon=1.0, confidence=0.9).passed
    assert failures <= 20


def test_indicator_runs_needed_is_the_least_that_separates():
    for epsilon, delta, m in [(0.5, 0.0, 3), (1.0, 1e-3, 25), (0.2, 0.0, 1), (2.0, 1e-6, 100)]:
        n = indicator_runs_needed(epsilon=epsilon, delta=delta, indicators=m)
        ones, zeros = np.ones((n, m), np.int64), np.zeros((n, m), np.int64)
        assert not indicator_test(ones, zeros, epsilon=epsilon, delta=delta).passed
        assert indicator_test(ones[1:], zeros[1:], epsilon=epsilon, delta=delta).passed
    # roughly e^epsilon * ln(4 m / (1 - confidence)): the cost of a large epsilon
    large, small = (indicator_runs_needed(epsilon=e, indicators=10) for e in (4.0, 0.5))
    assert large > 20 * small
    with pytest.raises(ValueError):
        indicator_runs_needed(epsilon=1.0, delta=1.0, indicators=1)


def test_indicator_test_inputs():
    with pytest.raises(ValueError, match="0/1"):
        indicator_test(np.full((5, 1), 2), np.zeros((5, 1)), epsilon=1.0)
    with pytest.raises(ValueError, match="shapes differ"):
        indicator_test(np.zeros((5, 1)), np.zeros((6, 1)), epsilon=1.0)
    with pytest.raises(ValueError, match="names"):
        indicator_test(np.zeros((5, 2)), np.zeros((5, 2)), epsilon=1.0, names=["a"])
    result = indicator_test(np.ones(30), np.zeros(30), epsilon=0.5)     # one indicator, 1-d
    assert not result.passed and len(result.events) <= 6 and result.n_selection == 0


def test_layout_indicators():
    layout = ReleaseLayout(keys=("a", "b"), values=("count", "sum"))
    x = layout.vectorize({"k": np.array(["a", "b", "a"]), "r": np.array([0, 0, 1]),
                          "count": np.array([1.0, np.nan, 3.0]), "sum": np.array([2.0, 5.0, np.nan])},
                         2, replica_column="r")
    matrix, names = layout.indicators(x)
    assert names == ["released[a]", "released[b]", "count[a] released", "sum[a] released",
                     "count[b] released", "sum[b] released"]
    assert matrix.tolist() == [[1, 1, 1, 1, 0, 1], [1, 0, 1, 0, 0, 0]]
