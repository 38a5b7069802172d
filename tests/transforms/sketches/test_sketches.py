"""LiquidLegions sketches: fingerprints, registers, merge laws, estimators, row rules (no Beam)."""
import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from transforms.privacy_units import UnitIdError
from transforms.sketches.estimators import (estimate_reach, expected_active_registers,
                                            frequency_distribution, k_plus_reach, k_reach,
                                            shuffle_distance)
from transforms.sketches.fingerprint import FingerprintSalt, fingerprint
from transforms.sketches.impressions import (IdType, ImpressionColumns, normalise_ids,
                                             partial_sketches)
from transforms.sketches.liquid_legions import LiquidLegionsSketch, SketchConfig

SALT = FingerprintSalt.for_campaign("campaign-1")


# ----------------------------------------------------------------------------- fingerprints

def test_fingerprint_is_deterministic_and_salted_per_campaign():
    ids = np.arange(10_000, dtype=np.int64)
    a = fingerprint(ids, SALT)
    assert np.array_equal(a, fingerprint(ids.copy(), FingerprintSalt.for_campaign("campaign-1")))
    other = fingerprint(ids, FingerprintSalt.for_campaign("campaign-2"))
    assert np.mean(a == other) < 1e-3
    secret = fingerprint(ids, FingerprintSalt.for_campaign("campaign-1", b"publishers' secret"))
    assert np.mean(a == secret) < 1e-3
    # Different campaigns also scatter the same people over different registers.
    cfg = SketchConfig(num_registers=1000, decay_rate=0.0)
    assert np.mean(cfg.registers_of(a) == cfg.registers_of(other)) < 0.01


def test_integer_fingerprint_is_a_bijection_and_well_mixed():
    ids = np.arange(1_000_000, dtype=np.int64)  # consecutive ids: the hard case for mixing
    fps = fingerprint(ids, SALT)
    assert np.unique(fps).size == ids.size
    bits = ((fps[:200_000, None] >> np.arange(64, dtype=np.uint64)) & np.uint64(1)).mean(axis=0)
    assert np.all(np.abs(bits - 0.5) < 0.006)
    # Negative int64 ids are their two's-complement uint64.
    assert fingerprint(np.array([-1]), SALT)[0] == \
        fingerprint(np.array([2 ** 64 - 1], dtype=np.uint64), SALT)[0]


def test_string_fingerprints_do_not_depend_on_the_batch():
    words = ["", "a", "ab", "abcdefgh", "abcdefghi", "é" * 9, "x" * 64, "y" * 65, "y" * 200,
             "a\x00", "a"]
    whole = fingerprint(pa.array(words), SALT)
    one_by_one = np.array([fingerprint([w], SALT)[0] for w in words], np.uint64)
    assert np.array_equal(whole, one_by_one)
    assert whole[1] == whole[-1]
    assert len(set(whole[:-1].tolist())) == len(words) - 1  # "a" vs "a\x00" differ: length mixed
    as_bytes = fingerprint(pa.array([w.encode() for w in words], pa.binary()), SALT)
    assert np.array_equal(whole, as_bytes)
    sliced = pa.array(words).slice(3, 5)
    assert np.array_equal(fingerprint(sliced, SALT), whole[3:8])


def test_fingerprint_rejects_nulls_and_floats():
    with pytest.raises(ValueError, match="nulls"):
        fingerprint(pa.array(["a", None]), SALT)
    with pytest.raises(TypeError, match="floating"):
        fingerprint(np.array([1.0, 2.0]), SALT)


# ----------------------------------------------------------------------------- registers

@pytest.mark.parametrize("decay_rate", [10.0, 0.0])
def test_register_choice_follows_the_truncated_exponential(decay_rate):
    cfg = SketchConfig(num_registers=64, decay_rate=decay_rate)
    ids = np.random.default_rng(1).integers(0, 2 ** 62, 400_000)
    counts = np.bincount(cfg.registers_of(fingerprint(ids, SALT)), minlength=64)
    expected = cfg.register_probabilities() * ids.size
    assert stats.chisquare(counts, expected).pvalue > 1e-4
    if decay_rate:
        assert counts[0] > 20 * counts[-1]  # register 0 is the busiest


def test_register_formula_matches_the_reference():
    cfg = SketchConfig(num_registers=100_000, decay_rate=10.0)
    u = np.array([0.0, 0.25, 0.5, 0.999999])
    fps = (u * 2.0 ** 64).astype(np.uint64)
    a = 10.0
    x = 1 - np.log(np.exp(a) + u * (1 - np.exp(a))) / a  # LiquidLegions register (WFA any-sketch)
    assert np.array_equal(cfg.registers_of(fps), np.floor(x * cfg.num_registers).astype(int))


def test_config_validation():
    with pytest.raises(ValueError, match="num_registers"):
        SketchConfig(num_registers=0, decay_rate=10)
    with pytest.raises(ValueError, match="decay_rate"):
        SketchConfig(num_registers=10, decay_rate=-1)
    with pytest.raises(ValueError, match="max_frequency"):
        LiquidLegionsSketch.empty(SketchConfig(num_registers=10, decay_rate=1), SALT).frequency_histogram(0)


# ----------------------------------------------------------------------------- sketch contents

def _sketch(ids, impressions=None, m=16, a=3.0, salt=SALT):
    return LiquidLegionsSketch.from_ids(SketchConfig(num_registers=m, decay_rate=a), salt, np.asarray(ids, np.int64),
                                        None if impressions is None else np.asarray(impressions))


def test_registers_hold_counts_and_a_unique_key():
    cfg = SketchConfig(num_registers=8, decay_rate=0.0)
    ids = np.arange(200, dtype=np.int64)
    regs = cfg.registers_of(fingerprint(ids, SALT))
    # Find two ids sharing a register and one alone in its register.
    by_reg = {r: ids[regs == r] for r in np.unique(regs)}
    sk = LiquidLegionsSketch.from_ids(cfg, SALT, np.r_[ids, ids[:3]])
    assert sk.counts.sum() == 203
    assert all(sk.collided[r] == (len(v) > 1) for r, v in by_reg.items())
    lone = LiquidLegionsSketch.from_ids(cfg, SALT, np.array([7, 7, 7]))
    r7 = regs[7]
    assert lone.counts[r7] == 3 and not lone.collided[r7]
    assert lone.keys[r7] == fingerprint(np.array([7]), SALT)[0]
    assert lone.frequency_histogram(2).tolist() == [0, 1]  # 3 impressions -> the "2+" bin
    assert lone.frequency_histogram(5).tolist() == [0, 0, 1, 0, 0]


def test_impression_weights_equal_repeated_rows():
    ids = np.array([5, 9, 5, 11, 9, 5], np.int64)
    weighted = _sketch([5, 9, 11], [3, 2, 1])
    assert weighted == _sketch(ids)
    with pytest.raises(ValueError, match="impressions"):
        _sketch([5, 9], [1, 0])


def test_frequency_histogram_skips_collided_and_caps():
    sk = LiquidLegionsSketch.empty(SketchConfig(num_registers=6, decay_rate=1.0), SALT)
    sk.counts[:] = [0, 1, 4, 2, 7, 3]
    sk.collided[:] = [False, False, False, False, False, True]
    assert sk.active_registers() == 5
    assert sk.frequency_histogram(3).tolist() == [1, 1, 2]


id_lists = st.lists(st.integers(min_value=0, max_value=40), max_size=30)


@settings(max_examples=60, deadline=None)
@given(id_lists, id_lists, id_lists)
def test_merge_laws(xs, ys, zs):
    a, b, c = _sketch(xs), _sketch(ys), _sketch(zs)
    empty = LiquidLegionsSketch.empty(a.config, SALT)
    assert a.merge(b) == b.merge(a)
    assert a.merge(b).merge(c) == a.merge(b.merge(c))
    assert a.merge(empty) == a == empty.merge(a)
    # Merging partial sketches equals building from all rows at once.
    assert a.merge(b).merge(c) == _sketch(xs + ys + zs)
    # Union is not idempotent on counts (impressions add up) but is on the key state.
    aa = a.merge(a)
    assert np.array_equal(aa.collided, a.collided) and np.array_equal(aa.counts, 2 * a.counts)


def test_merge_rejects_incompatible_sketches():
    a = _sketch([1, 2])
    with pytest.raises(ValueError, match="salt"):
        a.merge(_sketch([1, 2], salt=FingerprintSalt.for_campaign("other")))
    with pytest.raises(ValueError, match="config"):
        a.merge(_sketch([1, 2], m=17))
    with pytest.raises(ValueError, match="at least one"):
        LiquidLegionsSketch.union([])


def test_pickle_round_trip_is_compact():
    import pickle

    sk = LiquidLegionsSketch.from_ids(SketchConfig(num_registers=100_000, decay_rate=10), SALT, np.arange(1000))
    data = pickle.dumps(sk)
    assert pickle.loads(data) == sk
    assert len(data) < 40_000  # sparse: only the ~1000 active registers travel


# ----------------------------------------------------------------------------- estimators

def test_expected_active_matches_exact_register_sum():
    cfg = SketchConfig(num_registers=100_000, decay_rate=10.0)
    p = cfg.register_probabilities()
    for n in [100, 10_000, 1_000_000, 10_000_000]:
        exact = np.sum(-np.expm1(n * np.log1p(-p)))
        assert expected_active_registers(n, cfg) == pytest.approx(exact, rel=1e-4)
        assert estimate_reach(exact, cfg) == pytest.approx(n, rel=1e-3)
    uniform = SketchConfig(num_registers=1000, decay_rate=0.0)
    assert estimate_reach(expected_active_registers(700, uniform), uniform) == pytest.approx(700)


@pytest.mark.parametrize("n", [3_000, 60_000, 400_000])
def test_reach_estimator_is_unbiased(n):
    cfg = SketchConfig(num_registers=20_000, decay_rate=10.0)
    rng = np.random.default_rng(n)
    rel = []
    for run in range(40):
        ids = rng.choice(2 ** 62, n, replace=False) if n < 10_000 else \
            rng.integers(0, 2 ** 62, n)
        sk = LiquidLegionsSketch.from_ids(cfg, FingerprintSalt.for_campaign(f"u{run}"), ids)
        rel.append(estimate_reach(sk.active_registers(), cfg) / n - 1)
    rel = np.array(rel)
    stderr = rel.std(ddof=1) / np.sqrt(rel.size)
    assert abs(rel.mean()) < max(4 * stderr, 0.002), (rel.mean(), stderr)
    assert np.mean(np.abs(rel) < 0.05) >= 0.95


def test_frequency_estimator_is_unbiased_despite_collisions():
    cfg = SketchConfig(num_registers=5_000, decay_rate=10.0)
    rng = np.random.default_rng(3)
    n, k = 100_000, 5  # ~20 people per register at the dense end: many collisions
    truth = np.array([0.4, 0.25, 0.15, 0.1, 0.1])
    estimates = []
    for run in range(40):
        freq = rng.choice(np.arange(1, k + 1), n, p=truth)
        freq[freq == k] += rng.integers(0, 3, int((freq == k).sum()))  # "5+" holds 5, 6, 7
        sk = LiquidLegionsSketch.from_ids(cfg, FingerprintSalt.for_campaign(f"f{run}"),
                                          rng.integers(0, 2 ** 62, n), freq)
        estimates.append(frequency_distribution(sk.frequency_histogram(k)))
    mean = np.mean(estimates, axis=0)
    assert shuffle_distance(mean, truth) < 0.015
    # Each run samples only ~500 non-collided registers: still well within 80/20.
    assert all(shuffle_distance(e, truth) < 0.1 for e in estimates)
    # Counting collided registers too would be biased towards high frequencies.
    sk_all = np.bincount(np.minimum(sk.counts[sk.counts > 0], k) - 1, minlength=k)
    assert shuffle_distance(frequency_distribution(sk_all), truth) > 0.1


def test_estimators_on_noisy_inputs():
    cfg = SketchConfig(num_registers=1000, decay_rate=10.0)
    assert estimate_reach(-5, cfg) == 0.0
    assert estimate_reach(0, cfg) == 0.0
    assert np.isfinite(estimate_reach(5000, cfg))  # clamped to m - 1 registers
    assert estimate_reach(999, cfg) == estimate_reach(5000, cfg)
    # The E1 formula is the Poisson limit: off by ~a/(2m) relative at tiny reach.
    assert estimate_reach(1, cfg) == pytest.approx(1.0, rel=1e-2)
    dist = frequency_distribution([-3, 2, 6])
    assert dist.tolist() == [0.0, 0.25, 0.75]
    assert frequency_distribution([-1, 0, -2]).tolist() == [0.0, 0.0, 0.0]
    assert k_reach(100, dist).tolist() == [0.0, 25.0, 75.0]
    assert k_plus_reach(100, dist).tolist() == [100.0, 100.0, 75.0]
    assert shuffle_distance([1, 0], [0, 1]) == 1.0


# ----------------------------------------------------------------------------- row rules

CFG = SketchConfig(num_registers=1000, decay_rate=10.0)


def _salt_of(campaign):
    return FingerprintSalt.for_campaign(campaign)


def test_rows_with_missing_or_undeclared_fields_are_dropped_and_counted():
    table = pa.table({
        "publisher": ["p1", "p1", "p2", None, "p3", "", "p1", "p2"],
        "campaign": ["c1", "c1", "c1", "c1", "c1", "c1", "c1", None],
        "vid": ["1", " 2 ", "x", "3", "4", "5", None, "6"],
    })
    out, counts = partial_sketches(table, config=CFG, salt_of=_salt_of, campaigns=["c1"],
                                   publishers=["p1", "p2"])
    assert (counts.rows, counts.used, counts.missing_id, counts.missing_key,
            counts.undeclared_key) == (8, 2, 2, 3, 1)
    assert dict(out)[("c1", "p1")] == LiquidLegionsSketch.from_ids(CFG, _salt_of("c1"),
                                                                  np.array([1, 2]))
    assert ("c1", "p2") not in dict(out)  # its only row had an unusable id


def test_int_and_string_id_rules():
    ok, ids = normalise_ids(pa.array(["7", "-3", "+4", "", "1e3", "99999999999999999999", None]),
                            IdType.INT)
    assert ok.tolist() == [True, True, True, False, True, False, False]
    assert ids[:3].tolist() == [7, -3, 4] and ids[4] == 1000  # "1e3" is the number 1000
    ok, ids = normalise_ids(pa.array([1.0, 2.5, float("nan")]), "int")
    assert ok.tolist() == [True, False, False]
    ok, ids = normalise_ids(pa.array([2 ** 64 - 1, 5], pa.uint64()), "int")
    assert ok.tolist() == [False, True]
    ok, ids = normalise_ids(pa.array([12, None, 3]), IdType.STRING)
    assert ok.tolist() == [True, False, True] and ids[0].as_py() == "12"
    ok, _ = normalise_ids(pa.array(["a", " ", ""]), "string")
    assert ok.tolist() == [True, False, False]
    with pytest.raises(UnitIdError, match="person id"):  # a type that cannot hold ids
        normalise_ids(pa.array([True]), "int")


@pytest.mark.parametrize("id_type", ["int", "string"])
def test_one_person_whatever_the_id_type_of_the_column(id_type):
    """7 (int64), 7.0 (float64, pandas' integer column with a null), "7", " +007 " and "７" are
    one person: one register with 5 impressions, not five people."""
    batches = [pa.table({"publisher": ["p"], "campaign": ["c"], "vid": pa.array([7], pa.int64())}),
               pa.table({"publisher": ["p", "p"], "campaign": ["c", "c"],
                         "vid": pa.array([7.0, None], pa.float64())}),
               pa.table({"publisher": ["p"] * 3, "campaign": ["c"] * 3, "vid": ["7", " +007 ", "７"]})]
    sketches = [dict(partial_sketches(b, config=CFG, salt_of=_salt_of, id_type=id_type)[0])[("c", "p")]
                for b in batches]
    merged = sketches[0].copy()
    for sketch in sketches[1:]:
        merged.merge_in_place(sketch)
    assert merged.active_registers() == 1
    assert merged.frequency_histogram(10).tolist() == [0, 0, 0, 0, 1, 0, 0, 0, 0, 0]


def test_int_ids_read_as_text_or_numbers_give_the_same_sketch():
    ids = np.random.default_rng(0).integers(-2 ** 40, 2 ** 40, 5000)
    as_int = pa.table({"publisher": ["p"] * 5000, "campaign": ["c"] * 5000, "vid": ids})
    as_text = as_int.set_column(2, "vid", pa.array([str(v) for v in ids]))
    a, _ = partial_sketches(as_int, config=CFG, salt_of=_salt_of, campaigns=["c"],
                            publishers=["p"])
    b, _ = partial_sketches(as_text, config=CFG, salt_of=_salt_of, campaigns=["c"],
                            publishers=["p"])
    assert a == b


def test_single_id_publisher_and_empty_batch():
    table = pa.table({"publisher": ["solo"] * 4, "campaign": ["c"] * 4, "vid": [42] * 4})
    out, counts = partial_sketches(table, config=CFG, salt_of=_salt_of, campaigns=["c"],
                                   publishers=["solo"])
    (key, sk), = out
    assert key == ("c", "solo") and sk.active_registers() == 1
    assert sk.frequency_histogram(10)[3] == 1
    assert estimate_reach(sk.active_registers(), CFG) == pytest.approx(1.0, rel=1e-2)
    out, counts = partial_sketches(table.slice(0, 0), config=CFG, salt_of=_salt_of,
                                   campaigns=["c"], publishers=["solo"])
    assert out == [] and counts.rows == 0


def test_missing_columns_fail_naming_them():
    table = pa.table({"publisher": ["p"], "campaign_id": ["c"], "vid": [1]})
    with pytest.raises(ValueError, match=r"missing column\(s\) \['campaign'\]"):
        partial_sketches(table, config=CFG, salt_of=_salt_of, campaigns=["c"], publishers=["p"])
    cols = ImpressionColumns(campaign="campaign_id")
    out, _ = partial_sketches(table, config=CFG, salt_of=_salt_of, columns=cols,
                              campaigns=["c"], publishers=["p"])
    assert len(out) == 1
