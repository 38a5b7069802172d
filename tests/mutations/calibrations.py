"""The calibration inventory: every calibration parameter of every mechanism (each sensitivity,
each budget or delta split, each clip or clamp, each client-side randomisation parameter) and
the mutant of mutants.py that breaks it (issue 40, item 7).

``test_calibrations.py`` checks the table against the tree and the mutation suite: every entry
names a mutant the runner knows, in the entry's file; every file under ``transforms/`` or
``pipelines/`` that calibrates (calls ``calibrate``, computes a ``*_sensitivity``, a keep or flip
probability, a binomial share or a Polya table) has an entry here or a reason in
``NOT_CALIBRATIONS``. So a new mechanism, or a new parameter in a new file, shows up as a failure
until it has its row and its mutant.

An entry whose ``mutant`` is None is a *gap*: a parameter without a mutant yet, with ``gap`` saying
why. The checks list the gaps by name, so closing one (or opening a new one) is a visible change.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional


@dataclass(frozen=True, kw_only=True)
class Calibration:
    mechanism: str               # what releases, or randomises, with this parameter
    parameter: str               # the calibration parameter
    file: str                    # where it is set (relative to the repository root)
    mutant: Optional[str]        # the mutant of mutants.py that breaks it (None: a gap)
    gap: str = ""                # why there is no mutant yet (gaps only)


def _c(mechanism, parameter, file, mutant=None, gap=""):
    return Calibration(mechanism=mechanism, parameter=parameter, file=file, mutant=mutant, gap=gap)


SENSITIVITY = "accounting/sensitivity.py"
SELECTION = "transforms/selection.py"
ORACLES = "transforms/ldp/oracles.py"
SHUFFLE = "transforms/ldp/shuffle.py"
EVENT_LEVEL = "transforms/ara/event_level.py"
LARK_PARAMS = "transforms/lark/params.py"
SKETCHES = "transforms/sketches/dp.py"
CN_CONFIG = "pipelines/centralnotice/config.py"
STAGE = "transforms/bounding_stage.py"

CALIBRATIONS = (
    # -- the noise engine and the accountants
    _c("Laplace-family noise", "scale drawn = scale calibrated", "transforms/noise/mechanisms.py",
       "noise-scale-halved"),
    _c("PLD accountant", "a Gaussian measure's sensitivity", "accounting/calibration.py",
       "pld-wrong-sensitivity"),
    _c("rho-calibrated Gaussian", "the exact curve's sensitivity", "accounting/calibration.py",
       "exact-curve-wrong-sensitivity"),
    _c("SharedBudget", "delta split over the parts that use it", "accounting/shared_budget.py",
       "pure-part-delta-counted-twice"),
    _c("calibration to a target", "the joint multiplier's composition check", "accounting/target.py",
       "joint-calibration-over-budget"),
    # -- sensitivities of DPAggregate's measures
    _c("counts", "L1 = L0 Linf", SENSITIVITY, "count-l1-of-one-partition"),
    _c("counts", "L2 = sqrt(L0) Linf", SENSITIVITY, "count-l2-of-one-partition"),
    _c("sums", "per-row magnitude max(|min|, |max|)", SENSITIVITY, "sum-sensitivity-halved"),
    _c("privacy-unit counts", "L1 = L0", SENSITIVITY, "unit-count-l1-of-one-key"),
    _c("moments (count, normalised sum)", "split of the moments' budget share", "transforms/metrics.py",
       "moments-split-overspent"),
    _c("quantile trees", "L1 = depth x the count's L1", "transforms/quantiles.py",
       "quantile-tree-l1-of-one-level"),
    _c("quantile trees", "L2 = sqrt(depth) x the count's L2 (Gaussian kinds)", "transforms/quantiles.py",
       "quantile-tree-l2-of-one-level"),
    _c("vector sums", "L1 = count L1 x max_norm (x sqrt(d) for the L2 ball)", "transforms/vectors.py",
       "vector-sum-l1-of-one-column"),
    _c("vector sums", "L2 = count L2 x max_norm (Gaussian kinds)", "transforms/vectors.py",
       "vector-sum-l2-without-the-clip-norm"),
    _c("private quantile (exponential mechanism)", "score sensitivity 2 max(q, 1 - q)",
       "transforms/private_quantile.py", "quantile-score-scale-halved"),
    # -- contribution bounding
    _c("contribution bounding", "L0 (max_partitions)", "transforms/bounding.py", "no-l0-bound"),
    _c("contribution bounding", "value clamp to [min_value, max_value]", STAGE, "values-not-clamped"),
    _c("contribution bounding", "vector clip to max_norm", STAGE, "vector-not-clipped"),
    # -- private key selection
    _c("selection", "keys one neighbouring change moves (L0, 2 L0 under substitution)", SELECTION,
       "selection-one-changed-key"),
    _c("truncated geometric selection", "keep curve for L0 keys", SELECTION,
       "selection-threshold-for-one-key"),
    _c("truncated geometric selection", "epsilon split over L0 keys", SELECTION,
       "selection-geometric-epsilon-not-split"),
    _c("truncated geometric selection", "delta split over L0 keys", SELECTION,
       "selection-geometric-delta-not-split"),
    _c("truncated geometric selection", "per-key budget's composed delta", SELECTION,
       "selection-per-key-delta-uncomposed"),
    _c("Laplace thresholding", "L1 = L0", SELECTION, "selection-laplace-l1-of-one-key"),
    _c("Laplace thresholding", "threshold at delta / L0", SELECTION,
       "selection-laplace-threshold-delta-not-split"),
    _c("Gaussian thresholding", "L2 = sqrt(L0)", SELECTION, "selection-gaussian-l2-of-one-key"),
    _c("Gaussian thresholding", "noise at delta / 2", SELECTION,
       "selection-gaussian-noise-delta-not-split"),
    _c("Gaussian thresholding", "threshold at delta / (2 L0)", SELECTION,
       "selection-gaussian-threshold-delta-not-split"),
    # -- local randomizers (client side)
    _c("generalized randomized response", "keep probability e^eps / (e^eps + k - 1)", ORACLES,
       "rr-probability-off"),
    _c("optimized unary encoding", "zero-bit probability 1 / (e^eps + 1)", ORACLES,
       "oue-zero-bit-at-twice-epsilon"),
    _c("symmetric unary encoding", "per-bit epsilon / 2", ORACLES, "sue-per-bit-epsilon"),
    _c("local hashing", "keep probability among g buckets", ORACLES, "olh-keep-among-two"),
    _c("label randomized response", "keep probability among the support", "transforms/ldp/labels.py",
       "label-rr-keep-among-two"),
    _c("split-and-mix summation", "binomial noise for the value bound B", SHUFFLE,
       "shuffle-noise-for-a-unit-value"),
    _c("split-and-mix summation", "delta split: noise and secure summation", SHUFFLE,
       "shuffle-summation-delta-not-split"),
    _c("split-and-mix summation", "trials each client adds (client side)", SHUFFLE,
       "shuffle-client-adds-half-its-coins"),
    # -- Attribution Reporting
    _c("ARA summary reports", "L1 sensitivity = the 65,536 contribution budget",
       "transforms/ara/summary.py", "ara-summary-sensitivity-halved"),
    _c("ARA summary reports", "a source's budget across its reports (client side)",
       "transforms/ara/contribution.py", "ara-source-budget-not-accumulated"),
    _c("ARA event-level reports", "flip probability k / (k + e^eps - 1)", EVENT_LEVEL,
       "event-level-flip-of-binary-rr"),
    _c("ARA event-level reports", "number of output states C(N + R, R)", EVENT_LEVEL,
       "event-level-states-without-no-report"),
    # -- Masked LARk
    _c("Masked LARk aggregation", "L1 = d (U - L)", LARK_PARAMS, "lark-aggregation-range-of-one-column"),
    _c("Masked LARk aggregation", "browser clip of values to [lower, upper] (client side)",
       "transforms/lark/browser.py", "lark-values-not-clipped"),
    _c("Masked LARk gradients", "L1 = 2 psi (replace one report)", LARK_PARAMS,
       "lark-gradient-sensitivity-of-one-gradient"),
    _c("Masked LARk gradients", "per-record clip to L1 norm psi", "transforms/lark/model.py",
       "lark-gradient-not-clipped"),
    _c("Masked LARk helpers", "k-anonymity threshold k", "transforms/lark/helper.py",
       "lark-k-anonymity-dropped"),
    _c("Masked LARk local feature noise", "scale 255 / epsilon (client side)",
       "transforms/lark/local_dp.py", "lark-local-feature-noise-for-half-the-range"),
    _c("central DP-SGD (the training comparison's baseline)", "L1 = 2 psi",
       "transforms/lark/training.py", "central-dp-sgd-sensitivity-of-one-gradient"),
    # -- sketches (reach and frequency)
    _c("sketch statistics", "epsilon split over the P + 1 scopes", SKETCHES,
       "sketch-epsilon-not-split-over-scopes"),
    _c("sketch statistics", "reach / histogram fraction of a scope", SKETCHES,
       "sketch-histogram-takes-the-whole-scope"),
    _c("sketch statistics", "discrete Gaussian delta split over the scopes", SKETCHES,
       "sketch-gaussian-delta-not-split-over-scopes"),
    _c("sketch statistics", "factor 2 under substitution", SKETCHES, "sketch-substitute-not-doubled"),
    _c("sketch statistics", "which statistics double under substitution (the histogram)", SKETCHES,
       "sketch-histogram-kept-under-substitution"),
    _c("sketch statistics", "reach sensitivity (one register)", SKETCHES,
       gap="no leaking value exists: one person added, removed or replaced moves the reach by at "
           "most 1 (every neighbouring pair of small populations enumerated on the real sketch), "
           "and every figure in (0, 1], under either relation and noise kind, calibrates the "
           "reach on the integer grid for a change of at least 1 at the scope's epsilon "
           "(tests/accounting/verification/test_sketch_exact.py); a figure of 0 or less is "
           "refused by calibrate, a crash, not a leak"),
    _c("sketch statistics", "histogram sensitivity (one bin)", SKETCHES,
       "sketch-histogram-sensitivity-halved"),
    _c("distributed sketch noise", "Polya(1/n) share of n helpers", SKETCHES,
       "sketch-polya-shares-for-twice-the-helpers"),
    _c("distributed sketch noise", "the sampler's total-variation delta", SKETCHES,
       "sketch-sampler-delta-not-charged"),
    # -- CentralNotice
    _c("CentralNotice impressions", "sensitivity k (a block of impressions)", CN_CONFIG,
       "centralnotice-impressions-half-a-block"),
    _c("CentralNotice user-DP clicks", "sensitivity and L0 = max_clicks_per_user", CN_CONFIG,
       "centralnotice-user-clicks-of-one-row"),
    # -- the multi-key discrete Gaussian in composition (issue 39.2)
    _c("PLD accountant", "a multi-key discrete Gaussian's dominating PLD: max over the patterns",
       "accounting/calibration.py", "multi-key-dominating-pld-last-pattern"),
    _c("PLD accountant", "a multi-key discrete Gaussian's dominating PLD: the unit's L2",
       "accounting/calibration.py", "multi-key-dominating-pld-one-click"),
)

#: Files the inventory's scan finds (they call a calibration) that set no calibration parameter
#: of a released mechanism, with the reason.
NOT_CALIBRATIONS = {
    "pipelines/centralnotice/data.py": "synthetic sample configurations (their release "
                                       "thresholds); releases calibrate through config.py",
    "pipelines/centralnotice/tuning.py": "expected error of candidate (k, epsilon) before a "
                                         "release; the release calibrates through config.py",
    "pipelines/ara/summary_reports.py": "the plan's statement of the summary noise; the noise "
                                        "drawn is transforms/ara/summary.py's (test_every_planned_"
                                        "measure_is_noised_for_the_sensitivities_it_states)",
    "transforms/moments.py": "the moments' budget search predicts variances; the calibration "
                             "itself is Measure.calibrated (transforms/metrics.py)",
}

# -- issue 39.2: CentralNotice releases calibrated jointly to a target
CALIBRATIONS = CALIBRATIONS + (
    _c("CentralNotice joint target", "the target's delta", CN_CONFIG,
       "centralnotice-target-delta-ignored"),
)
