"""Variance, standard deviation, quantiles (issue 16 point 2): exact in testing mode, every
measure's change under one unit added/removed within its stated sensitivity (a focused
neighbour test until the neighbouring-pair audit covers them), and the DP tester on the noise
the release draws, with a deliberately broken calibration that must fail."""
import collections
import glob
import json
import os
import tempfile

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest

from accounting.budget import PrivacyBudget
from accounting.verification.dp_tester import DPTester
from accounting.keys import ReleaseKey
from accounting.sensitivity import ContributionBounds, Neighbouring
from transforms import quantiles as quantiles_module
from transforms.aggregate import Compute, DPAggregate, Keys
from transforms.keyset import PublicKeyset
from transforms.metrics import (Count, Median, Percentiles, Quantiles, Std, Sum, Variance, VectorSum,
                                as_metric)
from transforms.quantiles import QuantileTree
from aggregate_kit import aggregate_of

BOUNDS = ContributionBounds(max_partitions=2, max_contributions_per_partition=3, min_value=0, max_value=100)
KEYS = ["a", "b", "c"]


def _rows(seed=0, units=40):
    rng = np.random.default_rng(seed)
    rows = []
    for u in range(units):
        for _ in range(rng.integers(1, 9)):
            rows.append({"u": u, "k": KEYS[rng.integers(0, 3)], "v": float(rng.normal(55, 25))})
    return rows


def _aggregate(metrics, testing=True, bounds=BOUNDS, neighbouring=Neighbouring.ADD_REMOVE, **kwargs):
    return aggregate_of(privacy_unit="u", keys=["k"], value="v", metrics=metrics, bounds=bounds,
                        budget=PrivacyBudget(epsilon=1.0), keyset=PublicKeyset.from_keys(KEYS, ["k"]),
                        testing=testing, neighbouring=neighbouring,
                        release_key=ReleaseKey.for_testing(3), **kwargs)


def _run(rows, transform):
    directory = tempfile.mkdtemp()
    with beam.Pipeline(runner="FnApiRunner") as p:
        (p | beam.Create([pa.Table.from_pylist(rows)]) | transform
         | beam.FlatMap(lambda t: t.to_pylist()) | beam.Map(json.dumps)
         | beam.io.WriteToText(os.path.join(directory, "out")))
    return {r["k"]: r for path in glob.glob(os.path.join(directory, "out*"))
            for r in map(json.loads, open(path))}


def _bounded_values(rows, bounds=BOUNDS):
    """Reference bounding for data where no unit exceeds the bounds: clamped values per key."""
    per_key = collections.defaultdict(list)
    for r in rows:
        per_key[r["k"]].append(min(max(r["v"], bounds.min_value), bounds.max_value))
    return per_key


def _within_bounds_rows(seed=1):
    rows = []
    rng = np.random.default_rng(seed)
    for u in range(60):
        for key in rng.choice(KEYS, size=2, replace=False):
            for _ in range(rng.integers(1, 4)):
                rows.append({"u": u, "k": str(key), "v": float(rng.normal(55, 25))})
    return rows


def test_testing_mode_variance_std_and_quantiles_are_exact():
    rows = _within_bounds_rows()
    out = _run(rows, _aggregate([Count(), Variance(), Std(), Quantiles([0.1, 0.5, 0.9]), Median(),
                                 "mean"]))
    width = QuantileTree(low=0, high=100).leaf_width
    for key, values in _bounded_values(rows).items():
        values = np.array(values)
        assert out[key]["count"] == len(values)
        assert out[key]["variance"] == pytest.approx(values.var(), rel=1e-9)
        assert out[key]["std"] == pytest.approx(values.std(), rel=1e-9)
        for q in (0.1, 0.5, 0.9):
            # the tree's answer lies in the leaf holding the rank-q value (interpolated inside it)
            exact = np.quantile(values, q, method="inverted_cdf")
            assert abs(out[key][f"quantiles_p{100 * q:g}"] - exact) <= width + 1e-9
        # the median (one quantile: permute-and-flip states the smaller error) is the leaf edge
        # whose rank (values below it) is nearest n / 2, here without noise
        edges = np.arange(257) * width
        best = np.abs((values[:, None] < edges[None, :]).sum(axis=0) - len(values) / 2).min()
        assert abs((values < out[key]["median"]).sum() - len(values) / 2) == best


def test_quantile_tree_post_processing():
    tree = QuantileTree(low=0.0, high=8.0, branching=2, depth=3)
    assert tree.leaves == 8 and tree.num_nodes == 14 and tree.leaf_width == 1.0
    assert list(tree.leaf_of(np.array([0.0, 0.99, 1.0, 7.5, 8.0]))) == [0, 0, 1, 7, 7]
    hist = np.array([[0, 0, 4, 0, 0, 0, 0, 4]])
    nodes = tree.node_counts(hist)
    assert list(nodes[0]) == [4, 4, 0, 4, 0, 4, 0, 0, 4, 0, 0, 0, 0, 4]
    q = tree.quantiles(nodes, [0.0, 0.25, 0.5, 0.75, 1.0])[0]
    assert list(q) == [2.0, 2.5, 3.0, 7.5, 8.0]
    # Negative noisy counts are clipped; answers never leave the range.
    noisy = nodes + np.random.default_rng(0).integers(-6, 7, size=nodes.shape)
    assert np.all((tree.quantiles(noisy, [0.01, 0.99]) >= 0) & (tree.quantiles(noisy, [0.01, 0.99]) <= 8))
    with pytest.raises(ValueError, match="at most 65536"):
        QuantileTree(low=0, high=1, branching=16, depth=5)


def _exact_partials(agg, rows):
    """Exact per-key partials through the transform's own bounding DoFns (no Beam runner)."""
    from transforms.utility import _partials

    total = _partials(agg._config, pa.Table.from_pylist(rows))
    by_key = {r["k"]: r for r in total.to_pylist()}
    return by_key


def _answers(agg, partials):
    """measure name -> (keys, width) exact answers, zeros for keys without rows."""
    out = {}
    for m in agg.measures.values():
        columns = m.columns or (m.partial,)
        out[m.name] = np.array([[partials.get(k, {}).get(c, 0) or 0 for c in columns] for k in KEYS],
                               dtype=float)
    return out


@pytest.mark.parametrize("neighbouring", list(Neighbouring))
def test_one_unit_moves_every_measure_within_its_stated_sensitivity(neighbouring):
    agg = _aggregate([Count(), Variance(), Std(name="sd"),
                      Quantiles([0.5, 0.9], branching=4, depth=3, mechanism="tree")],
                     neighbouring=neighbouring)
    stated = {m.name: m.sensitivities for m in agg.plan.measures}
    rows = _rows(seed=4, units=25)
    worst = collections.defaultdict(float)
    base = _answers(agg, _exact_partials(agg, rows))
    for unit in range(25):
        without = [r for r in rows if r["u"] != unit]
        if neighbouring is Neighbouring.SUBSTITUTE:  # replace the unit by an extreme one
            without += [{"u": unit, "k": k, "v": 100.0} for k in ("a", "c") for _ in range(5)]
        other = _answers(agg, _exact_partials(agg, without))
        for name, answer in base.items():
            diff = answer - other[name]
            l1, l2 = np.abs(diff).sum(), np.sqrt((diff ** 2).sum())
            assert l1 <= stated[name].l1 * (1 + 1e-9), (name, unit, l1, stated[name])
            assert l2 <= stated[name].l2 * (1 + 1e-9), (name, unit, l2, stated[name])
            worst[name] = max(worst[name], l1 / stated[name].l1)
    # The test has teeth: some unit comes close to the bound of the count and the tree.
    assert worst["count"] >= 0.5 and worst["quantiles"] >= 0.5


def _noise_samplers(measure, exact_a, exact_b, n):
    keys = pa.table({"lane": np.arange(n)})

    def sampler(exact, seed):
        return lambda m: measure.noisy(np.tile(exact, (m, 1)) if measure.columns else np.full(m, exact),
                                       ReleaseKey.for_testing(seed), keys.slice(0, m))
    return sampler(exact_a, 11), sampler(exact_b, 12)


def _tree_pair(agg):
    """Worst case for one key's tree: a unit's Linf rows all in one leaf (one node per level)."""
    tree = agg._config.partials.trees[0]
    linf = agg._config.bounds.max_contributions_per_partition
    base = np.zeros((1, tree.leaves), dtype=np.int64)
    base[0, :] = 2
    extra = base.copy()
    extra[0, 5] += linf
    return tree, tree.node_counts(base)[0], tree.node_counts(extra)[0]


def test_dp_tester_on_the_quantile_tree_and_a_broken_calibration(monkeypatch):
    epsilon = 1.0
    bounds = ContributionBounds(max_partitions=1, max_contributions_per_partition=2, min_value=0, max_value=8)
    n = 30_000

    def run(agg):
        tree, a, b = _tree_pair(agg)
        path = np.flatnonzero(a != b)
        tester = DPTester(n_samples=n, projections={
            "path": lambda x: x[:, path].sum(axis=1), **{f"x[{i}]": (lambda x, i=i: x[:, i]) for i in path}})
        measure = agg.measures["quantiles"]
        assert measure.integer and measure.spec.kind.is_integer
        return tester.run(*_noise_samplers(measure, a, b, n), epsilon=epsilon)

    metric = Quantiles([0.5], branching=2, depth=3, mechanism="tree")
    agg = DPAggregate(
        compute=Compute(metrics=[metric], value="v"),
        keys=Keys(privacy_unit="u", columns=["k"], keyset=PublicKeyset.from_keys(KEYS, ["k"])),
        bounds=bounds,
        budget=PrivacyBudget(epsilon=epsilon),
        release_key=ReleaseKey.for_testing(1))
    assert run(agg).passed
    # Broken: calibrated as if a unit moved one node in the whole tree (depth ignored).
    monkeypatch.setattr(quantiles_module, "tree_sensitivity", lambda count, depth: count)
    broken = DPAggregate(
        compute=Compute(metrics=[metric], value="v"),
        keys=Keys(privacy_unit="u", columns=["k"], keyset=PublicKeyset.from_keys(KEYS, ["k"])),
        bounds=bounds,
        budget=PrivacyBudget(epsilon=epsilon),
        release_key=ReleaseKey.for_testing(2))
    result = run(broken)
    assert not result.passed, result


def test_dp_tester_on_the_variance_squares_and_a_broken_calibration():
    epsilon = 1.0
    bounds = ContributionBounds(max_partitions=1, max_contributions_per_partition=2, min_value=0, max_value=10)
    n = 60_000
    agg = _aggregate([Count(), Variance()], testing=False, bounds=bounds)
    squares = agg.measures["variance.normalized_squares"]
    share = next(m for m in agg.plan.measures if m.name == squares.name).epsilon
    # Worst case: Linf rows at the range's end or midpoint ((v - m)^2 - h^2/2 = +-h^2/2 each).
    contribution = 2 * 25.0 / 2
    a, b = 100.0, 100.0 + contribution
    tester = DPTester(n_samples=n)
    assert tester.run(*_noise_samplers(squares, a, b, n), epsilon=share).passed
    # Broken: the squares noised like the normalized sum (per-row h instead of h^2/2).
    nsum = agg.measures["variance.normalized_sum"]
    from dataclasses import replace
    broken = replace(squares, spec=nsum.spec)
    assert not tester.run(*_noise_samplers(broken, a, b, n), epsilon=share).passed


def test_metric_arguments_fail_clearly():
    assert as_metric("count").kind.value == "count"
    assert as_metric("median").output_columns == ("median",)
    assert Percentiles([50, 99]).output_columns == ("percentile_p50", "percentile_p99")
    with pytest.raises(ValueError, match="unknown metric 'cnt'; known: \\['count'"):
        _aggregate(["cnt"])
    with pytest.raises(TypeError, match="a metric must be a Metric"):
        _aggregate([42])
    with pytest.raises(ValueError, match="quantiles must be numbers in \\[0, 1\\]"):
        Quantiles([50])
    with pytest.raises(TypeError, match="threshold must be a number"):
        Count(threshold="10")
    with pytest.raises(ValueError, match="unknown noise 'gauss'"):
        Count(noise="gauss")
    with pytest.raises(ValueError, match="integer counts"):
        Quantiles([0.5], noise="laplace")
    with pytest.raises(ValueError, match="needs real-valued noise"):
        _aggregate([Variance(noise="discrete_laplace")])
    with pytest.raises(ValueError, match=r"metrics \['std'\] need a value column"):
        DPAggregate(
            compute=Compute(metrics=[Std()]),
            keys=Keys(privacy_unit="u", columns=["k"], keyset=PublicKeyset.from_keys(KEYS, ["k"])),
            bounds=BOUNDS,
            budget=PrivacyBudget(epsilon=1))


def test_explain_states_sensitivities_and_quantile_error():
    text = _aggregate([Variance(), Quantiles([0.5], mechanism="tree")], testing=False).explain()
    assert "variance.normalized_squares" in text and "h = 50" in text
    assert "quantile tree: 272 node counts" in text and "rank error of std <=" in text
    # one quantile: permute-and-flip states the smaller rank error, and is chosen
    chosen = _aggregate([Quantiles([0.5]), Quantiles([0.1, 0.25, 0.5, 0.75, 0.9], name="q5")],
                        testing=False)
    assert [m.mechanism for m in chosen.plan.measures] == ["permute_and_flip", "discrete_laplace"]
    assert "quantiles: permute-and-flip over the 257 leaf edges" in chosen.explain()
    with pytest.raises(ValueError, match="mechanism must be one of"):
        Quantiles([0.5], mechanism="exponential")


def _vector_rows(seed=5, units=25, dimension=4):
    rng = np.random.default_rng(seed)
    return [{"u": u, "k": KEYS[rng.integers(0, 3)], "e": list(rng.normal(0, 2, dimension))}
            for u in range(units) for _ in range(rng.integers(1, 8))]


def _vector_aggregate(norm, testing=True, neighbouring=Neighbouring.ADD_REMOVE, noise=None, epsilon=1.0,
                      bounds=ContributionBounds(max_partitions=2, max_contributions_per_partition=3)):
    return DPAggregate(
        compute=Compute(metrics=[Count(), VectorSum(dimension=4, max_norm=1.5, norm=norm, noise=noise)], value="e"),
        keys=Keys(privacy_unit="u", columns=["k"], keyset=PublicKeyset.from_keys(KEYS, ["k"])),
        bounds=bounds,
        budget=PrivacyBudget(epsilon=epsilon, delta=1e-6),
        release_key=ReleaseKey.for_testing(4),
        testing=testing,
        neighbouring=neighbouring)


def test_vector_sum_clips_rows_and_sums_exactly_in_testing_mode():
    rows = [{"u": i, "k": "a", "e": [3.0, 4.0, 0.0, 0.0] if i % 2 else [0.1, -0.2, 0.0, 0.0]}
            for i in range(10)]
    rows += [{"u": 99, "k": "b", "e": [1.0, None, 0.0, 0.0]}, {"u": 98, "k": "b", "e": [1.0]}]
    out = _run(rows, _vector_aggregate("l2"))
    # [3, 4] has L2 norm 5 -> scaled to 1.5: [0.9, 1.2]; five of each row kind.
    assert out["a"]["vector_sum"] == pytest.approx([5 * 0.9 + 5 * 0.1, 5 * 1.2 - 5 * 0.2, 0, 0])
    assert out["b"]["count"] == 0 and out["b"]["vector_sum"] == [0, 0, 0, 0]  # invalid rows dropped
    l1 = _run(rows, _vector_aggregate("l1"))
    assert l1["a"]["vector_sum"] == pytest.approx([5 * 1.5 * 3 / 7 + 0.5, 5 * 1.5 * 4 / 7 - 1.0, 0, 0])
    with pytest.raises(ValueError, match="must hold lists of numbers"):
        _vector_aggregate("l2").check_schema(pa.schema([("u", pa.int64()), ("k", pa.string()), ("e", pa.float64())]))
    with pytest.raises(ValueError, match="cannot be combined"):
        DPAggregate(
            compute=Compute(metrics=[Count(), Sum(), VectorSum(dimension=4, max_norm=1)], value="e"),
            keys=Keys(privacy_unit="u", columns=["k"], keyset=PublicKeyset.from_keys(KEYS, ["k"])),
            bounds=BOUNDS,
            budget=PrivacyBudget(epsilon=1))


@pytest.mark.parametrize("norm,neighbouring", [("l1", Neighbouring.ADD_REMOVE), ("l2", Neighbouring.SUBSTITUTE)])
def test_one_unit_moves_the_vector_sum_within_its_stated_sensitivity(norm, neighbouring):
    agg = _vector_aggregate(norm, neighbouring=neighbouring)
    stated = {m.name: m.sensitivities for m in agg.plan.measures}
    rows = _vector_rows()
    base = _answers(agg, _exact_partials(agg, rows))
    worst = 0.0
    for unit in range(25):
        other_rows = [r for r in rows if r["u"] != unit]
        if neighbouring is Neighbouring.SUBSTITUTE:
            other_rows += [{"u": unit, "k": k, "e": [-9.0, 9.0, -9.0, 9.0]} for k in ("a", "b") for _ in range(4)]
        other = _answers(agg, _exact_partials(agg, other_rows))
        diff = base["vector_sum"] - other["vector_sum"]
        l1, l2 = np.abs(diff).sum(), np.sqrt((diff ** 2).sum())
        assert l1 <= stated["vector_sum"].l1 * (1 + 1e-9) and l2 <= stated["vector_sum"].l2 * (1 + 1e-9)
        worst = max(worst, (l1 if norm == "l1" else l2) / (stated["vector_sum"].l1 if norm == "l1"
                                                            else stated["vector_sum"].l2))
    assert worst >= 0.5


def test_dp_tester_on_the_vector_sum_and_a_broken_calibration():
    """L2 clipping with Laplace noise needs L1 sensitivity sqrt(d) * C per row; calibrating it
    as if the rows were L1-clipped (C) understates the sensitivity by sqrt(4) = 2."""
    n = 30_000
    epsilon = 1.0
    one_key = ContributionBounds(max_partitions=1, max_contributions_per_partition=3)
    agg = _vector_aggregate("l2", testing=False, noise="laplace", epsilon=2 * epsilon, bounds=one_key)
    measure = agg.measures["vector_sum"]
    share = next(m for m in agg.plan.measures if m.name == "vector_sum").epsilon
    assert share == pytest.approx(epsilon)
    # Worst case: Linf = 3 rows on the diagonal, each clipped to L2 norm 1.5 (L1 norm 3).
    a = np.zeros(4)
    b = np.full(4, 3 * 1.5 / 2)
    # The privacy loss of Laplace noise between a and b (the most powerful projection).
    loss = {"loss": lambda x: (np.abs(x - a) - np.abs(x - b)).sum(axis=1), "sum(x)": lambda x: x.sum(axis=1)}
    tester = DPTester(n_samples=n, projections=loss)
    assert tester.run(*_noise_samplers(measure, a, b, n), epsilon=share).passed
    broken_agg = _vector_aggregate("l1", testing=False, noise="laplace", epsilon=2 * epsilon, bounds=one_key)
    broken = broken_agg.measures["vector_sum"]
    result = tester.run(*_noise_samplers(broken, a, b, n), epsilon=share)
    assert not result.passed, result
