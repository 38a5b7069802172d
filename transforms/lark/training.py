"""Training driver: logistic regression by minibatch gradient descent on helper gradients.

Each step, the ad server (this driver) picks a minibatch of stored reports, sends the current
model to every helper, each helper releases its noisy masked gradient sum for the batch
(Algorithm 3, :func:`transforms.lark.helper.release_gradient` -- the computation
:class:`transforms.lark.beam.HelperGradient` runs), and the server combines and decodes them
and takes a step  theta <- theta - lr * gradient / batch size.  Browsers share each record once
(fake labels, masks, blinding, optional local feature noise); the same reports serve every epoch.

Baselines on the same minibatches, for the paper's Figures 3 and 5:

* ``train_central``: the same descent on clear data, unclipped, no noise;
* ``train_central_dp``: a trusted curator clipping each gradient to L1 norm psi and adding ONE
  Laplace draw of scale 2 psi / epsilon per coordinate and step (the same relation and epsilon
  as each helper). The masked helpers add one such draw *each* (the one-honest-helper rule), so
  the gap between the two is the price of not trusting any single helper.

Privacy of a training run: minibatches of an epoch are disjoint, so each epoch costs every report
epsilon (parallel composition) and E epochs cost E * epsilon (basic composition; adaptive choice
of models is allowed by it): ``TrainingConfig.total_epsilon``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable, Optional, Sequence

import numpy as np
import pyarrow as pa

from accounting.calibration import NoiseKind, calibrate
from accounting.keys import ReleaseKey
from accounting.validation import check_epsilon, check_positive_int
from transforms.lark.browser import gradient_reports
from transforms.lark.combine import combine_gradients, gradient_vector
from transforms.lark.data import gradient_records
from transforms.lark.helper import (BatchOutcome, gradient_params_digest, gradient_partials,
                                    merge_partials, release_gradient)
from transforms.lark.local_dp import LocalFeatureNoise
from transforms.lark.model import LogisticModel, clipped_gradient_floats
from transforms.lark.params import GradientParams
from transforms.randomness import RandomSource, SystemRandomness
from transforms.noise import RandomStreams, add_noise

HelperRelease = Callable[[int, pa.Table, LogisticModel, str],
                         "tuple[Optional[pa.Table], BatchOutcome]"]


#: Bounds of the public hyper-parameters, checked before any charge: every epoch is a measure
#: of the release, and a step of the clipped, standardised gradient beyond this rate overflows.
MAX_EPOCHS = 1000
MAX_LEARNING_RATE = 1e3


@dataclass(frozen=True, kw_only=True)
class TrainingConfig:
    """Hyper-parameters (public). ``epsilon`` is per helper release (one step); None: no noise."""

    epochs: int = 10
    batch_size: int = 250
    learning_rate: float = 0.5
    clip_norm: float = 1.0
    epsilon: Optional[float] = 1.0
    k: int = 50
    fraction_bits: int = 16
    num_helpers: int = 2
    feature_scale: float = 1.0 / 32.0
    feature_offset: float = 128.0
    local_noise: Optional[LocalFeatureNoise] = None
    seed: int = 0

    def __post_init__(self):
        check_positive_int(self.epochs, "epochs")
        check_positive_int(self.batch_size, "batch_size")
        if self.epochs > MAX_EPOCHS:
            raise ValueError(f"epochs must be at most {MAX_EPOCHS} (each is a charged measure)")
        if not 0 < self.learning_rate <= MAX_LEARNING_RATE:
            raise ValueError(f"learning_rate must be in (0, {MAX_LEARNING_RATE:g}] (a larger "
                             "step throws the model's weights out of the floats)")
        if self.epsilon is not None:
            check_epsilon(self.epsilon)
        if self.batch_size <= self.k:
            raise ValueError(f"batch_size ({self.batch_size}) must exceed k ({self.k}): every "
                             "step would be suppressed by k-anonymity")

    def gradient_params(self, num_features: int) -> GradientParams:
        return GradientParams(num_features=num_features, clip_norm=self.clip_norm,
                              epsilon=self.epsilon, k=self.k, fraction_bits=self.fraction_bits,
                              num_helpers=self.num_helpers)

    def total_epsilon(self) -> Optional[float]:
        """Per report over the run: epochs * epsilon (disjoint batches within an epoch)."""
        return None if self.epsilon is None else self.epochs * self.epsilon


@dataclass(frozen=True, kw_only=True)
class TrainingResult:
    """The trained model and what happened: steps taken, steps suppressed by k-anonymity (in
    all and per epoch), the per-report epsilon, and accuracy after each epoch (``evaluate``)."""

    model: LogisticModel
    steps: int = 0
    suppressed_steps: int = 0
    epsilon_total: Optional[float] = None
    history: tuple = ()
    suppressed_by_epoch: tuple = ()


def minibatches(num_records: int, batch_size: int, epoch: int, seed: int) -> list[np.ndarray]:
    """The ad server's public minibatch assignment: a fresh permutation per epoch, cut into full
    batches (the remainder waits for the next epoch)."""
    order = np.random.default_rng([seed, epoch, 1013]).permutation(num_records)
    count = num_records // batch_size
    return [order[i * batch_size:(i + 1) * batch_size] for i in range(count)]


def in_process_helpers(params: GradientParams,
                       helper_keys: Optional[Sequence[ReleaseKey]]) -> HelperRelease:
    """Each helper's Algorithm 3 in this process, with a per-step key derived from its own key
    (every step is a separate release with independent noise)."""
    if params.epsilon is not None:
        if helper_keys is None or len(helper_keys) != params.num_helpers:
            raise ValueError(f"noisy training needs one ReleaseKey per helper "
                             f"({params.num_helpers})")
        if len({k.fingerprint() for k in helper_keys}) != len(helper_keys):
            raise ValueError("every helper needs its own key")

    def release(helper: int, table: pa.Table, model: LogisticModel, batch_id: str):
        partials, _ = gradient_partials(table, params, model, helper)
        key = None if params.epsilon is None else helper_keys[helper].derive(f"step:{batch_id}")
        return release_gradient(merge_partials(partials), params, model, helper=helper,
                                release_key=key)
    return release


def train_masked(features: np.ndarray, labels: np.ndarray, config: TrainingConfig, *,
                 helper_keys: Optional[Sequence[ReleaseKey]] = None,
                 randomness: Optional[RandomSource] = None,
                 helpers: Optional[HelperRelease] = None,
                 evaluate: Optional[tuple] = None,
                 start: Optional[LogisticModel] = None,
                 faulty: Optional[np.ndarray] = None) -> TrainingResult:
    """Masked LARk training (see the module docstring). ``evaluate``: (features, labels) whose
    accuracy is recorded after each epoch; ``start``: the initial model (default zeros with
    the configuration's feature standardisation); ``faulty``: booleans, records whose content
    was faulty -- shared neutralised (strictly fake: :mod:`transforms.lark.browser`), so they
    count in every minibatch and add nothing to its gradient."""
    n, d = features.shape
    params = config.gradient_params(d)
    helpers = helpers or in_process_helpers(params, helper_keys)
    reports = gradient_reports(gradient_records(features, labels), num_features=d,
                               num_helpers=config.num_helpers, local_noise=config.local_noise,
                               randomness=randomness or SystemRandomness(),
                               batch_id="unassigned", faulty=faulty)
    reports = [r.drop(["batch_id"]) for r in reports]
    model = start or LogisticModel.zeros(d, config.feature_scale, config.feature_offset)
    if model.num_features != d:
        raise ValueError(f"the initial model has {model.num_features} weights, the records "
                         f"{d} features")
    steps, suppressed, history = 0, [], []
    for epoch in range(config.epochs):
        suppressed.append(0)
        for step, rows in enumerate(minibatches(n, config.batch_size, epoch, config.seed)):
            batch_id = f"epoch-{epoch:04d}/step-{step:06d}"
            indices = pa.array(rows)
            outputs = []
            for h in range(config.num_helpers):
                table = reports[h].take(indices)
                table = table.add_column(0, "batch_id",
                                         pa.array([batch_id] * len(rows), pa.string()))
                out, outcome = helpers(h, table, model, batch_id)
                outputs.append(out)
            if any(o is None for o in outputs):
                suppressed[-1] += 1
                continue
            combined = combine_gradients(outputs, params, gradient_params_digest(params, model))
            gradient = gradient_vector(combined, batch_id, params.dimension)
            model = model.with_vector(model.vector() - config.learning_rate * gradient / len(rows))
            steps += 1
        if evaluate is not None:
            history.append(model.accuracy(*evaluate))
    return TrainingResult(model=model, steps=steps, suppressed_steps=sum(suppressed),
                          epsilon_total=config.total_epsilon(), history=tuple(history),
                          suppressed_by_epoch=tuple(suppressed))


def _central(features, labels, config: TrainingConfig, gradient_of, evaluate,
             start: Optional[LogisticModel] = None, faulty=None) -> TrainingResult:
    n, d = features.shape
    model = start or LogisticModel.zeros(d, config.feature_scale, config.feature_offset)
    real = np.ones(n, dtype=bool) if faulty is None else ~np.asarray(faulty, dtype=bool)
    steps, history = 0, []
    for epoch in range(config.epochs):
        for step, rows in enumerate(minibatches(n, config.batch_size, epoch, config.seed)):
            batch_id = f"epoch-{epoch:04d}/step-{step:06d}"
            used = rows[real[rows]]  # faulty records add nothing, as in the masked training
            gradient = gradient_of(model, features[used], labels[used], batch_id)
            model = model.with_vector(model.vector() - config.learning_rate * gradient / len(rows))
            steps += 1
        if evaluate is not None:
            history.append(model.accuracy(*evaluate))
    return TrainingResult(model=model, steps=steps, history=tuple(history),
                          suppressed_by_epoch=(0,) * config.epochs)


def train_central(features, labels, config: TrainingConfig, *, evaluate=None,
                  start: Optional[LogisticModel] = None, faulty=None) -> TrainingResult:
    """The same descent on the clear data: no clipping, no noise, no masking."""
    return _central(features, labels, config,
                    lambda m, x, y, _: m.gradients(x, y).sum(axis=0), evaluate, start, faulty)


def train_central_dp(features, labels, config: TrainingConfig, *, release_key: ReleaseKey,
                     evaluate=None, start: Optional[LogisticModel] = None,
                     faulty=None) -> TrainingResult:
    """A trusted curator: per-record L1 clipping to psi and one Laplace draw per coordinate per
    step, calibrated to the same relation (L1 sensitivity 2 psi) and epsilon as one helper."""
    if config.epsilon is None:
        raise ValueError("central DP training needs epsilon")
    spec = calibrate(NoiseKind.LAPLACE, epsilon=config.epsilon,
                     l1_sensitivity=2 * config.clip_norm, l0=features.shape[1] + 1)
    key = release_key.derive("masked-lark/central-dp")

    def gradient_of(model, x, y, batch_id):
        clipped = clipped_gradient_floats(model.gradients(x, y), config.clip_norm).sum(axis=0)
        lanes = pa.table({"batch_id": [batch_id] * clipped.size,
                          "coordinate": np.arange(clipped.size)})
        return add_noise(spec, clipped, RandomStreams.for_keys(key, "central-dp-sgd", lanes))
    result = _central(features, labels, config, gradient_of, evaluate, start, faulty)
    return dataclasses.replace(result, epsilon_total=config.total_epsilon())
