"""Client randomizers, randomness sources and report formats (validation of bad input)."""
import sys
import subprocess

import numpy as np
import pyarrow as pa
import pytest

from accounting.keys import ReleaseKey
from transforms.ldp import KeyedRandomness, SystemRandomness, make_oracle
from transforms.ldp.estimators import count_support, candidate_values, estimate_frequencies
from transforms.ldp.randomizers import randomize
from transforms.ldp.randomness import threshold_ceil, threshold_floor, uniform_below
from transforms.ldp.reports import check_schema, report_arrays, report_schema

ORACLES = [("binary_rr", 2), ("grr", 100), ("sue", 20), ("oue", 20), ("rappor", 20),
           ("olh", 1 << 20)]


def test_package_imports_without_beam():
    code = ("import sys, transforms.ldp, transforms.ldp.pem, transforms.ldp.shuffle, "
            "transforms.ldp.labels, transforms.ldp.simulate, transforms.ldp.evaluation; "
            "assert 'apache_beam' not in sys.modules")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("name, d", ORACLES)
def test_keyed_reports_depend_on_key_and_id_only_not_on_batching(name, d):
    oracle = make_oracle(name, epsilon=1.0, domain_size=d)
    values = np.arange(3000) % d
    ids = np.arange(10_000, 13_000)
    source = KeyedRandomness(ReleaseKey.for_testing(8), "clients")
    whole = randomize(oracle, values, source=source, ids=ids)
    parts = pa.concat_tables([randomize(oracle, values[i:i + 700], source=source,
                                        ids=ids[i:i + 700]) for i in range(0, 3000, 700)])
    assert whole.equals(parts)
    other_key = randomize(oracle, values, source=KeyedRandomness(ReleaseKey.for_testing(9),
                                                                 "clients"), ids=ids)
    assert not whole.equals(other_key)
    assert whole.schema == report_schema(oracle)


def test_system_randomness_needs_no_ids_and_is_not_reproducible():
    oracle = make_oracle("grr", epsilon=0.5, domain_size=50)
    values = np.zeros(2000, dtype=np.int64)
    a = randomize(oracle, values, source=SystemRandomness())
    b = randomize(oracle, values)  # the default: the OS CSPRNG, as on a client device
    assert a.num_rows == 2000 and not a.equals(b)
    with pytest.raises(ValueError, match="needs one integer id per client"):
        randomize(oracle, values, source=KeyedRandomness.for_testing(1))


def test_grid_thresholds_and_exact_uniform_choice():
    assert threshold_floor(0.5) == threshold_ceil(0.5) == 1 << 31
    assert threshold_floor(1 / 3) + 1 == threshold_ceil(1 / 3)
    # Rejected values (the top partial range) are redrawn: only accepted ones are reduced.
    u = np.array([0, 5, (1 << 32) - 1, (1 << 32) - 2], dtype=np.uint64)
    redraws = []

    def redraw(positions, round_):
        redraws.append(positions.tolist())
        return np.full(positions.size, 7, dtype=np.uint64)

    out = uniform_below(u, 3, redraw)
    assert redraws == [[2]] and out.tolist() == [0, 2, 1, (1 << 32) - 2 - 3 * ((1 << 32) // 3 - 1)]
    with pytest.raises(ValueError):
        uniform_below(u, 0, redraw)


def test_values_outside_the_domain_or_null_are_refused():
    oracle = make_oracle("grr", epsilon=1, domain_size=10)
    source = KeyedRandomness.for_testing(1)
    with pytest.raises(ValueError, match=r"values must be in \[0, 10\)"):
        randomize(oracle, [1, 10], source=source, ids=[0, 1])
    with pytest.raises(ValueError, match=r"must be in \[0, 10\)"):
        randomize(oracle, [-1, 3], source=source, ids=[0, 1])
    with pytest.raises(ValueError, match="null values"):
        randomize(oracle, pa.array([1, None]), source=source, ids=[0, 1])
    with pytest.raises(ValueError, match="integers"):
        randomize(oracle, np.array([0.5]), source=source, ids=[0])
    with pytest.raises(ValueError, match="2 ids for 3 values"):
        randomize(oracle, [1, 2, 3], source=source, ids=[0, 1])
    with pytest.raises(ValueError, match="must not be negative"):
        randomize(oracle, [1], source=source, ids=[-4])


def test_schema_faults_are_clear_errors():
    source = KeyedRandomness.for_testing(2)
    oue = make_oracle("oue", epsilon=1, domain_size=20)
    reports = randomize(oue, np.arange(20), source=source, ids=np.arange(20))
    # Reports of another oracle or parameters are refused by their metadata.
    with pytest.raises(ValueError, match="randomized as .*oue.* but are being aggregated as"):
        report_arrays(make_oracle("oue", epsilon=2, domain_size=20), reports)
    # Wrong width: bits of a 20-value domain read as a 40-value domain (metadata stripped).
    stripped = reports.replace_schema_metadata(None)
    with pytest.raises(ValueError, match="needs 5 bytes"):
        report_arrays(make_oracle("oue", epsilon=1, domain_size=40), stripped)
    with pytest.raises(ValueError, match="need a column 'report'"):
        check_schema(make_oracle("grr", epsilon=1, domain_size=20), stripped.schema)
    olh = make_oracle("olh", epsilon=1, domain_size=1 << 20)
    olh_reports = randomize(olh, np.arange(5), source=source, ids=np.arange(5))
    with pytest.raises(ValueError, match="hash functions of 2 digits, but domain 1000 needs 1"):
        report_arrays(make_oracle("olh", epsilon=1, domain_size=1000),
                      olh_reports.replace_schema_metadata(None))
    with pytest.raises(TypeError, match="pyarrow Table"):
        report_arrays(olh, [1, 2])


def test_row_faults_raise_or_are_dropped_and_counted():
    grr = make_oracle("grr", epsilon=1, domain_size=10)
    table = pa.table({"report": pa.array([1, 12, None, 3, -1], pa.int64())})
    with pytest.raises(ValueError, match="row 1 is out of the domain"):
        report_arrays(grr, table)
    arrays = report_arrays(grr, table, on_invalid="drop")
    assert (arrays.n, arrays.dropped_out_of_domain, arrays.dropped_null) == (2, 2, 1)
    assert arrays.report.tolist() == [1, 3]
    olh = make_oracle("olh", epsilon=1, domain_size=100)  # g = 4 buckets
    reports = randomize(olh, np.arange(4), source=KeyedRandomness.for_testing(1), ids=np.arange(4))
    bad = reports.set_column(2, "report", pa.array([0, 4, 1, 3], pa.uint16()))
    with pytest.raises(ValueError, match="4 buckets"):
        report_arrays(olh, bad)
    assert report_arrays(olh, bad, on_invalid="drop").dropped_out_of_domain == 1
    # Unary padding bits beyond the domain must be zero.
    oue = make_oracle("oue", epsilon=1, domain_size=12)
    padded = pa.table({"bits": pa.array([b"\x00\xf0"], pa.binary(2))},
                      schema=report_schema(oue))
    with pytest.raises(ValueError, match="out of the domain"):
        report_arrays(oue, padded)


def test_csv_style_integer_columns_are_accepted_and_checked():
    grr = make_oracle("grr", epsilon=1, domain_size=10)
    source = KeyedRandomness.for_testing(3)
    reports = randomize(grr, np.arange(10), source=source, ids=np.arange(10))
    widened = pa.table({"report": reports.column("report").cast(pa.int64())})
    assert estimate_frequencies(grr, widened).equals(estimate_frequencies(grr, reports))


def test_candidates_and_full_domain_counts_agree():
    source = KeyedRandomness.for_testing(4)
    for name, d in [("grr", 300), ("oue", 300), ("olh", 300)]:
        oracle = make_oracle(name, epsilon=2, domain_size=d)
        reports = randomize(oracle, np.arange(5000) % d, source=source, ids=np.arange(5000))
        full = count_support(oracle, reports, candidate_values(oracle))
        chosen = np.array([0, 7, 150, 299])
        some = count_support(oracle, reports, candidate_values(oracle, chosen))
        assert np.array_equal(full.support[chosen], some.support) and full.n == some.n == 5000
    with pytest.raises(ValueError, match="give the candidate values"):
        candidate_values(make_oracle("olh", epsilon=1, domain_size=1 << 20))
    with pytest.raises(ValueError, match=r"candidates must be in \[0, 300\)"):
        candidate_values(oracle, [300])
