"""Masked LARk on Beam: secret-shared helper aggregation and masked gradients with DP noise.

Source: Pfeiffer et al., "Masked LARk: Masked Learning, Aggregation and Reporting worKflow"
(seed 004_8c653e9040d4a384): Algorithm 1 (browsers share), Algorithm 2 (helpers sum, add noise,
apply k-anonymity), Section 4 (real and fake labels with masks) and Algorithm 3 (masked,
clipped, noisy gradients), Section 4.2.3 (local DP on features).

Modules (one concept each): :mod:`ring` (Z/2^64, fixed point, overflow bounds),
:mod:`randomness` (secure keyed streams), :mod:`sharing` (additive shares), :mod:`masks` (fake
labels, masks, blinding), :mod:`local_dp` (feature noise), :mod:`model` (bit-reproducible
logistic regression), :mod:`params` (public parameters, sensitivities), :mod:`reports` (wire
format), :mod:`browser` (map step), :mod:`helper` (Algorithms 2 and 3), :mod:`combine` (ad
server), :mod:`training` (gradient-descent driver and baselines), :mod:`data` (generators),
:mod:`beam` (PTransforms). Everything but :mod:`beam` is importable without Beam.

Privacy argument
================

Parties: browsers, H >= 2 helpers, the ad server. Security model: honest-but-curious helpers
(Section 3.3.1), the ad server possibly malicious in what it sends (batches, models). Unit of
privacy: one *report* (the paper's k is "per record"; the system cannot identify users).

Neighbouring relations (stated in :mod:`params`): batches with the same reports (ids, keys,
number) differing in one report's values (aggregation) or in one report's features and labels
(training). Reports and their keys reach the helpers in the clear by design, so their number per
key is not protected by this guarantee; a user with m reports is protected with m * epsilon
(group privacy).

What one helper alone learns. Its reports: report ids (random), keys (aggregation) or features
(training; only their local-DP version if the browser adds feature noise), the two labels in
random order (for binary labels always {0, 1}), and ring elements -- shares, masks and blinding
words -- that are uniform and independent of the values and of which label is real (any H - 1
shares of a secret are uniform: :mod:`sharing`). So a helper learns the keys, counts and features
it is shown, and nothing about values or labels. It does not see other helpers' reports:
nothing in a helper's computation reads another helper's stream.

What the ad server learns. Per released coordinate, the helpers' outputs
Psi~^h = Psi^h + eta^h. Because the first H - 1 partial sums are uniform and independent (sums
of uniform shares; for gradients thanks to the blinding vectors, see :mod:`masks`), the tuple
of outputs is a bijective image of (H - 1 independent uniforms, S + sum_h eta^h): the server
learns exactly the noisy sum S + sum_h eta^h, where S is the true sum -- per released key with
more than k reports. Each eta^h is discrete Laplace with scale Delta / epsilon, so this is
epsilon-DP (adding the other helpers' independent noise is post-processing). The set of
released keys depends only on per-key report counts, which are fixed between neighbours.

One helper colluding with the server. The coalition knows that helper's shares, masks, noise
and keys. Against an honest helper h it holds the honest output Psi~^h and can remove everything
else: it learns S + eta^h -- still epsilon-DP because eta^h alone has the full scale. (If all H
helpers collude, there is no protection: they hold every share.) With two helpers, the colluding
helper's masks alpha^0 do not reveal real labels without alpha^1.

Noise per helper. Each helper adds the full discrete Laplace scale Delta / epsilon, independently
(not 1/H of it): the guarantee must hold with a single honest helper, whose noise is then the
only noise the coalition cannot subtract. The honest-everyone total is the sum of H such draws
(variance H times the central one) -- the price of trusting only one helper. Splitting the noise
(e.g. Polya shares summing to one discrete Laplace, as :mod:`transforms.sketches.dp` does) would
leave a coalition with 1/H of the noise: the DP tester catches that variant (tests).

Per-record k-anonymity and DP. A key (for gradients, a batch) is released only with more than k
reports. Under the relations above the counts are equal in neighbouring batches, so the
threshold costs no privacy and adds none: the guarantee is the noise's. Under add/remove of a
report an exact threshold is *not* DP (one report moves a key from k to k + 1 reports and from
suppressed to released), and it protects nothing against a server that fills a batch with its own
reports (it holds the helpers' public keys), so k-anonymity is a guard against tiny aggregates,
never a substitute for the noise. The helpers also refuse batches with duplicate report ids (a
replayed report would exceed the per-report sensitivity) and batches whose sum could overflow
the ring.

Composition. One helper release (a batch) costs epsilon for each report in it (reports of
different keys: parallel composition). Training runs many releases: a report in E epochs of
disjoint minibatches costs E * epsilon (basic composition); the server chooses models adaptively,
which basic composition allows. Local feature noise adds d * epsilon_feature for the features
against everyone, helpers included; it does not protect labels.

Not covered: helpers cannot check that a shared value lies in [lower, upper] (a malicious
browser can poison sums; the paper's Section 6 leaves sanitation open); timing and traffic
analysis; reports reused across batches beyond what each helper's ledger records.
"""
from transforms.lark.browser import aggregation_reports, gradient_reports
from transforms.lark.combine import combine_aggregation, combine_gradients, gradient_vector
from transforms.lark.helper import (aggregation_partials, gradient_partials, merge_partials,
                                    release_aggregation, release_gradient)
from transforms.lark.local_dp import LocalFeatureNoise
from transforms.lark.model import LogisticModel
from transforms.lark.params import AggregationParams, GradientParams
from transforms.lark.randomness import BrowserRandomness
from transforms.lark.reports import LarkInputError
from transforms.lark.ring import FixedPoint, RingOverflowError
from transforms.lark.sharing import recover, share

__all__ = ["AggregationParams", "GradientParams", "FixedPoint", "RingOverflowError",
           "BrowserRandomness", "LocalFeatureNoise", "LogisticModel", "LarkInputError",
           "share", "recover", "aggregation_reports", "gradient_reports",
           "aggregation_partials", "gradient_partials", "merge_partials",
           "release_aggregation", "release_gradient", "combine_aggregation",
           "combine_gradients", "gradient_vector"]
