"""A small version of benchmarks/reach_frequency.py: WFA 95/5 reach and 80/20 frequency."""
import math

import numpy as np
import pytest

from accounting.keys import ReleaseKey
from transforms.sketches.beam import SketchUnionFn
from accounting.budget import PrivacyBudget
from transforms.sketches.dp import ReachFrequencyNoise, SketchStatistics, add_global_noise
from transforms.sketches.estimators import (estimate_reach, frequency_distribution,
                                            shuffle_distance)
from transforms.sketches.fingerprint import FingerprintSalt
from transforms.sketches.liquid_legions import LiquidLegionsSketch, SketchConfig

CONFIG = SketchConfig(num_registers=100_000, decay_rate=10.0)
K = 10


def _run(n, run, budget, key):
    """Three publishers with overlapping audiences; union reach exactly n."""
    rng = np.random.default_rng([n, run])
    ids = rng.choice(2 ** 62, n, replace=False)
    member = np.stack([rng.random(n) < q for q in (0.6, 0.45, 0.3)])
    nobody = ~member.any(axis=0)
    member[rng.integers(0, 3, int(nobody.sum())), np.flatnonzero(nobody)] = True
    campaign = f"acc-{n}-{run}"
    salt = FingerprintSalt.for_campaign(campaign)
    fn = SketchUnionFn()
    acc = fn.create_accumulator()
    total = np.zeros(n, np.int64)
    for j in range(3):
        rows = np.flatnonzero(member[j])
        imp = rng.geometric(0.5, rows.size)
        total[rows] += imp
        acc = fn.add_input(acc, LiquidLegionsSketch.from_ids(CONFIG, salt, ids[rows], imp))
    noisy = add_global_noise(SketchStatistics.of(fn.extract_output(acc), K), budget, key,
                             campaign, ("union", ""))
    truth = np.bincount(np.minimum(total, K) - 1, minlength=K) / n
    return (estimate_reach(noisy.active_registers, CONFIG) / n - 1,
            shuffle_distance(frequency_distribution(noisy.histogram), truth))


@pytest.mark.parametrize("n, runs", [(10_000, 30), (300_000, 10)])
def test_wfa_criteria_at_epsilon_ln3(n, runs):
    budget = ReachFrequencyNoise(budget=PrivacyBudget(epsilon=math.log(3)), num_publishers=3)
    key = ReleaseKey.for_testing(99)
    rel, shuffle = np.array([_run(n, r, budget, key) for r in range(runs)]).T
    assert np.mean(np.abs(rel) <= 0.05) >= 0.95, rel
    assert np.mean(shuffle <= 0.2) >= 0.8, shuffle
    # Well inside the criteria: the sketch's own spread is ~1%.
    assert np.quantile(np.abs(rel), 0.9) < 0.03
