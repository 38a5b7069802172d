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

from transforms.noise.encoding import be_bytes, encode_keys, encode_keys_matrix, join_binary

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
    lengths = pc.binary_length(messages).to_numpy(zero_copy_only=False).astype(np.int64)
    # Zero-pad every message to whole blocks (unambiguous: the true length is in block 0).
    padded = join_binary([messages, _ZERO_PADS.take(pa.array((-lengths) % 16))]).cast(pa.large_binary())
    offsets_buffer, data_buffer = padded.buffers()[1:3]
    offsets = np.frombuffer(offsets_buffer, dtype=np.int64)[padded.offset:padded.offset + n + 1]
    blocks = np.frombuffer(data_buffer, dtype=np.uint8)
    first = (offsets[:-1] - offsets[0]) // 16
    blocks = blocks[offsets[0]:offsets[-1]].reshape(-1, 16)
    count = np.diff(offsets) // 16
    encryptor = ecb(mac_key)
    state = np.zeros((n, 16), dtype=np.uint8)
    state[:, :8] = be_bytes(lengths.astype(_U64), 8)
    state = np.frombuffer(encryptor.update(state.tobytes()), dtype=np.uint8).reshape(n, 16).copy()
    uniform = n and bool(np.all(count == count[0]))
    for j in range(int(count.max()) if n else 0):
        active = slice(None) if uniform else np.nonzero(count > j)[0]
        mixed = state[active] ^ blocks[first[active] + j]
        state[active] = np.frombuffer(encryptor.update(mixed.tobytes()), dtype=np.uint8).reshape(-1, 16)
    return state


def _cbc_mac_fixed(mac_key: bytes, matrix: np.ndarray) -> np.ndarray:
    """``cbc_mac`` of the rows of an (n, width) uint8 matrix: zero-padded to whole blocks in one
    numpy copy, then :func:`_cbc_mac_blocks`."""
    n, width = matrix.shape
    blocks = np.zeros((n, -(-width // 16) * 16), dtype=np.uint8)
    blocks[:, :width] = matrix
    return _cbc_mac_blocks(mac_key, blocks, width)


def _cbc_mac_blocks(mac_key: bytes, blocks: np.ndarray, width: int) -> np.ndarray:
    """``cbc_mac`` of n messages of ``width`` bytes each, given zero-padded to whole blocks as an
    (n, 16k) uint8 matrix: one AES call per block position (as the Arrow path does for equal
    lengths), each pass encrypted into one buffer and the next pass's input XOR'd into one
    array (no allocation per block position)."""
    n = blocks.shape[0]
    if n == 0:
        return np.zeros((0, 16), dtype=np.uint8)
    blocks = blocks.reshape(n, -1, 16)
    encryptor = ecb(mac_key)
    state = np.zeros((n, 16), dtype=np.uint8)
    state[:, :8] = be_bytes(np.full(n, width, dtype=_U64), 8)
    out = bytearray(n * 16 + 15)  # update_into wants room for one more block, less a byte
    encrypted = np.frombuffer(out, dtype=np.uint8, count=n * 16).reshape(n, 16)
    encryptor.update_into(state, out)
    for j in range(blocks.shape[1]):
        np.bitwise_xor(encrypted, blocks[:, j], out=state)
        encryptor.update_into(state, out)
    return encrypted.copy()


def mac_keys(mac_key: bytes, keys) -> np.ndarray:
    """``cbc_mac`` of the canonical encodings of ``keys`` (:func:`encode_keys`): straight from a
    fixed-width byte matrix where every key encodes to the same length (integer, boolean or
    float key columns), through Arrow binary arrays otherwise. Same outputs either way."""
    matrix = encode_keys_matrix(keys, pad_to=16)
    if matrix is not None:  # a view of its rows zero-padded to whole blocks (matrix.base)
        return _cbc_mac_blocks(mac_key, matrix.base, matrix.shape[1])
    return cbc_mac(mac_key, encode_keys(keys))


def mac_words(mac: np.ndarray) -> np.ndarray:
    """PRF outputs (n, 16) uint8 as (n, 2) uint64 words (native byte order)."""
    return mac.view(np.uint64).reshape(-1, 2)
