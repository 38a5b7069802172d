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
from transforms.aggregate import DPAggregate
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
    with pytest.raises(ValueError, match="epsilon=1.1 > total"):
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
    return DPAggregate(privacy_unit="u", keys=["k"], value="v", metrics=[Count(), Sum()], bounds=BOUNDS,
                       budget=part, keyset=keyset, label=name)


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
    aggs = [DPAggregate(privacy_unit="u", keys=["k"], metrics=[Count(noise=NoiseKind.DISCRETE_GAUSSIAN)],
                        bounds=BOUNDS, budget=shared.part(n), keyset=PublicKeyset.from_keys(["x"], ["k"]),
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
        DPAggregate(privacy_unit="u", keys=["k"], metrics=[Count()], bounds=BOUNDS, budget=1.0,
                    keyset=PublicKeyset.from_keys(["x"], ["k"]))
