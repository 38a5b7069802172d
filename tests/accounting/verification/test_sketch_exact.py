"""Exact enumerations behind two of the sketches' calibration parameters (issue 40.7): no
sampling, every probability and every neighbouring pair computed.

* Distributed noise (transforms/sketches/dp.py): n helpers each add X - Y, X and Y drawn from
  the integer inverse-CDF table of Polya(1/n, p). The table's law is known exactly (each entry's
  mass is a difference of thresholds over 2^64), so the law of the summed shares is an exact
  convolution of rationals. It is compared here with the exact Polya and discrete Laplace laws,
  computed independently (mpmath: the Polya mass from the rising factorial, the discrete Laplace
  mass in closed form), and the released statistic's exact hockey-stick divergence at the
  stated epsilon is compared with the delta the release charges. The table's law has a bounded
  support, so that divergence is positive: charging distributed noise as pure discrete Laplace
  states a guarantee that is false (the mutant sketch-sampler-delta-not-charged).
* Reach sensitivity: one person added, removed or replaced moves a sketch's active-register
  count by at most 1 (every neighbouring pair of small populations, enumerated on the real
  sketch), and every sensitivity figure in (0, 1] calibrates the reach for a change of at least
  1 (the integer grid rounds it up). So no value of the reach's sensitivity constant under-noises
  the reach: why calibrations.py keeps that parameter without a mutant.
"""
from __future__ import annotations

import itertools

import mpmath
import numpy as np
import pytest

from accounting.budget import PrivacyBudget
from accounting.sensitivity import Neighbouring, Sensitivities
from transforms.sketches import dp
from transforms.sketches.fingerprint import FingerprintSalt
from transforms.sketches.liquid_legions import LiquidLegionsSketch, SketchConfig

PRECISION_BITS = 1024      # the convolved masses are rationals over 2^(128 n): exact here
TWO64 = 1 << 64


# -------------------------------------------------------------------------------- exact laws

def table_masses(table: dp.PolyaTable) -> list[int]:
    """The table sampler's law, exactly: numerators over 2^64 of P(draw = k), k = 0..K (a draw
    is the number of thresholds <= a uniform 64-bit word)."""
    t = [int(x) for x in table.thresholds]
    return [t[0]] + [b - a for a, b in zip(t, t[1:])] + [TWO64 - t[-1]]


def convolve(a: list[int], b: list[int]) -> list[int]:
    out = [0] * (len(a) + len(b) - 1)
    for i, x in enumerate(a):
        if x:
            for j, y in enumerate(b):
                out[i + j] += x * y
    return out


def summed_shares(table: dp.PolyaTable, helpers: int) -> tuple[list[int], int, int]:
    """The law of sum_i (X_i - Y_i) over ``helpers`` shares: (numerators, denominator, offset of
    the value 0 in the list)."""
    one = table_masses(table)
    difference = convolve(one, one[::-1])               # X - Y, from -K to K
    total = [1]
    for _ in range(helpers):
        total = convolve(total, difference)
    return total, TWO64 ** (2 * helpers), helpers * (len(one) - 1)


def polya_mass(k: int, helpers: int, p) -> mpmath.mpf:
    r = mpmath.mpf(1) / helpers
    return mpmath.rf(r, k) / mpmath.factorial(k) * p ** k * (1 - p) ** r


def total_variation_of_a_draw(table: dp.PolyaTable) -> mpmath.mpf:
    p = mpmath.exp(-1 / mpmath.mpf(table.unit_scale))
    masses = table_masses(table)
    exact = [polya_mass(k, table.num_helpers, p) for k in range(len(masses))]
    beyond = 1 - mpmath.fsum(exact)                         # the exact law's mass above K
    return (mpmath.fsum(abs(mpmath.mpf(m) / TWO64 - e) for m, e in zip(masses, exact)) + beyond) / 2


def total_variation_to_discrete_laplace(table: dp.PolyaTable, helpers: int) -> mpmath.mpf:
    p = mpmath.exp(-1 / mpmath.mpf(table.unit_scale))
    masses, denominator, zero = summed_shares(table, helpers)
    c = (1 - p) / (1 + p)
    inside = mpmath.fsum(abs(mpmath.mpf(m) / denominator - c * p ** abs(z - zero))
                         for z, m in enumerate(masses))
    outside = 2 * p ** (zero + 1) / (1 + p)                 # discrete Laplace mass beyond +-nK
    return (inside + outside) / 2


def hockey_stick(table: dp.PolyaTable, helpers: int, epsilon: float, shift: int) -> mpmath.mpf:
    """The exact delta at ``epsilon`` of one value released with the summed shares, between
    answers ``shift`` apart: max over both directions of sum_z (P(z) - e^eps Q(z))_+."""
    masses, denominator, _ = summed_shares(table, helpers)
    e = mpmath.exp(mpmath.mpf(epsilon))
    p = masses + [0] * shift                 # the law of the answer a + noise ...
    q = [0] * shift + masses                 # ... and of a + shift + noise, on one range
    return max(mpmath.fsum(max(mpmath.mpf(0), mpmath.mpf(x) - e * y) for x, y in zip(p, q)),
               mpmath.fsum(max(mpmath.mpf(0), mpmath.mpf(y) - e * x) for x, y in zip(p, q))) / denominator


@pytest.fixture(autouse=True)
def _precision():
    with mpmath.workprec(PRECISION_BITS):
        yield


# -------------------------------------------------------------------------- distributed noise

@pytest.mark.parametrize("helpers,unit_scale", [(1, 0.5), (2, 0.5), (3, 1.0), (2, 2.0)])
def test_polya_table_draws_are_within_their_stated_total_variation(helpers, unit_scale):
    """One draw, and the summed shares of one value, against the exact laws (Polya(1/n, p) and
    discrete Laplace of scale b): within the bounds the charged delta is built from."""
    table = dp.polya_table(helpers, unit_scale)
    one = total_variation_of_a_draw(table)
    assert 0 < one <= table.tv_per_draw, (float(one), table.tv_per_draw)
    summed = total_variation_to_discrete_laplace(table, helpers)
    assert 0 < summed <= table.tv_per_value, (float(summed), table.tv_per_value)


CONFIGS = [(Neighbouring.ADD_REMOVE, 1), (Neighbouring.ADD_REMOVE, 2), (Neighbouring.ADD_REMOVE, 3),
           (Neighbouring.SUBSTITUTE, 2)]


@pytest.mark.parametrize("neighbouring,helpers", CONFIGS, ids=lambda v: getattr(v, "name", str(v)))
def test_distributed_sketch_noise_meets_the_delta_it_charges_exactly(neighbouring, helpers):
    """Each statistic's exact divergence at its stated epsilon, for one value moved by the
    statistic's whole sensitivity (the reach; one histogram bin), is positive and at most the
    delta the release charges for it (charged_specs: the calibrated delta, zero for discrete
    Laplace, plus the sampler's)."""
    noise = dp.ReachFrequencyNoise(budget=PrivacyBudget(epsilon=8.0), num_publishers=1,
                                   neighbouring=neighbouring)
    max_frequency = 3
    charged = noise.charged_specs(helpers, max_frequency)
    for name, spec in (("reach", noise.reach_spec()), ("frequency", noise.histogram_spec())):
        table = dp.polya_table(helpers, spec.unit_scale)
        exact = hockey_stick(table, helpers, charged[name].epsilon, int(spec.unit_sensitivity))
        assert exact > 0, name                  # the table's law is not discrete Laplace
        assert exact <= charged[name].delta, (name, float(exact), charged[name].delta)


def test_the_hockey_stick_sees_a_coarse_noise():
    """The divergence computation on a law it must refute: the summed shares of a table built
    for twice the helpers (half the variance) exceed epsilon's delta by far at a shift of 1."""
    table = dp.polya_table(2, 1.0)                  # built for 2 helpers, drawn by 1
    assert hockey_stick(table, 1, 1.0, 1) > 1e-3
    assert hockey_stick(dp.polya_table(1, 1.0), 1, 1.0, 1) < 1e-15


# ------------------------------------------------------------------------ reach sensitivity

def _statistics(ids, impressions, config, salt, max_frequency):
    if not ids:
        return 0, np.zeros(max_frequency, np.int64)
    sketch = LiquidLegionsSketch.from_ids(config, salt, np.array(ids, np.int64),
                                          np.array(impressions, np.int64))
    return sketch.active_registers(), sketch.frequency_histogram(max_frequency)


def test_one_person_moves_the_reach_by_at_most_one_under_both_relations():
    """Every population of 6 people (each absent, or present with 1 or 2 impressions) in 3
    registers, and every neighbour: one person added or removed, or one replaced by another
    (another id, or the same id with other impressions). The reach moves by at most 1 under both
    relations -- a replaced person empties at most one register and fills at most one -- and the
    histogram by at most 1 (add/remove) or 2 (substitution) in L1."""
    config, salt, k = SketchConfig(num_registers=3, decay_rate=0.0), FingerprintSalt.for_campaign("c"), 2
    # two people in each register (the first ids that fill them): every kind of collision
    registers = config.registers_of(dp_fingerprints(list(range(100)), salt))
    people = [i for i in range(100) if (registers[:i] == registers[i]).sum() < 2][:6]
    assert sorted(registers[people].tolist()) == [0, 0, 1, 1, 2, 2]
    stats = {}
    for population in itertools.product((0, 1, 2), repeat=len(people)):
        present = [i for i, c in enumerate(population) if c]
        stats[population] = _statistics([people[i] for i in present], [population[i] for i in present],
                                        config, salt, k)
    worst = {"add_remove": (0, 0), "substitute": (0, 0)}
    for population, (reach, histogram) in stats.items():
        for relation, other in neighbours(population):
            reach2, histogram2 = stats[other]
            moved = (abs(reach2 - reach), int(np.abs(histogram2 - histogram).sum()))
            worst[relation] = tuple(max(a, b) for a, b in zip(worst[relation], moved))
    assert worst == {"add_remove": (1, 1), "substitute": (1, 2)}


def neighbours(population):
    """(relation, neighbour) of a population (impressions per person, 0: absent): one person
    added or removed; one person replaced by an absent one, or by the same id with other
    impressions."""
    def with_(changes):
        out = list(population)
        for i, c in changes:
            out[i] = c
        return tuple(out)
    for i, c in enumerate(population):
        if c:
            yield "add_remove", with_([(i, 0)])
            yield "substitute", with_([(i, 3 - c)])
            for j, d in enumerate(population):
                if not d:
                    yield from (("substitute", with_([(i, 0), (j, e)])) for e in (1, 2))
        else:
            yield from (("add_remove", with_([(i, e)])) for e in (1, 2))


def dp_fingerprints(ids, salt):
    from transforms.sketches.fingerprint import fingerprint
    return fingerprint(np.array(ids, np.int64), salt)


@pytest.mark.parametrize("kind", ["discrete_laplace", "discrete_gaussian"])
@pytest.mark.parametrize("neighbouring", [Neighbouring.ADD_REMOVE, Neighbouring.SUBSTITUTE])
@pytest.mark.parametrize("figure", [1e-9, 0.25, 0.5, 0.999, 1.0])
def test_every_reach_sensitivity_figure_up_to_one_calibrates_the_reach_for_a_change_of_one(
        kind, neighbouring, figure, monkeypatch):
    """Any positive figure for the reach's sensitivity (the constant a mutant would lower) is
    calibrated on the integer grid for a change of at least 1 -- what one person moves (above) --
    at the scope's epsilon: the reach constant has no leaking value."""
    monkeypatch.setattr(dp, "REACH_SENSITIVITY", Sensitivities(l0=1, linf=figure, l1=figure, l2=figure))
    noise = dp.ReachFrequencyNoise(budget=PrivacyBudget(epsilon=2.0, delta=1e-6), num_publishers=3,
                                   kind=kind, neighbouring=neighbouring)
    spec = noise.reach_spec()
    assert spec.unit_sensitivity >= 1 and spec.granularity == 1.0
    assert spec.epsilon == pytest.approx(2.0 * noise.reach_fraction / noise.num_scopes)
    if kind == "discrete_laplace":
        assert spec.unit_sensitivity / spec.unit_scale <= spec.epsilon * (1 + 1e-12)
