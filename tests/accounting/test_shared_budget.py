"""One budget shared by several aggregations of one pipeline (accounting/shared_budget.py)."""
import glob
import json
import os
import tempfile

import apache_beam as beam
import pyarrow as pa
import pytest

from accounting.budget import PrivacyBudget
from accounting.keys import ReleaseKey
from accounting.sensitivity import ContributionBounds
from accounting.shared_budget import SharedBudget
from transforms.aggregate import Compute, DPAggregate, Keys
from transforms.keyset import PublicKeyset
from transforms.metrics import Count, Sum

BOUNDS = ContributionBounds(max_partitions=1, max_contributions_per_partition=2, min_value=0, max_value=4)


def test_split_by_weights_and_explicit_parts():
    shared = SharedBudget(PrivacyBudget(epsilon=1.0, delta=1e-6), weights={"a": 1, "b": 3})
    assert shared.budget("a") == PrivacyBudget(epsilon=0.25, delta=2.5e-7)
    assert shared.budget("b").epsilon == pytest.approx(0.75)
    rho = SharedBudget(PrivacyBudget.zcdp(0.2, delta=1e-6), weights={"a": 1, "b": 1})
    assert rho.budget("a").rho == pytest.approx(0.1)
    explicit = SharedBudget(PrivacyBudget(epsilon=1.0), budgets={"a": PrivacyBudget(epsilon=0.4),
                                                                  "b": PrivacyBudget(epsilon=0.6)})
    assert explicit.budget("b").epsilon == 0.6
    with pytest.raises(ValueError, match=r"epsilon=1.1, delta=0 \(basic\) > total epsilon=1"):
        SharedBudget(PrivacyBudget(epsilon=1.0), budgets={"a": PrivacyBudget(epsilon=0.5),
                                                          "b": PrivacyBudget(epsilon=0.6)})
    with pytest.raises(ValueError, match="same kind"):
        SharedBudget(PrivacyBudget(epsilon=1.0), budgets={"a": PrivacyBudget(rho=0.1)})
    with pytest.raises(ValueError, match="exactly one"):
        SharedBudget(PrivacyBudget(epsilon=1.0))
    with pytest.raises(KeyError, match="parts: \\['a', 'b'\\]"):
        shared.part("c")


def _aggregate(part, name):
    keyset = PublicKeyset.from_keys(["x", "y"], ["k"])
    return DPAggregate(
        compute=Compute(metrics=[Count(), Sum()], value="v"),
        keys=Keys(privacy_unit="u", columns=["k"], keyset=keyset),
        bounds=BOUNDS,
        budget=part,
        label=name)


def test_two_aggregations_share_one_budget_and_draw_independent_noise():
    shared = SharedBudget(PrivacyBudget(epsilon=2.0), weights={"first": 1, "second": 1},
                          release_key=ReleaseKey.for_testing(5))
    first, second = _aggregate(shared.part("first"), "A"), _aggregate(shared.part("second"), "B")
    assert first.release_key is not second.release_key
    rows = [{"u": i, "k": "x" if i % 2 else "y", "v": 1.0} for i in range(200)]
    directory = tempfile.mkdtemp()
    with beam.Pipeline(runner="FnApiRunner") as p:
        source = p | beam.Create([pa.Table.from_pylist(rows)])
        for tag, transform in (("a", first), ("b", second)):
            (source | f"Agg{tag}" >> transform | f"Rows{tag}" >> beam.FlatMap(lambda t: t.to_pylist())
             | f"Json{tag}" >> beam.Map(json.dumps)
             | f"Write{tag}" >> beam.io.WriteToText(os.path.join(directory, tag)))
    out = {tag: [json.loads(line) for path in glob.glob(os.path.join(directory, tag + "*"))
                 for line in open(path)] for tag in "ab"}
    assert len(out["a"]) == len(out["b"]) == 2
    # Same data, same plan, different derived keys: the noise differs.
    assert sorted(r["count"] for r in out["a"]) != sorted(r["count"] for r in out["b"])
    total = shared.guarantee()
    assert total.epsilon == pytest.approx(2.0) and total.delta == 0
    assert total.epsilon == pytest.approx(first.guarantee().epsilon + second.guarantee().epsilon)
    text = shared.explain()
    assert "== first ==" in text and "== second ==" in text and "basic  epsilon=2" in text
    with pytest.raises(ValueError, match="already issued"):
        shared.part("first")


def test_zcdp_parts_compose_by_zcdp_once():
    shared = SharedBudget(PrivacyBudget.zcdp(0.5, delta=1e-6), weights={"a": 1, "b": 1})
    from accounting.calibration import NoiseKind
    aggs = [DPAggregate(
        compute=Compute(metrics=[Count(noise=NoiseKind.DISCRETE_GAUSSIAN)]),
        keys=Keys(privacy_unit="u", columns=["k"], keyset=PublicKeyset.from_keys(["x"], ["k"])),
        bounds=BOUNDS,
        budget=shared.part(n),
        release_key=ReleaseKey.for_testing(i)) for i, n in enumerate("ab")]
    whole = shared.guarantee()
    one = PrivacyBudget.zcdp(0.5, delta=1e-6).as_epsilon_delta()
    # Composed as rho 0.25 + 0.25 = 0.5 converted once: the declared total, not 2 conversions.
    assert whole.epsilon == pytest.approx(one.epsilon, rel=1e-6)
    assert whole.epsilon < sum(a.plan.guarantee("zcdp", delta=5e-7).epsilon for a in aggs)


def test_a_part_spent_twice_is_refused():
    shared = SharedBudget(PrivacyBudget(epsilon=1.0), weights={"a": 1})
    part = shared.part("a")
    _aggregate(part, "A")
    with pytest.raises(ValueError, match="already spent"):
        _aggregate(part, "B")
    with pytest.raises(TypeError, match="PrivacyBudget or a SharedBudget part"):
        DPAggregate(
            compute=Compute(metrics=[Count()]),
            keys=Keys(privacy_unit="u", columns=["k"], keyset=PublicKeyset.from_keys(["x"], ["k"])),
            bounds=BOUNDS,
            budget=1.0)


def test_mixed_explicit_parts_fit_by_the_accountant_and_parts_spent_by_measures():
    from accounting import guarantee
    from accounting.calibration import calibrate, calibrate_zcdp
    from accounting.measures import Measure
    from accounting.sensitivity import Sensitivities

    total = PrivacyBudget(epsilon=1.0, delta=1e-6)
    parts = {"pure": PrivacyBudget(epsilon=0.3), "gauss": PrivacyBudget(rho=0.01, delta=1e-7)}
    shared = SharedBudget(total, budgets=parts, accountant="zcdp")
    one = Sensitivities(l0=1, linf=1.0, l1=1.0, l2=1.0)
    pure = Measure.of_noise("pure", calibrate("discrete_laplace", epsilon=0.3, l1_sensitivity=1), one)
    gauss = Measure.of_noise("gauss", calibrate_zcdp("discrete_gaussian", rho=0.01, l2_sensitivity=1,
                                                     delta_for_reporting=1e-7), one)
    shared.part("pure").spend([pure])
    # A part's measures must fit the part: twice the rho is refused before anything is spent.
    big = Measure.of_noise("gauss", calibrate_zcdp("discrete_gaussian", rho=0.02, l2_sensitivity=1,
                                                   delta_for_reporting=1e-7), one)
    gauss_part = shared.part("gauss")
    with pytest.raises(ValueError, match="rho"):
        gauss_part.spend([big])
    gauss_part.spend([gauss])
    assert [m.name for m in shared.measures()] == ["pure", "gauss"]
    # The job's guarantee is accounting.guarantee.compose of all measures, nothing else.
    assert shared.guarantee() == guarantee.compose([pure, gauss], "zcdp", 1e-6)
    assert shared.guarantee("basic") == guarantee.compose([pure, gauss], "basic")
    assert "== gauss ==" in shared.explain() and "composes by zcdp" in shared.explain()
    # Mixed parts must fit the total as the accountant composes them: zCDP fits 0.95, basic not.
    tight = PrivacyBudget(epsilon=0.95, delta=1e-6)
    assert SharedBudget(tight, budgets=parts, accountant="zcdp").names == ("pure", "gauss")
    with pytest.raises(ValueError, match=r"\(basic\) > total epsilon=0.95"):
        SharedBudget(tight, budgets=parts, accountant="basic")
    with pytest.raises(ValueError, match="needs delta > 0"):
        SharedBudget(total, budgets={"g": PrivacyBudget(rho=0.01)})


def test_private_selection_is_a_measure_composed_with_the_others():
    from accounting import guarantee
    from transforms.selection import PrivateSelection

    shared = SharedBudget(PrivacyBudget(epsilon=2.0, delta=1e-6), weights={"a": 1, "b": 1})
    a = DPAggregate(
        compute=Compute(metrics=[Count()]),
        keys=Keys(privacy_unit="u", columns=["k"], selection=PrivateSelection()),
        bounds=BOUNDS,
        budget=shared.part("a"),
        testing=True)
    _aggregate(shared.part("b"), "B")
    names = [m.name for m in shared.measures()]
    assert names == ["count", "a/key_selection", "count", "sum.normalized_sum"]  # the sum: S + m N
    selection = shared.measures()[1]
    assert (selection.epsilon, selection.delta) == (a.selector.epsilon, a.selector.delta)
    assert selection.noise is None and "private key selection" in selection.mechanism
    whole = shared.guarantee()
    assert whole == guarantee.compose(shared.measures(), "basic")
    assert whole.epsilon == pytest.approx(2.0) and whole.delta == pytest.approx(5e-7)  # b spends no delta
    assert a.guarantee() == guarantee.compose(shared.measures()[:2], "basic")


def test_a_parts_budget_is_spendable_only_through_its_shared_budget():
    """``part.budget`` passed to a second aggregation spent the part outside the job's
    guarantee (main f02cb62): every consumer refuses it; the part itself is spent once."""
    from accounting.budget import ReleasePlan
    from transforms.sketches.dp import ReachFrequencyNoise
    from transforms.utility import choose_bounds

    shared = SharedBudget(PrivacyBudget(epsilon=1.0), weights={"a": 1, "b": 1})
    part = shared.part("a")
    assert part.budget == PrivacyBudget(epsilon=0.5) and shared.budget("b") == PrivacyBudget(epsilon=0.5)
    _aggregate(part, "A")
    for budget in (part.budget, shared.budget("b")):
        with pytest.raises(ValueError, match=r"spendable only through it.*shared\.part"):
            _aggregate(budget, "Escapes")
        with pytest.raises(ValueError, match="spendable only through it"):
            ReleasePlan(budget=budget)
        with pytest.raises(ValueError, match="spendable only through it"):
            ReachFrequencyNoise(budget=budget, num_publishers=1)
        with pytest.raises(ValueError, match="spendable only through it"):
            choose_bounds([{"u": 1, "k": "x"}], privacy_unit="u", keys=["k"], budget=budget)
    assert [m.name for m in shared.measures()] == ["count", "sum.normalized_sum"]
    assert shared.guarantee().epsilon == pytest.approx(0.5)


def test_delta_goes_to_the_parts_that_use_it_and_explain_says_where():
    from accounting.calibration import calibrate
    from accounting.measures import Measure
    from accounting.sensitivity import Sensitivities

    one = Sensitivities(l0=1, linf=1.0, l1=1.0, l2=1.0)
    total = PrivacyBudget(epsilon=1.0, delta=1e-6)
    shared = SharedBudget(total, weights={"counts": 1, "sums": 2}, needs_delta=["sums"])
    assert shared.budget("counts").delta == 0 and shared.budget("sums").delta == pytest.approx(1e-6)
    shared.part("counts").spend([Measure.of_noise(
        "c", calibrate("discrete_laplace", epsilon=shared.budget("counts").epsilon, l1_sensitivity=1), one)])
    shared.part("sums").spend([Measure.of_noise(
        "s", calibrate("gaussian", epsilon=shared.budget("sums").epsilon, delta=1e-6,
                       l2_sensitivity=1), one)])
    allocation = shared.delta_allocation()
    assert allocation["counts"] == {"delta": 0.0, "used": 0.0}
    assert allocation["sums"]["used"] == pytest.approx(1e-6)
    assert "sums: 1e-06 (its measures use 1e-06)" in shared.explain()
    # Without needs_delta the parts declare it when drawn: the pure part gets none, the Gaussian
    # part drawn after it all of it.
    plain = SharedBudget(total, weights={"counts": 1, "sums": 2})
    assert plain.budget("counts").delta == pytest.approx(1e-6 / 3)  # if it used delta
    plain.part("counts").spend([Measure.of_noise(
        "c", calibrate("discrete_laplace", epsilon=plain.budget("counts").epsilon, l1_sensitivity=1), one)])
    assert plain.budget("counts").delta == 0 and plain.budget("sums").delta == pytest.approx(1e-6)
    assert "counts: 0 (pure: its mechanisms use no delta)" in plain.explain()
    assert "not allocated: 1e-06 (kept for the parts not drawn yet: sums)" in plain.explain()
    plain.part("sums").spend([Measure.of_noise(
        "s", calibrate("gaussian", epsilon=plain.budget("sums").epsilon, delta=1e-6,
                       l2_sensitivity=1), one)])
    assert plain.delta_allocation()["sums"] == {"delta": pytest.approx(1e-6), "used": pytest.approx(1e-6)}
    assert "not allocated" not in plain.explain()
    # Drawn the other way round, the Gaussian part keeps the pure part's share back for it
    # (it might have used delta); explain says it stayed unused and how to avoid that.
    late = SharedBudget(total, weights={"counts": 1, "sums": 2})
    counts = late.part("counts")
    late.part("sums").spend([Measure.of_noise(
        "s", calibrate("gaussian", epsilon=late.budget("sums").epsilon, delta=2e-6 / 3,
                       l2_sensitivity=1), one)])
    assert late.budget("sums").delta == pytest.approx(2e-6 / 3)
    counts.spend([Measure.of_noise(
        "c", calibrate("discrete_laplace", epsilon=late.budget("counts").epsilon, l1_sensitivity=1), one)])
    assert "not allocated: 3.33e-07 (unused: kept for parts that were then drawn as pure" in late.explain()
    with pytest.raises(ValueError, match="drawn as not using delta"):  # a part declares once
        counts.spendable_budget(uses_delta=True)
    with pytest.raises(ValueError, match="parts without a weight"):
        SharedBudget(total, weights={"a": 1}, needs_delta=["b"])
    with pytest.raises(ValueError, match="goes with weights"):
        SharedBudget(total, budgets={"a": total}, needs_delta=["a"])
    with pytest.raises(ValueError, match="delta is 0"):
        SharedBudget(PrivacyBudget(epsilon=1.0), weights={"a": 1}, needs_delta=["a"])
