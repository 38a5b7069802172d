"""ARA parameter optimisation, error model, hierarchy consistency and the synthetic generator."""
import math

import numpy as np
import pytest

from pipelines import ara_optimize as opt
from pipelines import ara_synthetic as synthetic
from transforms.ara.contribution import CONTRIBUTION_BUDGET
from transforms.ara.hierarchy import tree_consistency


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


# --- error model -----------------------------------------------------------------------------

def test_closed_form_matches_simulation_without_drops(small):
    train, test, taus = small
    k = test.max_reports_per_source  # every report of every source fits: no algorithm-C drops
    params = opt.Parameters(np.array([1.0, 12000.0]), np.array([[0.4, 0.6]]), k)
    config = params.to_config(test)
    rounded = opt.Parameters(config.clip_array, config.budget_array / config.budget_array.sum(), k)
    for eps in (2.0, 32.0):
        closed = opt.expected_error(test, rounded, taus, eps)
        sim = opt.simulate_error(test, config, taus, eps, np.random.default_rng(1), 200)
        assert sim == pytest.approx(closed, rel=0.05)


def test_closed_form_is_conservative_about_drops(small):
    # With K below the reports per source, C keeps at least the first K reports, so the
    # simulated error is not above the closed form by more than noise.
    train, test, taus = small
    params = opt.Parameters(np.array([1.0, 12000.0]), np.array([[0.5, 0.5]]), 4)
    closed = opt.expected_error(test, params, taus, 8.0)
    sim = opt.simulate_error(test, params.to_config(test), taus, 8.0, np.random.default_rng(2), 50)
    assert sim <= closed * 1.03


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


def test_optimizer_is_locally_optimal_in_shares_and_clip(small):
    train, _, taus = small
    params, err = opt.optimize_parameters(train, 8.0, taus, k_candidates=[6])
    for delta in (-0.05, 0.05):
        shares = params.shares + np.array([[delta, -delta]])
        worse = opt.expected_error(train, opt.Parameters(params.clip, shares, 6), taus, 8.0)
        assert worse >= err - 1e-9
        clip = params.clip * np.array([1.0, 1 + 4 * delta])
        worse = opt.expected_error(train, opt.Parameters(clip, params.shares, 6), taus, 8.0)
        assert worse >= err - 1e-9


def test_epsilon_above_aggregation_service_limit_is_refused(small):
    train, _, taus = small
    with pytest.raises(ValueError, match="epsilon"):
        opt.optimize_parameters(train, 65.0, taus)


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
