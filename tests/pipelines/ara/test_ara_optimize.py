"""ARA parameter optimisation (encodings, exact error model), hierarchy consistency and the
synthetic generator."""
import dataclasses
import math

import numpy as np
import pytest

from pipelines.ara import optimize as opt
from pipelines.ara import synthetic
from transforms.ara.contribution import (CONTRIBUTION_BUDGET, ENCODINGS, ContributionConfig,
                                         bound_ranked_contributions, contribution_vectors)
from transforms.ara.hierarchy import tree_consistency
from transforms.ara.summary import summary_noise_variance


@pytest.fixture(scope="module")
def small():
    train = opt.workload_from_conversions(synthetic.generate("adtech_real_estate", 1, scale=0.2))
    test = opt.workload_from_conversions(synthetic.generate("adtech_real_estate", 2, scale=0.2))
    return train, test, opt.taus_from_training(train)


# --- synthetic data --------------------------------------------------------------------------

def test_presets_match_published_parameters():
    p = synthetic.PRESETS["criteo"]
    mu, sigma = p.lognormal_mu_sigma
    assert math.exp(mu + sigma ** 2 / 2) == pytest.approx(130.05)   # mean
    assert math.exp(mu - sigma ** 2) == pytest.approx(17.22)        # mode
    assert p.impression_dimensions == (20, 10, 8, 2) and p.conversions_per_impression == 10
    assert synthetic.PRESETS["adtech_real_estate"].impression_dimensions == (2, 90)
    assert synthetic.PRESETS["adtech_travel"].impression_dimensions == (90, 2)
    with pytest.raises(ValueError, match="unknown preset"):
        synthetic.generate("nope", 1)


def test_generator_is_seeded_and_has_the_published_shape():
    a = synthetic.generate("criteo", 5)
    b = synthetic.generate("criteo", 5)
    c = synthetic.generate("criteo", 6)
    assert np.array_equal(a.value, b.value) and not np.array_equal(a.value[:100], c.value[:100])
    per_source = np.bincount(a.source_id)
    assert per_source.mean() == pytest.approx(10, rel=0.05)          # Poisson(10)
    assert per_source.var() == pytest.approx(10, rel=0.15)
    assert np.mean(a.value) == pytest.approx(130.05, rel=0.1)        # log-normal mean
    assert ((a.features >= 0) & (a.features < np.array([20, 10, 8, 2]))).all()
    # sources are contiguous and ``order`` counts conversions within a source
    assert (a.order[per_source.cumsum()[:-1][per_source[1:] > 0]] == 0).all()


def test_impressions_follow_the_published_generators_power_law():
    # Oracle: the published generator's transformation (Clauset et al. eq. D.6, x_min = 1,
    # truncated at x_max by drawing r below r_max), then slice size x + 1.
    rng = np.random.default_rng(0)
    a, x_max, n = 2.5, 1000, 400_000
    r_max = 1 - ((x_max + 0.5) / 0.5) ** (1 - a)
    oracle = np.floor(0.5 * (1 - rng.uniform(0, r_max, n)) ** (-1 / (a - 1)) + 0.5) + 1
    ours = synthetic.sample_impressions_per_slice(rng, a, x_max, n)
    assert ours.min() >= 2 and ours.max() <= x_max + 1
    for size in (2, 3, 5):
        assert (ours == size).mean() == pytest.approx((oracle == size).mean(), rel=0.03, abs=1e-3)
    pmf = synthetic.published_impressions_pmf(a, x_max)
    assert pmf.sum() == pytest.approx(1.0) and (ours == 2).mean() == pytest.approx(pmf[0], rel=0.01)
    with pytest.raises(ValueError):
        synthetic.published_impressions_pmf(1.0, 10)


@pytest.mark.parametrize("name", sorted(synthetic.PRESETS))
def test_generated_statistics_match_the_published_generator(name):
    expected = synthetic.PRESETS[name].expected_statistics()
    stats = [synthetic.dataset_statistics(synthetic.generate(name, seed)) for seed in (1, 2, 3)]
    assert all(s["slices"] == expected["slices"] for s in stats)  # every slice has >= 2 impressions
    for field in ("impressions", "conversions", "value_mean"):
        mean = np.mean([s[field] for s in stats])
        assert mean == pytest.approx(expected[field], rel=0.12), field


# --- exact error per encoding ----------------------------------------------------------------

def _config(w, encoding, k, count_clip=0.8, value_clip=12000.0):
    if encoding == "split":  # padding with the value split at 0.3 C
        return opt.Parameters(encoding="padding", clip=[count_clip, value_clip],
                              shares=[[0.0, 0.35]], overflow_shares=[[0.0, 0.65]],
                              split=[1.0, 0.3], reports_per_source=k).to_config(w)
    shares = [[0.4, 0.6]] if encoding == "separate" else [[0.0, 1.0]]
    return opt.Parameters(encoding=encoding, clip=[count_clip, value_clip], shares=shares,
                          reports_per_source=k).to_config(w)


@pytest.mark.parametrize("encoding", ENCODINGS + ("split",))
@pytest.mark.parametrize("drops", [False, True])
@pytest.mark.parametrize("scales", [(), (0.7, 1.6)])
def test_exact_error_matches_monte_carlo_per_query(small, encoding, drops, scales):
    _, test, taus = small
    k = 3 if drops else test.max_reports_per_source  # 3: algorithm C drops reports
    config = dataclasses.replace(_config(test, encoding, k), estimate_scales=scales)
    eps, reps = 4.0, 150
    exact = opt.error_components(test, config, taus, eps)
    rng = np.random.default_rng(11)
    sq = np.zeros((1, 2))
    for _ in range(reps):
        est = opt.simulate_estimates(test, config, eps, rng)
        for m in range(2):
            x = test.truth[0][test.nonempty(0), m]
            sq[0, m] += np.mean(((est[0][m][test.nonempty(0)] - x) / np.maximum(taus[m], x)) ** 2)
    for m, name in enumerate(test.measures):
        bias2, var = exact[(0, name)]
        assert sq[0, m] / reps == pytest.approx(bias2 + var, rel=0.06), (name, bias2, var)
    closed = opt.expected_error(test, config, taus, eps)
    assert math.sqrt(sq.mean() / reps) == pytest.approx(closed, rel=0.04)


def test_fitted_estimate_scales_are_optimal_and_only_post_processing(small):
    train, _, taus = small
    config = _config(train, "split", 3)
    fitted = opt.fit_estimate_scales(train, config, taus, 2.0)
    gamma = fitted.scale_array
    assert (gamma != 1).all()
    # algorithm A and the L1 total per report do not depend on gamma
    u = np.random.default_rng(0).random((50, 1, len(config.columns)))
    assert (fitted.contributions(train.values[:50], u) == config.contributions(
        train.values[:50], u)).all()
    assert fitted.column_scales() == pytest.approx(
        config.column_scales() * np.concatenate([gamma, gamma[config.split_measures]]))
    best = opt.expected_error(train, fitted, taus, 2.0)
    assert best < opt.expected_error(train, config, taus, 2.0)
    for m in range(2):  # the closed form is the minimum in each coordinate
        for factor in (0.97, 1.03):
            g = gamma.copy()
            g[m] *= factor
            other = dataclasses.replace(fitted, estimate_scales=tuple(g))
            assert opt.expected_error(train, other, taus, 2.0) > best
    assert ContributionConfig.from_json(fitted.to_json()) == fitted
    assert "estimate_scales" not in config.to_json()  # default configs keep their bytes
    with pytest.raises(ValueError, match="estimate_scales"):
        dataclasses.replace(config, estimate_scales=(1.0, 0.0))


def test_no_rounding_variance_for_exact_integer_counts(small):
    _, test, taus = small
    eps = 8.0
    noise = summary_noise_variance(eps)
    config = _config(test, "separate", 4, count_clip=1.0)
    b_count, b_value = config.budgets[0]
    ne = test.nonempty(0)
    _, var = opt.error_components(test, config, taus, eps)[(0, "count")]
    # a count of 1 clipped at 1 contributes exactly b: the variance is the noise's alone
    den = np.maximum(taus[0], test.truth[0][ne, 0]) ** 2
    assert var == pytest.approx(np.mean(noise / b_count ** 2 / den), rel=1e-12)
    _, var_value = opt.error_components(test, config, taus, eps)[(0, "value")]
    noise_only = np.mean((12000.0 / b_value) ** 2 * noise
                         / np.maximum(taus[1], test.truth[0][ne, 1]) ** 2)
    assert var_value > noise_only  # values are rounded randomly


def test_padding_count_is_exact_before_noise_and_unbiased_after(small):
    _, test, taus = small
    config = _config(test, "padding", 3, count_clip=1.0)
    rng = np.random.default_rng(4)
    contrib = contribution_vectors(test.values, config.clip_array, config.budget_array,
                                   rng.random((len(test.rank), 1, 2)), config.padding_measure)
    assert (contrib.sum(axis=2) == config.level_totals()[None, :]).all()  # every report: B_l
    assert (contrib >= 0).all()
    kept = test.rank < 3
    n_kept = np.bincount(test.codes[kept, 0], minlength=test.level_sizes[0])
    errors = np.array([opt.simulate_estimates(test, config, 2.0, rng)[0][0] - n_kept
                       for _ in range(300)])
    sd = math.sqrt(len(config.measures) * summary_noise_variance(2.0)) / config.level_totals()[0]
    assert abs(errors.mean()) < 4 * sd / math.sqrt(errors.size)  # unbiased for the kept reports
    assert errors.std() == pytest.approx(sd, rel=0.03)


def test_algorithm_c_model_matches_the_pure_rule(small):
    _, test, _ = small
    totals = np.random.default_rng(0).integers(0, 40000, len(test.rank))
    assert (test.greedy_keep(totals) == bound_ranked_contributions(
        test.source_index, test.rank, totals)).all()


# --- optimiser -------------------------------------------------------------------------------

def test_optimizer_chooses_the_better_encoding_and_says_why(small):
    train, _, taus = small
    results = {eps: opt.optimize(train, eps, taus) for eps in (1.0, 64.0)}
    for eps, result in results.items():
        assert set(result.candidates) == set(ENCODINGS)
        assert result.error == min(r.error for r in result.candidates.values())
        for r in result.candidates.values():
            assert r.error == pytest.approx(opt.expected_error(train, r.config, taus, eps))
            assert r.config.encoding == r.encoding
        other = [e for e in ENCODINGS if e != result.encoding][0]
        assert result.reason.startswith(result.encoding + ":") and other in result.reason
    # padding frees the count's share: at low epsilon it wins clearly on this data
    assert results[1.0].encoding == "padding"
    assert results[1.0].candidates["separate"].error > 1.05 * results[1.0].error


def test_padding_is_refused_when_counts_are_not_one(small):
    train, _, taus = small
    values = train.values.copy()
    values[0, 0] = 2.0
    w = opt.Workload(measures=train.measures, values=values, source_index=train.source_index,
                     rank=train.rank, codes=train.codes, level_sizes=train.level_sizes,
                     slice_dimensions=train.slice_dimensions, prefixes=train.prefixes)
    result = opt.optimize(w, 4.0, taus, k_candidates=[4])
    assert result.encoding == "separate" and "padding" in result.unavailable
    assert "padding not considered" in result.reason
    with pytest.raises(ValueError, match="padding"):
        opt.expected_error(w, _config(w, "padding", 4), taus, 4.0)


def test_count_clip_varies_when_that_helps(small):
    train, _, taus = small
    for encoding in ENCODINGS:
        params, err = opt.optimize_encoding(train, 1.0, encoding, taus, k_candidates=[6])
        gamma = params.estimate_scales
        assert params.to_config(train).scale_array == pytest.approx(gamma)
        # noise dominates at epsilon 1: shrinking the count estimate (count clip below 1 times
        # the count's estimate scale) pays
        assert min(1.0, params.clip[0]) * gamma[0] < 0.99
        fixed = dataclasses.replace(params, clip=np.array([1.0, params.clip[1]]),
                                    estimate_scales=np.array([1.0, gamma[1]]))
        assert opt.expected_error(train, fixed, taus, 1.0) > err


def test_optimizer_improves_on_baseline_on_held_out_data(small):
    train, test, taus = small
    rng = np.random.default_rng(3)
    for eps in (1.0, 16.0):
        params, train_err = opt.optimize_parameters(train, eps, taus)
        config = params.to_config(train)
        assert config.budget_array.sum() * config.reports_per_source <= CONTRIBUTION_BUDGET
        for q in (95, 99):
            base = opt.baseline_parameters(train, q)
            assert train_err < opt.expected_error(train, base, taus, eps)
            optimized = opt.simulate_error(test, config, taus, eps, rng, 10)
            baseline = opt.simulate_error(test, base.to_config(train), taus, eps, rng, 10)
            assert optimized < baseline


@pytest.mark.parametrize("encoding", ENCODINGS)
def test_optimizer_is_locally_optimal_in_shares_and_clip(small, encoding):
    train, _, taus = small
    params, err = opt.optimize_encoding(train, 8.0, encoding, taus, k_candidates=[6])
    v = 1  # the value measure
    for delta in (-0.05, 0.05):
        if encoding == "separate":
            shares = params.shares + np.array([[delta, -delta]])
            worse = opt.expected_error(train, opt.Parameters(
                encoding=encoding, clip=params.clip, shares=shares, reports_per_source=6),
                taus, 8.0)
            assert worse >= err - 1e-9
        clip = params.clip * np.array([1.0, 1 + 4 * delta])
        worse = opt.expected_error(train, dataclasses.replace(params, clip=clip), taus, 8.0)
        assert worse >= err - 1e-9
        if params.split[v] < 1:  # padding with a split: the split point is optimal too
            split = params.split * np.array([1.0, 1 + delta])
            worse = opt.expected_error(train, dataclasses.replace(params, split=split), taus, 8.0)
            assert worse >= err - 1e-9
    assert params.clip[v] > 0


def test_epsilon_above_aggregation_service_limit_is_refused(small):
    train, _, taus = small
    with pytest.raises(ValueError, match="epsilon"):
        opt.optimize_parameters(train, 65.0, taus)


# --- gamma held at 1; the choice under value drift -------------------------------------------

def test_estimate_scales_can_be_held_at_one(small):
    train, _, taus = small
    held = opt.optimize(train, 4.0, taus, k_candidates=[3, 6], fit_scales=False)
    fitted = opt.optimize(train, 4.0, taus, k_candidates=[3, 6])
    assert set(held.candidates) == set(ENCODINGS)
    for encoding, result in held.candidates.items():
        assert (result.config.scale_array == 1).all()
        assert "estimate_scales" not in result.config.to_json()
        assert result.error == pytest.approx(opt.expected_error(train, result.config, taus, 4.0))
        # gamma free can only help on the training data (up to the integer rounding)
        assert fitted.candidates[encoding].error <= result.error * 1.001
    assert held.reason.endswith("estimate scales held at 1")
    assert (fitted.config.scale_array != 1).any()


def test_drifted_training_data_scales_the_values_only(small):
    train, _, _ = small
    half = opt.drifted(train, 0.5)
    assert np.array_equal(half.values[:, 0], train.values[:, 0])  # counts stay
    assert np.array_equal(half.values[:, 1], 0.5 * train.values[:, 1])
    assert half.codes is train.codes and half.source_index is train.source_index
    for bad in (0.0, -1.0, math.inf):
        with pytest.raises(ValueError, match="drift"):
            opt.drifted(train, bad)


def test_drift_robust_choice_from_training_data_stays_below_the_papers_optimiser(small):
    train, test, taus = small
    eps = 4.0
    choice = opt.choose_for_drift(train, eps, taus, k_candidates=[3, 6, 9])
    assert set(choice.candidates) == {f"{kind}/{e}" for kind in ("fitted", "gamma_1")
                                      for e in ENCODINGS} | {"equal_split/p95", "equal_split/p99"}
    # every figure the choice rests on is an exact error of the (drifted) training data
    for name, config in choice.candidates.items():
        assert choice.errors[name] == pytest.approx(tuple(
            opt.expected_error(opt.drifted(train, f), config, taus, eps)
            for f in choice.drift_factors))
    assert choice.error == pytest.approx(opt.expected_error(train, choice.config, taus, eps))
    paper = choice.candidates[opt.PAPER_CANDIDATE]
    assert (paper.scale_array == 1).all() and paper.encoding == "separate"
    others = [n for n in choice.candidates if n != opt.PAPER_CANDIDATE]
    assert choice.chosen != opt.PAPER_CANDIDATE
    assert choice.worst_ratio(choice.chosen) == min(choice.worst_ratio(n) for n in others)
    assert choice.worst_ratio(choice.chosen) <= 1 - opt.DRIFT_MARGIN
    assert choice.reason.startswith(choice.chosen + ":")
    # The release data (here: held-out data, its values halved, unchanged, doubled): the
    # training choice (fitted gamma) overshoots when the values halve; the drift-robust one
    # stays at or below the paper's optimiser.
    training = min((c for n, c in choice.candidates.items() if n.startswith("fitted/")),
                   key=lambda c: opt.expected_error(train, c, taus, eps))
    half = opt.drifted(test, 0.5)
    assert opt.expected_error(half, training, taus, eps) > \
        1.05 * opt.expected_error(half, paper, taus, eps)
    for f in (0.5, 1.0, 2.0):
        release = opt.drifted(test, f)
        assert opt.expected_error(release, choice.config, taus, eps) <= \
            opt.expected_error(release, paper, taus, eps)


def test_drift_robust_choice_keeps_the_papers_optimiser_without_a_clear_winner(small):
    train, _, taus = small
    choice = opt.choose_for_drift(train, 4.0, taus, k_candidates=[3], polish=False,
                                  fit_scales=False, margin=0.9)
    assert not any(n.startswith("fitted/") for n in choice.candidates)  # gamma held at 1
    assert all((c.scale_array == 1).all() for c in choice.candidates.values())
    assert choice.chosen == opt.PAPER_CANDIDATE
    assert "no candidate 90% lower at every drift" in choice.reason
    for kwargs, match in (({"margin": 1.0}, "margin"), ({"drift_factors": ()}, "drift_factors"),
                          ({"drift_factors": (0.5, 0.0)}, "drift")):
        with pytest.raises(ValueError, match=match):
            opt.choose_for_drift(train, 4.0, taus, k_candidates=[3], **kwargs)


#: The drift suite: each preset's full-size training and held-out data, the held-out values
#: halved, unchanged and doubled (the release's drift against the training data).
DRIFTS = (0.5, 1.0, 2.0)


@pytest.mark.slow
@pytest.mark.parametrize("eps", [1.0, 4.0, 16.0])
@pytest.mark.parametrize("preset", sorted(synthetic.PRESETS))
def test_drift_robust_choice_at_or_below_the_papers_optimiser_in_every_drift_cell(preset, eps):
    train = opt.workload_from_conversions(synthetic.generate(preset, 11))
    test = opt.workload_from_conversions(synthetic.generate(preset, 12))
    taus = opt.taus_from_training(train)
    choice = opt.choose_for_drift(train, eps, taus)
    paper = choice.candidates[opt.PAPER_CANDIDATE]
    for f in DRIFTS:
        release = opt.drifted(test, f)
        robust = opt.expected_error(release, choice.config, taus, eps)
        assert robust <= opt.expected_error(release, paper, taus, eps), (f, choice.reason)


# --- hierarchy -------------------------------------------------------------------------------

def _dense_gls(ys, variances, sizes):
    leaves = sizes[-1]
    rows, weights, obs = [], [], []
    for level, size in enumerate(sizes):
        width = leaves // size
        for i in range(size):
            r = np.zeros(leaves)
            r[i * width:(i + 1) * width] = 1
            rows.append(r)
            weights.append(1 / variances[level])
            obs.append(ys[level][i])
    a, w = np.array(rows), np.diag(weights)
    return np.linalg.solve(a.T @ w @ a, a.T @ w @ np.array(obs))


@pytest.mark.parametrize("variances", [[1.0, 1.0, 1.0], [4.0, 1.0, 9.0], [0.5, 30.0, 2.0]])
def test_tree_consistency_is_the_generalised_least_squares_solution(variances):
    rng = np.random.default_rng(0)
    fanouts, sizes = [1, 3, 4], [2, 6, 24]
    ys = [rng.normal(0, 5, s) for s in sizes]
    out = tree_consistency(ys, variances, fanouts)
    leaves = _dense_gls(ys, variances, sizes)
    assert np.allclose(out[-1], leaves)
    assert np.allclose(out[1], out[2].reshape(6, 4).sum(axis=1))
    assert np.allclose(out[0], out[1].reshape(2, 3).sum(axis=1))


def test_tree_consistency_reduces_error():
    rng = np.random.default_rng(1)
    truth_leaves = rng.poisson(50, (2000, 16)).astype(float)
    truth = [truth_leaves.sum(axis=1), truth_leaves.reshape(2000, 4, 4).sum(axis=2).ravel(),
             truth_leaves.ravel()]
    sizes = [2000, 8000, 32000]
    noisy = [t + rng.laplace(0, 10, t.shape) for t in truth]
    out = tree_consistency(noisy, [200.0] * 3, [1, 4, 4])
    for level in range(3):
        raw = np.mean((noisy[level] - truth[level]) ** 2)
        cons = np.mean((out[level] - truth[level]) ** 2)
        assert cons < raw * (0.9 if level < 2 else 0.99), (level, raw, cons)
    assert sum(sizes) == sum(o.size for o in out)


def test_tree_consistency_bad_input():
    with pytest.raises(ValueError):
        tree_consistency([np.zeros(2), np.zeros(5)], [1, 1], [1, 2])
    with pytest.raises(ValueError):
        tree_consistency([np.zeros(2)], [0.0], [1])


def test_hierarchical_simulation_benefits_from_consistency(small):
    data = synthetic.generate("criteo", 4, scale=0.5)
    w = opt.workload_from_conversions(data, prefixes=(0, 1, 2, 3, 4))
    taus = opt.taus_from_training(w)
    params, _ = opt.optimize_parameters(w, 16.0, taus, k_candidates=[10])
    config = params.to_config(w)
    raw = opt.simulate_error(w, config, taus, 16.0, np.random.default_rng(5), 5)
    cons = opt.simulate_error(w, config, taus, 16.0, np.random.default_rng(5), 5, consistency=True)
    assert cons < raw
