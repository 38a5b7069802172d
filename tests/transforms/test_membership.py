"""The PCollection keyset's membership filter: no false negatives, a small stated false-positive
rate, the same filter however the keyset is split, and false positives never released."""
from __future__ import annotations

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.util import assert_that, equal_to

from accounting.budget import PrivacyBudget
from accounting.sensitivity import ContributionBounds
from transforms.aggregate import Compute, DPAggregate, Keys, Output
from transforms.bounding_stage import _FilterWordsCoder, _KeyFilterFn, _StagedKeyFilterFn
from transforms.keyset import PublicKeyset
from transforms.membership import BITS_PER_KEY, KeyFilter, filter_words
from transforms.metrics import Count

RNG = np.random.default_rng(11)


def _hashes(n):
    return RNG.integers(0, 2 ** 64 - 1, n, dtype=np.uint64, endpoint=True)


def test_every_added_key_is_found_and_few_others_are():
    keys, others = _hashes(400_000), _hashes(400_000)
    filt = KeyFilter.of(keys, filter_words(len(keys)))
    assert filt.words.nbytes == len(keys) * BITS_PER_KEY // 8
    assert filt.contains(keys).all()  # no false negative
    rate = filt.contains(others).mean()
    assert 0.002 < rate < 0.007, rate  # about 0.4% at the size it was built for (module docstring)
    crowded = KeyFilter.of(keys, filter_words(len(keys) // 2))  # twice the keys it was sized for
    assert crowded.contains(keys).all() and crowded.contains(others).mean() < 0.05


def test_the_filter_does_not_depend_on_how_the_keyset_is_split():
    keys = _hashes(50_000)
    words = filter_words(len(keys))
    whole = KeyFilter.of(keys, words).to_bytes()
    parts = [KeyFilter.of(chunk, words) for chunk in np.array_split(keys[::-1], 7)]
    merged = parts[0]
    for part in parts[1:]:
        merged.union(part)
    assert merged.to_bytes() == whole
    with pytest.raises(ValueError, match="cannot be merged"):
        merged.union(KeyFilter.empty(words + 1))


def test_bytes_round_trip_and_an_empty_filter_holds_nothing():
    keys = _hashes(1000)
    filt = KeyFilter.of(keys, filter_words(1000))
    again = KeyFilter.from_bytes(filt.to_bytes())
    assert again.contains(keys).all() and np.array_equal(again.words, filt.words)
    assert not KeyFilter.empty(1).contains(keys).any()
    assert filt.contains(keys[:0]).shape == (0,)
    for bad in (b"", b"1234567"):
        with pytest.raises(ValueError, match="multiple of 8"):
            KeyFilter.from_bytes(bad)


def test_combine_fn_merges_decoded_accumulators_into_the_same_filter():
    chunks = [_hashes(n) for n in (1000, 10, 5000, 0, 300)]
    chunks.append(chunks[0][:100])  # repeated keys
    words = filter_words(sum(len(c) for c in chunks))
    fn, coder = _KeyFilterFn(), _FilterWordsCoder()
    left, right = fn.create_accumulator(), fn.create_accumulator()
    for i, chunk in enumerate(chunks):
        if i % 2:
            left = fn.add_input(left, (words, chunk))
        else:
            right = fn.add_input(right, (words, chunk))
    left = coder.decode(coder.encode(left))  # read-only words, as after a shuffle
    assert not left.flags.writeable
    again = fn.add_input(coder.decode(coder.encode(right)), (words, chunks[0]))  # added to a copy
    assert again.flags.writeable and fn.extract_output(again) == fn.extract_output(right)
    merged = fn.merge_accumulators([fn.create_accumulator(), left, right])
    assert fn.extract_output(merged) == KeyFilter.of(np.concatenate(chunks), words).to_bytes()
    assert coder.decode(coder.encode(None)) is None
    empty = KeyFilter.from_bytes(fn.extract_output(fn.merge_accumulators([None, None])))
    assert not empty.contains(np.concatenate(chunks)).any()


@pytest.mark.parametrize("expected_size,staged", [(1, False), (None, False), (1, True)])
def test_filter_false_positives_are_dropped_at_the_join_and_counted(expected_size, staged, tmp_path):
    """A filter sized for 1 key (stated) holds 16 bits: with 200 keys every row passes it, so the
    rows of keys outside the keyset are bounded and must be dropped, and counted, at the join.
    Counted size (None): the filter is sized right and drops them before bounding. Staged: the
    filter is read from its file (transforms.keyset_staging), with the same effect."""
    inside = [f"k{i}" for i in range(200)]
    rows = [{"user": f"u{i}", "k": inside[i % 200]} for i in range(400)]
    rows += [{"user": f"v{i}", "k": f"outside{i}"} for i in range(50)]  # units with only outside rows
    staging = str(tmp_path) if staged else None
    counters = _release(rows, inside, expected_size, staging)  # asserts the released keys and counts
    before, after = counters.get("dropped_outside_keyset", 0), \
        counters.get("dropped_outside_keyset_after_bounding", 0)
    assert (before, after) == ((0, 50) if expected_size == 1 else (50, 0))
    if staged:
        (run,) = tmp_path.iterdir()
        assert len(list(run.glob("filter-*.u64"))) == 1 and list(run.glob("keys-*.arrow"))


def _release(rows, keys, expected_size, staging_dir=None):
    p = beam.Pipeline(runner="FnApiRunner")
    keyset = PublicKeyset.from_pcollection(p | "Keys" >> beam.Create([{"k": k} for k in keys]), ["k"],
                                           expected_size=expected_size, staging_dir=staging_dir)
    out = (p | "Rows" >> beam.Create(rows)
           | DPAggregate(
               compute=Compute(metrics=[Count()]),
               keys=Keys(privacy_unit="user", columns=["k"], keyset=keyset),
               output=Output(format="dicts"),
               bounds=ContributionBounds(max_partitions=1, max_contributions_per_partition=1),
               budget=PrivacyBudget(epsilon=1.0),
               testing=True))
    # Exact mode: each inside key has its two units, and no outside key is released.
    assert_that(out | beam.Map(lambda r: (r["k"], r["count"])), equal_to([(k, 2) for k in keys]))
    result = p.run()
    result.wait_until_finish()
    return {c.key.metric.name: c.committed for c in result.metrics().query()["counters"]}


def test_an_unstated_keyset_is_counted_once_for_the_filter_and_the_key_shards():
    p = beam.Pipeline(runner="FnApiRunner")
    keyset = PublicKeyset.from_pcollection(p | "Keys" >> beam.Create([{"k": "a"}]), ["k"])
    _ = (p | "Rows" >> beam.Create([{"user": "u", "k": "a"}])
         | DPAggregate(
             compute=Compute(metrics=[Count()]),
             keys=Keys(privacy_unit="user", columns=["k"], keyset=keyset),
             bounds=ContributionBounds(max_partitions=1, max_contributions_per_partition=1),
             budget=PrivacyBudget(epsilon=1.0),
             testing=True))
    counts = []

    class Visitor(beam.pipeline.PipelineVisitor):
        def visit_transform(self, node):
            if "KeysetSize" in node.full_label.rsplit("/", 1)[-1]:
                counts.append(node.full_label.rsplit("/", 1)[-1])

        enter_composite_transform = visit_transform

    p.visit(Visitor())
    assert sorted(counts) == ["KeysetSize", "SumKeysetSize"], counts  # one Map and one sum
    assert keyset.counted_size() is keyset.counted_size()


@pytest.mark.parametrize("background", [False, True])
def test_a_staged_filter_is_the_same_bytes_however_its_accumulators_travel(background, tmp_path):
    """Accumulators compacted to staged files, or not, given more input after staging, merged in
    any mix, through the coder or not, adds in the background or not: the staged file holds
    _KeyFilterFn's bytes."""
    chunks = [_hashes(n) for n in (1000, 10, 5000, 0, 300, 2000)]
    chunks.append(np.concatenate(chunks[:3]))
    words = filter_words(sum(len(c) for c in chunks))
    expected = KeyFilter.of(np.concatenate(chunks), words).to_bytes()
    fn = _StagedKeyFilterFn(str(tmp_path), background=background)
    coder = fn.get_accumulator_coder()

    def read(path):
        assert isinstance(path, str) and path.startswith(str(tmp_path))
        with open(path, "rb") as handle:
            return handle.read()

    accs = [fn.add_input(fn.create_accumulator(), (words, c)) for c in chunks]
    accs[0] = fn.add_input(fn.add_input(accs[0], (words, chunks[2])), (words, chunks[4]))
    staged = [fn.compact(a) if i % 2 else a for i, a in enumerate(accs)]  # half staged as files
    staged[1] = fn.add_input(staged[1], (words, chunks[1]))  # a staged one given more input
    travelled = [coder.decode(coder.encode(a)) for a in staged]
    for batch in (staged, travelled, [None] + travelled[::-1]):
        assert read(fn.extract_output(fn.merge_accumulators(batch))) == expected
    assert read(fn.extract_output(fn.merge_accumulators([fn.merge_accumulators(travelled[:3]),
                                                         fn.compact(fn.merge_accumulators(travelled[3:]))]))) \
        == expected
    assert coder.decode(coder.encode(None)) is None
    empty = KeyFilter.from_bytes(read(fn.extract_output(fn.merge_accumulators([None]))))
    assert not empty.contains(np.concatenate(chunks)).any()


def test_a_key_sets_its_six_probe_bits_in_its_word():
    # The probes as the module docstring defines them, bit by bit, against the table lookups.
    from transforms import membership
    hashes = np.random.default_rng(5).integers(0, 2 ** 64, 20_000, dtype=np.uint64)
    word, mask = membership._word_and_mask(hashes, 12_345)
    for h, w, m in zip(hashes[:2000].tolist(), word[:2000].tolist(), mask[:2000].tolist()):
        assert w == ((h >> 32) * 12_345) >> 32
        mixed = (h * 0x9E3779B97F4A7C15) % 2 ** 64
        assert m == sum({1 << ((mixed >> (58 - 6 * p)) & 63) for p in range(membership.PROBES)})


@pytest.mark.parametrize("num_words", [1, 3, 97, 5_000])
def test_adding_keys_that_share_words_sets_every_keys_bits(num_words):
    """Many keys per word in one add (down to a single word): the words equal the OR of each
    key's mask into its word, key by key."""
    from transforms import membership
    hashes = _hashes(20_000)
    word, mask = membership._word_and_mask(hashes, num_words)
    expected = np.zeros(num_words, dtype=np.uint64)
    for w, m in zip(word.tolist(), mask.tolist()):
        expected[w] |= np.uint64(m)
    filt = KeyFilter.empty(num_words)
    for chunk in np.array_split(hashes, 3):
        filt.add(chunk)
    assert np.array_equal(filt.words, expected)
    assert filt.contains(hashes).all()
