"""Masked LARk, pure parts (no Beam): ring, sharing, masks, helpers' Algorithms 2 and 3, combine,
privacy checks (two-sample independence of shares, the DP tester with a broken variant)."""
import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

from accounting.verification.dp_tester import DPTester
from accounting.keys import ReleaseKey
from transforms.lark import helper as H
from transforms.lark.browser import aggregation_reports, gradient_reports
from transforms.lark.combine import combine_aggregation, combine_gradients, gradient_vector
from transforms.lark.data import classification_data, conversion_records, gradient_records
from transforms.lark.local_dp import LocalFeatureNoise
from transforms.lark.masks import blinding, mask_labels
from transforms.lark.model import (LogisticModel, clipped_gradient_floats, deterministic_exp,
                                   sigmoid)
from transforms.lark.params import AggregationParams, GradientParams
from transforms.lark.randomness import BrowserRandomness
from transforms.randomness import RecordDraws, SystemRandomness, stream_words
from transforms.lark.reports import LarkInputError, hex_to_ids, ids_to_hex, uint64_column
from transforms.lark.ring import FixedPoint, RingOverflowError, sum_fits
from transforms.lark.sharing import recover, share, share_from_words

R = BrowserRandomness.for_testing


def _streams(n, seed=1, purpose="t"):
    return R(seed).streams(purpose, pa.table({"i": np.arange(n)}))


def _draws(n, seed=1):
    return RecordDraws(n, streams=_streams(n, seed))


def _agg_params(**kw):
    base = dict(lower=0.0, upper=100.0, epsilon=None, k=2, fraction_bits=0)
    base.update(kw)
    return AggregationParams(**base)


def _records(keys, values, batch="b1", start=0):
    n = len(keys)
    return pa.table({"record_id": np.arange(start, start + n), "batch_id": [batch] * n,
                     "key": list(keys), "value": np.asarray(values, dtype=np.float64)})


def _run_helpers(reports, params, keys=None):
    outputs, outcomes = [], []
    for h, table in enumerate(reports):
        parts, _ = H.aggregation_partials(table, params, h)
        out, outcome = H.release_aggregation(H.merge_partials(parts), params, helper=h,
                                             release_key=None if keys is None else keys[h])
        outputs.append(out)
        outcomes.append(outcome)
    return outputs, outcomes


# ----------------------------------------------------------------------------- ring and sharing

def test_fixed_point_round_trip_negative_and_fractional():
    codec = FixedPoint(fraction_bits=16)
    values = np.array([0.0, -1.5, 3.25, -1e6, 1e6, 2.0 ** -16, -(2.0 ** -16)])
    assert np.array_equal(codec.decode(codec.encode(values)), values)
    assert codec.encode([-1.0])[0] == np.uint64(2 ** 64 - 2 ** 16)  # two's complement
    assert codec.decode(codec.encode([1 / 3]))[0] == pytest.approx(1 / 3, abs=2.0 ** -17)
    ints = FixedPoint(fraction_bits=0)
    assert ints.decode_units(ints.encode(np.array([-7, 0, 2 ** 40]))).tolist() == [-7, 0, 2 ** 40]


def test_fixed_point_refuses_overflow_and_non_finite():
    codec = FixedPoint(fraction_bits=20)
    with pytest.raises(RingOverflowError, match="does not fit"):
        codec.encode([2.0 ** 43])
    with pytest.raises(RingOverflowError):
        codec.encode(np.array([2 ** 43], dtype=np.int64))
    with pytest.raises(ValueError, match="finite"):
        codec.encode([np.nan])
    with pytest.raises(RingOverflowError):
        AggregationParams(lower=0, upper=2.0 ** 60, epsilon=1, k=0, fraction_bits=8)
    assert sum_fits(2 ** 20, 2 ** 42) and not sum_fits(2 ** 21, 2 ** 42)


@pytest.mark.parametrize("num_helpers", [2, 3])
def test_share_recover_round_trip(num_helpers):
    rng = np.random.default_rng(0)
    values = rng.integers(-2 ** 62, 2 ** 62, size=(1000, 3))
    streams = _streams(1000)
    shares = share(values, num_helpers, lambda shape: np.stack(
        [stream_words(streams, shape[2]) for _ in range(shape[0])]))
    assert len(shares) == num_helpers
    assert np.array_equal(recover(shares).view(np.int64), values)
    codec = FixedPoint(fraction_bits=12)
    reals = rng.normal(0, 1000, 500)
    real_shares = share_from_words(codec.encode(reals), stream_words(_streams(500, 2), 1).T)
    assert np.allclose(codec.decode(recover(real_shares)), reals, atol=2.0 ** -13)
    # any single share is far from the value it hides
    assert not np.any(real_shares[0] == codec.encode(reals))
    with pytest.raises(ValueError):
        share(values, 1, None)
    with pytest.raises(ValueError, match="shapes"):
        recover([np.zeros(2, np.uint64), np.zeros(3, np.uint64)])


def test_report_ids_and_uint64_text_columns():
    w = np.array([[0, 2 ** 64 - 1], [0x0123456789ABCDEF, 42]], dtype=np.uint64)
    text = ids_to_hex(w)
    assert text.to_pylist()[0] == "0" * 16 + "f" * 16
    back, ok = hex_to_ids(pa.array(text.to_pylist() + ["xyz", None, "g" * 32]))
    assert ok.tolist() == [True, True, False, False, False]
    assert np.array_equal(back[:2], w)
    values, ok = uint64_column(pa.array(["18446744073709551615", "18446744073709551616", "-1",
                                         " 7", "", None]))
    assert ok.tolist() == [True, False, False, True, False, False]
    assert values[0] == np.uint64(2 ** 64 - 1) and values[3] == 7
    signed, ok = uint64_column(pa.array([-1], pa.int64()))
    assert ok.all() and signed[0] == np.uint64(2 ** 64 - 1)


# ----------------------------------------------------------------------------- masks

def test_masks_sum_to_one_and_zero_and_order_is_random():
    n = 4000
    labels = np.random.default_rng(1).integers(0, 2, n)
    fake_flags = np.zeros(n, bool)
    fake_flags[:100] = True
    for num_helpers in (2, 3):
        m = mask_labels(labels, num_labels=2, num_helpers=num_helpers, draws=_draws(n),
                        strictly_fake=fake_flags)
        sum_a, sum_b = recover(m.mask_a), recover(m.mask_b)
        real_is_a = (m.label_a == labels)
        assert set(zip(m.label_a.tolist(), m.label_b.tolist())) == {(0, 1), (1, 0)}
        expected_a = np.where(real_is_a & ~fake_flags, 1, 0).astype(np.uint64)
        expected_b = np.where(~real_is_a & ~fake_flags, 1, 0).astype(np.uint64)
        assert np.array_equal(sum_a, expected_a) and np.array_equal(sum_b, expected_b)
        assert 0.45 < real_is_a.mean() < 0.55  # the order of real and fake is random
    multi = mask_labels(np.array([0] * 3000 + [2] * 10), num_labels=4, num_helpers=2,
                        draws=_draws(3010, 3))
    fake = np.where(multi.label_a == np.array([0] * 3000 + [2] * 10), multi.label_b, multi.label_a)
    assert set(fake[:3000].tolist()) == {1, 2, 3} and set(fake[3000:].tolist()) == {0}
    blinds = blinding(500, 4, 3, _draws(500, 4))
    assert not recover(blinds).any() and blinds[0].any()


# ----------------------------------------------------------------------------- Algorithm 2

def test_exact_aggregate_without_noise_integers_and_fixed_point():
    rng = np.random.default_rng(5)
    keys = rng.choice(["a", "b", "c"], 3000)
    for params, values in [
            (_agg_params(lower=-50, upper=50), rng.integers(-60, 60, 3000)),
            (_agg_params(lower=-10.5, upper=99.75, fraction_bits=10), rng.uniform(-20, 120, 3000))]:
        records = _records(keys, values)
        reports = aggregation_reports(records, params, randomness=R(9))
        combined = combine_aggregation(_run_helpers(reports, params)[0], params)
        clipped_units = params.codec.units(np.clip(values, params.lower, params.upper))
        for key, got in zip(combined.column("key").to_pylist(),
                            combined.column("value").to_numpy()):
            want = clipped_units[keys == key].sum()
            assert got * 2 ** params.fraction_bits == want  # exact, in units


def test_k_anonymity_releases_only_more_than_k_reports():
    params = _agg_params(k=3)
    keys = ["k2"] * 2 + ["k3"] * 3 + ["k4"] * 4
    reports = aggregation_reports(_records(keys, np.ones(9)), params, randomness=R(1))
    outputs, outcomes = _run_helpers(reports, params)
    assert [o.status for o in outcomes] == ["released"] * 2
    assert outcomes[0].keys_released == 1 and outcomes[0].keys_suppressed == 2
    assert combine_aggregation(outputs, params).column("key").to_pylist() == ["k4"]
    # k = 0: a single report is released; nothing above k: the batch releases nothing
    zero = _agg_params(k=0)
    out, _ = _run_helpers(aggregation_reports(_records(["x"], [5]), zero, randomness=R(2)), zero)
    assert combine_aggregation(out, zero).column("value").to_pylist() == [5]
    none, outcomes = _run_helpers(reports, _agg_params(k=4))
    assert none == [None, None] and outcomes[0].status == "below_k"


def test_helper_noise_is_integer_on_the_ring_and_full_scale_per_helper():
    params = _agg_params(epsilon=0.5, k=0, lower=0, upper=4)
    n_keys = 3000
    keys = [f"k{i:05d}" for i in range(n_keys)]
    reports = aggregation_reports(_records(keys, np.full(n_keys, 2.0)), params, randomness=R(3))
    helper_keys = [ReleaseKey.for_testing(10), ReleaseKey.for_testing(11)]
    outputs, _ = _run_helpers(reports, params, helper_keys)
    noisy = combine_aggregation(outputs, params).column("value").to_numpy()
    assert noisy.dtype == np.int64
    # coalition with helper 1 sees value + helper 0's noise: full scale 4 / 0.5 = 8
    partial1 = H.merge_partials(H.aggregation_partials(reports[1], params, 1)[0])
    view = (outputs[0].column("share_value").to_numpy() + partial1.sums[:, 0]).view(np.int64) - 2
    spec = params.noise_spec()
    assert spec.unit_scale == 8
    assert np.var(view) == pytest.approx(spec.variance, rel=0.1)
    assert np.var(noisy - 2) == pytest.approx(2 * spec.variance, rel=0.1)  # two full draws


def test_duplicate_reports_and_overflow_refuse_the_batch():
    params = _agg_params()
    reports = aggregation_reports(_records(["a"] * 5, np.ones(5)), params, randomness=R(1))
    replayed = pa.concat_tables([reports[0], reports[0].slice(0, 1)])
    parts, _ = H.aggregation_partials(replayed, params, 0)
    out, outcome = H.release_aggregation(H.merge_partials(parts), params, helper=0, release_key=None)
    assert out is None and outcome.status == "duplicate_reports"
    tight = _agg_params(upper=2.0 ** 40, max_batch_records=10)
    parts, _ = H.aggregation_partials(
        aggregation_reports(_records(["a"] * 11, np.ones(11)), tight, randomness=R(1))[0], tight, 0)
    assert H.release_aggregation(H.merge_partials(parts), tight, helper=0,
                                 release_key=None)[1].status == "overflow"
    big = _agg_params(upper=2.0 ** 61)
    assert big.batch_fits(3) and not big.batch_fits(4)


# ----------------------------------------------------------------------------- bad input

def _two_batches():
    params = _agg_params(k=1)
    a = aggregation_reports(_records(["x"] * 4, [1, 2, 3, 4], batch="A"), params, randomness=R(1))
    b = aggregation_reports(_records(["x"] * 4, [5, 6, 7, 8], batch="B", start=100), params,
                            randomness=R(1))
    return params, _run_helpers(a, params)[0], _run_helpers(b, params)[0]


def test_combine_refuses_missing_mismatched_and_mixed_batches():
    params, out_a, out_b = _two_batches()
    assert combine_aggregation(out_a, params).column("value").to_pylist() == [10]
    with pytest.raises(LarkInputError, match=r"no output from helper\(s\) \[1\]"):
        combine_aggregation([out_a[0], out_b[0]], params)
    with pytest.raises(LarkInputError, match="batch ids do not match"):
        combine_aggregation([out_a[0], out_b[1]], params)
    relabelled = out_b[1].set_column(0, "batch_id", pa.array(["A"], pa.string()))
    with pytest.raises(LarkInputError, match="different sets of reports"):
        combine_aggregation([out_a[0], relabelled], params)
    with pytest.raises(LarkInputError, match="more than once"):
        combine_aggregation([out_a[0], out_a[1], out_a[1]], params)
    with pytest.raises(LarkInputError, match="other public parameters"):
        combine_aggregation(out_a, _agg_params(k=2))
    with pytest.raises(LarkInputError, match="no helper outputs"):
        combine_aggregation([None, None], params)


def test_helper_refuses_other_helpers_reports_and_counts_malformed_rows():
    params = _agg_params()
    reports = aggregation_reports(_records(["a"] * 4, np.ones(4)), params, randomness=R(1))
    with pytest.raises(LarkInputError, match="addressed to helper"):
        H.aggregation_partials(pa.concat_tables([reports[0], reports[1]]), params, 0)
    with pytest.raises(LarkInputError, match="lack column"):
        H.aggregation_partials(reports[0].drop(["share_value"]), params, 0)
    text = reports[0].set_column(4, "share_value", pa.array(
        [str(v) for v in reports[0].column("share_value").to_pylist()[:3]] + ["not-a-number"]))
    parts, stats = H.aggregation_partials(text, params, 0)
    assert stats.malformed == 1 and stats.faults == {"bad_share_value": 1}
    assert parts[0].num_reports == 3


# ----------------------------------------------------------------------------- Algorithm 3

def test_deterministic_sigmoid_matches_libm():
    t = np.linspace(-700, 0, 20001)
    assert np.max(np.abs(deterministic_exp(t) / np.exp(t) - 1)) < 1e-14
    z = np.linspace(-40, 40, 1001)
    assert np.max(np.abs(sigmoid(z) - 1 / (1 + np.exp(-z)))) < 1e-15


def test_masked_gradient_equals_clear_gradient_to_fixed_point_precision():
    x, y, _ = classification_data(3000, num_features=8, seed=3)
    records = gradient_records(x, y, fake_rate=0.1, seed=3)
    params = GradientParams(num_features=8, clip_norm=2.0, epsilon=None, k=10, num_helpers=3)
    model = LogisticModel(weights=tuple(np.linspace(-1, 1, 8)), bias=0.2,
                          feature_scale=1 / 32, feature_offset=128)
    reports = gradient_reports(records, num_features=8, num_helpers=3, randomness=R(4),
                               batch_id="s1")
    outputs = []
    for h in range(3):
        parts, _ = H.gradient_partials(reports[h], params, model, h)
        outputs.append(H.release_gradient(H.merge_partials(parts), params, model, helper=h,
                                          release_key=None)[0])
    combined = gradient_vector(combine_gradients(outputs, params,
                                                 H.gradient_params_digest(params, model)), "s1", 9)
    real = ~records.column("fake").to_numpy(zero_copy_only=False)
    units = H.clear_gradient_units(model, params, x[real], y[real])
    assert np.array_equal(combined * 2 ** 16, units)  # exact in fixed-point units
    floats = clipped_gradient_floats(model.gradients(x[real], y[real]), 2.0).sum(axis=0)
    assert np.max(np.abs(combined - floats)) <= 2 * real.sum() * 2.0 ** -16
    # the model is bound into the outputs: another model's digest is refused
    other = LogisticModel(weights=(0.0,) * 8, feature_scale=1 / 32, feature_offset=128)
    with pytest.raises(LarkInputError, match="other public parameters"):
        combine_gradients(outputs, params, H.gradient_params_digest(params, other))


def test_clipped_integer_gradients_respect_the_cap():
    from transforms.lark.model import clipped_gradient_units
    g = np.random.default_rng(0).normal(0, 3, size=(5000, 7))
    units = clipped_gradient_units(g, cap=65536, fraction_bits=16)
    assert np.abs(units).sum(axis=1).max() <= 65536
    small = g * 1e-3
    assert np.array_equal(clipped_gradient_units(small, 65536, 16),
                          np.trunc(np.ldexp(small, 16)).astype(np.int64))


def test_gradient_batch_of_exactly_k_reports_is_suppressed():
    x, y, _ = classification_data(20, num_features=3, seed=1)
    params = GradientParams(num_features=3, clip_norm=1.0, epsilon=1.0, k=10)
    model = LogisticModel.zeros(3)
    for n, released in ((10, False), (11, True)):
        rep = gradient_reports(gradient_records(x[:n], y[:n]), num_features=3, randomness=R(1),
                               batch_id="b")[0]
        out, outcome = H.release_gradient(H.merge_partials(H.gradient_partials(
            rep, params, model, 0)[0]), params, model, helper=0,
            release_key=ReleaseKey.for_testing(1))
        assert (out is not None) == released
        assert outcome.status == ("released" if released else "below_k")


def test_local_feature_noise_stays_in_byte_range():
    x = np.array([[0, 255, 128]] * 2000, dtype=np.uint8)
    noise = LocalFeatureNoise(epsilon_per_feature=1.0)
    noisy = noise.apply(x, _streams(x.size))
    assert noisy.dtype == np.uint8 and noisy.min() == 0 and noisy.max() == 255
    assert 100 < np.abs(noisy[:, 2].astype(int) - 128).mean() < 260
    assert noise.vector_epsilon(3) == 3.0
    with pytest.raises(ValueError, match="bytes"):
        noise.apply(np.array([[256]]), _streams(1))


# ----------------------------------------------------------------------------- privacy checks

def _shares_of(values, helper, seed, random_bits=64):
    """Helper ``helper``'s shares of ``values`` (two helpers); ``random_bits`` < 64 is a broken
    browser whose uniform words are too short (e.g. an int16 ring for a 64-bit value)."""
    params = _agg_params(lower=0, upper=1000)
    records = _records(["k"] * len(values), values)
    if random_bits == 64:
        return aggregation_reports(records, params, randomness=R(seed))[helper] \
            .column("share_value").to_numpy()
    uniform = stream_words(_streams(len(values), seed), 1).T >> np.uint64(64 - random_bits)
    return share_from_words(params.codec.encode(values), uniform)[helper]


def _independent(a, b) -> bool:
    """Two-sample tests: KS on the signed and on the unsigned reading, chi-square on the low
    byte; all at level 1e-3."""
    signed = lambda s: s.view(np.int64).astype(np.float64)
    unsigned = lambda s: (s >> np.uint64(11)).astype(np.float64)
    low = lambda s: np.bincount((s & np.uint64(255)).astype(np.int64), minlength=256)
    return (stats.ks_2samp(signed(a), signed(b)).pvalue > 1e-3
            and stats.ks_2samp(unsigned(a), unsigned(b)).pvalue > 1e-3
            and stats.chi2_contingency(np.vstack([low(a), low(b)]))[1] > 1e-3)


@pytest.mark.parametrize("helper", [0, 1])
def test_one_helpers_shares_are_independent_of_the_values(helper):
    """Two-sample tests between a helper's shares of two very different datasets."""
    n = 20000
    zeros, large = np.zeros(n), np.random.default_rng(2).integers(900, 1000, n)
    assert _independent(_shares_of(zeros, helper, seed=1), _shares_of(large, helper, seed=2))
    if helper == 1:  # power: the same tests see through 12-bit randomness
        assert not _independent(_shares_of(zeros, 1, 1, random_bits=12),
                                _shares_of(large, 1, 2, random_bits=12))


def test_masks_are_independent_of_which_label_is_real():
    n = 20000
    labels = np.random.default_rng(3).integers(0, 2, n)
    m = mask_labels(labels, num_labels=2, num_helpers=2, draws=_draws(n, 8))
    real_is_a = m.label_a == labels
    for h in range(2):
        as_unit = lambda s: (s >> np.uint64(11)).astype(np.float64) * 2.0 ** -53
        assert stats.ks_2samp(as_unit(m.mask_a[h][real_is_a]),
                              as_unit(m.mask_a[h][~real_is_a])).pvalue > 1e-3
        parity = [np.mean(m.mask_a[h][sel] & np.uint64(1)) for sel in (real_is_a, ~real_is_a)]
        assert abs(parity[0] - parity[1]) < 0.03


def _coalition_samples(params, n_keys, differing_value, helper_key, seed):
    """What a server colluding with helper 1 learns about each key from honest helper 0:
    the decoded sum plus helper 0's noise (k + 1 reports per key, one of them differing)."""
    per_key = params.k + 1
    keys = np.repeat([f"k{i:06d}" for i in range(n_keys)], per_key)
    values = np.tile([differing_value] + [params.lower] * params.k, n_keys)
    reports = aggregation_reports(_records(keys, values), params, randomness=R(seed))
    honest = H.merge_partials(H.aggregation_partials(reports[0], params, 0)[0])
    out, _ = H.release_aggregation(honest, params, helper=0, release_key=helper_key)
    colluder = H.merge_partials(H.aggregation_partials(reports[1], params, 1)[0])
    return (out.column("share_value").to_numpy() + colluder.sums[:, 0]).view(np.int64)


def test_helper_output_is_dp_against_a_colluding_server_and_split_noise_is_not():
    n, epsilon = 20000, 1.0
    params = _agg_params(lower=0, upper=1, epsilon=epsilon, k=2)
    d = _coalition_samples(params, n, 1, ReleaseKey.for_testing(1), seed=1)
    d_prime = _coalition_samples(params, n, 0, ReleaseKey.for_testing(2), seed=2)
    tester = DPTester(n_samples=n)
    assert tester.run(lambda m: d[:m], lambda m: d_prime[:m], epsilon=epsilon).passed
    # broken: each of the 2 helpers adds half the noise (epsilon * H), trusting the other one
    split = _agg_params(lower=0, upper=1, epsilon=epsilon * 2, k=2)
    b = _coalition_samples(split, n, 1, ReleaseKey.for_testing(3), seed=3)
    b_prime = _coalition_samples(split, n, 0, ReleaseKey.for_testing(4), seed=4)
    assert not tester.run(lambda m: b[:m], lambda m: b_prime[:m], epsilon=epsilon).passed


def _shifted_min(centre, shift):
    """Projection of a vector output: min over coordinates of (x - centre) in the direction of
    ``shift``. The event {min >= t} is where a noise calibrated for fewer moved coordinates than
    a neighbour moves shows its loss: each coordinate's tail ratio multiplies."""
    centre, sign = np.asarray(centre, dtype=np.float64), np.sign(np.asarray(shift, dtype=np.float64))

    def project(x):
        return np.min((np.asarray(x, dtype=np.float64) - centre) * sign, axis=1)
    return project


def test_helper_noise_covers_one_reports_values_in_every_column():
    """Two value columns: one report moves both of its key's sums (L1 = d (U - L)), so the
    coalition's view of the pair must meet epsilon jointly -- a noise calibrated for one
    column's range passes each column alone and fails here. The differing report's values lie
    far beyond the declared range: the browser clips them to it (a value sent unclipped moves
    the sums by more than the noise covers)."""
    n, epsilon = 20000, 1.0
    params = _agg_params(value_columns=("a", "b"), lower=0, upper=1, epsilon=epsilon, k=2)

    def samples(differing, seed):
        keys = np.repeat([f"k{i:06d}" for i in range(n)], params.k + 1)
        first = np.tile([differing] + [0.0] * params.k, n)
        records = pa.table({"record_id": np.arange(keys.size), "batch_id": ["b1"] * keys.size,
                            "key": list(keys), "a": first, "b": first})
        reports = aggregation_reports(records, params, randomness=R(seed))
        honest = H.merge_partials(H.aggregation_partials(reports[0], params, 0)[0])
        out, _ = H.release_aggregation(honest, params, helper=0,
                                       release_key=ReleaseKey.for_testing(seed))
        colluder = H.merge_partials(H.aggregation_partials(reports[1], params, 1)[0])
        return np.stack([(out.column(f"share_{c}").to_numpy() + colluder.sums[:, j]).view(np.int64)
                         for j, c in enumerate(params.value_columns)], axis=1)

    d, d_prime = samples(50.0, 21), samples(0.0, 22)
    tester = DPTester(n_samples=n, projections={"a": lambda x: x[:, 0], "sum": lambda x: x.sum(axis=1),
                                                "both": _shifted_min([0, 0], [1, 1])})
    tester.assert_dp(lambda m: d[:m], lambda m: d_prime[:m], epsilon=epsilon)


@pytest.mark.slow
def test_masked_gradient_helper_is_dp_in_one_reports_label():
    """Algorithm 3 through the DP tester: batches of k + 1 reports differing in one label; the
    coalition view of honest helper 0 on both coordinates (feature and bias). The features are
    scaled so that every per-record gradient exceeds the clip norm: the clipped gradient has L1
    norm psi and a label flip moves it by 2 psi -- what the noise must cover (an unclipped
    gradient, or a noise for psi, fails)."""
    params = GradientParams(num_features=1, clip_norm=1.0, epsilon=1.0, k=2, fraction_bits=4)
    model = LogisticModel(weights=(0.0,), bias=0.0, feature_scale=4 / 255)

    def samples(first_label, n, seed):
        out = np.empty((n, 2), dtype=np.int64)
        x = np.full((3 * n, 1), 255, dtype=np.uint8)
        y = np.tile([first_label, 0, 0], n)
        records = gradient_records(x, y).append_column(
            "batch_id", pa.array(np.repeat([f"b{i:06d}" for i in range(n)], 3)))
        reports = gradient_reports(records, num_features=1, randomness=R(seed))
        parts0 = H.gradient_partials(reports[0], params, model, 0)[0]
        parts1 = {p.batch_id: p for p in H.gradient_partials(reports[1], params, model, 1)[0]}
        key = ReleaseKey.for_testing(seed)
        for i, p in enumerate(parts0):
            table, _ = H.release_gradient(p, params, model, helper=0, release_key=key)
            total = table.column("share").to_numpy()[:2] + parts1[p.batch_id].sums[0, :2]
            out[i] = total.view(np.int64)
        return out
    n = 10000
    centre = H.clear_gradient_units(model, params, np.full((3, 1), 255, np.uint8), np.array([1, 0, 0]))
    other = H.clear_gradient_units(model, params, np.full((3, 1), 255, np.uint8), np.array([0, 0, 0]))
    # the flip moves 2 psi (less one unit per coordinate and record of truncation toward zero)
    assert np.abs(other - centre).sum() >= 2 * params.cap_units - 2 * params.dimension
    a, b = samples(1, n, 5), samples(0, n, 6)
    tester = DPTester(n_samples=n, projections={"bias": lambda x: x[:, 1],
                                                "both": _shifted_min(centre, other - centre)})
    tester.assert_dp(lambda m: a[:m], lambda m: b[:m], epsilon=1.0)


def test_local_feature_noise_is_epsilon_dp_per_feature():
    """The browser's local noise on a byte feature: 0 and 255 (the extremes of its range) must be
    indistinguishable within epsilon_per_feature."""
    noise = LocalFeatureNoise(epsilon_per_feature=1.0)
    n = 200_000

    def sample(value, seed):
        return lambda m: noise.apply(np.full((m, 1), value, dtype=np.uint8),
                                     _streams(m, seed=seed, purpose="local")).astype(np.int64)[:, 0]
    DPTester(n_samples=n).assert_dp(sample(0, 31), sample(255, 32), epsilon=1.0)


def test_conversion_generator_shapes():
    t = conversion_records(1000, num_campaigns=5, num_batches=2, seed=1)
    assert t.num_rows == 1000 and set(t.column("batch_id").to_pylist()) == {"batch-000", "batch-001"}
    values = t.column("value").to_numpy()
    assert values.min() >= 0 and values.max() <= 100


def test_secure_and_keyed_randomness():
    params = _agg_params(k=0)
    records = _records(["a", "b", "a"], [1, 2, 3])
    secure = aggregation_reports(records, params)  # default: the OS CSPRNG
    assert not SystemRandomness().is_testing and not BrowserRandomness.keyed(ReleaseKey.generate()).is_testing
    assert BrowserRandomness.for_testing(1).is_testing
    out, _ = _run_helpers(secure, params)
    assert combine_aggregation(out, params).column("value").to_pylist() == [4, 2]
    assert secure[0].column("share_value") != aggregation_reports(records, params)[0] \
        .column("share_value")
    # keyed: a record's report depends on its content only, not on the table it comes in
    keyed = BrowserRandomness.keyed(ReleaseKey.for_testing(7))
    alone = aggregation_reports(records.slice(1, 1), params, randomness=keyed)[1]
    together = aggregation_reports(records, params, randomness=keyed)[1]
    assert alone.to_pylist()[0] == together.to_pylist()[1]
    changed = records.set_column(3, "value", pa.array([1.0, 5.0, 3.0]))
    other = aggregation_reports(changed, params, randomness=keyed)[1]
    assert other.to_pylist()[1]["share_value"] != together.to_pylist()[1]["share_value"]
    assert other.to_pylist()[1]["report_id"] != together.to_pylist()[1]["report_id"]
    with pytest.raises(TypeError, match="ReleaseKey"):
        BrowserRandomness(None)


def test_reports_read_back_from_csv_text(tmp_path):
    import pyarrow.csv as pacsv
    params = _agg_params(k=0, fraction_bits=4, lower=-10, upper=10)
    records = _records(["a", "a", "b"], [-1.25, 2.5, 9.0])
    reports = aggregation_reports(records, params, randomness=R(3))
    texts = []
    for h, table in enumerate(reports):
        path = tmp_path / f"h{h}.csv"
        pacsv.write_csv(table, path)
        texts.append(pacsv.read_csv(path, convert_options=pacsv.ConvertOptions(
            column_types={c: pa.string() for c in table.column_names})))
    out, _ = _run_helpers(texts, params)
    assert combine_aggregation(out, params).column("value").to_pylist() == [1.25, 9.0]


def test_ring_bincount_wraps_and_many_batches_compact():
    rng = np.random.default_rng(4)
    values = rng.integers(0, 2 ** 64, size=(5000, 2), dtype=np.uint64)
    groups = rng.integers(0, 7, 5000)
    got = H.ring_bincount(groups, values, 7)
    for g in range(7):
        for j in range(2):
            assert int(got[g, j]) == sum(int(v) for v in values[groups == g, j]) % 2 ** 64
    params = _agg_params(k=0)
    n = 300
    batches = [f"b{i % 50:02d}" for i in range(n)]
    keys = [f"k{(i * 7) % 200:03d}" for i in range(n)]
    records = pa.table({"record_id": np.arange(n), "batch_id": batches, "key": keys,
                        "value": np.arange(n, dtype=np.float64) % 100})
    reports = aggregation_reports(records, params, randomness=R(1))
    parts, _ = H.aggregation_partials(reports[0], params, 0)
    assert len(parts) == 50 and sum(p.num_reports for p in parts) == n
    outputs = []
    for h in range(2):
        for part in H.aggregation_partials(reports[h], params, h)[0]:
            outputs.append(H.release_aggregation(part, params, helper=h, release_key=None)[0])
    combined = combine_aggregation(outputs, params)
    want = records.group_by(["batch_id", "key"]).aggregate([("value", "sum")]).sort_by(
        [("batch_id", "ascending"), ("key", "ascending")])
    assert combined.column("value").to_pylist() == want.column("value_sum").to_pylist()


def test_masked_training_without_noise_is_clipped_central_training_exactly():
    from transforms.lark.training import TrainingConfig, minibatches, train_masked
    x, y, _ = classification_data(1200, num_features=5, seed=8)
    config = TrainingConfig(epochs=2, batch_size=200, k=20, epsilon=None, clip_norm=0.5)
    masked = train_masked(x, y, config, randomness=R(5))
    params = config.gradient_params(5)
    model = LogisticModel.zeros(5, config.feature_scale, config.feature_offset)
    for epoch in range(2):
        for rows in minibatches(1200, 200, epoch, 0):
            units = H.clear_gradient_units(model, params, x[rows], y[rows])
            model = model.with_vector(model.vector() - config.learning_rate
                                      * np.ldexp(units.astype(np.float64), -16) / len(rows))
    assert masked.steps == 12 and np.array_equal(masked.model.vector(), model.vector())


def test_noisy_masked_training_learns():
    from transforms.lark.training import TrainingConfig, train_masked
    x, y, _ = classification_data(3000, num_features=10, seed=9)
    xt, yt, _ = classification_data(2000, num_features=10, seed=10)
    config = TrainingConfig(epochs=3, batch_size=250, k=50, epsilon=1.0, clip_norm=1.0)
    result = train_masked(x, y, config, randomness=R(6),
                          helper_keys=[ReleaseKey.for_testing(1), ReleaseKey.for_testing(2)])
    assert result.epsilon_total == 3.0 and result.suppressed_steps == 0
    assert result.model.accuracy(xt, yt) > 0.85  # majority class: ~0.75
    with pytest.raises(ValueError, match="own key"):
        train_masked(x, y, config, helper_keys=[ReleaseKey.for_testing(1)] * 2)
