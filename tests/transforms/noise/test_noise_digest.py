"""The noise engine's outputs pinned bit for bit: a few thousand draws of every mechanism under a
fixed testing key, the words each sampler consumed and the keys' MAC seeds, hashed together.

The digests below were computed before the engine's hot paths were rewritten for speed (issue 41):
any change to the streams' definition, the key encoding or MAC, the words a sampler reads or the
values it returns changes them. A deliberate change of the engine's output (a new stream version)
must change these digests in the same commit and say why.
"""
from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest

from accounting.calibration import NoiseKind, calibrate
from accounting.keys import ReleaseKey
from transforms.noise import RandomStreams, add_noise, discrete_gaussian, discrete_laplace
from transforms.noise import samplers

N = 3000


def _keys(n: int) -> pa.Table:
    """Output keys as the benchmark has them (text of several lengths, two-letter text, an
    integer): the layout-grouped MAC path; the column order mixes text and fixed-width."""
    rng = np.random.default_rng(41)
    return pa.table({"campaign": pa.array(rng.integers(0, 500, n)).cast(pa.string()),
                     "country": pa.array(np.array(["DE", "FR", "JP", "BR"])[rng.integers(0, 4, n)]),
                     "day": pa.array(np.arange(n, dtype=np.int64) - 7)})


def _specs():
    return {
        "discrete_laplace": (calibrate(NoiseKind.DISCRETE_LAPLACE, epsilon=1, l1_sensitivity=1), True),
        "laplace": (calibrate(NoiseKind.LAPLACE, epsilon=1, l1_sensitivity=10), False),
        "discrete_gaussian": (calibrate(NoiseKind.DISCRETE_GAUSSIAN, epsilon=1, delta=1e-7,
                                        l2_sensitivity=1), True),
        "gaussian": (calibrate(NoiseKind.GAUSSIAN, epsilon=1, delta=1e-7, l2_sensitivity=1), False),
    }


class _Digest:
    def __init__(self):
        self._hash = hashlib.sha256()

    def add(self, label: str, array: np.ndarray) -> None:
        array = np.asarray(array)
        kind = {"i": "<i8", "u": "<u8", "f": "<f8", "b": "|u1"}[array.dtype.kind]
        self._hash.update(label.encode() + b"\0" + np.ascontiguousarray(array, dtype=kind).tobytes())

    def hexdigest(self) -> str:
        return self._hash.hexdigest()


def _mechanism_digest(name: str) -> str:
    spec, integer = _specs()[name]
    key = ReleaseKey.for_testing(41)
    digest = _Digest()
    for label, keys in (("table", _keys(N)), ("range", None)):
        streams = (RandomStreams.for_keys(key, name, keys) if keys is not None
                   else RandomStreams.for_range(key, name, N, offset=10 ** 6))
        digest.add(label + "/seeds", streams._seeds)
        values = np.arange(N, dtype=np.int64) - N // 2
        noisy = add_noise(spec, values if integer else values * 0.37, streams)
        digest.add(label + "/noisy", noisy)
        digest.add(label + "/words", streams._counters)
        # A second sample from the same streams (lanes past their first sample's words), on a
        # subset of lanes in a scrambled order.
        lanes = np.random.default_rng(3).permutation(N)[: N // 2]
        if spec.kind.is_gaussian:
            again = discrete_gaussian(streams, spec.unit_scale, lanes)
        else:
            again = discrete_laplace(streams, spec.unit_scale, lanes)
        digest.add(label + "/again", again)
        digest.add(label + "/words-again", streams._counters)
    return digest.hexdigest()


#: sha256 of each mechanism's draws, words consumed and seeds (see the module docstring).
EXPECTED = {
    "discrete_laplace": "9dff611291485d2594ffdcab73fa4f7293d6c6dd45a85f5d40e283ccf552f5bc",
    "laplace": "d1d6d9e2a41962a901ca361d1e0d4baf89672783b30fb3bbfd1050859f1bd120",
    "discrete_gaussian": "7debf4f138df63d04e5eccd0822da5bc096935c36e30534359ea0f21762ed41f",
    "gaussian": "ffb7a9560adfd6e5a44d27500b0b15b1a26c438b715b874a475bad179d6b6c80",
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_mechanism_draws_are_bit_identical(name):
    assert _mechanism_digest(name) == EXPECTED[name]


def _samplers_digest() -> str:
    """Small and large scales (rejection of a negative zero, many Gaussian rejections, K = 0 and
    K > 0 digit plans), the Bernoulli samplers, randint and uniform floats."""
    key = ReleaseKey.for_testing(42)
    digest = _Digest()
    for scale in (0.3, 1.0, 17.5, 3.0e5):
        streams = RandomStreams.for_range(key, f"dl{scale}", N)
        digest.add(f"dl{scale}", discrete_laplace(streams, scale))
        digest.add(f"dl{scale}/words", streams._counters)
    for sigma in (0.4, 2.5, 25.0, 1.0e4):
        streams = RandomStreams.for_range(key, f"dg{sigma}", N)
        digest.add(f"dg{sigma}", discrete_gaussian(streams, sigma))
        digest.add(f"dg{sigma}/words", streams._counters)
    streams = RandomStreams.for_range(key, "bernoulli", N)
    lanes = np.arange(N)
    gamma = np.random.default_rng(5).exponential(1.5, N)
    digest.add("bexp", samplers.bernoulli_exp(streams, gamma, lanes))
    num = np.random.default_rng(6).integers(0, 1000, N).astype(np.uint64)
    digest.add("bfrac", samplers.bernoulli_exp_fraction(streams, num, 1000, lanes))
    digest.add("bfrac-lanes", samplers.bernoulli_exp_fraction(
        streams, num, np.full(N, 1000, dtype=np.uint64), lanes))
    for bound in (7, 1 << 20, (1 << 63) + 5):
        digest.add(f"randint{bound}", streams.randint(np.uint64(bound)))
    digest.add("randint-lanes", streams.randint(np.arange(1, N + 1, dtype=np.uint64)))
    digest.add("uniform", streams.uniform_float(lanes[::3]))
    digest.add("ahead", streams.ahead(lanes[::-7], 5))
    digest.add("words", streams._counters)
    return digest.hexdigest()


EXPECTED_SAMPLERS = "3d4e2348531f3da3e296cdf918a0f35b8a66194d11328a3d7fbef059ef783fb1"


def test_sampler_draws_are_bit_identical():
    assert _samplers_digest() == EXPECTED_SAMPLERS


def _mac_digest() -> str:
    """The keyed MAC of keys on every encoding path: fixed-width columns, text layouts (one and
    many, sliced, chunked, dictionary-encoded), and the general Arrow path (nulls, dates, free
    text of very many lengths)."""
    import datetime

    from transforms.noise.prf import mac_keys

    rng = np.random.default_rng(43)
    n = 2000
    words = ["", "a", "bé", "日本語", "xyz" * 7, "DE"]
    table = pa.table({"c": pa.array(rng.integers(0, 500, n)).cast(pa.string()),
                      "w": pa.array([words[i] for i in rng.integers(0, len(words), n)]),
                      "y": pa.array([bytes([i % 256]) * (i % 5) for i in range(n)], pa.large_binary()),
                      "i": pa.array(rng.integers(-2 ** 62, 2 ** 62, n)),
                      "u": pa.array(rng.integers(0, 255, n).astype(np.uint8)),
                      "f": pa.array(np.r_[rng.normal(size=n - 2), -0.0, 0.0]),
                      "b": pa.array(rng.integers(0, 2, n).astype(bool))})
    cases = {"all": table, "fixed": table.select(["i", "u", "f", "b"]), "text": table.select(["w"]),
             "slice": table.slice(37, 1500),
             "chunks": pa.concat_tables([table.slice(0, 100), table.slice(100)]),
             "dictionary": pa.table({"s": pa.array(words * 10).dictionary_encode(),
                                     "i": pa.array(range(60))}),
             "nulls": pa.table({"s": ["a", None, "bc"] * 50, "i": list(range(150))}),
             "dates": pa.table({"d": pa.array([datetime.date(2023, 1, 1 + i % 28) for i in range(90)])}),
             "many": pa.table({"s": ["x" * i for i in range(300)]}),
             "ints": pa.table({"k": np.arange(n, dtype=np.int64)})}
    digest = _Digest()
    for label, keys in cases.items():
        digest.add(label, mac_keys(b"m" * 32, keys).view(np.uint64))
    digest.add("python", mac_keys(b"m" * 32, [("a", 1), (2.5, None), "x", b"y"]).view(np.uint64))
    return digest.hexdigest()


EXPECTED_MAC = "fa4ed70d198bae28da6f0f9be3cb0ea0b83f0c19874fdf4f3e96bae4d31254e0"


def test_key_macs_are_bit_identical():
    assert _mac_digest() == EXPECTED_MAC


# --------------------------------------------------------------------------- groupings

def _mixed_keys(n: int) -> pa.Table:
    """Keys whose encodings span several numbers of blocks (text of 0 to 40 bytes before,
    between and after fixed-width columns), with negative integers, unsigned integers above
    2^63, -0.0, booleans and a dictionary-encoded text column."""
    rng = np.random.default_rng(44)
    texts = ["", "a", "é", "DE", "日本語", "x" * 11, "y" * 27, "z" * 40]
    return pa.table({"s": pa.array([texts[i] for i in rng.integers(0, len(texts), n)]),
                     "i": pa.array(rng.integers(-2 ** 63, 2 ** 63 - 1, n, endpoint=True)),
                     "y": pa.array([bytes([i % 7]) * (i % 9) for i in range(n)], pa.binary()),
                     "u": pa.array(rng.integers(0, 2 ** 64 - 1, n, dtype=np.uint64, endpoint=True)),
                     "f": pa.array(np.r_[rng.normal(size=n - 1), -0.0]),
                     "b": pa.array(rng.integers(0, 2, n).astype(bool)),
                     "c": pa.array([texts[i] for i in rng.integers(0, 5, n)]).dictionary_encode()})


@pytest.mark.parametrize("rows", [1, 7, 64, 10 ** 6])
def test_key_macs_do_not_depend_on_the_chunk_of_rows_encoded_together(rows, monkeypatch):
    """The windowed MAC path, a chunk of ``rows`` keys at a time (a chunk's words reused, rows
    of different block counts in one chunk), gives the general Arrow path's MACs."""
    from transforms.noise import prf
    from transforms.noise.encoding import WindowedKeys, encode_keys

    monkeypatch.setattr(prf, "WINDOW_ROWS", rows)
    keys = _mixed_keys(500)
    for case in (keys, keys.slice(13, 300), pa.concat_tables([keys.slice(0, 40), keys.slice(40)]),
                 keys.select(["i", "f", "b"]), keys.select(["b", "s"]), keys.slice(0, 1)):
        assert WindowedKeys.of(case) is not None
        assert np.array_equal(prf.mac_keys(b"w" * 32, case), prf.cbc_mac(b"w" * 32, encode_keys(case)))


def test_windowed_rows_are_the_canonical_encodings():
    """The words WindowedKeys writes are encode_keys's bytes, zero past each key's length."""
    from transforms.noise.encoding import WindowedKeys, encode_keys

    keys = _mixed_keys(300)
    windowed = WindowedKeys.of(keys)
    words = np.zeros((windowed.num_words, 200), dtype="<u8")
    lengths = windowed.fill(50, 250, words)
    rows = np.ascontiguousarray(words.T).view(np.uint8)  # row r: its words' bytes in order
    expected = encode_keys(keys).to_pylist()[50:250]
    assert [bytes(row[:length]) for row, length in zip(rows, lengths)] == expected
    assert not any(row[length:].any() for row, length in zip(rows, lengths))
    assert WindowedKeys.of(pa.table({"s": ["x" * 65]})) is None  # long text: the other paths


@pytest.mark.parametrize("t,s", [(1 << 20, 1 << 20), (37 << 20, 1 << 20), (20971521 << 20, 1 << 20)])
def test_discrete_laplace_does_not_depend_on_the_lanes_sampled_together(t, s, monkeypatch):
    """Groups of a few lanes and one group of all give the same values and leave every lane's
    stream at the same place; so do a range of lanes (read through views) and the same lanes
    in another order."""
    key = ReleaseKey.for_testing(45)
    n = 3000
    whole = RandomStreams.for_range(key, "groups", n)
    expected = samplers.discrete_laplace_units(whole, t, s, np.arange(n))
    monkeypatch.setattr(samplers, "_BLOCKS_PER_PASS", 1)
    monkeypatch.setattr(samplers, "_MIN_LANES_PER_PASS", 37)
    small = RandomStreams.for_range(key, "groups", n)
    assert np.array_equal(samplers.discrete_laplace_units(small, t, s, np.arange(n)), expected)
    assert np.array_equal(small._counters, whole._counters)
    order = np.random.default_rng(1).permutation(n)
    shuffled = RandomStreams.for_range(key, "groups", n)
    assert np.array_equal(samplers.discrete_laplace_units(shuffled, t, s, order), expected[order])
    assert np.array_equal(shuffled._counters, whole._counters)


def _draws_digest() -> str:
    """Plain draws: every lane (fewer and more lanes than a draw encrypts together), chosen
    lanes with repeats (a repeated lane gets its one next word each time it is named), uniform
    floats and a numpy Generator keyed from a stream."""
    key = ReleaseKey.for_testing(46)
    digest = _Digest()
    for n in (1000, 70000):
        streams = RandomStreams.for_range(key, f"draws{n}", n)
        for round_ in range(2):
            digest.add(f"{n}/all{round_}", streams.draw())
        lanes = np.random.default_rng(n).integers(0, n, 2 * n)
        digest.add(f"{n}/chosen", streams.draw(lanes))
        digest.add(f"{n}/uniform", streams.uniform_float())
        digest.add(f"{n}/words", streams._counters)
        digest.add(f"{n}/generator", streams.generator().integers(0, 2 ** 63, 10))
    return digest.hexdigest()


EXPECTED_DRAWS = "25424d2f51d2876577b23412072ed0d8c3e03da44287c2ed4d28f7c9af7a6580"


def test_plain_draws_are_bit_identical():
    assert _draws_digest() == EXPECTED_DRAWS


@pytest.mark.parametrize("den", [1 << 60, 1 << 20, 1 << 62, 1])
def test_bernoulli_steps_read_ahead_are_the_loops(den):
    """The first two steps of bernoulli_exp_fraction read ahead for a power-of-two denominator
    (one AES call for both words of every lane) give the step-by-step loop's outcomes and leave
    every lane's stream where the loop does (the loop: the same denominator given per lane)."""
    key = ReleaseKey.for_testing(47)
    n = 5000
    rng = np.random.default_rng(den % 1009)
    num = rng.integers(0, den, n, endpoint=True).astype(np.uint64)
    num[:3] = [0, den, den - 1] if den > 1 else [0, 1, 1]
    lanes = rng.permutation(n + 100)[:n]
    ahead = RandomStreams.for_range(key, "steps", n + 100)
    loop = RandomStreams.for_range(key, "steps", n + 100)
    got = samplers.bernoulli_exp_fraction(ahead, num, den, lanes)
    want = samplers.bernoulli_exp_fraction(loop, num, np.full(n, den, dtype=np.uint64), lanes)
    assert np.array_equal(got, want)
    assert np.array_equal(ahead._counters, loop._counters)
