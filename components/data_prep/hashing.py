"""Deterministic feature hashing: (slot, raw value) -> id in [0, vocab_size).

Every sparse id written to a MultiSlot shard comes from :func:`feature_id`, so all
ids lie in ``[0, vocab_size)`` -- a geo-mode parameter-server worker keeps a dense
local table of exactly ``vocab_size`` rows.

Algorithm (stable across processes, machines and Python versions, unlike the
per-process salted builtin ``hash()``):

1. key = UTF-8 bytes of ``f"{slot_name}\\x1f{raw_value}"`` (``\\x1f`` is the ASCII
   unit separator, so ``("C1", "23")`` and ``("C12", "3")`` differ);
2. h = 64-bit FNV-1a of the key;
3. h = MurmurHash3 ``fmix64`` finaliser of h -- FNV-1a's low bits depend only on
   the low bits of the input bytes, which would collide badly under a
   power-of-two modulus without this avalanche step;
4. id = h mod vocab_size.

:func:`hash64_many` / :func:`feature_ids` are numpy-vectorised versions that give
bit-identical results to the scalar functions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_FMIX_C1 = 0xFF51AFD7ED558CCD
_FMIX_C2 = 0xC4CEB9FE1A85EC53
_MASK64 = (1 << 64) - 1
_KEY_SEPARATOR = "\x1f"

# Shards store ids as decimal text that readers may parse through float64, which is
# exact up to 2**53 -- far above any embedding table a PS can hold.
MAX_VOCAB_SIZE = 1 << 53


def _fmix64(h: int) -> int:
    h ^= h >> 33
    h = (h * _FMIX_C1) & _MASK64
    h ^= h >> 33
    h = (h * _FMIX_C2) & _MASK64
    h ^= h >> 33
    return h


def hash64(key: bytes) -> int:
    """64-bit FNV-1a of ``key`` followed by the ``fmix64`` finaliser."""
    h = _FNV_OFFSET
    for byte in key:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK64
    return _fmix64(h)


def hash64_many(keys: Sequence[bytes]) -> np.ndarray:
    """Vectorised :func:`hash64`: uint64 array, one hash per key."""
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    if len(keys) == 0:
        return np.zeros(0, dtype=np.uint64)
    width = max(int(lengths.max()), 1)
    # Fixed-width byte matrix; the NUL padding is masked out by `lengths`.
    matrix = np.array(keys, dtype=f"S{width}").view(np.uint8).reshape(len(keys), width)
    hashes = np.full(len(keys), _FNV_OFFSET, dtype=np.uint64)
    prime = np.uint64(_FNV_PRIME)
    for position in range(width):
        stepped = (hashes ^ matrix[:, position].astype(np.uint64)) * prime
        hashes = np.where(position < lengths, stepped, hashes)
    hashes ^= hashes >> np.uint64(33)
    hashes *= np.uint64(_FMIX_C1)
    hashes ^= hashes >> np.uint64(33)
    hashes *= np.uint64(_FMIX_C2)
    hashes ^= hashes >> np.uint64(33)
    return hashes


def _check_vocab_size(vocab_size: int) -> None:
    if not 1 <= vocab_size <= MAX_VOCAB_SIZE:
        raise ValueError(f"vocab_size must be in [1, 2**53], got {vocab_size}")


def feature_key(slot_name: str, raw_value: str | int) -> bytes:
    """The bytes that are hashed for one (slot, value) pair."""
    return f"{slot_name}{_KEY_SEPARATOR}{raw_value}".encode()


def feature_id(slot_name: str, raw_value: str | int, vocab_size: int) -> int:
    """Id of ``raw_value`` in slot ``slot_name``, in ``[0, vocab_size)``.

    ``raw_value`` is hashed through ``str()``, so ``7`` and ``"7"`` give the same id.
    """
    _check_vocab_size(vocab_size)
    return hash64(feature_key(slot_name, raw_value)) % vocab_size


def feature_ids(slot_name: str, raw_values: Iterable[str | int], vocab_size: int) -> np.ndarray:
    """Vectorised :func:`feature_id` for many values of one slot: int64 array."""
    _check_vocab_size(vocab_size)
    prefix = f"{slot_name}{_KEY_SEPARATOR}"  # feature_key, inlined: this is a hot loop
    hashes = hash64_many([(prefix + str(value)).encode("utf-8") for value in raw_values])
    return (hashes % np.uint64(vocab_size)).astype(np.int64)
