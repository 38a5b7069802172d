"""Count encodings of ARA summary reports: padding (optionally with a value split) in algorithm A,
algorithm R and the Beam pipeline, against the pure functions."""
import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that

from accounting.keys import ReleaseKey
from transforms.ara.beam import (BoundSourceContributions, EncodeConversions, Reconstruct,
                                 SummaryReport)
from transforms.ara.contribution import ContributionConfig, bound_contributions
from transforms.ara.summary import key_bytes, noisy_summary
from transforms.noise import RandomStreams


def _padding(split=True, **over):
    base = dict(measures=("count", "value"), clip_thresholds=(1.0, 100.0), slice_dimensions=(3,),
                prefixes=(0, 1), budgets=((0, 3000), (0, 5000)), reports_per_source=4,
                encoding="padding")
    if split:
        base.update(split_fractions=(1.0, 0.25), overflow_budgets=((0, 2000), (0, 6000)))
    base.update(over)
    return ContributionConfig(**base)


def test_padding_configs_are_validated():
    with pytest.raises(ValueError, match="must include 'count'"):
        _padding(split=False, measures=("clicks", "value"))
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        _padding(split=False, clip_thresholds=(2.0, 100.0))
    with pytest.raises(ValueError, match="need encoding='padding'"):
        _padding(encoding="separate", budgets=((1, 3000), (1, 5000)))
    with pytest.raises(ValueError, match="overflow_budgets must be >= 1"):
        _padding(overflow_budgets=((0, 0), (0, 6000)))
    with pytest.raises(ValueError, match="count is not split"):
        _padding(split_fractions=(0.5, 0.25))
    with pytest.raises(ValueError, match="exceeds the L1"):
        _padding(overflow_budgets=((0, 2000), (0, 6000)), reports_per_source=5)
    cfg = _padding()
    assert ContributionConfig.from_json(cfg.to_json()) == cfg
    assert cfg.columns == [0, 1, 3] and len(cfg.output_domain()) == 3 * (1 + 3)


def test_split_contributions_are_exact_for_counts_and_unbiased_for_values():
    cfg = _padding()
    values = np.array([[1.0, 5.0], [1.0, 40.0], [1.0, 250.0], [1.0, 0.0]])
    rng = np.random.default_rng(0)
    draws = np.stack([cfg.contributions(values, rng.random((4, 2, 3))) for _ in range(4000)])
    main_and_pad = draws[:, :, :, :2].sum(axis=3)
    assert (main_and_pad == cfg.level_totals()[None, None, :]).all()  # the count is exact
    assert (draws[:, :, :, 2] <= cfg.overflow_array[:, 1][None, None, :]).all()
    scales = cfg.column_scales()
    value = (draws[:, :, :, 1] * scales[None, None, :, 1]
             + draws[:, :, :, 2] * scales[None, None, :, 2])
    expected = np.minimum(values[:, 1], 100.0)
    assert np.allclose(value.mean(axis=0), expected[:, None], atol=1.0)
    # a value below the split never reaches the overflow bucket (its report spends B_l only)
    assert (draws[:, 0, :, 2] == 0).all() and (draws[:, 3, :, 2] == 0).all()


def test_reconstruction_of_each_bucket_kind():
    cfg = _padding()
    # level 1, slice 2: 7 conversions whose clipped values sum to 300, split at 25 (0.25 x 100)
    # into 120 below the split and 180 above it; noiseless sums of the three buckets:
    level, code, n = 1, 2, 7
    b_main, b_over = 5000, 6000
    keys = [cfg.bucket_key(level, c, code) for c in cfg.columns]
    main_sum = 120.0 * b_main / 25.0     # main part: range 25 on budget 5000
    over_sum = 180.0 * b_over / 75.0     # overflow part: range 75 on budget 6000
    pad_sum = n * b_main - main_sum      # padding: every report totals B_l = 5000
    est = cfg.reconstruct_estimates(keys, [pad_sum, main_sum, over_sum])
    assert est[0] == pytest.approx(n)              # padding bucket: the count
    assert est[1] == pytest.approx(300.0)          # main bucket: the whole value
    assert np.isnan(est[2])                        # overflow bucket: part of the main one
    partial = cfg.reconstruct_estimates(keys[:2], [pad_sum, main_sum])
    assert np.isnan(partial[1]) and partial[0] == pytest.approx(n)
    with pytest.raises(KeyError):
        cfg.scale_of_key(cfg.bucket_key(0, 2, 0))  # column 2 would be the count's overflow


def _expected(cfg, table, key, epsilon):
    """Algorithms A, C, S, R with the pure functions and the pipeline's keyed randomness."""
    n = table.num_rows
    sources = [str(s) for s in table.column("source_id").to_pylist()]
    orders = table.column("order").to_pylist()
    lanes = [(s, o, j) for s, o in zip(sources, orders) for j in range(cfg.n_queries)]
    u = RandomStreams.for_keys(key, "ara-randomized-rounding", lanes).uniform_float()
    values = np.column_stack([np.ones(n), table.column("value").to_numpy()])
    contrib = cfg.contributions(values, u.reshape((n, len(cfg.prefixes), len(cfg.columns))))
    keep = bound_contributions(np.array(sources, dtype=object), contrib.sum(axis=(1, 2)),
                               np.array(orders))
    codes = cfg.slice_codes(table.column("dim_0").to_numpy()[:, None])
    domain = cfg.output_domain()
    sums = dict.fromkeys(domain, 0)
    for i in np.flatnonzero(keep):
        for l in range(len(cfg.prefixes)):
            for j, c in enumerate(cfg.columns):
                sums[cfg.bucket_key(l, c, codes[i, l])] += int(contrib[i, l, j])
    noisy = noisy_summary(np.array([sums[k] for k in domain]), domain, epsilon, key)
    estimates = cfg.reconstruct_estimates(domain, noisy)
    return {key_bytes(k): (int(v), None if np.isnan(e) else float(e))
            for k, v, e in zip(domain, noisy, estimates)}


def test_padding_with_split_through_beam_matches_the_pure_algorithms():
    cfg = _padding()
    rng = np.random.default_rng(3)
    n = 60
    table = pa.table({"source_id": pa.array(rng.integers(0, 12, n)),
                      "order": pa.array(np.arange(n)), "dim_0": pa.array(rng.integers(0, 3, n)),
                      "value": pa.array(rng.lognormal(3.0, 1.2, n))})
    expected = _expected(cfg, table, ReleaseKey.for_testing(9), 4.0)
    key = ReleaseKey.for_testing(9)

    def check(rows):
        got = {k: (v, e) for k, v, e in rows}
        assert set(got) == set(expected)
        for k, (v, e) in expected.items():
            assert got[k][0] == v
            assert (got[k][1] is None) == (e is None)
            if e is not None:
                assert got[k][1] == pytest.approx(e)

    with beam.Pipeline(runner="FnApiRunner") as p:
        reports = (p | "Conv" >> beam.Create([table.to_batches()[0]], reshuffle=False)
                   | EncodeConversions(cfg, key))
        contributions = reports | BoundSourceContributions()
        domain = p | "Domain" >> beam.Create([key_bytes(k) for k in cfg.output_domain()])
        noisy = {"contributions": contributions, "domain": domain} | SummaryReport(4.0, key)
        assert_that(noisy | Reconstruct(cfg), check)
