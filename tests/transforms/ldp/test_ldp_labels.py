"""Label randomization for a training export: transition/debias matrices, RR-with-prior, Beam."""
import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to

from accounting.keys import KeyReuseError, ReleaseKey
from transforms.ldp import KeyedRandomness
from transforms.ldp.beam import RandomizeLabels
from transforms.ldp.labels import (LabelRandomizer, debias_table, estimate_label_counts,
                                   label_counts, randomize_label_indices, randomize_label_table)


def test_rr_matrices_and_unbiased_class_counts():
    rr = LabelRandomizer(epsilon=1.0, labels=(0, 1, 2))
    e = math.exp(1.0)
    p, q = rr.probabilities()
    assert p == pytest.approx(e / (e + 2), abs=2 ** -32) and q == pytest.approx((1 - p) / 2)
    T = rr.transition_matrix()
    assert np.allclose(T.sum(axis=0), 1.0)
    assert np.allclose(rr.debias_matrix() @ T, np.eye(3))
    assert rr.realised_epsilon <= 1.0
    labels = np.repeat([0, 1, 2], [6000, 3000, 1000])
    source = KeyedRandomness.for_testing(2)
    estimates = []
    for run in range(40):
        out = randomize_label_indices(rr, labels, source=KeyedRandomness.for_testing(run),
                                      ids=np.arange(labels.size))
        estimates.append(estimate_label_counts(rr, np.bincount(out, minlength=3))[0])
    estimates = np.array(estimates)
    _, std = estimate_label_counts(rr, np.array([6000, 3000, 1000]))
    assert np.all(np.abs(estimates.mean(axis=0) - [6000, 3000, 1000]) < 4 * std / math.sqrt(40))
    assert source.is_testing


def test_rr_with_prior_keeps_the_best_top_k():
    e = math.exp(0.5)
    prior = (0.55, 0.3, 0.1, 0.05)
    rr = LabelRandomizer(epsilon=0.5, labels=("a", "b", "c", "d"), prior=prior)
    objective = [sum(sorted(prior, reverse=True)[:k]) * e / (e + k - 1) for k in range(1, 5)]
    assert len(rr.support) == int(np.argmax(objective)) + 1
    T = rr.transition_matrix()
    assert np.allclose(T.sum(axis=0), 1.0)
    outside = [i for i in range(4) if i not in rr.support]
    assert all(T[i].sum() == 0 for i in outside)  # labels outside the support never appear
    assert rr.debias_matrix() is None
    assert rr.realised_epsilon <= 0.5
    with pytest.raises(ValueError, match="not identifiable"):
        estimate_label_counts(rr, [1, 2, 3, 4])


def test_bad_declarations_are_refused():
    with pytest.raises(ValueError, match="two distinct"):
        LabelRandomizer(epsilon=1, labels=("a",))
    with pytest.raises(ValueError, match="two distinct"):
        LabelRandomizer(epsilon=1, labels=("a", "a"))
    with pytest.raises(ValueError, match="prior"):
        LabelRandomizer(epsilon=1, labels=("a", "b"), prior=(1.0,))
    with pytest.raises(ValueError, match="local epsilon"):
        LabelRandomizer(epsilon=-1, labels=("a", "b"))


def test_table_randomization_keeps_every_row_and_is_keyed_by_example_id():
    rr = LabelRandomizer(epsilon=2.0, labels=("no", "yes"))
    table = pa.table({"example": pa.array(["e%d" % i for i in range(1000)]),
                      "feature": np.arange(1000),
                      "label": pa.array(["yes", "no", None, "maybe"] * 250)})
    source = KeyedRandomness.for_testing(3, "labels")
    out, undeclared = randomize_label_table(rr, table, label_column="label", id_column="example",
                                            source=source, unbiased_column="label_unbiased")
    assert undeclared == 500 and out.num_rows == 1000
    assert out.column("feature").equals(table.column("feature"))
    assert set(out.column("label").to_pylist()) <= {"no", "yes"}
    # Unbiased binary label: (1[yes] - q) / (p - q), its mean estimates the share of "yes".
    p, q = rr.probabilities()
    unbiased = out.column("label_unbiased").to_numpy()
    assert set(np.round(unbiased, 9)) == {round(-q / (p - q), 9), round((1 - q) / (p - q), 9)}
    # Same ids, same output, in any batching.
    again, _ = randomize_label_table(rr, table.slice(500), label_column="label",
                                     id_column="example", source=source)
    assert again.column("label").equals(out.slice(500).column("label"))
    with pytest.raises(ValueError, match="do not fit the label column"):
        randomize_label_table(LabelRandomizer(epsilon=1, labels=(1.5, 2.5)),
                              pa.table({"i": [1], "label": pa.array([True])}),
                              label_column="label", id_column="i", source=source)
    with pytest.raises(ValueError, match="needs an example id column"):
        randomize_label_table(rr, table, label_column="label", id_column=None, source=source)


def test_multiclass_unbiased_vectors_and_debias_table():
    rr = LabelRandomizer(epsilon=1.0, labels=(3, 5, 7))
    table = pa.table({"id": np.arange(9), "label": [3, 5, 7] * 3})
    out, _ = randomize_label_table(rr, table, label_column="label", id_column="id",
                                   source=KeyedRandomness.for_testing(4), unbiased_column="soft")
    soft = np.array(out.column("soft").to_pylist())
    assert soft.shape == (9, 3) and np.allclose(soft.sum(axis=1), 1.0)
    debias = debias_table(rr, label_counts(rr, out, "label"))
    assert debias.column("label").to_pylist() == ["3", "5", "7"]
    assert sum(debias.column("randomized_count").to_pylist()) == 9


def test_beam_randomize_labels_matches_the_pure_function_and_claims_its_key():
    rr = LabelRandomizer(epsilon=1.0, labels=("cat", "dog", "fish"))
    rows = pa.table({"id": np.arange(600, dtype=np.int64),
                     "label": pa.array(["cat", "dog", "fish"] * 200)})
    key = ReleaseKey.for_testing(11)
    expected, _ = randomize_label_table(rr, rows, label_column="label", id_column="id",
                                        source=KeyedRandomness(key, "labels"))
    expected_debias = debias_table(rr, label_counts(rr, expected, "label"))
    transform = RandomizeLabels(rr, label_column="label", id_column="id", release_key=key)
    with TestPipeline() as p:
        out = p | beam.Create([rows.slice(0, 250), rows.slice(250)]) | transform
        assert_that(out["dataset"] | "Rows" >> beam.FlatMap(lambda t: t.to_pylist()),
                    equal_to(expected.to_pylist()), label="dataset")
        assert_that(out["debias"] | "Debias" >> beam.FlatMap(lambda t: t.to_pylist()),
                    equal_to(expected_debias.to_pylist()), label="debias")
    with pytest.raises(KeyReuseError):
        with TestPipeline() as p:
            _ = p | beam.Create([rows]) | transform
