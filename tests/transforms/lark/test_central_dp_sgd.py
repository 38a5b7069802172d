"""Central DP-SGD (the training comparison's baseline, ``train_central_dp``) through the DP tester:
one noisy central step on neighbouring datasets that differ in one replaced record.

The curator clips each record's gradient to L1 norm psi and adds one Laplace draw per coordinate
calibrated for L1 sensitivity 2 psi: replacing a record (its label flipped, say) moves the sum of
clipped gradients by up to 2 psi. The test takes one step (one epoch, one minibatch holding every
record) from the zero model, so the released model is theta = -lr (clipped sum + noise) / n, an
affine image of the noisy gradient: the tester sees the mechanism itself. Every record's gradient
exceeds the clip norm, so the replaced record moves the clipped sum by exactly 2 psi (L1): noise
for psi (one gradient, the add/remove figure) gives twice the stated epsilon.

Error rates: each sample is a fresh testing key (``ReleaseKey.for_testing``), so the samples are
independent and the run is reproducible; a correct mechanism fails with probability at most
1 - confidence = 1e-3 over the choice of keys, and a calibration for psi has true epsilon 2 on
the loss projection, far outside the tester's interval at this sample size.
"""
from __future__ import annotations

import numpy as np
import pytest

from accounting.keys import ReleaseKey
from accounting.verification.dp_tester import DPTester
from transforms.lark.model import LogisticModel, clipped_gradient_floats
from transforms.lark.training import TrainingConfig, train_central_dp

FEATURES = np.full((3, 1), 255, dtype=np.uint8)     # standardised 3.97: every gradient is clipped
CONFIG = TrainingConfig(epochs=1, batch_size=3, k=2, learning_rate=1.0, clip_norm=1.0, epsilon=1.0,
                        feature_scale=1 / 32, feature_offset=128.0)


def one_step(labels, n, first_seed):
    """The model after one central DP step on (FEATURES, labels), under n fresh testing keys."""
    return np.array([train_central_dp(FEATURES, np.asarray(labels), CONFIG,
                                      release_key=ReleaseKey.for_testing(first_seed + i)).model.vector()
                     for i in range(n)])


def noiseless_step(labels):
    """theta without noise: -lr x the clipped gradient sum / n (computed here from the clip)."""
    model = LogisticModel.zeros(1, CONFIG.feature_scale, CONFIG.feature_offset)
    clipped = clipped_gradient_floats(model.gradients(FEATURES, np.asarray(labels)), CONFIG.clip_norm)
    return -CONFIG.learning_rate * clipped.sum(axis=0) / len(labels)


def laplace_loss(centre, shift):
    """The privacy-loss statistic of a Laplace location shift from ``centre`` by ``shift`` (equal
    scales): the sum over coordinates of the offsets clipped to the shift, in its direction."""
    centre, shift = np.asarray(centre, dtype=np.float64), np.asarray(shift, dtype=np.float64)
    sign, size = np.sign(shift), np.abs(shift)

    def project(x):
        return np.clip((np.asarray(x, dtype=np.float64) - centre) * sign, 0.0, size).sum(axis=1)
    return project


@pytest.mark.slow
def test_one_central_dp_sgd_step_is_dp_under_one_replaced_record():
    d_labels, d2_labels = [1, 0, 0], [0, 0, 0]          # the first record replaced (label flipped)
    centre, other = noiseless_step(d_labels), noiseless_step(d2_labels)
    # the replaced record moves the clipped sum by 2 psi: lr 2 psi / n in the model (L1)
    assert np.abs(other - centre).sum() == pytest.approx(
        2 * CONFIG.clip_norm * CONFIG.learning_rate / 3)
    n = 20_000
    a, b = one_step(d_labels, n, 1_000_000), one_step(d2_labels, n, 2_000_000)
    tester = DPTester(n_samples=n, confidence=0.999, projections={
        "weight": lambda x: x[:, 0], "bias": lambda x: x[:, 1],
        "privacy loss": laplace_loss(centre, other - centre)})
    result = tester.run(lambda m: a[:m], lambda m: b[:m], epsilon=CONFIG.epsilon)
    assert result.passed, result
    # the stated epsilon is tight: the same samples refute a claim well below it
    assert not tester.run(lambda m: a[:m], lambda m: b[:m], epsilon=0.6 * CONFIG.epsilon).passed
