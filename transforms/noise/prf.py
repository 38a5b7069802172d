"""The keyed pseudo-random function of the noise engine: length-prefixed AES-256 CBC-MAC.

``cbc_mac(key, messages)`` maps each message (a canonical key encoding, see
:mod:`transforms.noise.encoding`) to 16 bytes. The message length is MAC'd first and messages are
zero-padded to whole blocks, so the construction is a PRF on messages of any length (a
length-prefixed CBC-MAC): outputs for distinct messages look independent and uniform to anyone
without the key. Vectorised: one AES call per block position over all messages of a batch.

AES comes from the ``cryptography`` package (OpenSSL, AES-NI); everything else is numpy/Arrow.
"""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from transforms.noise.encoding import (WINDOW_ROWS, WindowedKeys, be_bytes, encode_keys,
                                      encode_keys_layouts, join_binary)

_U64 = np.uint64


def ecb(key: bytes):
    """An AES-256 block encryptor (ECB: callers feed it independent blocks)."""
    return Cipher(algorithms.AES(key), modes.ECB()).encryptor()


_ZERO_PADS = pa.array([b"\0" * i for i in range(16)], pa.large_binary())


def cbc_mac(mac_key: bytes, messages) -> np.ndarray:
    """Length-prefixed AES CBC-MAC of each message: a (n, 16) uint8 array of PRF outputs.

    ``messages``: an Arrow binary array, or an (n, width) uint8 matrix of n messages of one
    length (the same outputs as the binary array of its rows)."""
    if isinstance(messages, np.ndarray):
        return _cbc_mac_fixed(mac_key, messages)
    n = len(messages)
    if n == 0:
        return np.zeros((0, 16), dtype=np.uint8)
    if messages.type != pa.large_binary():
        messages = messages.cast(pa.large_binary())
    lengths = pc.binary_length(messages).to_numpy(zero_copy_only=False).astype(np.int64)
    # Zero-pad every message to whole blocks (unambiguous: the true length is in block 0).
    padded = join_binary([messages, _ZERO_PADS.take(pa.array((-lengths) % 16))])
    offsets_buffer, data_buffer = padded.buffers()[1:3]
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[padded.offset:padded.offset + n + 1]
    count = np.diff(offsets) // 16
    if np.all(lengths == lengths[0]):  # one length: the fixed-width path reads the blocks in place
        rows = np.frombuffer(data_buffer, dtype=np.uint8, count=offsets[-1] - offsets[0],
                             offset=offsets[0]).reshape(n, -1)
        return _cbc_mac_blocks(mac_key, rows, int(lengths[0]))
    blocks = np.frombuffer(data_buffer, dtype=np.uint8)[offsets[0]:offsets[-1]].copy().view(_U64)
    blocks = blocks.reshape(-1, 2)
    first = (offsets[:-1] - offsets[0]) // 16
    encryptor = ecb(mac_key)
    heads = np.zeros((n, 16), dtype=np.uint8)
    heads[:, :8] = be_bytes(lengths.astype(_U64), 8)
    state = encrypt_words(encryptor, heads.view(_U64))
    for j in range(int(count.max())):
        active = np.flatnonzero(count > j)
        mixed = np.take(state, active, axis=0)
        mixed ^= np.take(blocks, first[active] + j, axis=0)
        state[active] = encrypt_words(encryptor, mixed)
    return state.view(np.uint8)


def encrypt_words(encryptor, words: np.ndarray) -> np.ndarray:
    """AES (the ECB ``encryptor``) of each 16-byte row of a C-contiguous (n, 2) uint64 array,
    encrypted straight from and into numpy buffers."""
    out = bytearray(words.nbytes + 15)  # update_into wants room for one more block, less a byte
    written = encryptor.update_into(words.view(np.uint8), out)
    assert written == words.nbytes
    return np.frombuffer(out, dtype=_U64, count=words.size).reshape(-1, 2)


class Scratch:
    """Reusable buffers for the AES calls of one sampler run: blocks to encrypt and their
    ciphertexts, grown on demand and reused, so that a loop of draws touches the same few
    (cache-resident) pages instead of allocating and zeroing fresh ones on every call. Not
    shared between threads: one per sampler call."""

    def __init__(self):
        self._blocks = np.empty((0, 2), dtype=_U64)
        self._out = bytearray(15)
        self._row, self._row_key = None, None

    def counter_row(self, first: int, count: int) -> np.ndarray:
        """The 2·count words (first, 0, first + 1, 0, ...): what a block row of lanes all at
        counter ``first`` is XOR'd with (kept for the next pass at the same place)."""
        if self._row_key != (first, count):
            row = np.zeros((count, 2), dtype=_U64)
            row[:, 0] = np.arange(count, dtype=_U64) + _U64(first)
            self._row, self._row_key = row.reshape(-1), (first, count)
        return self._row

    def blocks(self, count: int) -> np.ndarray:
        """A (count, 2) uint64 array to fill with the blocks of the next :meth:`encrypt`."""
        if self._blocks.shape[0] < count:
            self._blocks = np.empty((max(count, 2 * self._blocks.shape[0]), 2), dtype=_U64)
        return self._blocks[:count]

    def encrypt(self, encryptor, blocks: np.ndarray) -> np.ndarray:
        """AES of each row of a C-contiguous (n, 2) uint64 array, as a view of this scratch's
        output buffer (valid until the next call)."""
        if len(self._out) < blocks.nbytes + 15:  # update_into wants one more block, less a byte
            self._out = bytearray(max(blocks.nbytes, 2 * len(self._out)) + 15)
        written = encryptor.update_into(blocks.view(np.uint8), self._out)
        assert written == blocks.nbytes
        return np.frombuffer(self._out, dtype=_U64, count=blocks.size).reshape(-1, 2)


def _cbc_mac_fixed(mac_key: bytes, matrix: np.ndarray) -> np.ndarray:
    """``cbc_mac`` of the rows of an (n, width) uint8 matrix: zero-padded to whole blocks in one
    numpy copy, then :func:`_cbc_mac_blocks`."""
    n, width = matrix.shape
    blocks = np.zeros((n, -(-width // 16) * 16), dtype=np.uint8)
    blocks[:, :width] = matrix
    return _cbc_mac_blocks(mac_key, blocks, width)


def _cbc_mac_blocks(mac_key: bytes, blocks: np.ndarray, width: int) -> np.ndarray:
    """``cbc_mac`` of n messages of ``width`` bytes each, given zero-padded to whole blocks as a
    C-contiguous (n, 16k) uint8 matrix. Every message has the same length block, so its AES is
    computed once; then one AES call per block position over all messages, each encrypted into
    one buffer and the next position's input XOR'd word by word as (n,) strided uint64 columns
    (numpy loops over rows, not over 16 bytes of each row)."""
    n = blocks.shape[0]
    if n == 0:
        return np.zeros((0, 16), dtype=np.uint8)
    words = blocks.reshape(n, -1).view(_U64)  # (n, 2k): block j is words 2j, 2j + 1
    encryptor = ecb(mac_key)
    head = np.zeros(2, dtype=_U64)
    head.view(np.uint8)[:8] = be_bytes(np.array([width], dtype=_U64), 8)[0]
    chain = encrypt_words(encryptor, head.reshape(1, 2))[0]
    out = bytearray(n * 16 + 15)  # update_into wants room for one more block, less a byte
    encrypted = np.frombuffer(out, dtype=_U64, count=2 * n).reshape(n, 2)
    state = np.empty((n, 2), dtype=_U64)
    for j in range(words.shape[1] // 2):
        left, right = (chain[0], chain[1]) if j == 0 else (encrypted[:, 0], encrypted[:, 1])
        np.bitwise_xor(words[:, 2 * j], left, out=state[:, 0])
        np.bitwise_xor(words[:, 2 * j + 1], right, out=state[:, 1])
        encryptor.update_into(state.view(np.uint8), out)
    if words.shape[1] == 0:  # empty messages: the MAC is the length block's
        encrypted[:] = chain
    return encrypted.view(np.uint8)


def mac_keys(mac_key: bytes, keys) -> np.ndarray:
    """``cbc_mac`` of the canonical encodings of ``keys`` (:func:`encode_keys`): written a chunk
    of rows at a time into one cache-resident buffer and MAC'd in key order where the key
    columns are integers, booleans, floats or short text and bytes without nulls
    (:class:`~transforms.noise.encoding.WindowedKeys`), from one fixed-width matrix per layout
    where text is longer (:func:`encode_keys_layouts`), through Arrow binary arrays otherwise
    (nulls, dates, free text of very many lengths). Same outputs on every path."""
    windowed = WindowedKeys.of(keys)
    if windowed is not None:
        return _mac_windowed(mac_key, windowed)
    layouts = encode_keys_layouts(keys, pad_to=16)
    if layouts is None:
        return cbc_mac(mac_key, encode_keys(keys))
    if len(layouts) == 1:
        return _cbc_mac_blocks(mac_key, layouts[0][1].base, layouts[0][1].shape[1])
    out = np.empty((sum(rows.size for rows, _ in layouts), 16), dtype=np.uint8)
    for rows, matrix in layouts:  # one length per layout: each the fixed-width path
        out[rows] = _cbc_mac_blocks(mac_key, matrix.base, matrix.shape[1])
    return out


def _mac_windowed(mac_key: bytes, keys: WindowedKeys) -> np.ndarray:
    """``cbc_mac`` of :class:`WindowedKeys`, a chunk of rows at a time: each row's chain starts
    from the AES of its length block (one per possible length, computed once), then one AES call
    per block position over the chunk's rows; a row with fewer blocks than the longest keeps its
    state past its last block."""
    n = keys.num_rows
    out = np.empty((n, 2), dtype="<u8")
    if not n:
        return out.view(np.uint8)
    encryptor = ecb(mac_key)
    lengths = np.arange(keys.min_length, keys.max_length + 1, dtype=_U64)
    heads = np.zeros((lengths.size, 2), dtype=_U64)
    heads.view(np.uint8)[:, :8] = be_bytes(lengths, 8)
    chains = encrypt_words(encryptor, heads).view("<u8").copy()  # AES of each length block
    chunk = min(n, WINDOW_ROWS)
    words = np.zeros((keys.num_words, chunk), dtype="<u8")
    mixed = np.empty((chunk, 2), dtype="<u8")
    scratch = Scratch()
    for start in range(0, n, chunk):
        m = min(chunk, n - start)
        if start:
            words.fill(0)
        length = keys.fill(start, start + m, words)
        state = np.take(chains, length - keys.min_length, axis=0)
        blocks = (length + 15) // 16
        fewest, most = int(blocks.min()), int(blocks.max())
        for j in range(most):
            np.bitwise_xor(state[:, 0], words[2 * j, :m], out=mixed[:m, 0])
            np.bitwise_xor(state[:, 1], words[2 * j + 1, :m], out=mixed[:m, 1])
            if j == fewest:  # state is still the buffer this block's AES overwrites (later
                state = state.copy()  # states are np.where's own arrays)
            encrypted = scratch.encrypt(encryptor, mixed[:m].view(_U64)).view("<u8")
            # Past a row's last block its MAC is final: it keeps its state.
            state = encrypted if j < fewest else np.where((blocks > j)[:, None], encrypted, state)
        out[start:start + m] = state
    return out.view(np.uint8)


def mac_words(mac: np.ndarray) -> np.ndarray:
    """PRF outputs (n, 16) uint8 as (n, 2) uint64 words (native byte order)."""
    return mac.view(np.uint64).reshape(-1, 2)
