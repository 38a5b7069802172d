"""One client-randomness interface (transforms/randomness.py): the OS CSPRNG, LDP's keyed source
and Masked LARk's keyed browser source all give the same kinds of draws, and LDP and LARk clients
take any of them."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from transforms.lark.browser import aggregation_reports
from transforms.lark.params import AggregationParams
from transforms.lark.randomness import BrowserRandomness
from transforms.ldp import make_oracle
from transforms.ldp.randomizers import randomize
from transforms.ldp.randomness import KeyedRandomness
from transforms.randomness import RandomSource, SystemRandomness

SOURCES = {"system": SystemRandomness(), "ldp_keyed": KeyedRandomness.for_testing(1, "p"),
           "browser_keyed": BrowserRandomness.for_testing(1)}
KEYED = ("ldp_keyed", "browser_keyed")


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_every_source_gives_words_and_record_draws(name):
    source = SOURCES[name]
    assert isinstance(source, RandomSource) and source.describe()
    ids = np.arange(50)
    words = source.words(ids, 3, "stage")
    assert words.shape == (50, 3) and words.dtype == np.uint64
    assert len(np.unique(words)) == 150  # 64-bit words: no repeats
    lanes = pa.table({"id": ids, "value": ids * 2.5})
    draws = source.records("stage", lanes)
    assert draws.size == 50 and draws.words(2).shape == (50, 2)
    assert source.streams("stage", lanes).size == 50
    assert source.word_at(ids[:4], np.array([0, 1, 2, 0]), "stage").shape == (4,)


@pytest.mark.parametrize("name", KEYED)
def test_keyed_sources_reproduce_per_record_and_separate_stages(name):
    source = SOURCES[name]
    ids = np.arange(20)
    words = source.words(ids, 4, "a")
    assert np.array_equal(source.words(ids[::-1], 4, "a"), words[::-1])  # per record, not per batch
    assert np.array_equal(source.word_at(ids, np.arange(20) % 4, "a"), words[ids, ids % 4])
    assert not np.any(source.words(ids, 4, "b") == words)
    lanes = pa.table({"id": ids, "value": ids * 1.5})
    alone = source.records("r", lanes.slice(3, 1)).words(2)
    assert np.array_equal(alone[0], source.records("r", lanes).words(2)[3])  # content-keyed
    changed = lanes.set_column(1, "value", pa.array(ids * 1.5 + 1))
    assert not np.any(source.records("r", changed).words(2) == source.records("r", lanes).words(2))


def test_system_randomness_is_never_reproducible():
    source = SOURCES["system"]
    assert not source.is_testing
    assert not np.array_equal(source.words(np.arange(8), 2, "s"), source.words(np.arange(8), 2, "s"))
    lanes = pa.table({"id": np.arange(8)})
    assert not np.array_equal(source.records("s", lanes).words(2), source.records("s", lanes).words(2))


@pytest.mark.parametrize("name", sorted(SOURCES))
def test_ldp_and_lark_clients_take_any_source(name):
    source = SOURCES[name]
    oracle = make_oracle("grr", epsilon=1.0, domain_size=8)
    reports = randomize(oracle, np.arange(40) % 8, source=source,
                        ids=None if name == "system" else np.arange(40))
    assert reports.num_rows == 40
    params = AggregationParams(lower=0.0, upper=10.0, epsilon=None, k=0)
    records = pa.table({"record_id": np.arange(2), "batch_id": ["b", "b"], "key": ["a", "b"],
                        "value": [1.0, 2.0]})
    shares = aggregation_reports(records, params, randomness=source)
    assert len(shares) == 2 and shares[0].num_rows == 2
