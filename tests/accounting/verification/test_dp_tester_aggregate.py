"""The DP tester, end to end on small DPAggregate releases (issue 10, "a sharper DP tester").

Every sample is one whole release of the real transform: :func:`aggregate_kit.sample_releases`
runs ``n`` independent releases of one small dataset in a single FnApiRunner pipeline (the rows
replicated under a public replica key, each replica with its own privacy units; noise, selection
and bounding are keyed PRFs of the output key, so replicas draw independent randomness), and
:class:`accounting.verification.dp_tester.ReleaseLayout` turns the released rows into one vector per release.

Each test checks the fixed code against its stated guarantee (``DPAggregate.guarantee()``) and a
test-only broken variant that re-introduces a bug of issue 10:

* point 3: private selection calibrated for L0 changed keys under substitution (which changes
  2·L0 keys) -- caught by the joint event "key i released and key j not", invisible per key
  (slow: with L0 = 2 only the four-key event sees it; Laplace thresholding);
* a noise-grid bug: integer noise drawn on a grid of 2 -- caught by the parity projection,
  invisible to threshold and bin events on the value;
* point 1: the keyset join's keys-with-rows-first order -- caught by "key i emitted before j";
* point 2: unit ids hashed with their type, so 7 and "7" are two units -- caught by the plain
  per-key events (the unit's rows pass bounding twice: twice the sensitivity).
* point 5: bounding priorities that depend on the batch position -- caught by the difference
  of two runs of the same rows cut into other batches under one key;
* point 4: one release key on two days' data -- caught by the difference of the two releases;
* (slow) counts calibrated for add/remove under a substitution claim -- caught by the value
  difference x_a - x_b only;
* issue 30: release thresholds compared against the exact value (key and value modes) -- caught
  by the released/suppressed indicators, deterministic on both sides, while the testing mode's
  exact runs cannot tell the two apart;
* issue 40.7: a quantile tree's node counts and an L2-clipped vector sum's columns at L0 = 2,
  sampled from the DPAggregate's calibrated measures -- a calibration for one tree level, or for
  one column's bound, is caught on the joint coordinates only (the mutants
  quantile-tree-l1-of-one-level and vector-sum-l1-of-one-column); with Gaussian noise the same
  pairs check the L2 norms: a calibration for one level's L2, or for the row count's L2 without
  the clip norm, is caught on the sum of the moved coordinates (quantile-tree-l2-of-one-level,
  vector-sum-l2-without-the-clip-norm).

Error rates. Keys are fixed testing keys (``ReleaseKey.for_testing``), so every run is the same
run. Over the choice of keys, a passing check on a correct mechanism fails with probability at
most ``1 - CONFIDENCE`` = 1e-3 (the tester's union bound; see accounting/verification/dp_tester.py); each
broken variant's violation is several times its confidence interval at these sample sizes (the
margins are stated per test), so missing it has negligible probability.
"""
from __future__ import annotations

import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest

from accounting.budget import PrivacyBudget
from accounting.verification.dp_tester import DPTester, ReleaseLayout, indicator_test
from accounting.keys import ReleaseKey
from accounting.sensitivity import ContributionBounds, Neighbouring
from aggregate_kit import (REPLICA, AggregateJob, aggregate_of, run_and_collect, sample_releases,
                           thresholds_on_exact_values)
from transforms import bounding_stage
from transforms import bounding
from transforms import release as release_module
from transforms.keyset import PublicKeyset
from transforms.metrics import Count, PrivacyUnitCount, Quantiles, Sum, VectorSum
from transforms.noise.samplers import discrete_laplace
from transforms.selection import PrivateSelection, SelectionStrategy, Selector

CONFIDENCE = 0.999
ONE = ContributionBounds(max_partitions=1, max_contributions_per_partition=1)


def units(prefix, n, key, **columns):
    return [{"user": f"{prefix}{i}", "k": key, **columns} for i in range(n)]


def samples(job, rows, n, layout, seed, transform=None):
    return sample_releases(job, rows, n, layout, key=ReleaseKey.for_testing(seed), transform=transform)


def check(outputs_d, outputs_d2, projections, claim, n):
    """The tester on already drawn outputs (each sampler is a slice of them)."""
    tester = DPTester(n_samples=n, confidence=CONFIDENCE, projections=projections)
    return tester.run(lambda m: outputs_d[:m], lambda m: outputs_d2[:m],
                      epsilon=claim.epsilon, delta=claim.delta)


# --------------------------------------------------------------------------------------------
# Point 3: private selection under substitution
# --------------------------------------------------------------------------------------------

# L0 = 1, substitution: the replaced unit leaves k1 for k2, so k1 and k2 move in opposite
# directions. Selection gets 0.9 of epsilon = 1 and all of delta = 1e-3.
SELECTION_BUDGET = PrivacyBudget(epsilon=1.0, delta=1e-3)


def selection_job(strategy):
    return AggregateJob(keys=("k",), metrics=(PrivacyUnitCount(),), bounds=ONE,
                        budget=SELECTION_BUDGET, selection=PrivateSelection(strategy=strategy, weight=9.0),
                        neighbouring=Neighbouring.SUBSTITUTE)


def substitution_pair(m):
    """D: k1 holds m units (one of them "x"), k2 holds m - 1; D': "x" replaced by "y" in k2."""
    background = units("a", m - 1, "k1") + units("b", m - 1, "k2")
    return (background + [{"user": "x", "k": "k1"}], background + [{"user": "y", "k": "k2"}])


def selection_calibrated_for_l0(job, key, keys, keyset):
    """Test-only broken variant (issue 10 point 3, the old code): the selector calibrated for the
    bounds' L0 changed keys, ignoring that a substitution changes 2·L0."""
    aggregate = job.transform(key, False, keys=keys, keyset=keyset)
    s = aggregate.selector
    aggregate.selector = Selector(s.selection, s.epsilon, s.delta, job.bounds.max_partitions)
    return aggregate


SELECTION_LAYOUT = ReleaseLayout(keys=("k1", "k2"), values=("privacy_unit_count",))


def is_joint(projection: str) -> bool:
    """"k1 released and k2 not" (or its mirror), or the value difference, whose extreme
    (missing minus released) is the same event."""
    return " and not " in projection or " - " in projection


@pytest.mark.parametrize("strategy,m", [
    # m: the units per key where the old calibration's joint event is most exposed.
    (SelectionStrategy.TRUNCATED_GEOMETRIC, 8),
    pytest.param(SelectionStrategy.LAPLACE_THRESHOLDING, 9, marks=pytest.mark.slow),
])
def test_selection_under_substitution_needs_the_joint_event(strategy, m):
    job = selection_job(strategy)
    claim = job.declared().guarantee()
    assert (claim.epsilon, claim.delta) == pytest.approx((1.0, 1e-3))
    fixed, old = job.declared().selector, selection_calibrated_for_l0(job, ReleaseKey.for_testing(0),
                                                                         None, None).selector
    assert (fixed.max_partitions, old.max_partitions) == (2, 1)

    # Exact event probabilities of the old calibration: the joint event's loss is about twice
    # the selection's 0.9, per-key events stay within it (margins for the checks below).
    keep = old.keep_probability
    joint_d, joint_d2 = keep(m) * (1 - keep(m - 1)), keep(m - 1) * (1 - keep(m))
    assert math.log((joint_d - claim.delta) / joint_d2) > 1.4 * claim.epsilon
    assert math.log(keep(m) / keep(m - 1)) < 0.91

    n = 6_000
    d, d2 = substitution_pair(m)
    per_key = SELECTION_LAYOUT.projections(pairs=False)
    everything = SELECTION_LAYOUT.projections()

    # The fixed selection passes with every projection, joint ones included.
    fixed_d, fixed_d2 = samples(job, d, n, SELECTION_LAYOUT, 1), samples(job, d2, n, SELECTION_LAYOUT, 2)
    result = check(fixed_d, fixed_d2, everything, claim, n)
    assert result.passed, result

    # The old calibration: per-key events cannot see it (each key alone is within the claim);
    # the joint event "k1 released and k2 not" (or its mirror) refutes the claim.
    old_d = samples(job, d, n, SELECTION_LAYOUT, 3, transform=selection_calibrated_for_l0)
    old_d2 = samples(job, d2, n, SELECTION_LAYOUT, 4, transform=selection_calibrated_for_l0)
    assert check(old_d, old_d2, per_key, claim, n).passed
    result = check(old_d, old_d2, everything, claim, n)
    assert not result.passed, result
    assert is_joint(result.worst.event.projection)
    assert result.epsilon_lower_bound > 1.2


# --------------------------------------------------------------------------------------------
# Noise on the wrong grid: the low-order-bit projection
# --------------------------------------------------------------------------------------------

def noise_on_a_grid_of_two(spec, values, streams):
    """Test-only broken variant of ``transforms.noise.add_noise`` for integer kinds: noise of
    the calibrated scale, but drawn in steps of 2 (2 * DLap(scale / 2)), so every output keeps
    the exact answer's parity."""
    values = np.asarray(values)
    assert spec.kind.is_integer and not spec.kind.is_gaussian
    return values.astype(np.int64) + 2 * discrete_laplace(streams, spec.unit_scale / 2)


# Keyset mode, add/remove: the added unit "x" puts the odd value 201 into key "a". Values range
# over [0, 256] with epsilon 1: the noise spreads the sum over thousands of values, so the
# tester treats it as continuous (threshold and bin events on the value).
GRID_LAYOUT = ReleaseLayout(keys=("a", "b"), values=("sum",))


def grid_job():
    return AggregateJob(keys=("k",), value="v", metrics=(Sum(noise="discrete_laplace"),),
                        bounds=ContributionBounds(max_partitions=1, max_contributions_per_partition=1,
                                                  min_value=0, max_value=256),
                        budget=PrivacyBudget(epsilon=1.0), public_keys=("a", "b"))


def test_noise_on_the_wrong_grid_is_caught_by_the_parity_projection(monkeypatch):
    job = grid_job()
    claim = job.declared().guarantee()
    background = units("a", 3, "a", v=10) + units("b", 2, "b", v=7)
    d, d2 = background + [{"user": "x", "k": "a", "v": 201}], background
    n = 3_000
    parity = GRID_LAYOUT.projections(integer_bits=1)
    result = check(samples(job, d, n, GRID_LAYOUT, 5), samples(job, d2, n, GRID_LAYOUT, 6),
                   parity, claim, n)
    assert result.passed, result

    monkeypatch.setattr(release_module, "add_noise", noise_on_a_grid_of_two)
    broken_d, broken_d2 = samples(job, d, n, GRID_LAYOUT, 7), samples(job, d2, n, GRID_LAYOUT, 8)
    assert np.all(np.mod(broken_d[:, GRID_LAYOUT.value("a", "sum")], 2) == 1)   # 221 + even noise
    assert check(broken_d, broken_d2, GRID_LAYOUT.projections(), claim, n).passed
    result = check(broken_d, broken_d2, parity, claim, n)
    assert not result.passed, result
    assert result.worst.event.projection == "sum[a] mod 2^1"
    assert result.epsilon_lower_bound > 5 * claim.epsilon


# --------------------------------------------------------------------------------------------
# Point 1: output order
# --------------------------------------------------------------------------------------------

ORDER_LAYOUT = ReleaseLayout(keys=("a", "b", "c"), values=("count",), order=True)


def test_keys_with_rows_first_order_is_caught_by_the_order_projection(monkeypatch):
    job = AggregateJob(keys=("k",), metrics=(Count(),), bounds=ONE,
                       budget=PrivacyBudget(epsilon=1.0), public_keys=("a", "b", "c"))
    claim = job.declared().guarantee()
    d, d2 = units("a", 2, "a") + [{"user": "x", "k": "c"}], units("a", 2, "a")
    n = 2_000
    projections = ORDER_LAYOUT.projections()
    result = check(samples(job, d, n, ORDER_LAYOUT, 9), samples(job, d2, n, ORDER_LAYOUT, 10),
                   projections, claim, n)
    assert result.passed, result

    # The old order: the keyset join's, keys with rows first.
    monkeypatch.setattr(release_module, "sorted_by_keys", lambda table, keys: table)
    result = check(samples(job, d, n, ORDER_LAYOUT, 11), samples(job, d2, n, ORDER_LAYOUT, 12),
                   projections, claim, n)
    assert not result.passed, result
    assert result.worst.event.projection.startswith("rank[")
    assert result.epsilon_lower_bound > 3 * claim.epsilon


# --------------------------------------------------------------------------------------------
# The other modes pass their guarantee, and the same samples refute a smaller claim
# --------------------------------------------------------------------------------------------

def keyset_substitution():
    """Keyset, substitution: "x" in key a is replaced by "y" in key b (L1 = 2 over two keys)."""
    job = AggregateJob(keys=("k",), metrics=(Count(),), bounds=ONE, budget=PrivacyBudget(epsilon=1.0),
                       public_keys=("a", "b"), neighbouring=Neighbouring.SUBSTITUTE)
    background = units("a", 3, "a") + units("b", 3, "b")
    return (job, background + [{"user": "x", "k": "a"}], background + [{"user": "y", "k": "b"}],
            ReleaseLayout(keys=("a", "b"), values=("count",)))


def selection_add_remove():
    """Private selection, add/remove: "x" joins key k1 (8 units against 7)."""
    job = selection_job(SelectionStrategy.TRUNCATED_GEOMETRIC).with_(neighbouring=Neighbouring.ADD_REMOVE)
    background = units("a", 7, "k1") + units("b", 7, "k2")
    return job, background + [{"user": "x", "k": "k1"}], background, SELECTION_LAYOUT


@pytest.mark.parametrize("mode,refuted", [(keyset_substitution, 0.25), (selection_add_remove, 0.45)])
def test_release_passes_its_guarantee_with_every_projection(mode, refuted):
    job, d, d2, layout = mode()
    claim = job.declared().guarantee()
    n = 6_000
    projections = layout.projections(integer_bits=1)
    outputs_d, outputs_d2 = samples(job, d, n, layout, 13), samples(job, d2, n, layout, 14)
    result = check(outputs_d, outputs_d2, projections, claim, n)
    assert result.passed, result
    # Power: the same outputs refute a claim well below the true loss (the tester sees it).
    smaller = claim._replace(epsilon=refuted)
    assert not check(outputs_d, outputs_d2, projections, smaller, n).passed


def counts_calibrated_for_add_remove(job, key, keys, keyset):
    """Test-only broken variant: the counts' noise calibrated for add/remove (L1 = 1) although
    the release states substitution (L1 = 2: one key loses the unit, another gains it)."""
    return job.with_(neighbouring=Neighbouring.ADD_REMOVE).transform(key, False, keys=keys, keyset=keyset)


@pytest.mark.slow
def test_measure_ignoring_substitution_is_caught_by_the_value_difference():
    # Broken: each key alone is exactly at the claim (discrete Laplace of scale 1, shift 1); the
    # difference count[a] - count[b] shifts by 2, P(diff >= c + 2) is 0.36 against 0.082
    # (loss 1.48 against the claimed 1).
    job, d, d2, layout = keyset_substitution()
    claim = job.declared().guarantee()
    n = 10_000
    per_key, everything = layout.projections(pairs=False), layout.projections()
    outputs_d = samples(job, d, n, layout, 15, transform=counts_calibrated_for_add_remove)
    outputs_d2 = samples(job, d2, n, layout, 16, transform=counts_calibrated_for_add_remove)
    assert check(outputs_d, outputs_d2, per_key, claim, n).passed
    result = check(outputs_d, outputs_d2, everything, claim, n)
    assert not result.passed, result
    assert result.worst.event.projection == "count[a] - count[b]"


# --------------------------------------------------------------------------------------------
# Point 2: one unit, ids of several types
# --------------------------------------------------------------------------------------------

def mixed_id_releases(job, n, with_unit, seed):
    """n releases of ``job`` (keyset ("a",), L0 = Linf = 1) on units 1 and 2 in key "a" and, with
    ``with_unit``, unit 7 given once as int64 7 and once as the text "7" in another batch.

    Like :func:`aggregate_kit.sample_releases` (replicas under a public key column, a unit id
    space per replica: replica r's unit u is r * 10 + u), but with typed unit ids, which that
    kit's per-replica text ids would erase.
    """
    keys = (REPLICA, *job.keys)
    keyset = PublicKeyset.from_table(pa.table({REPLICA: np.arange(n, dtype=np.int64), "k": ["a"] * n}))
    aggregate = job.transform(ReleaseKey.for_testing(seed), False, keys=keys, keyset=keyset)
    replica = np.arange(n, dtype=np.int64)
    background = pa.table({"user": np.concatenate([replica * 10 + 1, replica * 10 + 2]),
                           "k": ["a"] * (2 * n), REPLICA: np.concatenate([replica, replica])})
    batches = [background]
    if with_unit:
        batches.append(pa.table({"user": replica * 10 + 7, "k": ["a"] * n, REPLICA: replica}))
        batches.append(pa.table({"user": [str(u) for u in (replica * 10 + 7).tolist()],
                                 "k": ["a"] * n, REPLICA: replica}))
    tables = run_and_collect(lambda p: p | beam.Create(batches, reshuffle=False) | aggregate)
    data = pa.concat_tables([t.select([REPLICA, "k", "count"]) for t in tables])
    layout = ReleaseLayout(keys=("a",), values=("count",))
    arrays = {c: data.column(c).to_numpy(zero_copy_only=False) for c in data.column_names}
    return layout.vectorize(arrays, n, replica_column=REPLICA)


def type_tagged_unit_ids(column, name="privacy unit"):
    """Test-only broken variant (issue 10 point 2, the old code): ids keep their type, so int64
    7 and the text "7" are two units."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    return pa.array([None if v is None else f"{column.type}:{v}" for v in column.to_pylist()],
                    pa.string())


def test_unit_ids_of_several_types_are_caught_as_twice_the_sensitivity(monkeypatch):
    job = AggregateJob(keys=("k",), metrics=(Count(),), bounds=ONE, budget=PrivacyBudget(epsilon=1.0),
                       public_keys=("a",))
    claim = job.declared().guarantee()
    n = 4_000
    fixed = mixed_id_releases(job, n, True, 17), mixed_id_releases(job, n, False, 18)
    assert np.median(fixed[0][:, 1]) == 3 and np.median(fixed[1][:, 1]) == 2
    result = check(*fixed, None, claim, n)
    assert result.passed, result

    monkeypatch.setattr(bounding_stage, "canonical_unit_dictionary",
                        lambda column, name: type_tagged_unit_ids(column, name).dictionary_encode())
    broken = mixed_id_releases(job, n, True, 19), mixed_id_releases(job, n, False, 20)
    assert np.median(broken[0][:, 1]) == 4                        # unit 7 counted twice
    result = check(*broken, None, claim, n)
    assert not result.passed, result
    assert result.epsilon_lower_bound > 1.3


# --------------------------------------------------------------------------------------------
# Point 3 with L0 = 2: only the event over all 2·L0 moved keys sees the old calibration
# --------------------------------------------------------------------------------------------

@pytest.mark.slow
def test_selection_under_substitution_with_two_keys_per_unit_needs_the_four_key_event():
    # The old calibration (2 keys instead of 4) gives each key (0.45, 5e-4); at m = 15 units
    # the four-key event has probabilities 0.121 against 0.025 (loss 1.56 against the claimed
    # 1.0) while every pair of keys carries at most 0.78: pair projections cannot see it.
    bounds = ContributionBounds(max_partitions=2, max_contributions_per_partition=1)
    job = selection_job(SelectionStrategy.TRUNCATED_GEOMETRIC).with_(bounds=bounds)
    claim = job.declared().guarantee()
    m, n = 15, 16_000
    background = [row for key in ("k1", "k2", "k3", "k4") for row in units(f"{key}-", m - 1, key)]
    d = background + [{"user": "x", "k": "k1"}, {"user": "x", "k": "k2"}]
    d2 = background + [{"user": "y", "k": "k3"}, {"user": "y", "k": "k4"}]
    layout = ReleaseLayout(keys=("k1", "k2", "k3", "k4"))
    pairs = layout.projections()
    four = {**pairs, **layout.joint_projection(["k1", "k2"], ["k3", "k4"]),
            **layout.joint_projection(["k3", "k4"], ["k1", "k2"])}

    fixed = samples(job, d, n, layout, 21), samples(job, d2, n, layout, 22)
    result = check(*fixed, four, claim, n)
    assert result.passed, result

    old = (samples(job, d, n, layout, 23, transform=selection_calibrated_for_l0),
           samples(job, d2, n, layout, 24, transform=selection_calibrated_for_l0))
    assert check(*old, pairs, claim, n).passed
    result = check(*old, four, claim, n)
    assert not result.passed, result
    assert result.worst.event.projection.startswith("released[k")
    assert " and not [" in result.worst.event.projection


# --------------------------------------------------------------------------------------------
# Point 4: one key on two inputs
# --------------------------------------------------------------------------------------------

def test_key_reuse_across_days_is_caught_by_the_value_difference():
    """Two daily releases; the unit "x" appears on day 2 only. With a fresh key per release the
    pair of releases is as private as day 2's; with day 1's key reused on day 2 (a key file
    outside the ledger, issue 10 point 4) the same noise cancels in count[day 2] - count[day 1]."""
    job = AggregateJob(keys=("k",), metrics=(Count(),), bounds=ONE, budget=PrivacyBudget(epsilon=1.0),
                       public_keys=("a",))
    claim = job.declared().guarantee()
    layout = ReleaseLayout(keys=("a",), values=("count",))
    background = units("a", 3, "a")
    day2_d, day2_d2 = background + [{"user": "x", "k": "a"}], background
    n = 1_000
    column = layout.value("a", "count")
    day1 = samples(job, background, n, layout, 25)[:, column]

    def both_days(day2):
        return np.stack([day1, day2[:, column]], axis=1)

    projections = {"day1": lambda x: x[:, 0], "day2": lambda x: x[:, 1],
                   "day2 - day1": lambda x: x[:, 1] - x[:, 0]}
    fresh = [both_days(samples(job, rows, n, layout, seed)) for rows, seed in ((day2_d, 26), (day2_d2, 27))]
    result = check(*fresh, projections, claim, n)
    assert result.passed, result

    reused = [both_days(samples(job, rows, n, layout, 25)) for rows in (day2_d, day2_d2)]   # day 1's key
    assert np.all(reused[0][:, 1] - reused[0][:, 0] == 1) and np.all(reused[1][:, 1] == reused[1][:, 0])
    assert check(*reused, {k: projections[k] for k in ("day1", "day2")}, claim, n).passed
    result = check(*reused, projections, claim, n)
    assert not result.passed, result
    assert result.worst.event.projection == "day2 - day1"


# --------------------------------------------------------------------------------------------
# Point 5: bounding that depends on batching
# --------------------------------------------------------------------------------------------

def priorities_by_batch_position(original):
    """Test-only broken variant of ``transforms.bounding.prioritize`` (issue 10 point 5, the
    old code): the row priority mixes the row's position in its batch."""
    def prioritize(table, *args, **kwargs):
        out = original(table, *args, **kwargs)
        pair = out.column(bounding.PAIR).to_numpy().astype(np.uint64)
        position = np.arange(out.num_rows, dtype=np.uint64)
        with np.errstate(over="ignore"):
            row = (pair ^ position) * np.uint64(0x9E3779B97F4A7C15)
        return out.set_column(out.schema.get_field_index(bounding.ROW), bounding.ROW, pa.array(row))
    return prioritize


def test_batching_dependent_bounding_is_caught_by_the_difference_of_two_runs(monkeypatch):
    """The same rows released twice under one key, cut into batches two ways: a release that
    depends on content only repeats itself exactly. Unit "x" has two rows (0 and 10) where
    Linf = 1 keeps one: with position priorities, which one depends on the batching, and the
    difference of the two runs (noise-free: same key, same output key) shows x is there."""
    job = AggregateJob(keys=("k",), value="v", metrics=(Sum(),), public_keys=("a",),
                       bounds=ContributionBounds(max_partitions=1, max_contributions_per_partition=1,
                                                 min_value=0, max_value=10),
                       budget=PrivacyBudget(epsilon=1.0))
    claim = job.declared().guarantee()
    layout = ReleaseLayout(keys=("a",), values=("sum",))
    background = units("a", 3, "a", v=5)
    d = background + [{"user": "x", "k": "a", "v": 0}, {"user": "x", "k": "a", "v": 10}]
    n = 1_000
    column = layout.value("a", "sum")

    def two_runs(rows, seed):
        runs = [sample_releases(job, rows, n, layout, key=ReleaseKey.for_testing(seed),
                                batch_rows=batch_rows)[:, column] for batch_rows in (50_000, 997)]
        return np.stack(runs, axis=1)

    projections = {"run 1": lambda x: x[:, 0], "run 2": lambda x: x[:, 1],
                   "run 2 - run 1": lambda x: x[:, 1] - x[:, 0]}
    fixed = two_runs(d, 28), two_runs(background, 29)
    assert np.all(fixed[0][:, 0] == fixed[0][:, 1])
    result = check(*fixed, projections, claim, n)
    assert result.passed, result

    monkeypatch.setattr(bounding, "prioritize", priorities_by_batch_position(bounding.prioritize))
    broken = two_runs(d, 30), two_runs(background, 31)
    assert np.all(broken[1][:, 0] == broken[1][:, 1]) and np.any(broken[0][:, 0] != broken[0][:, 1])
    result = check(*broken, projections, claim, n)
    assert not result.passed, result
    assert result.worst.event.projection == "run 2 - run 1"


# --------------------------------------------------------------------------------------------
# Issue 30: release thresholds on the noisy value, not the exact one
# --------------------------------------------------------------------------------------------

def threshold_job(mode):
    """Keyset ("a", "b"), counts thresholded at 2.5; in value mode the privacy-unit count is
    released unthresholded, so a suppressed count is a null value of a released key."""
    metrics = (Count(threshold=2.5),) + ((PrivacyUnitCount(),) if mode == "value" else ())
    return AggregateJob(keys=("k",), metrics=metrics, bounds=ONE, budget=PrivacyBudget(epsilon=1.0),
                        public_keys=("a", "b"), options={"threshold_mode": mode})


@pytest.mark.parametrize("mode", ["key", "value"])
def test_a_threshold_on_the_exact_value_is_caught_by_the_released_indicator(mode, monkeypatch):
    """Unit "x" takes key b from 2 units to 3, across the threshold 2.5. With the noisy count
    compared, b (key mode) or its count (value mode) is released with probabilities 0.73
    against 0.27 (discrete Laplace of scale 2: a loss of 1 on the claimed 1 -- within it). With
    the exact count compared, it is released on every sample of D and on none of D'."""
    job = threshold_job(mode)
    claim = job.declared().guarantee()
    layout = ReleaseLayout(keys=("a", "b"), values=tuple(m.column for m in job.metrics))
    projections = layout.projections()
    background = units("a", 4, "a") + units("b", 2, "b")
    d, d2 = background + [{"user": "x", "k": "b"}], background
    n = 1_000

    def indicators(outputs):
        return indicator_test(*(layout.indicators(x)[0] for x in outputs), epsilon=claim.epsilon,
                              delta=claim.delta, names=layout.indicators(outputs[0])[1])

    fixed = samples(job, d, n, layout, 40), samples(job, d2, n, layout, 41)
    result = check(*fixed, projections, claim, n)
    assert result.passed, result
    assert indicators(fixed).passed

    monkeypatch.setattr(release_module._NoiseAndRelease, "_release",
                        thresholds_on_exact_values(release_module._NoiseAndRelease._release))
    broken = samples(job, d, n, layout, 42), samples(job, d2, n, layout, 43)
    b = layout.value("b", "count")
    assert np.all(broken[0][:, b] != layout.missing) and np.all(broken[1][:, b] == layout.missing)
    result = check(*broken, projections, claim, n)
    assert not result.passed, result
    assert result.worst.count_denominator == 0 and result.worst.count_numerator == n // 2
    result = indicators(broken)
    assert not result.passed and result.worst.event.projection in ("released[b]", "count[b] released")


# --------------------------------------------------------------------------------------------
# Issue 39: count and sum from the shared moment measures (sum = S + midpoint N)
# --------------------------------------------------------------------------------------------

# Values in [0, 100]: the added unit's 100 moves the normalised sum S by its full sensitivity
# 50 and the count N by 1, so the released sum S + 50 N moves by 100 -- within the claim only
# if N and S together spend no more than the budget (the equal split: each at epsilon / 2).
DERIVED_LAYOUT = ReleaseLayout(keys=("a",), values=("count", "sum"))


def derived_job():
    return AggregateJob(keys=("k",), value="v", metrics=(Count(), Sum()),
                        bounds=ContributionBounds(max_partitions=1, max_contributions_per_partition=1,
                                                  min_value=0, max_value=100),
                        budget=PrivacyBudget(epsilon=1.0), public_keys=("a",),
                        options={"error_columns": False})


def test_count_and_sum_derived_from_one_count_and_one_normalised_sum_keep_the_claim():
    job = derived_job()
    declared = job.declared()
    assert [m.name for m in declared.plan.measures] == ["count", "sum.normalized_sum"]
    claim = declared.guarantee()
    assert claim.epsilon == pytest.approx(1.0)
    background = units("a", 5, "a", v=40.0)
    d, d2 = background + [{"user": "x", "k": "a", "v": 100.0}], background
    n = 4_000
    result = check(samples(job, d, n, DERIVED_LAYOUT, 31), samples(job, d2, n, DERIVED_LAYOUT, 32),
                   DERIVED_LAYOUT.projections(), claim, n)
    assert result.passed, result


# --------------------------------------------------------------------------------------------
# Issue 40.7: measures with several coordinates per key, at L0 > 1
# --------------------------------------------------------------------------------------------
#
# A quantile tree's node counts and a vector sum's columns are vector measures: the release
# stage noises each coordinate from its own lane, calibrated for the L1 norm of what one unit
# moves across *all* of them (and all its keys). Per coordinate, a calibration for a smaller
# norm (one level of the tree, one column's bound) looks sound; only the joint output shows the
# loss. The node counts are not released themselves (the quantiles are their post-processing),
# so these tests sample the DPAggregate's own calibrated measures (``DPAggregate.measures``:
# the noise the release stage draws, under its keyed lanes, one replica per sample) on the exact
# answers of a neighbouring pair where the added unit fills its bounds: Linf rows in each of L0
# keys, every row at the norm bound.
#
# The projection: for a Laplace-family location shift from a to a + s (s >= 0) the privacy loss
# of coordinate i is (2 clip(x_i - a_i, 0, s_i) - s_i) / scale, so the loss of the joint output
# is increasing in the sum of the clipped offsets, whatever the scale. The projection therefore
# depends on the public pair only, not on the calibration under test, and its tail events carry
# the whole loss; the plain sum of the moved coordinates is kept beside it.

WIDE = dict(max_partitions=2, max_contributions_per_partition=2)
WIDE_KEYS = ["k0", "k1", "k2"]           # the unit's L0 = 2 keys are k0 and k1; k2 stays


def wide_aggregate(metric, **bounds):
    return aggregate_of(privacy_unit="user", keys=["k"], value="v", metrics=[metric],
                        bounds=ContributionBounds(**WIDE, **bounds), budget=PrivacyBudget(epsilon=1.0),
                        keyset=PublicKeyset.from_keys(WIDE_KEYS, ["k"]),
                        release_key=ReleaseKey.for_testing(40))


def measure_check(measure, exact_d, exact_d2, claim, n, seeds):
    """The tester on ``measure``'s noisy answers for the (keys, width) exact answers of D and D'
    (n replicas of the keys per sampler, each replica its own lanes)."""
    moved = np.flatnonzero((exact_d != exact_d2).reshape(-1))
    low = exact_d.reshape(-1)[moved]
    shift = (exact_d2 - exact_d).reshape(-1)[moved]
    assert np.all(shift > 0)

    def sampler(exact, seed):
        def draw(m):
            lanes = pa.table({REPLICA: np.repeat(np.arange(m), len(exact)), "k": WIDE_KEYS * m})
            return measure.noisy(np.tile(exact, (m, 1)), ReleaseKey.for_testing(seed), lanes).reshape(m, -1)
        return draw

    tester = DPTester(n_samples=n, confidence=CONFIDENCE, projections={
        "moved coordinates": lambda x: x[:, moved].sum(axis=1),
        "moved coordinates, clipped to the change": lambda x: np.clip(x[:, moved] - low, 0, shift).sum(axis=1)})
    return tester.run(sampler(exact_d, seeds[0]), sampler(exact_d2, seeds[1]),
                      epsilon=claim.epsilon, delta=claim.delta)


def test_quantile_tree_node_counts_are_noised_for_a_units_rows_on_every_level():
    """One unit's Linf rows in one leaf of each of its L0 keys move one node per level: depth x
    L0 x Linf in L1 over 2 x depth node counts. A calibration without the depth (one node per
    key) has depth times the loss on the joint counts; each node alone stays within the claim."""
    depth = 3
    aggregate = wide_aggregate(Quantiles([0.5], branching=2, depth=depth, mechanism="tree"),
                               min_value=0, max_value=8)
    measure = aggregate.measures["quantiles"]
    assert measure.integer and len(measure.columns) == 2 ** (depth + 1) - 2
    claim = aggregate.guarantee()
    assert claim.epsilon == pytest.approx(1.0)
    tree = aggregate._config.partials.trees[0]
    leaves = np.full((len(WIDE_KEYS), tree.leaves), 3, dtype=np.int64)   # D: 3 rows per leaf
    added = leaves.copy()
    added[:2, tree.leaf_of(np.array([5.5]))[0]] += WIDE["max_contributions_per_partition"]
    d, d2 = tree.node_counts(leaves), tree.node_counts(added)
    assert np.abs(d2 - d).sum() == depth * 2 * 2              # the unit at its bounds
    result = measure_check(measure, d, d2, claim, 50_000, seeds=(41, 42))
    assert result.passed, result


def test_vector_sum_is_noised_for_the_l1_norm_across_its_columns():
    """One unit's Linf vectors of L2 norm C in each of its L0 keys, spread evenly over the d
    columns: each column moves by Linf C / sqrt(d), the joint output by L0 Linf sqrt(d) C in L1.
    A calibration for the per-column bound (L0 Linf C) has sqrt(d) times the loss on the joint
    vector; each column alone stays within the claim."""
    from transforms.vectors import clip

    dimension, max_norm = 9, 3.0
    aggregate = wide_aggregate(VectorSum(dimension=dimension, max_norm=max_norm, norm="l2"))
    measure = aggregate.measures["vector_sum"]
    assert not measure.integer and len(measure.columns) == dimension
    claim = aggregate.guarantee()
    assert claim.epsilon == pytest.approx(1.0)
    row = clip(np.full((1, dimension), 5.0), max_norm, "l2")[0]        # norm C, 1.0 per column
    d = np.full((len(WIDE_KEYS), dimension), 2.0)
    d2 = d.copy()
    d2[:2] += WIDE["max_contributions_per_partition"] * row
    assert np.abs(d2 - d).sum() == pytest.approx(2 * 2 * math.sqrt(dimension) * max_norm)
    result = measure_check(measure, d, d2, claim, 60_000, seeds=(43, 44))
    assert result.passed, result


# Gaussian kinds: the L2 norm of the same neighbours. One unit at its bounds moves 2 x depth node
# counts by Linf each (L2 = Linf sqrt(L0 depth)), or d columns of L0 keys by Linf C / sqrt(d)
# each (L2 = Linf sqrt(L0) C); a calibration for one level's L2 (without sqrt(depth)), or for
# the row count's L2 (without the clip norm C), has sigma too small by that factor. The moved
# coordinates all shift alike, so their plain sum is the Gaussian's sufficient statistic. At these
# sample sizes the tester's epsilon lower bound is about 0.5 on the real calibration (claim 1),
# about 1.4 (tree) and 2.3 (vector sum) on the calibrations without the factor.

GAUSSIAN_DELTA = 1e-3


def wide_gaussian_aggregate(metric, wide=WIDE, **bounds):
    return aggregate_of(privacy_unit="user", keys=["k"], value="v", metrics=[metric],
                        bounds=ContributionBounds(**wide, **bounds),
                        budget=PrivacyBudget(epsilon=1.0, delta=GAUSSIAN_DELTA),
                        keyset=PublicKeyset.from_keys(WIDE_KEYS, ["k"]),
                        release_key=ReleaseKey.for_testing(45))


def test_gaussian_quantile_tree_is_noised_for_the_l2_norm_of_a_units_rows_on_every_level():
    """Discrete Gaussian node counts: one unit's Linf rows in one leaf of each of its L0 keys
    move 2 x depth nodes by Linf, L2 = Linf sqrt(L0 depth); noise for one level's L2
    (Linf sqrt(L0)) has sqrt(depth) = 2 times too small a sigma. (Linf = 1 here: the multi-key
    discrete Gaussian's calibration enumerates the shift patterns of L1 = depth L0 Linf.)"""
    depth, wide = 4, dict(WIDE, max_contributions_per_partition=1)
    aggregate = wide_gaussian_aggregate(Quantiles([0.5], branching=2, depth=depth, mechanism="tree",
                                                  noise="discrete_gaussian"), wide, min_value=0, max_value=16)
    measure = aggregate.measures["quantiles"]
    assert measure.integer and measure.spec.kind.is_gaussian
    claim = aggregate.guarantee()
    assert (claim.epsilon, claim.delta) == pytest.approx((1.0, GAUSSIAN_DELTA))
    tree = aggregate._config.partials.trees[0]
    leaves = np.full((len(WIDE_KEYS), tree.leaves), 3, dtype=np.int64)
    added = leaves.copy()
    linf = wide["max_contributions_per_partition"]
    added[:2, tree.leaf_of(np.array([11.5]))[0]] += linf
    d, d2 = tree.node_counts(leaves), tree.node_counts(added)
    assert sorted((d2 - d)[d2 != d]) == [linf] * (2 * depth)   # the unit at its bounds
    result = measure_check(measure, d, d2, claim, 30_000, seeds=(46, 47))
    assert result.passed, result


def test_gaussian_vector_sum_is_noised_for_the_l2_norm_of_its_clipped_rows():
    """Gaussian vector sums: one unit's Linf rows of L2 norm C in each of its L0 keys move the
    joint output by Linf sqrt(L0) C in L2; noise for the row count's L2 alone (without C = 3)
    has a third of the sigma."""
    from transforms.vectors import clip

    dimension, max_norm = 9, 3.0
    aggregate = wide_gaussian_aggregate(VectorSum(dimension=dimension, max_norm=max_norm, norm="l2",
                                                  noise="gaussian"))
    measure = aggregate.measures["vector_sum"]
    assert not measure.integer and measure.spec.kind.is_gaussian
    claim = aggregate.guarantee()
    assert (claim.epsilon, claim.delta) == pytest.approx((1.0, GAUSSIAN_DELTA))
    row = clip(np.full((1, dimension), 5.0), max_norm, "l2")[0]
    d = np.full((len(WIDE_KEYS), dimension), 2.0)
    d2 = d.copy()
    d2[:2] += WIDE["max_contributions_per_partition"] * row
    assert np.sqrt(((d2 - d) ** 2).sum()) == pytest.approx(2 * math.sqrt(2) * max_norm)  # Linf sqrt(L0) C
    result = measure_check(measure, d, d2, claim, 20_000, seeds=(48, 49))
    assert result.passed, result
