"""ARA algorithm S (summary report), R and JSON report validation."""
import json
import math

import numpy as np
import pytest

from accounting.verification.dp_tester import DPTester
from transforms.ara.contribution import CONTRIBUTION_BUDGET, bound_contributions
from transforms.ara.reports import ReportFault, format_report, parse_report
from transforms.ara.summary import (BucketDomain, add_summary_noise, bucket_streams,
                                    keys_to_hi_lo, noisy_summary, parse_output_domain,
                                    reconstruct, sum_by_bucket, summary_noise_spec,
                                    summary_noise_variance)
from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams

BIG = (1 << 127) + 5  # a key that needs all 128 bits


# --- algorithm S math ------------------------------------------------------------------------

def test_domain_lookup_with_128_bit_keys():
    domain = BucketDomain([BIG, 3, 1 << 64, 3])
    assert len(domain) == 3 and domain.keys == [3, 1 << 64, BIG]
    hi, lo = keys_to_hi_lo([BIG, 4, 1 << 64, 3])
    assert domain.index(hi, lo).tolist() == [2, -1, 1, 0]


def test_sum_by_bucket_drops_unknown_and_keeps_empty_declared():
    domain = BucketDomain([10, 20, 30])
    hi, lo = keys_to_hi_lo([10, 10, 99, 30])
    sums, unknown = sum_by_bucket(domain, hi, lo, np.array([5, 6, 1000, 7]))
    assert sums.tolist() == [11, 0, 7] and unknown == 1


def test_noise_scale_and_epsilon_limit():
    spec = summary_noise_spec(2.0)
    assert spec.scale == pytest.approx(CONTRIBUTION_BUDGET / 2.0)
    assert spec.variance == pytest.approx(summary_noise_variance(2.0), rel=1e-6)
    for bad in (0, -1, 64.5, float("nan")):
        with pytest.raises(ValueError, match="epsilon"):
            summary_noise_spec(bad)
    summary_noise_spec(64)


def test_declared_empty_bucket_gets_noise_and_noise_is_keyed_per_bucket():
    key = ReleaseKey.for_testing(5)
    keys = [1, 2, BIG]
    sums = np.zeros(3, dtype=np.int64)
    a = noisy_summary(sums, keys, 1.0, key)
    assert a.dtype == np.int64 and np.count_nonzero(a) >= 2  # P(DLap(65536) = 0) ~ 8e-6
    # the noise of a bucket does not depend on the other buckets or their order
    b = noisy_summary(np.zeros(2, dtype=np.int64), [BIG, 1], 1.0, key)
    assert b.tolist() == [a[2], a[0]]
    assert noisy_summary(sums, keys, 1.0, ReleaseKey.for_testing(6)).tolist() != a.tolist()


def test_reconstruction_unbiased_with_summary_noise():
    # E[R(S(sum))] = sum * C / b: noise has mean zero (checked over many buckets).
    n = 200_000
    key = ReleaseKey.for_testing(9)
    sums = np.full(n, 12345, dtype=np.int64)
    noisy = add_summary_noise(sums, 32.0, RandomStreams.for_range(key, "r", n))
    est = reconstruct(noisy, 50.0 / 4096)
    se = math.sqrt(summary_noise_variance(32.0) / n) * 50.0 / 4096
    assert abs(est.mean() - 12345 * 50.0 / 4096) < 5 * se


# --- DP of the summary noise (statistical tester) --------------------------------------------

def _summary_sampler(bucket_sums, epsilon, seed):
    """n independent summary reports of two declared buckets with the given exact sums."""
    key = ReleaseKey.for_testing(seed)

    def sample(n):
        tiled = np.tile(np.asarray(bucket_sums, dtype=np.int64), n)
        out = add_summary_noise(tiled, epsilon, RandomStreams.for_range(key, "dp-test", 2 * n))
        return out.reshape(n, 2)
    return sample


def _neighbouring_sums(apply_bounding: bool):
    """Bucket sums of D and of D' = D + source 3, whose three reports go to buckets 100, 200, 200."""
    domain = BucketDomain([100, 200])
    src = np.array([0, 1, 2, 3, 3, 3])
    keys = [100, 200, 200, 100, 200, 200]
    vals = np.array([4464, 65536, 57929, 60000, 60000, 5536])
    keep = bound_contributions(src, vals) if apply_bounding else np.ones(len(src), bool)

    def sums(with_source_3):
        rows = [i for i in range(len(src)) if keep[i] and (with_source_3 or src[i] != 3)]
        hi, lo = keys_to_hi_lo([keys[i] for i in rows])
        return sum_by_bucket(domain, hi, lo, vals[rows])[0]
    return sums(False), sums(True)


def test_summary_noise_passes_dp_tester_for_a_full_budget_source():
    d, d_prime = _neighbouring_sums(apply_bounding=True)
    assert np.abs(d_prime - d).sum() == CONTRIBUTION_BUDGET  # the source spends its full budget
    tester = DPTester(n_samples=100_000)
    result = tester.run(_summary_sampler(d, 1.0, 1), _summary_sampler(d_prime, 1.0, 2),
                        epsilon=1.0)
    assert result.passed, result


def test_dp_tester_catches_a_source_that_bypasses_bounding():
    d, d_prime = _neighbouring_sums(apply_bounding=False)
    assert np.abs(d_prime - d).sum() == 125536  # C would have kept 65536
    tester = DPTester(n_samples=100_000)
    result = tester.run(_summary_sampler(d, 1.0, 3), _summary_sampler(d_prime, 1.0, 4),
                        epsilon=1.0)
    assert not result.passed, result


# --- JSON aggregatable reports ---------------------------------------------------------------

def _line(**over):
    obj = {"source_id": "imp-1", "order": 2,
           "contributions": [{"bucket": "0x" + "0" * 31 + "5", "value": 100},
                             {"bucket": str(BIG), "value": 65000}]}
    obj.update(over)
    return json.dumps(obj)


def test_parse_valid_report_roundtrip():
    r = parse_report(_line())
    assert r.source_id == "imp-1" and r.order == 2 and r.contributions == ((5, 100), (BIG, 65000))
    assert r.total == 65100 - 0 and parse_report(format_report(r)) == r
    assert parse_report('{"source_id": 17, "contributions": []}').order == 0


@pytest.mark.parametrize("line,reason", [
    ("{not json", "malformed_json"),
    ("[1, 2]", "malformed_json"),
    (_line(source_id=None), "missing_source_id"),
    (_line(order=-1), "bad_order"),
    (_line(contributions={"bucket": 1}), "malformed_contributions"),
    (_line(contributions=[{"bucket": 1}]), "malformed_contributions"),
    (_line(contributions=[{"bucket": "0x1" + "0" * 32, "value": 1}]), "bad_bucket_key"),
    (_line(contributions=[{"bucket": str(2**128), "value": 1}]), "bad_bucket_key"),
    (_line(contributions=[{"bucket": "-3", "value": 1}]), "bad_bucket_key"),
    (_line(contributions=[{"bucket": 1, "value": -5}]), "negative_value"),
    (_line(contributions=[{"bucket": 1, "value": 2.5}]), "bad_value"),
    (_line(contributions=[{"bucket": 1, "value": "7"}]), "bad_value"),
    (_line(contributions=[{"bucket": 1, "value": 65537}]), "bad_value"),
    (_line(contributions=[{"bucket": 1, "value": 40000}, {"bucket": 2, "value": 30000}]),
     "report_over_budget"),
])
def test_bad_reports_rejected_with_reason(line, reason):
    with pytest.raises(ReportFault) as e:
        parse_report(line)
    assert e.value.reason == reason


def test_output_domain_file_parsing():
    d = parse_output_domain(f"# declared\n0x10\n\n{BIG}  # big\n16\n")
    assert d.keys == [16, BIG]
    with pytest.raises(ValueError, match="line 1"):
        parse_output_domain("0x" + "1" * 33)
    with pytest.raises(ValueError, match="at least one"):
        parse_output_domain("# nothing\n")


def test_bucket_streams_accept_128_bit_keys():
    s = bucket_streams(ReleaseKey.for_testing(1), [BIG, 0])
    assert s.size == 2
