"""Noise samplers and keyed streams: closed forms, reproducibility, secrecy, bad input."""
import datetime
import math
import os
import stat

import numpy as np
import pyarrow as pa
import pytest
from scipy import stats

from accounting.calibration import NoiseKind, calibrate, calibrate_zcdp
from accounting.keys import ReleaseKey
from transforms.noise import (RandomStreams, add_noise, discrete_gaussian, discrete_laplace, encode_key)

N = 400_000


def _within(observed, expected, n, z=5.0):
    """|observed - expected| within z binomial standard errors."""
    return abs(observed - expected) <= z * math.sqrt(expected * (1 - expected) / n)


def test_discrete_laplace_worked_example():
    # Δ = 1, ε = ln(4/3): P[0] = 1/7, P[±1] = 3/28
    # (Ghazi & Manurangsi's tutorial, seed 000_015430204a1d6d17.txt).
    spec = calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=math.log(4 / 3), l1_sensitivity=1)
    z = add_noise(spec, np.zeros(N, dtype=np.int64), RandomStreams.for_range(ReleaseKey.for_testing(1), "t", N))
    assert z.dtype == np.int64
    assert _within((z == 0).mean(), 1 / 7, N)
    assert _within((z == 1).mean(), 3 / 28, N)
    assert _within((z == -1).mean(), 3 / 28, N)


@pytest.mark.parametrize("scale", [0.5, 1.0, 3.0, 17.5])
def test_discrete_laplace_mse(scale):
    z = discrete_laplace(RandomStreams.for_range(ReleaseKey.for_testing(2), f"s{scale}", N), scale)
    p = math.exp(-1 / scale)
    mse = 2 * p / (1 - p) ** 2
    # The sample variance of a discrete Laplace has relative s.e. about sqrt((kurt+2)/N) < 3/sqrt(N).
    assert abs((z.astype(float) ** 2).mean() / mse - 1) < 5 * 3 / math.sqrt(N)
    assert abs(z.mean()) < 5 * math.sqrt(mse / N)


@pytest.mark.parametrize("epsilon,sensitivity", [(1.0, 1.0), (0.5, 2.5), (2.0, 0.1)])
def test_laplace_mse_and_grid(epsilon, sensitivity):
    spec = calibrate(NoiseKind.LAPLACE, epsilon=epsilon, l1_sensitivity=sensitivity)
    # The grid adjustment inflates the scale by a relative 2^-20 at most.
    assert sensitivity / epsilon <= spec.scale <= sensitivity / epsilon * (1 + 2 ** -20)
    values = np.full(N, 12.345)
    z = add_noise(spec, values, RandomStreams.for_range(ReleaseKey.for_testing(3), "lap", N))
    noise = z - 12.345
    target = 2 * (sensitivity / epsilon) ** 2
    assert abs((noise ** 2).mean() / target - 1) < 0.03
    assert np.all(np.mod(z, spec.granularity) == 0), "outputs must be multiples of the grid"
    assert math.log2(spec.granularity).is_integer()


@pytest.mark.parametrize("sigma", [0.8, 3.0, 25.0])
def test_discrete_gaussian_variance(sigma):
    z = discrete_gaussian(RandomStreams.for_range(ReleaseKey.for_testing(4), f"g{sigma}", N), sigma)
    # Exact variance of N_Z(0, σ²), by summation.
    support = np.arange(-int(40 * sigma) - 5, int(40 * sigma) + 6)
    pmf = np.exp(-support.astype(float) ** 2 / (2 * sigma ** 2))
    pmf /= pmf.sum()
    exact = float((pmf * support ** 2).sum())
    assert abs(z.astype(float).var() / exact - 1) < 0.02
    assert abs(z.mean()) < 5 * math.sqrt(exact / N)
    # Distribution check on the central values.
    for value in (0, 1, -1, 2):
        p = float(pmf[support == value][0])
        assert _within((z == value).mean(), p, N)


def test_gaussian_variance_and_grid():
    spec = calibrate(NoiseKind.GAUSSIAN, epsilon=1.0, delta=1e-6, l2_sensitivity=2.0)
    z = add_noise(spec, np.zeros(N), RandomStreams.for_range(ReleaseKey.for_testing(5), "gauss", N))
    assert abs(z.var() / spec.scale ** 2 - 1) < 0.02
    assert np.all(np.mod(z, spec.granularity) == 0)
    # Normality of the real-valued Gaussian (fine grid).
    assert stats.kstest(z[:20000] / spec.scale, "norm").pvalue > 1e-4


def test_zcdp_gaussian_sigma():
    spec = calibrate_zcdp(NoiseKind.DISCRETE_GAUSSIAN, rho=0.015, l2_sensitivity=1)
    assert spec.scale == pytest.approx(1 / math.sqrt(0.03))
    assert spec.rho == 0.015


def test_same_key_same_noise_any_batching_and_order():
    key = ReleaseKey.for_testing(9)
    keys = [("c1", "DE", "de.wikipedia", datetime.date(2023, 1, d)) for d in range(1, 29)]
    spec = calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=0.5, l1_sensitivity=3)
    whole = add_noise(spec, np.zeros(len(keys), dtype=np.int64), RandomStreams.for_keys(key, "count", keys))
    order = np.random.default_rng(0).permutation(len(keys))
    first, second = order[:10], order[10:]
    parts = {}
    for chunk in (second, first):
        chunk_keys = [keys[i] for i in chunk]
        noisy = add_noise(spec, np.zeros(len(chunk), dtype=np.int64),
                          RandomStreams.for_keys(key, "count", chunk_keys))
        parts.update(dict(zip(chunk.tolist(), noisy.tolist())))
    assert [parts[i] for i in range(len(keys))] == whole.tolist()
    # Arrow columns give the same lanes as Python tuples.
    table = pa.table({"c": [k[0] for k in keys], "g": [k[1] for k in keys], "p": [k[2] for k in keys],
                      "d": pa.array([k[3] for k in keys], pa.date32())})
    arrow = add_noise(spec, np.zeros(len(keys), dtype=np.int64), RandomStreams.for_keys(key, "count", table))
    assert arrow.tolist() == whole.tolist()


def test_purpose_and_key_change_the_noise():
    keys = list(range(2000))
    a = RandomStreams.for_keys(ReleaseKey.for_testing(1), "count", keys).draw()
    b = RandomStreams.for_keys(ReleaseKey.for_testing(1), "sum", keys).draw()
    c = RandomStreams.for_keys(ReleaseKey.for_testing(2), "count", keys).draw()
    assert (a == b).mean() < 0.01 and (a == c).mean() < 0.01


def test_first_draw_is_the_streams_first_word_and_the_aes_of_the_seed():
    """The copy-free path equals the stateful streams and AES-256-ECB of the seed block."""
    from transforms.noise.prf import ecb
    key = ReleaseKey.for_testing(3)
    seeds = np.random.default_rng(0).integers(0, 2 ** 63, size=(1001, 2), dtype=np.uint64)
    fast = RandomStreams.first_draw(key, "p", seeds)
    assert np.array_equal(fast, RandomStreams(key, "p", seeds).draw())
    raw = ecb(key.subkey("stream:p").secret_bytes()).update(seeds[:3].tobytes())
    assert fast[:3].tolist() == np.frombuffer(raw, dtype=np.uint64)[0::2].tolist()
    assert RandomStreams.first_draw(key, "p", seeds[:0]).size == 0


def test_fixed_width_paths_give_the_same_bytes_and_macs():
    """The numpy fast paths (fixed-width key matrix, one-bound randint, scalar Bernoulli
    parameters) equal the general Arrow / per-lane paths exactly."""
    from transforms.noise import samplers
    from transforms.noise.encoding import binary_rows, encode_keys, encode_keys_matrix
    from transforms.noise.prf import cbc_mac, mac_keys

    rng = np.random.default_rng(5)
    table = pa.table({"i": pa.array(rng.integers(-2 ** 62, 2 ** 62, 300)),
                      "u8": pa.array(rng.integers(0, 255, 300).astype(np.uint8)),
                      "f": pa.array(np.r_[rng.normal(size=298), -0.0, 0.0]),
                      "b": pa.array(rng.integers(0, 2, 300).astype(bool))})
    matrix = encode_keys_matrix(table)
    assert [bytes(r) for r in matrix] == [encode_key(tuple(r.values())) for r in table.to_pylist()]
    assert encode_keys(table).to_pylist() == [bytes(r) for r in matrix]
    assert encode_keys_matrix(pa.table({"s": ["a"]})) is None  # text: variable length
    for width in (1, 15, 16, 17, 33):
        rows = rng.integers(0, 256, (50, width)).astype(np.uint8)
        assert np.array_equal(cbc_mac(b"k" * 32, rows), cbc_mac(b"k" * 32, binary_rows(rows)))
    assert np.array_equal(mac_keys(b"k" * 32, table), cbc_mac(b"k" * 32, encode_keys(table)))
    key = ReleaseKey.for_testing(4)
    for bound in (7, 2 ** 20, 2 ** 63 + 5):
        common = RandomStreams.for_range(key, "r", 2000).randint(np.uint64(bound))
        lane = RandomStreams.for_range(key, "r", 2000).randint(np.full(2000, bound, dtype=np.uint64))
        assert np.array_equal(common, lane)
    lanes = np.arange(2000)
    num = rng.integers(0, 1000, 2000).astype(np.uint64)
    a = samplers.bernoulli_exp_fraction(RandomStreams.for_range(key, "e", 2000), num, 1000, lanes)
    b = samplers.bernoulli_exp_fraction(RandomStreams.for_range(key, "e", 2000), num,
                                        np.full(2000, 1000, dtype=np.uint64), lanes)
    assert np.array_equal(a, b)


def test_layout_groups_give_the_same_bytes_and_macs():
    """Keys with text and bytes columns of varying lengths, grouped by layout (one fixed-width
    matrix per combination of text lengths), give encode_keys's bytes row for row and the
    general path's MACs, sliced, chunked and dictionary-encoded columns included; nulls, dates
    and free text of very many lengths are left to the general path."""
    from transforms.noise import encoding
    from transforms.noise.encoding import encode_keys, encode_keys_layouts
    from transforms.noise.prf import cbc_mac, mac_keys

    rng = np.random.default_rng(8)
    n = 3000
    words = ["", "a", "bé", "日本語", "xyz" * 7, "DE"]
    table = pa.table({"c": pa.array(rng.integers(0, 500, n)).cast(pa.string()),
                      "w": pa.array([words[i] for i in rng.integers(0, len(words), n)]),
                      "y": pa.array([bytes([i % 256]) * (i % 5) for i in range(n)], pa.large_binary()),
                      "i": pa.array(np.arange(n, dtype=np.int64) - 100),
                      "f": pa.array(rng.normal(size=n)),
                      "b": pa.array(rng.integers(0, 2, n).astype(bool))})
    key = b"k" * 32
    cases = [table, table.slice(37, 2000), pa.concat_tables([table.slice(0, 100), table.slice(100)]),
             table.select(["w"]), table.select(["i", "w"]), pa.table({"s": ["x"] * 10}),
             pa.table({"s": pa.array(words * 10).dictionary_encode(), "i": pa.array(range(60))}),
             pa.table({"s": pa.array([], pa.string())}), table.slice(0, 1)]
    for keys in cases:
        layouts = encode_keys_layouts(keys, pad_to=16)
        assert layouts is not None
        got = [None] * keys.num_rows
        for rows, matrix in layouts:
            assert matrix.base.shape[1] % 16 == 0
            for row, encoded in zip(rows, matrix):
                got[row] = bytes(encoded)
        assert got == encode_keys(keys).to_pylist()
        assert got == [encode_key(tuple(r.values())) for r in keys.to_pylist()]
        assert np.array_equal(mac_keys(key, keys), cbc_mac(key, encode_keys(keys)))
    assert len(encode_keys_layouts(table)) > 1
    assert encode_keys_layouts(pa.table({"s": ["a", None]})) is None
    assert encode_keys_layouts(pa.table({"d": pa.array([datetime.date(2023, 1, 1)])})) is None
    many = pa.table({"s": ["x" * i for i in range(encoding._MAX_LAYOUTS + 1)]})
    assert encode_keys_layouts(many) is None
    assert np.array_equal(mac_keys(key, many), cbc_mac(key, encode_keys(many)))


def _reference_cbc_mac(key: bytes, message: bytes) -> bytes:
    """The PRF's definition, one message at a time through OpenSSL's own CBC mode: AES-CBC with a
    zero IV over the 8-byte big-endian length (zero-padded to a block) and the zero-padded
    message; the MAC is the last ciphertext block."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    head = len(message).to_bytes(8, "big") + bytes(8)
    body = message + bytes(-len(message) % 16)
    encryptor = Cipher(algorithms.AES(key), modes.CBC(bytes(16))).encryptor()
    return (encryptor.update(head + body) + encryptor.finalize())[-16:]


def test_cbc_mac_equals_cbc_mode_on_every_path():
    """Mixed lengths (one chain per message), one length as Arrow binaries (read in place) and as
    a matrix, empty messages and empty batches all give OpenSSL's CBC-MAC of the definition."""
    from transforms.noise.encoding import binary_rows
    from transforms.noise.prf import cbc_mac

    rng = np.random.default_rng(11)
    key = rng.bytes(32)
    mixed = [rng.bytes(int(n)) for n in rng.choice([0, 1, 15, 16, 17, 31, 32, 33, 40], 200)]
    expected = [_reference_cbc_mac(key, m) for m in mixed]
    for array in (pa.array(mixed, pa.binary()), pa.array(mixed, pa.large_binary()).slice(0)):
        assert [bytes(r) for r in cbc_mac(key, array)] == expected
    one_block = [rng.bytes(int(n)) for n in rng.integers(1, 17, 50)]  # one block, many lengths
    assert [bytes(r) for r in cbc_mac(key, pa.array(one_block))] == \
        [_reference_cbc_mac(key, m) for m in one_block]
    assert [bytes(r) for r in cbc_mac(key, pa.array(mixed[::-1])[::-1].slice(3, 50))] == expected[3:53]
    for width in (0, 5, 16, 23, 32, 33):
        rows = rng.integers(0, 256, (40, width)).astype(np.uint8)
        want = [_reference_cbc_mac(key, bytes(r)) for r in rows]
        assert [bytes(r) for r in cbc_mac(key, rows)] == want
        assert [bytes(r) for r in cbc_mac(key, binary_rows(rows))] == want
        assert [bytes(r) for r in cbc_mac(key, binary_rows(rows).slice(7, 20))] == want[7:27]
    assert cbc_mac(key, pa.array([], pa.binary())).shape == (0, 16)
    assert cbc_mac(key, np.zeros((0, 23), dtype=np.uint8)).shape == (0, 16)


def test_streams_are_uniform():
    streams = RandomStreams.for_range(ReleaseKey.generate(), "u", 200_000)
    u = streams.uniform_float()
    assert stats.kstest(u, "uniform").pvalue > 1e-4
    r = streams.randint(np.full(200_000, 7, dtype=np.uint64))
    counts = np.bincount(r.astype(np.int64), minlength=7)
    assert stats.chisquare(counts).pvalue > 1e-4


def test_key_encoding_is_injective_on_tricky_cases():
    cases = [("ab",), ("a", "b"), "ab", b"ab", 1, 1.0, True, "1", None, (1, None), (None, 1),
             -1, 2 ** 100, -(2 ** 100), datetime.date(2023, 1, 1), "2023-01-01"]
    encodings = [encode_key(c) for c in cases]
    # a scalar is its own 1-tuple: "ab" and ("ab",) coincide on purpose
    assert encodings[0] == encodings[2]
    rest = encodings[1:2] + encodings[3:]
    assert len(set(rest)) == len(rest)
    with pytest.raises(ValueError, match="128 bits"):
        encode_key(2 ** 128)
    with pytest.raises(ValueError, match="NaN"):
        encode_key(float("nan"))


def test_release_key_secrecy(tmp_path):
    key = ReleaseKey.generate()
    assert key.secret_bytes().hex() not in repr(key)
    assert not key.is_testing and ReleaseKey.for_testing(1).is_testing
    assert ReleaseKey.generate() != key
    path = tmp_path / "k.hex"
    key.save(str(path))
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert ReleaseKey.load(str(path)) == key
    with pytest.raises(FileExistsError):
        key.save(str(path))
    with pytest.raises(ValueError, match="testing"):
        ReleaseKey.for_testing(1).save(str(tmp_path / "t.hex"))


def test_integer_kinds_refuse_real_answers():
    spec = calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=1, l1_sensitivity=1)
    with pytest.raises(TypeError, match="integer"):
        add_noise(spec, np.array([0.5]), RandomStreams.for_range(ReleaseKey.for_testing(1), "x", 1))
    with pytest.raises(ValueError, match="lanes"):
        add_noise(spec, np.array([1, 2]), RandomStreams.for_range(ReleaseKey.for_testing(1), "x", 1))


def test_a_key_object_drives_each_purpose_once():
    from accounting.keys import KeyReuseError

    key = ReleaseKey.generate()
    key.claim("count", "first")
    key.claim("sum", "first")
    with pytest.raises(KeyReuseError, match="second"):
        key.claim("count", "second")
    key.derive("other").claim("count")  # a derived key is another key


# --------------------------------------------------------------------------- discrete Laplace words

def _laplace_by_definition(streams, t, s, lanes, plan=None):
    """discrete_laplace_units lane by lane, reading each word when the definition needs it."""
    from transforms.noise import samplers
    plan = plan or samplers._geometric_plan(t, s)
    out = []
    for lane in lanes:
        while True:
            negative, y = samplers._attempt_exact(streams, int(lane), plan)
            if not (negative and y == 0):
                out.append(-y if negative else y)
                break
    return np.array(out, dtype=np.int64)


@pytest.mark.parametrize("t,s", [(1 << 20, 1 << 20), (3, 1), (1, 7), (1, 1 << 20), (12345678901, 1 << 20),
                                 (37 << 20, 1 << 20), ((1 << 52) - 1, 1 << 20)])
def test_discrete_laplace_reads_the_words_its_definition_reads(t, s):
    # The vectorised sampler returns, lane by lane, what the word-by-word definition returns,
    # and leaves every lane's stream at the same place; whatever lanes are sampled together.
    from transforms.noise import samplers
    key = ReleaseKey.for_testing(21)
    lanes = np.random.default_rng(t % 997).permutation(5000)[:4000]
    vectorised = RandomStreams.for_range(key, "words", 5000)
    one_by_one = RandomStreams.for_range(key, "words", 5000)
    got = samplers.discrete_laplace_units(vectorised, t, s, lanes)
    assert np.array_equal(got, _laplace_by_definition(one_by_one, t, s, lanes))
    assert np.array_equal(vectorised._counters, one_by_one._counters)
    halves = RandomStreams.for_range(key, "words", 5000)
    split = np.concatenate([samplers.discrete_laplace_units(halves, t, s, lanes[2000:]),
                            samplers.discrete_laplace_units(halves, t, s, lanes[:2000])])
    assert np.array_equal(np.concatenate([got[2000:], got[:2000]]), split)


@pytest.mark.parametrize("t,s", [(1 << 20, 1 << 20), (5, 2), (1 << 24, 1 << 20), (7 << 26, 1 << 20)])
def test_discrete_laplace_probabilities(t, s):
    # P[z] = (1 - q) / (1 + q) q^|z|, q = e^(-s/t): a chi-square test over the values seen
    # (tails pooled so that every cell expects at least 50 samples).
    from transforms.noise import samplers
    n = 200_000
    z = samplers.discrete_laplace_units(RandomStreams.for_range(ReleaseKey.for_testing(22), f"p{t}", n),
                                        t, s, np.arange(n))
    q = math.exp(-s / t)
    reach = 0
    while n * (1 - q) / (1 + q) * q ** (reach + 1) >= 50:
        reach += 1
    values = np.arange(-reach, reach + 1)
    expected = n * (1 - q) / (1 + q) * q ** np.abs(values)
    tail = (n - expected.sum()) / 2
    observed = [(z < -reach).sum()] + [(z == v).sum() for v in values] + [(z > reach).sum()]
    _, p_value = stats.chisquare(observed, [tail, *expected, tail])
    assert p_value > 1e-4


def test_exact_comparisons_read_words_until_they_differ():
    from fractions import Fraction

    from transforms.noise import samplers
    number = samplers._Exponential(num=1, den=3)  # e^(-1/3)
    # The expansion against an independent enclosure: the alternating series of e^(-1/3).
    total, term, k = Fraction(0), Fraction(1), 0
    while term > Fraction(1, 2 ** 260):
        total += term if k % 2 == 0 else -term
        k += 1
        term = term * Fraction(1, 3) / k
    for words in (1, 2, 3):
        low, high = total - term, total + term
        assert math.floor(low * 2 ** (64 * words)) == math.floor(high * 2 ** (64 * words)) \
            == number.words(words)
    logistic = samplers._Exponential(num=1, den=3, logistic=True)
    assert logistic.words(2) == math.floor(total / (1 + total) * 2 ** 128)
    w0, w1, w2 = number.word(0), number.word(1), number.word(2)
    unused = iter([])
    assert samplers._below([w0 - 1], unused.__next__, number)
    assert not samplers._below([w0 + 1], unused.__next__, number)
    assert samplers._below([w0], iter([w1 - 1]).__next__, number)  # a tie: the next word decides
    assert not samplers._below([w0], iter([w1, w2 + 1]).__next__, number)
    # How many of r, r^2, ... exceed U (r = e^(-1/3)): U just below r^2 -> 2, equal to it as far
    # as two words -> the third word decides.
    powers = lambda m: samplers._Exponential(num=m, den=3)
    r2 = powers(2)
    assert samplers._count_below([r2.word(0) - 1], unused.__next__, powers) == 2
    assert samplers._count_below([r2.word(0)], iter([r2.word(1), r2.word(2) - 1]).__next__, powers) == 2
    assert samplers._count_below([r2.word(0)], iter([r2.word(1), r2.word(2) + 1]).__next__, powers) == 1


def test_a_word_equal_to_a_threshold_is_decided_word_by_word():
    # A plan whose first digit threshold is the word lane 0 reads for it (a real tie has
    # probability 2^-64), its expansion going on with words of our choosing: lane 0 reads more
    # words, exactly as the word-by-word definition under the same plan does, and so do the
    # lanes tying with the first tail threshold's expansion at a second word.
    from transforms.noise import samplers

    class Number:
        def __init__(self, words):
            self.words = words

        def word(self, index):
            return self.words[min(index, len(self.words) - 1)]

    class TiedPlan(samplers._GeometricPlan):
        def digit(self, j):
            return Number([int(self.digit_thresholds[0]), 1 << 63]) if j == 0 else super().digit(j)

    key = ReleaseKey.for_testing(23)
    t, s = 37 << 20, 1 << 20
    plan = samplers._geometric_plan(t, s)
    assert plan.k >= 1
    word = RandomStreams.for_range(key, "tie", 64).ahead(np.arange(64), plan.k + 2)[1, 0]
    tied = TiedPlan(t=t, s=s, k=plan.k, tail_thresholds=plan.tail_thresholds,
                    digit_thresholds=np.concatenate([[word], plan.digit_thresholds[1:]]).astype(np.uint64))
    lanes = np.arange(64)
    fast, slow = RandomStreams.for_range(key, "tie", 64), RandomStreams.for_range(key, "tie", 64)
    got = samplers._discrete_laplace_pass(fast, tied, lanes)
    assert np.array_equal(got, _laplace_by_definition(slow, t, s, lanes, plan=tied))
    assert np.array_equal(fast._counters, slow._counters)
    assert fast._counters[0] % (plan.k + 2) == 1  # one word more than its attempts' K + 2 each
