"""DPAggregate on the DirectRunner's engine (FnApiRunner): semantics, modes, bad input, DP."""
import glob
import json
import os
import tempfile

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from accounting.budget import PrivacyBudget
from accounting.verification.dp_tester import DPTester
from accounting.sensitivity import ContributionBounds
from transforms.aggregate import Compute, DPAggregate, Keys, Output
from transforms.bounding_stage import BoundingConfig
from transforms.keyset import PublicKeyset
from transforms.metrics import Count, Mean, PrivacyUnitCount, Sum
from accounting.keys import ReleaseKey
from transforms.selection import PrivateSelection, SelectionStrategy
from aggregate_kit import aggregate_of


def _collect(pcoll, directory):
    """Write released rows (from Arrow tables or dicts) as JSON lines into ``directory``."""
    return (pcoll | beam.FlatMap(lambda t: t.to_pylist() if isinstance(t, pa.Table) else [t])
            | beam.Map(json.dumps) | beam.io.WriteToText(os.path.join(directory, "out")))


def _read(directory):
    rows = []
    for path in glob.glob(os.path.join(directory, "out*")):
        with open(path) as handle:
            rows.extend(json.loads(line) for line in handle)
    return sorted(rows, key=lambda r: tuple(str(v) for v in r.values()))


def _run(rows, transform, as_arrow=False):
    """Run ``transform`` over rows (dicts, or one Arrow table) and return released dicts."""
    directory = tempfile.mkdtemp()
    with beam.Pipeline(runner="FnApiRunner") as p:
        source = p | beam.Create([pa.Table.from_pylist(rows)] if as_arrow else rows)
        _collect(source | transform, directory)
    return _read(directory)


BOUNDS = ContributionBounds(max_partitions=2, max_contributions_per_partition=3, min_value=0, max_value=5)


def _rows():
    # 30 users; user i visits countries by i % 3 patterns, 5 rows each, values 0..7.
    rows = []
    for i in range(30):
        for r in range(5):
            rows.append({"user": f"u{i}", "country": ["DE", "FR", "JP"][(i + r) % 3], "v": float((i + r) % 8)})
    return rows


def _exact_bounded(rows, l0, linf, low, high, kept_keys=None):
    """Reference: per unit all rows kept when the unit has <= l0 keys and <= linf rows per key."""
    from collections import defaultdict
    per = defaultdict(list)
    for r in rows:
        per[(r["user"], r["country"])].append(min(max(r["v"], low), high))
    return per


def test_testing_mode_exact_results_with_keyset():
    rows = [{"user": f"u{i}", "country": "DE" if i < 10 else "FR", "v": 2.0} for i in range(20)]
    rows += [{"user": "u0", "country": "DE", "v": 9.0}] * 4          # u0 has 5 rows in DE: Linf = 3
    rows += [{"user": "z", "country": "XX", "v": 1.0}]                # outside the keyset
    keyset = PublicKeyset.from_keys(["DE", "FR", "IT"], ["country"])
    transform = DPAggregate(
        compute=Compute(metrics=[Count(), Sum(), Mean(), PrivacyUnitCount()], value="v"),
        keys=Keys(privacy_unit="user", columns=["country"], keyset=keyset),
        output=Output(error_columns=False),  # exact values only
        bounds=BOUNDS,
        budget=PrivacyBudget(epsilon=1.0),
        testing=True)
    got = {r["country"]: r for r in _run(rows, transform)}
    assert set(got) == {"DE", "FR", "IT"}                            # IT: no rows, still released
    assert got["IT"]["count"] == 0 and got["IT"]["privacy_unit_count"] == 0
    assert got["FR"] == {"country": "FR", "count": 10, "sum": 20.0, "mean": 2.0, "privacy_unit_count": 10}
    de = got["DE"]
    assert de["count"] == 12 and de["privacy_unit_count"] == 10      # u0 capped at 3 rows
    # u0 keeps 3 of its 5 rows: {2, 9->5 clamped x4}: sum is 9*2 + (2+5+5 or 5+5+5)
    assert de["sum"] in (18 + 12.0, 18 + 15.0)


def test_arrow_input_equals_dict_input():
    rows = _rows()
    make = lambda: DPAggregate(
        compute=Compute(metrics=[Count(), Sum()], value="v"),
        keys=Keys(privacy_unit="user", columns=["country"], keyset=PublicKeyset.from_keys(["DE", "FR", "JP"], ["country"])),
        bounds=BOUNDS,
        budget=PrivacyBudget(epsilon=1.0),
        release_key=ReleaseKey.for_testing(3))
    assert _run(rows, make()) == _run(rows, make(), as_arrow=True)


def test_noise_reproducible_and_key_dependent():
    rows = _rows()
    make = lambda seed: DPAggregate(
        compute=Compute(metrics=[Count()]),
        keys=Keys(privacy_unit="user", columns=["country"], keyset=PublicKeyset.from_keys(["DE", "FR", "JP"], ["country"])),
        bounds=BOUNDS,
        budget=PrivacyBudget(epsilon=0.5),
        release_key=ReleaseKey.for_testing(seed))
    first, again = _run(rows, make(1)), _run(list(reversed(rows)), make(1))
    assert first == again                                              # order/bundling independent
    assert any(_run(rows, make(seed)) != first for seed in (2, 3, 4))  # the key drives the noise
    assert all(isinstance(r["count"], int) for r in first)            # integer noise for counts


def test_exclusions_and_no_key_outside_keyset():
    rows = _rows() + [{"user": "x", "country": "CN", "v": 1.0}]
    keyset = PublicKeyset.cross_product({"country": ["DE", "FR", "JP", "CN", "BR"]}).exclude("country", ["CN", "JP"])
    transform = DPAggregate(
        compute=Compute(metrics=[Count()]),
        keys=Keys(privacy_unit="user", columns=["country"], keyset=keyset),
        bounds=BOUNDS,
        budget=PrivacyBudget(epsilon=1.0),
        release_key=ReleaseKey.for_testing(5))
    assert {r["country"] for r in _run(rows, transform)} == {"DE", "FR", "BR"}


def test_thresholds_suppress_keys_or_values():
    rows = [{"user": f"u{i}", "country": "DE", "v": 1.0} for i in range(200)]
    rows += [{"user": "a", "country": "FR", "v": 1.0}]
    keyset = PublicKeyset.from_keys(["DE", "FR", "IT"], ["country"])
    key = ReleaseKey.for_testing(8)  # one key object drives one release: derive one per release
    common = dict(privacy_unit="user", keys=["country"], value="v", bounds=BOUNDS,
                  budget=PrivacyBudget(epsilon=2.0), keyset=keyset)
    by_key = _run(rows, aggregate_of(metrics=[Count(threshold=50)], release_key=key.derive("by key"),
                                     **common))
    assert [r["country"] for r in by_key] == ["DE"]
    by_value = _run(rows, aggregate_of(metrics=[Count(threshold=50), Sum()], threshold_mode="value",
                                       release_key=key.derive("by value"), **common))
    got = {r["country"]: r for r in by_value}
    assert set(got) == {"DE", "FR", "IT"} and got["FR"]["count"] is None and got["DE"]["count"] > 50


@pytest.mark.parametrize("strategy", list(SelectionStrategy))
def test_private_selection_keeps_popular_keys_only(strategy):
    rows = [{"user": f"u{i}", "page": "popular"} for i in range(400)]
    rows += [{"user": f"v{i}", "page": f"rare{i}"} for i in range(40)]   # one user each
    transform = DPAggregate(
        compute=Compute(metrics=[Count()]),
        keys=Keys(privacy_unit="user", columns=["page"], selection=PrivateSelection(strategy=strategy)),
        bounds=ContributionBounds(max_partitions=1, max_contributions_per_partition=1),
        budget=PrivacyBudget(epsilon=1.0, delta=1e-6),
        release_key=ReleaseKey.for_testing(4))
    assert [r["page"] for r in _run(rows, transform)] == ["popular"]


def test_private_selection_with_testing_mode_gives_exact_values():
    rows = [{"user": f"u{i}", "page": "p"} for i in range(300)]
    transform = DPAggregate(
        compute=Compute(metrics=[Count(), PrivacyUnitCount()]),
        keys=Keys(privacy_unit="user", columns=["page"], selection=PrivateSelection()),
        output=Output(error_columns=False),  # exact values only
        bounds=ContributionBounds(max_partitions=1, max_contributions_per_partition=1),
        budget=PrivacyBudget(epsilon=1.0, delta=1e-6),
        testing=True)
    assert _run(rows, transform) == [{"page": "p", "count": 300, "privacy_unit_count": 300}]


def test_testing_mode_refuses_a_secret_key():
    with pytest.raises(ValueError, match="testing mode refuses"):
        DPAggregate(
            compute=Compute(metrics=[Count()]),
            keys=Keys(privacy_unit="u", columns=["k"], keyset=PublicKeyset.from_keys(["a"], ["k"])),
            bounds=BOUNDS,
            budget=PrivacyBudget(epsilon=1),
            release_key=ReleaseKey.generate(),
            testing=True)


def test_bad_rows_follow_rules_and_are_counted():
    rows = [{"user": "a", "country": "DE", "v": 1.0},
            {"user": None, "country": "DE", "v": 1.0},
            {"user": "b", "country": None, "v": 1.0},
            {"user": "c", "country": "DE", "v": float("nan")},
            {"user": "d", "country": "DE", "v": float("inf")},
            {"user": "e", "country": "DE", "v": -3.0},
            {"user": "f", "country": "DE", "v": 99.0},
            {"user": "g", "country": "ZZ", "v": 1.0}]
    transform = DPAggregate(
        compute=Compute(metrics=[Count(), Sum()], value="v"),
        keys=Keys(privacy_unit="user", columns=["country"], keyset=PublicKeyset.from_keys(["DE"], ["country"])),
        output=Output(error_columns=False),  # exact values only
        bounds=BOUNDS,
        budget=PrivacyBudget(epsilon=1.0),
        testing=True)
    p = beam.Pipeline(runner="FnApiRunner")
    directory = tempfile.mkdtemp()
    _collect(p | beam.Create(rows) | transform, directory)
    result = p.run()
    result.wait_until_finish()
    assert _read(directory) == [{"country": "DE", "count": 3, "sum": 6.0}]           # a, e clamped to 0, f to 5
    counters = {c.key.metric.name: c.committed for c in result.metrics().query()["counters"]}
    assert counters["dropped_null_privacy_unit"] == 1
    assert counters["dropped_null_key"] == 1
    assert counters["dropped_invalid_value"] == 2
    assert counters["clamped_below_min"] == 1 and counters["clamped_above_max"] == 1
    assert counters["dropped_outside_keyset"] == 1


def test_missing_or_mistyped_columns_fail_before_running():
    transform = DPAggregate(
        compute=Compute(metrics=[Sum()], value="v"),
        keys=Keys(privacy_unit="user", columns=["country"], keyset=PublicKeyset.from_keys(["DE"], ["country"])),
        bounds=BOUNDS,
        budget=PrivacyBudget(epsilon=1.0),
        testing=True)
    with pytest.raises(ValueError, match="'country'"):
        transform.check_schema(pa.schema([("user", pa.string()), ("v", pa.float64())]))
    with pytest.raises(ValueError, match="value column 'v' must be numeric"):
        transform.check_schema(pa.schema([("user", pa.string()), ("country", pa.string()), ("v", pa.string())]))
    with pytest.raises(ValueError, match="value column"):
        DPAggregate(
            compute=Compute(metrics=[Sum()]),
            keys=Keys(privacy_unit="user", columns=["country"], keyset=PublicKeyset.from_keys(["DE"], ["country"])),
            bounds=BOUNDS,
            budget=PrivacyBudget(epsilon=1.0))
    with pytest.raises(ValueError, match="no public keyset"):
        DPAggregate(
            compute=Compute(metrics=[Count()]),
            keys=Keys(privacy_unit="user", columns=["country"]),
            bounds=BOUNDS,
            budget=PrivacyBudget(epsilon=1.0))


def test_pcollection_keyset():
    rows = _rows()
    with test_pipeline.TestPipeline(runner="FnApiRunner") as p:
        keys = p | "Keys" >> beam.Create([{"country": c} for c in ["DE", "FR", "BR"]])
        transform = DPAggregate(
            compute=Compute(metrics=[Count()]),
            keys=Keys(privacy_unit="user", columns=["country"], keyset=PublicKeyset.from_pcollection(keys, ["country"])),
            output=Output(format="dicts"),
            bounds=BOUNDS,
            budget=PrivacyBudget(epsilon=1.0),
            testing=True)
        released = p | "Rows" >> beam.Create(rows) | transform | beam.Map(lambda r: r["country"])
        assert_that(released, equal_to(["DE", "FR", "BR"]))


def test_dp_tester_end_to_end_on_count():
    """Neighbours differ by one unit with maximal contributions (Linf rows in each of L0 = 1 key).

    One pipeline releases 2n keys: n keys hold that unit (dataset D for each of them), n keys
    hold no row (D'). Noise is independent across keys, so each key is one sample.
    """
    n = 20_000
    linf = 3
    epsilon = 1.0
    rows = [{"user": f"u{i}", "k": i} for i in range(n) for _ in range(linf + 2)]
    keyset = PublicKeyset.from_table(pa.table({"k": pa.array(np.arange(2 * n))}))
    transform = DPAggregate(
        compute=Compute(metrics=[Count()]),
        keys=Keys(privacy_unit="user", columns=["k"], keyset=keyset),
        bounds=ContributionBounds(max_partitions=1, max_contributions_per_partition=linf),
        budget=PrivacyBudget(epsilon=epsilon),
        release_key=ReleaseKey.for_testing(21))
    directory = tempfile.mkdtemp()
    with beam.Pipeline(runner="FnApiRunner") as p:
        _collect(p | beam.Create([pa.Table.from_pylist(rows)]) | transform, directory)
    released = {r["k"]: r["count"] for r in _read(directory)}
    assert sorted(released) == list(range(2 * n))
    counts = np.array([released[k] for k in range(2 * n)])
    with_unit, without = counts[:n], counts[n:]
    tester = DPTester(n_samples=n, confidence=0.999)
    assert tester.run(lambda m: with_unit[:m], lambda m: without[:m], epsilon=epsilon).passed
    # The same outputs refute a claim of half the epsilon: the tester has power here.
    assert not tester.run(lambda m: with_unit[:m], lambda m: without[:m], epsilon=epsilon / 3).passed


def test_keyset_from_files(tmp_path):
    csv_path = tmp_path / "keys.csv"
    csv_path.write_text("country,project\nDE,de.wikipedia\nFR,fr.wikipedia\n")
    text_path = tmp_path / "countries.txt"
    text_path.write_text("# protected list style\nDE\nJP\n")
    from_csv = PublicKeyset.from_file(str(csv_path), ["country", "project"])
    assert from_csv.size() == 2
    table = pa.table({"country": ["DE", "FR", "DE"], "project": ["de.wikipedia", "de.wikipedia", "x"]})
    assert from_csv.member_mask(table).tolist() == [True, False, False]
    from_text = PublicKeyset.from_file(str(text_path), ["country"])
    assert sorted(pa.concat_tables(from_text.batches()).column("country").to_pylist()) == ["DE", "JP"]


def test_a_unit_with_millions_of_rows_stays_bounded_in_memory():
    """Each batch sends at most L0 * Linf rows of a unit; the shard re-bounds as rows accumulate."""
    from transforms import bounding_stage
    from transforms.partials import key_partials

    bounds = ContributionBounds(max_partitions=3, max_contributions_per_partition=2)
    config = BoundingConfig(unit="user", keys=["k"], value=None, bounds=bounds,
                            release_key=ReleaseKey.for_testing(1), num_shards=4)
    prepare = bounding_stage._PrepareAndBound(config)
    combine = bounding_stage._BoundRowsFn(3, 2, min_rows=50)
    held, largest = combine.create_accumulator(), 0
    for i in range(20):  # two million rows of one unit, in distinct batches
        batch = pa.table({"user": pa.array(["heavy"] * 100_000),
                          "k": pa.array((np.arange(100_000) + i) % 50)})
        for _, routed in prepare._prepare(batch, None)[0]:
            assert routed.num_rows <= 3 * 2
            held = combine.add_input(held, routed)
            largest = max(largest, sum(t.num_rows for t in held))
    bounded = combine.extract_output(combine.merge_accumulators([held, combine.create_accumulator()]))
    assert bounded.num_rows == 6 and largest <= 2 * 50
    partials = key_partials(bounded, ["k"], has_value=False)
    assert sum(partials.column("count").to_pylist()) == 6 and partials.num_rows == 3


def test_whole_release_guarantee_includes_key_selection():
    transform = DPAggregate(
        compute=Compute(metrics=[Count(noise="discrete_gaussian"), Sum()], value="v"),
        keys=Keys(privacy_unit="u", columns=["k"], selection=PrivateSelection(weight=2.0)),
        bounds=BOUNDS,
        budget=PrivacyBudget(epsilon=2.0, delta=1e-6))
    total = transform.guarantee()
    assert total.epsilon == pytest.approx(2.0) and total.delta == pytest.approx(1e-6)
    assert "whole release with key selection" in transform.explain()
    with pytest.raises(ValueError, match="zCDP"):
        DPAggregate(
            compute=Compute(metrics=[Count()]),
            keys=Keys(privacy_unit="u", columns=["k"], selection=PrivateSelection()),
            bounds=BOUNDS,
            budget=PrivacyBudget.zcdp(0.1, delta=1e-6))


def test_beam_rows_input_equals_dict_input():
    rows = _rows()[:60]
    make = lambda: DPAggregate(
        compute=Compute(metrics=[Count(), Mean()], value="v"),
        keys=Keys(privacy_unit="user", columns=["country"], keyset=PublicKeyset.from_keys(["DE", "FR", "JP"], ["country"])),
        bounds=BOUNDS,
        budget=PrivacyBudget(epsilon=1.0),
        testing=True)
    directory = tempfile.mkdtemp()
    with beam.Pipeline(runner="FnApiRunner") as p:
        source = p | beam.Create(rows) | beam.Map(lambda r: beam.Row(**r))
        _collect(source | make(), directory)
    assert _read(directory) == _run(rows, make())


def test_bounding_config_is_a_frozen_keyword_only_value():
    bounds = ContributionBounds(max_partitions=1, max_contributions_per_partition=1)
    config = BoundingConfig(unit="u", keys=["k"], value=None, bounds=bounds,
                            release_key=ReleaseKey.for_testing(1))
    assert config.keys == ("k",) and config.num_shards == 32
    with pytest.raises(TypeError):
        BoundingConfig("u", ["k"], None, bounds, ReleaseKey.for_testing(1))
    with pytest.raises(AttributeError):
        config.num_shards = 2


# --------------------------------------------------------------------------- integer overflow

def test_integer_sums_fail_clearly_instead_of_wrapping():
    """Arrow's int64 sums wrap around silently: every integer per-key sum is checked first."""
    from transforms.bounding import PAIR, VALUE
    from transforms.noise import RandomStreams, add_noise
    from transforms.noise.mechanisms import IntegerSumOverflowError
    from transforms.partials import check_int64_sums, key_partials, sum_partials
    from accounting.calibration import calibrate

    big = 2 ** 62
    bounded = pa.table({"k": ["a", "a", "b"], PAIR: [1, 2, 3], VALUE: [float(big), float(big), 7.0]})
    with pytest.raises(IntegerSumOverflowError, match="'value'.*int64 range.*1 key"):
        key_partials(bounded, ["k"], has_value=True, integer_sum=True)
    part = pa.table({"k": ["a"], "count": pa.array([1], pa.int64()), "sum": pa.array([big], pa.int64())})
    with pytest.raises(IntegerSumOverflowError, match="'sum'"):
        sum_partials([part, part], ["k"])
    # Exactly at the edges: no wrap, no error (both signs), and the sums are exact.
    edge = pa.table({"k": [1, 1, 2, 2], "v": pa.array([big, big - 1, -big, -big], pa.int64())})
    check_int64_sums(edge, ["k"], ["v"])
    assert edge.group_by("k").aggregate([("v", "sum")]).column("v_sum").to_pylist() == [2 ** 63 - 1, -2 ** 63]
    with pytest.raises(IntegerSumOverflowError):
        check_int64_sums(pa.table({"v": pa.array([-big, -big, -1], pa.int64())}), [], ["v"])
    # Normal sums take the one-pass path and are what Arrow gives.
    small = pa.table({"k": ["a", "a", "b"], PAIR: [1, 2, 3], VALUE: [3.0, 4.0, 5.0]})
    assert key_partials(small, ["k"], has_value=True, integer_sum=True).column("sum").to_pylist() == [7, 5]
    # Value plus noise never wraps either.
    spec = calibrate("discrete_laplace", epsilon=1.0, l1_sensitivity=1)
    keys = pa.table({"k": [f"k{i}" for i in range(64)]})  # some key draws positive noise
    streams = RandomStreams.for_keys(ReleaseKey.for_testing(1), "m", keys)
    with pytest.raises(IntegerSumOverflowError, match="plus its noise"):
        add_noise(spec, np.full(64, 2 ** 63 - 1, dtype=np.int64), streams)
    assert add_noise(spec, np.full(64, 2 ** 62, dtype=np.int64), streams).min() > 0


def test_dp_aggregate_integer_sum_that_would_wrap_fails_the_run():
    from transforms.metrics import Sum

    bounds = ContributionBounds(max_partitions=1, max_contributions_per_partition=1, min_value=0,
                                max_value=2 ** 62)
    rows = [{"user": f"u{i}", "country": "DE", "v": float(2 ** 62)} for i in range(3)]
    transform = DPAggregate(
        compute=Compute(metrics=[Sum(noise="discrete_laplace")], value="v"),
        keys=Keys(privacy_unit="user", columns=["country"], keyset=PublicKeyset.from_keys(["DE"], ["country"])),
        output=Output(error_columns=False),  # exact values only
        bounds=bounds,
        budget=PrivacyBudget(epsilon=1.0),
        testing=True)
    with pytest.raises(Exception, match="outside the int64 range"):
        _run(rows, transform)


def test_public_keyset_and_private_selection_of_the_keys_outside_it_in_one_call():
    """Issue 39: every keyset key released (FR without rows, with zeros), keys outside it
    selected privately (BR, busy: kept; XX, one unit: not), an excluded key (IT) never, all
    under one contribution bound: u0's rows count once across public and private keys."""
    rows = [{"user": f"u{i}", "country": "DE", "v": 1.0} for i in range(30)]
    rows += [{"user": f"b{i}", "country": "BR", "v": 2.0} for i in range(60)]
    rows += [{"user": "lone", "country": "XX", "v": 3.0}]
    rows += [{"user": f"i{i}", "country": "IT", "v": 4.0} for i in range(60)]
    rows += [{"user": "u0", "country": "BR", "v": 5.0}]  # u0's second key: over L0 = 1
    keyset = PublicKeyset.from_keys(["DE", "FR", "IT"], ["country"]).exclude("country", ["IT"])
    bounds = ContributionBounds(max_partitions=1, max_contributions_per_partition=1,
                                min_value=0, max_value=10)

    def transform(testing, seed):
        return DPAggregate(
            compute=Compute(metrics=[Count(), Sum()], value="v"),
            keys=Keys(privacy_unit="user", columns=["country"], keyset=keyset,
                      selection=PrivateSelection()),
            output=Output(error_columns=False), bounds=bounds,
            budget=PrivacyBudget(epsilon=1.0, delta=1e-5),
            release_key=ReleaseKey.for_testing(seed), testing=testing)

    exact = {r["country"]: r for r in _run(rows, transform(True, 1))}
    assert set(exact) == {"DE", "FR", "BR"}
    assert exact["FR"]["count"] == 0 and exact["BR"]["count"] + exact["DE"]["count"] == 90
    noisy = transform(False, 2)
    got = {r["country"] for r in _run(rows, noisy)}
    assert {"DE", "FR"} <= got and "IT" not in got and "XX" not in got
    claim = noisy.guarantee()
    assert (claim.epsilon, claim.delta) == pytest.approx((1.0, 1e-5))
    assert "every key of the public keyset, and the keys outside it" in noisy.explain()
    with pytest.raises(ValueError, match="in-memory keyset"):
        Keys(privacy_unit="user", columns=["country"], selection=PrivateSelection(),
             keyset=PublicKeyset.from_pcollection(beam.Pipeline() | beam.Create([{"country": "DE"}]),
                                                  ["country"], expected_size=1))
