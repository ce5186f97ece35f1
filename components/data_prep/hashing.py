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

:func:`hash64_many` / :func:`feature_ids` (Python strings) and :func:`hash_arrow_values` (an Arrow
string or binary array, as data prep reads its input) are numpy-vectorised versions that give bit-identical
results to the scalar functions.

The function is named by :data:`HASH_FUNCTION` in a dataset's ``stats.json``, a checkpoint's ``model.json``
and a serving model's ``serving.json``; code that maps raw values to ids refuses any other name
(:func:`check_hash_function`), so ids never silently change meaning between training and serving.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from typing import Optional

import numpy as np

_FNV_OFFSET = 0xCBF29CE484222325
_FNV_PRIME = 0x100000001B3
_FMIX_C1 = 0xFF51AFD7ED558CCD
_FMIX_C2 = 0xC4CEB9FE1A85EC53
_MASK64 = (1 << 64) - 1
_KEY_SEPARATOR = "\x1f"

# The name of the id function above (key, hash, finaliser, modulo). A new function gets a new name.
HASH_FUNCTION = "fnv1a64+fmix64(slot\\x1fvalue) mod vocab_size"
# The datasets and checkpoints made before the name was recorded used this same function.
IMPLEMENTED_HASH_FUNCTIONS = (HASH_FUNCTION,)

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
    return _fmix64(_fnv_prefix(key))


def hash64_many(keys: Sequence[bytes]) -> np.ndarray:
    """Vectorised :func:`hash64`: uint64 array, one hash per key."""
    lengths = np.fromiter(map(len, keys), dtype=np.int64, count=len(keys))
    if len(keys) == 0:
        return np.zeros(0, dtype=np.uint64)
    width = max(int(lengths.max()), 1)
    # Fixed-width byte matrix; the NUL padding is masked out by `lengths`.
    matrix = np.array(keys, dtype=f"S{width}").view(np.uint8).reshape(len(keys), width)
    starts = np.arange(len(keys), dtype=np.int64) * width
    return mix64(_fnv1a(np.full(len(keys), _FNV_OFFSET, dtype=np.uint64), matrix.ravel(), starts, lengths))


_FNV_CHUNK = 1 << 15  # keys hashed together


def _fnv1a(hashes: np.ndarray, data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """FNV-1a of ``data[starts[i]:starts[i] + lengths[i]]`` continued from ``hashes[i]``, for every i.

    The keys are taken longest first, so the keys still being hashed at byte ``position`` are a prefix of that
    order: each byte position updates only them, in place (no masking of the keys that have ended)."""
    if not len(lengths):
        return np.array(hashes, dtype=np.uint64)
    if len(lengths) > _FNV_CHUNK:  # a chunk's arrays stay in the cache while its bytes are taken
        return np.concatenate([_fnv1a(hashes[i:i + _FNV_CHUNK], data, starts[i:i + _FNV_CHUNK],
                                      lengths[i:i + _FNV_CHUNK]) for i in range(0, len(lengths), _FNV_CHUNK)])
    prime = np.uint64(_FNV_PRIME)
    longest = int(lengths.max())
    # Longest first; the distance to the longest key as uint16 (keys are short) sorts by radix, in linear time.
    shortfall = longest - lengths
    order = np.argsort(shortfall.astype(np.uint16) if longest < (1 << 16) else shortfall, kind="stable")
    state = np.array(hashes, dtype=np.uint64)[order]
    starts, lengths = starts[order], lengths[order]
    active = np.searchsorted(-lengths, -np.arange(int(lengths[0])), side="left")  # keys longer than each position
    for position, count in enumerate(active.tolist()):
        head = state[:count]
        head ^= data[starts[:count] + position]
        head *= prime
    hashes = np.empty_like(state)
    hashes[order] = state
    return hashes


def mix64(values: np.ndarray) -> np.ndarray:
    """MurmurHash3's ``fmix64`` of every uint64 (a bijection that spreads every input bit over all 64)."""
    h = np.array(values, dtype=np.uint64)
    h ^= h >> np.uint64(33)
    h *= np.uint64(_FMIX_C1)
    h ^= h >> np.uint64(33)
    h *= np.uint64(_FMIX_C2)
    h ^= h >> np.uint64(33)
    return h


def hash_arrow_values(prefix, values) -> np.ndarray:
    """:func:`hash64` of ``prefix + value`` for every value of an Arrow string/binary array (no nulls).

    ``prefix``: the bytes every key starts with, or per value FNV-1a's state after its own prefix
    (:func:`prefix_state`), so that the values of many slots are hashed in one pass."""
    import pyarrow as pa

    if pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type):
        offset_type = np.int64
    else:
        offset_type = np.int32
    count = len(values)
    if count == 0:
        return np.zeros(0, dtype=np.uint64)
    offsets = np.frombuffer(values.buffers()[1], offset_type)[values.offset: values.offset + count + 1]
    data = values.buffers()[2]
    data = np.frombuffer(data, np.uint8) if data is not None else np.zeros(0, np.uint8)
    if isinstance(prefix, (bytes, bytearray)):
        start = np.full(count, prefix_state(bytes(prefix)), dtype=np.uint64)
    else:
        start = np.asarray(prefix, dtype=np.uint64)
    lengths = (offsets[1:] - offsets[:-1]).astype(np.int64)
    return mix64(_fnv1a(start, data, offsets[:-1].astype(np.int64), lengths))


@functools.lru_cache(maxsize=4096)
def prefix_state(prefix: bytes) -> int:
    """FNV-1a's state after ``prefix`` (a slot's key prefix, :func:`slot_prefix`), computed once per process."""
    return _fnv_prefix(prefix)


def _fnv_prefix(prefix: bytes) -> int:
    """FNV-1a's state after ``prefix`` (the slot name and separator every key of a slot starts with)."""
    h = _FNV_OFFSET
    for byte in prefix:
        h = ((h ^ byte) * _FNV_PRIME) & _MASK64
    return h


def slot_prefix(slot_name: str) -> bytes:
    """What every key of ``slot_name`` starts with: :func:`feature_key` without the value."""
    return f"{slot_name}{_KEY_SEPARATOR}".encode()


def check_hash_function(name: Optional[str], where: str) -> None:
    """Refuse ids made by a hash function this code does not implement (``None``: made before names were recorded,
    by :data:`HASH_FUNCTION`)."""
    if name is not None and name not in IMPLEMENTED_HASH_FUNCTIONS:
        raise ValueError(f"{where} maps raw values to ids with {name!r}, which this code does not implement "
                         f"(it implements {', '.join(map(repr, IMPLEMENTED_HASH_FUNCTIONS))}): prepare the data "
                         "and train again with this version, or use the version that made it")


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
