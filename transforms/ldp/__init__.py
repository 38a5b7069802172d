"""Local and shuffle differential privacy: client randomizers, frequency oracles, PEM heavy
hitters, shuffle-model summation and label randomization.

Pure modules (numpy / pyarrow only, importable without Beam):

* :mod:`~transforms.ldp.randomness` -- keyed (secure, reproducible) or OS randomness, exact samplers;
* :mod:`~transforms.ldp.oracles` -- binary RR, GRR, SUE/OUE, basic RAPPOR, OLH: parameters,
  estimator, variance;
* :mod:`~transforms.ldp.hashing` -- OLH's universal hash family and support counting;
* :mod:`~transforms.ldp.reports` -- Arrow report schemas and validation;
* :mod:`~transforms.ldp.randomizers` -- client-side randomization;
* :mod:`~transforms.ldp.estimators` -- server-side support counts and estimates;
* :mod:`~transforms.ldp.simulate` -- client value distributions and report generation;
* :mod:`~transforms.ldp.evaluation` -- F1, NCR, NDCG of a top-k against ground truth;
* :mod:`~transforms.ldp.pem` -- prefix extending method (PEM) rounds;
* :mod:`~transforms.ldp.shuffle` -- split-and-mix summation and amplification by shuffling;
* :mod:`~transforms.ldp.labels` -- label randomization (epsilon-label-DP) and debiasing.

Beam wiring is in :mod:`transforms.ldp.beam` (imported on demand).
"""
from transforms.ldp.oracles import (BasicRappor, BinaryRR, GRR, OLH, ORACLES, Oracle,
                                    UnaryEncoding, make_oracle)
from transforms.ldp.randomness import KeyedRandomness
from transforms.randomness import RandomSource, SystemRandomness

__all__ = ["BasicRappor", "BinaryRR", "GRR", "OLH", "ORACLES", "Oracle", "UnaryEncoding",
           "make_oracle", "KeyedRandomness", "RandomSource", "SystemRandomness"]
