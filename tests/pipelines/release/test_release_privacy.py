"""Regression tests of the core's privacy fixes (issue 10, points 1-6): each fails on the old
behaviour. Small and fast; the neighbouring-pair audit harness covers whole jobs."""
import glob
import json
import os
import tempfile

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest

from accounting.budget import PrivacyBudget
from accounting.keys import ReleaseKey
from accounting.sensitivity import ContributionBounds
from transforms.aggregate import Compute, DPAggregate, Keys, Output
from transforms.keyset import PublicKeyset
from transforms.metrics import Count, PrivacyUnitCount
from transforms.selection import PrivateSelection
from aggregate_kit import aggregate_of

ONE = ContributionBounds(max_partitions=1, max_contributions_per_partition=1)


def _emitted_tables(elements, transform):
    """Run ``transform`` and return every emitted table as a list of row dicts (emission order
    within a table is preserved; the order of tables is the runner's)."""
    directory = tempfile.mkdtemp()
    with beam.Pipeline(runner="FnApiRunner") as p:
        (p | beam.Create(elements) | transform
         | beam.Map(lambda t: json.dumps(t.to_pylist(), default=str))
         | beam.io.WriteToText(os.path.join(directory, "out")))
    tables = []
    for path in glob.glob(os.path.join(directory, "out*")):
        with open(path) as handle:
            tables.extend(json.loads(line) for line in handle)
    return tables


# --------------------------------------------------------------------------- point 1: order

def test_keyset_release_is_sorted_by_key_not_keys_with_rows_first():
    keys = ["a", "b", "c", "d", "e"]
    rows = pa.table({"u": [1, 2, 3], "k": ["e", "e", "d"]})   # only the last keys have data
    transform = DPAggregate(
        compute=Compute(metrics=[Count()]),
        keys=Keys(privacy_unit="u", columns=["k"], keyset=PublicKeyset.from_keys(keys, ["k"])),
        output=Output(num_shards=1),
        bounds=ONE,
        budget=PrivacyBudget(epsilon=1.0),
        testing=True)
    (table,) = _emitted_tables([rows], transform)
    assert [r["k"] for r in table] == keys
    assert [r["count"] for r in table] == [0, 0, 0, 1, 2]


def test_private_selection_release_is_sorted_by_key():
    rows = pa.table({"u": list(range(400)), "k": [f"k{9 - i % 10}" for i in range(400)],
                     "day": [i % 2 for i in range(400)]})
    transform = DPAggregate(
        compute=Compute(metrics=[PrivacyUnitCount()]),
        keys=Keys(privacy_unit="u", columns=["k", "day"], selection=PrivateSelection()),
        output=Output(num_shards=2),
        bounds=ONE,
        budget=PrivacyBudget(epsilon=2.0, delta=1e-6),
        release_key=ReleaseKey.for_testing(3))
    tables = _emitted_tables([rows.slice(0, 150), rows.slice(150)], transform)
    assert sum(len(t) for t in tables) == 10
    for table in tables:
        keys = [(r["k"], r["day"]) for r in table]
        assert keys == sorted(keys)


def test_demo_release_noises_and_emits_counts_in_key_order():
    """The runner's combine order (keys with rows first on some engines) must not reach the file."""
    from accounting.calibration import NoiseKind, calibrate
    from runners.demo_release import AddCountNoise

    spec = calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=1.0, l1_sensitivity=1)
    fn = AddCountNoise(spec, ReleaseKey.for_testing(1))
    counts = [("z", 50), ("m", 1), ("a", 0), ("b", 0)]
    out = list(fn.process(counts))
    assert [k for k, _ in out] == ["a", "b", "m", "z"]
    assert out == list(fn.process(list(reversed(counts))))


def test_reach_frequency_release_order_is_public():
    from transforms.sketches.beam import PUBLISHER, UNION, release_order

    records = [{"campaign": c, "scope": s, "publisher": p}
               for c in ("c2", "c1") for s, p in ((PUBLISHER, "pub_b"), (UNION, None), (PUBLISHER, "pub_a"))]
    ordered = sorted(records, key=release_order)
    assert [(r["campaign"], r["publisher"]) for r in ordered] == [
        ("c1", None), ("c1", "pub_a"), ("c1", "pub_b"), ("c2", None), ("c2", "pub_a"), ("c2", "pub_b")]


# --------------------------------------------------------------------------- point 2: unit ids

def _one_key_count(elements):
    transform = DPAggregate(
        compute=Compute(metrics=[Count()]),
        keys=Keys(privacy_unit="user", columns=["k"], keyset=PublicKeyset.from_keys(["x"], ["k"])),
        bounds=ONE,
        budget=PrivacyBudget(epsilon=1.0),
        testing=True)
    (table,) = _emitted_tables(elements, transform)
    return table[0]["count"]


def test_one_unit_whatever_the_type_of_its_id_arrow_batches():
    """7 (int64), 7.0 (float64) and " 7" (text) are one person: L0 = Linf = 1 keeps 1 row, not 3."""
    batches = [pa.table({"user": pa.array([7], pa.int64()), "k": ["x"]}),
               pa.table({"user": pa.array([7.0, float("nan")], pa.float64()), "k": ["x", "x"]}),
               pa.table({"user": [" 7"], "k": ["x"]})]
    assert _one_key_count(batches) == 1


def test_one_unit_whatever_the_type_of_its_id_dict_rows():
    rows = [{"user": 7, "k": "x"}, {"user": 7.0, "k": "x"}, {"user": "7", "k": "x"},
            {"user": "Alice", "k": "x"}, {"user": "alice ", "k": "x"}]
    assert _one_key_count(rows) == 2


def test_a_unit_column_that_cannot_hold_ids_is_refused_before_the_pipeline_runs():
    from transforms.privacy_units import UnitIdError

    transform = DPAggregate(
        compute=Compute(metrics=[Count()]),
        keys=Keys(privacy_unit="user", columns=["k"], keyset=PublicKeyset.from_keys(["x"], ["k"])),
        bounds=ONE,
        budget=PrivacyBudget(epsilon=1.0),
        testing=True)
    with pytest.raises(UnitIdError, match="'user'"):
        transform.check_schema(pa.schema([("user", pa.bool_()), ("k", pa.string())]))
    transform.check_schema(pa.schema([("user", pa.float64()), ("k", pa.string())]))


# --------------------------------------------------------------------------- point 5: batching

def test_bounding_does_not_depend_on_batches_or_row_order():
    from transforms.metrics import Sum

    rows = pa.table({"user": ["heavy"] * 30 + ["light"], "k": ["x"] * 15 + ["y"] * 15 + ["x"],
                     "v": [float(i % 10) for i in range(30)] + [9.0]})
    bounds = ContributionBounds(max_partitions=2, max_contributions_per_partition=4,
                                max_contributions=5, min_value=0, max_value=10)

    def release(batches):
        transform = DPAggregate(
            compute=Compute(metrics=[Count(), Sum()], value="v"),
            keys=Keys(privacy_unit="user", columns=["k"], keyset=PublicKeyset.from_keys(["x", "y"], ["k"])),
            output=Output(num_shards=1),
            bounds=bounds,
            budget=PrivacyBudget(epsilon=1.0),
            testing=True)
        (table,) = _emitted_tables(batches, transform)
        return table

    whole = release([rows])
    reordered = rows.take(pa.array(list(range(30, -1, -1))))
    assert release([reordered.slice(0, 11), reordered.slice(11, 7), reordered.slice(18)]) == whole
    assert sum(r["count"] for r in whole) == 6  # L1 = 5 for the heavy unit, 1 for the light one


# --------------------------------------------------------------------------- point 3: substitution

@pytest.mark.parametrize("strategy", ["truncated_geometric", "laplace_thresholding",
                                      "gaussian_thresholding"])
def test_private_selection_is_calibrated_for_substitution(strategy):
    """Replacing a unit moves 2 * L0 keys: the released-key event "the removed unit's L0 keys
    kept, the added unit's L0 keys dropped" must stay within (epsilon, delta)."""
    from accounting.sensitivity import Neighbouring

    l0, epsilon, delta = 2, 1.0, 1e-5
    bounds = ContributionBounds(max_partitions=l0, max_contributions_per_partition=1)
    aggregate = DPAggregate(
        compute=Compute(metrics=[PrivacyUnitCount()]),
        keys=Keys(privacy_unit="u", columns=["k"], selection=PrivateSelection(strategy=strategy, weight=1.0)),
        bounds=bounds,
        budget=PrivacyBudget(epsilon=2 * epsilon, delta=delta),
        neighbouring=Neighbouring.SUBSTITUTE)
    selector = aggregate.selector
    assert (selector.epsilon, selector.delta) == pytest.approx((epsilon, delta))
    worst = 0.0
    for m in range(1, 400):
        keep_m, keep_less = selector.keep_probability(m), selector.keep_probability(m - 1)
        p_d = keep_m ** l0 * (1 - keep_less) ** l0            # D: unit A in the first L0 keys
        p_d2 = keep_less ** l0 * (1 - keep_m) ** l0           # D': unit B in the other L0 keys
        worst = max(worst, p_d - np.exp(epsilon) * p_d2)
    assert worst <= delta  # calibrated for L0 keys instead, truncated geometric gives ~0.07
    assert selector.max_partitions == 2 * l0


# --------------------------------------------------------------------------- point 4: key reuse

def _aggregate(**kwargs):
    args = dict(privacy_unit="u", keys=["k"], metrics=[Count()], bounds=ONE,
                keyset=PublicKeyset.from_keys(["x"], ["k"]), budget=PrivacyBudget(epsilon=1.0))
    args.update(kwargs)
    return aggregate_of(**args)


def test_one_dp_aggregate_applied_twice_raises():
    from accounting.keys import KeyReuseError

    aggregate = _aggregate(release_key=ReleaseKey.generate())
    p = beam.Pipeline()
    day1 = p | "Day1" >> beam.Create([pa.table({"u": [1], "k": ["x"]})])
    day2 = p | "Day2" >> beam.Create([pa.table({"u": [1, 2], "k": ["x", "x"]})])
    day1 | "Release1" >> aggregate
    with pytest.raises(KeyReuseError, match="bounding"):
        day2 | "Release2" >> aggregate


def test_two_transforms_cannot_share_a_key_object_but_derived_keys_are_fine():
    from accounting.keys import KeyReuseError

    key = ReleaseKey.generate()
    p = beam.Pipeline()
    rows = p | beam.Create([pa.table({"u": [1], "k": ["x"]})])
    rows | "A" >> _aggregate(release_key=key.derive("a"))
    rows | "B" >> _aggregate(release_key=key.derive("b"))
    rows | "C" >> _aggregate(release_key=key)
    with pytest.raises(KeyReuseError):
        rows | "D" >> _aggregate(release_key=key)


def test_reach_frequency_release_claims_its_keys():
    from accounting.keys import KeyReuseError
    from transforms.sketches.beam import ReleaseReachFrequency
    from transforms.sketches.dp import ReachFrequencyNoise
    from transforms.sketches.liquid_legions import SketchConfig

    release = ReleaseReachFrequency(SketchConfig(num_registers=100, decay_rate=10.0), ReachFrequencyNoise(budget=PrivacyBudget(epsilon=1.0), num_publishers=1),
                                    ReleaseKey.generate(), max_frequency=3)
    p = beam.Pipeline()
    sketches = p | beam.Create([])
    sketches | "Once" >> release
    with pytest.raises(KeyReuseError):
        sketches | "Twice" >> release


# --------------------------------------------------------------------------- point 6: names

@pytest.mark.parametrize("metrics", [[Count(name="key_selection")],
                                     [Count(name="x.count")],
                                     [Count(), PrivacyUnitCount(name="mean.normalized_sum")]])
def test_reserved_measure_names_are_refused(metrics):
    with pytest.raises(ValueError, match="reserved"):
        _aggregate(metrics=metrics, keyset=None, selection=PrivateSelection(),
                   budget=PrivacyBudget(epsilon=1.0, delta=1e-6))


def test_budget_check_counts_private_selection():
    from transforms.metrics import check_within_budget, plan_measures

    planned = plan_measures([Count()], ONE, PrivacyBudget(epsilon=1.0, delta=1e-6),
                                   selection_weight=1.0, selection_needs_delta=True)

    plan = planned.plan

    share = planned.selection_share
    check_within_budget(plan, (share.epsilon, share.delta))            # 0.5 + 0.5 = 1.0
    with pytest.raises(ValueError, match="beyond the declared budget"):
        check_within_budget(plan, (1.0, share.delta))                   # 0.5 + 1.0 > 1.0


def test_noisy_release_refuses_the_selection_stream_as_a_measure_name():
    from transforms.release import NoisedPartial, NoisyRelease, OutputColumn

    with pytest.raises(ValueError, match="key_selection"):
        NoisyRelease(keys=["k"], measures=[NoisedPartial(name="key_selection", partial="count")],
                     outputs=[OutputColumn(name="c", measure="key_selection")],
                     partial_types={"count": pa.int64()}, release_key=ReleaseKey.for_testing(1),
                     keyset=PublicKeyset.from_keys(["x"], ["k"]), testing=True)


def test_the_runner_check_takes_no_secret_or_stored_key(capsys):
    """runners.demo_release is a runner check outside the ledger: it only runs from a public
    testing seed, so no secret key can be applied to changed input or drawn afresh per run."""
    from runners.demo_release import parse_args

    base = ["--input", "x.csv", "--output", "o.csv", "--key_column", "k", "--keys", "a",
            "--epsilon", "1"]
    with pytest.raises(SystemExit):
        parse_args(base)  # no seed: refused, never a fresh secret key
    args, _ = parse_args(base + ["--testing_seed", "3"])
    assert args.testing_seed == 3 and not hasattr(args, "release_key_file")
