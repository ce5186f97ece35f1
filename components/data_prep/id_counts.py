"""How many train rows hold each id, in bounded memory, and the count filter it drives (``data.min_id_count``).

**The sketch.** A count-min sketch of :data:`DEPTH` rows of :data:`WIDTH` uint32 counters (:data:`SKETCH_BYTES`,
64 MiB) for every slot together, whatever the vocabulary. An id of a slot is the key ``mix64(id ^ hash64(slot))``
(:func:`slot_keys`); each row of counters has its own bucket for a key, a sighting adds one to the key's bucket in
every row, and a key's estimate is the least of its buckets. An estimate is never below the true count and exceeds
it by what other keys put in the same buckets: on average ``counted / WIDTH`` per row (``counted``: all sightings,
:attr:`CountSketch.counted`), so it is close to exact while the train split holds fewer sightings than a few times
WIDTH (4M) and vaguer beyond (stats.json records ``counted``). Counters stop at 2^32 - 1 rather than wrap.
Sketches add up counter by counter (an addition that stops at 2^32 - 1 is still associative on counts), so the
dataset's sketch is the sum of its units' in any grouping: the same whatever the number of processes or pods.

A sighting is a train row holding the id (an id twice in one row of one slot counts once), after negative
downsampling: the rows the servers train on.

**The count filter.** An id whose estimate is below ``min_id_count`` is written as its slot's out-of-vocabulary
id, :func:`oov_id`: the id the slot's value :data:`OOV_VALUE` hashes to (as a missing value is ``<missing>``'s),
so it lies in ``[0, vocab_size)`` and differs from slot to slot. Every split is mapped by the train split's counts:
an id never seen in training is its slot's OOV id in validation and test as well.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from os import PathLike

import numpy as np

from components.data_prep.hashing import feature_id, hash64, mix64

DEPTH = 4
WIDTH = 1 << 22
SKETCH_BYTES = DEPTH * WIDTH * np.dtype(np.uint32).itemsize
# The thresholds of stats["distinct_ids_seen_at_least"]: the ids the servers' admission (embedx_threshold) keeps.
SEEN_AT_LEAST = (1, 2, 3, 5, 10, 20, 50, 100)
OOV_VALUE = "<oov>"
_COUNT_MAX = np.iinfo(np.uint32).max
_WIDTH_BITS = WIDTH.bit_length() - 1
_ROW_SALTS = tuple(np.uint64(hash64(f"id-count-row\x1f{row}".encode())) for row in range(DEPTH))


@functools.cache
def _slot_salt(slot: str) -> np.uint64:
    return np.uint64(hash64(f"{slot}\x1fid-count".encode()))


def slot_keys(slot: str, ids: np.ndarray) -> np.ndarray:
    """The sketch's key of every id of ``slot``: distinct ids of a slot get distinct keys (mix64 is a bijection),
    and the slots' keys do not meet (but by a 2^-64 chance)."""
    return mix64(np.asarray(ids, np.uint64) ^ _slot_salt(slot))


@functools.lru_cache(maxsize=4096)
def oov_id(slot: str, vocab_size: int) -> int:
    """The id every rare id of ``slot`` is written as."""
    return feature_id(slot, OOV_VALUE, vocab_size)


def _buckets(keys: np.ndarray, row: int) -> np.ndarray:
    return (mix64(keys ^ _ROW_SALTS[row]) >> np.uint64(64 - _WIDTH_BITS)).astype(np.intp)


class CountSketch:
    """The count-min sketch above: :meth:`add` sightings, :meth:`estimates` of keys, :meth:`merge` another."""

    def __init__(self, table: np.ndarray | None = None):
        self.table = np.zeros((DEPTH, WIDTH), np.uint32) if table is None else table

    def add(self, keys: np.ndarray, counts: np.ndarray) -> None:
        """``counts[i]`` more sightings of ``keys[i]`` (a key may come more than once); a call adds less than 2^32
        to any counter (a block of rows does), so a counter that wraps is one that went past the top."""
        counts = np.asarray(counts, np.uint32)
        for row in range(DEPTH):
            buckets, counters = _buckets(keys, row), self.table[row]
            before = counters[buckets]
            np.add.at(counters, buckets, counts)
            counters[buckets[counters[buckets] < before]] = _COUNT_MAX

    def estimates(self, keys: np.ndarray) -> np.ndarray:
        """uint32 per key: at least its sightings."""
        found = self.table[0][_buckets(keys, 0)]
        for row in range(1, DEPTH):
            np.minimum(found, self.table[row][_buckets(keys, row)], out=found)
        return found

    def merge(self, other: "CountSketch") -> None:
        """Add ``other``'s sightings (row by row: one row's sum in int64 at a time, 32 MiB)."""
        for row in range(DEPTH):
            total = self.table[row].astype(np.int64) + other.table[row]
            self.table[row] = np.minimum(total, _COUNT_MAX)

    @property
    def counted(self) -> int:
        """Sightings added (each lands once in every row; exact unless a counter reached the top)."""
        return int(self.table[0].sum(dtype=np.uint64))

    def save(self, path: str | PathLike) -> None:
        np.save(path, self.table)

    @classmethod
    def load(cls, path: str | PathLike) -> "CountSketch":
        """Mapped, not read: the processes of a pool that load one file share its pages."""
        return cls(np.load(path, mmap_mode="r"))


@dataclass(frozen=True)
class IdCounts:
    """The train split's counts as a parser uses them: each id's estimate, and the count filter."""

    sketch: CountSketch
    min_id_count: int  # 1: no filter
    vocab_size: int

    def estimates(self, slot: str, ids: np.ndarray) -> np.ndarray:
        return self.sketch.estimates(slot_keys(slot, ids))

    def filtered(self, slot: str, ids: np.ndarray, estimates: np.ndarray) -> np.ndarray:
        """``ids`` with those rarer than ``min_id_count`` replaced by the slot's OOV id."""
        return self.filtered_slots([slot], np.array([len(ids)]), ids, estimates)

    def estimates_slots(self, slots: Sequence[str], sizes: np.ndarray, ids: np.ndarray) -> np.ndarray:
        """:meth:`estimates` of the ids of many slots at once: the first ``sizes[0]`` ids are of ``slots[0]``, the
        next ``sizes[1]`` of ``slots[1]``, and so on."""
        salts = np.repeat(np.array([_slot_salt(slot) for slot in slots], np.uint64), sizes)
        return self.sketch.estimates(mix64(np.asarray(ids, np.uint64) ^ salts))

    def filtered_slots(self, slots: Sequence[str], sizes: np.ndarray, ids: np.ndarray,
                       estimates: np.ndarray) -> np.ndarray:
        """:meth:`filtered` of the ids of many slots at once (``sizes``: as in :meth:`estimates_slots`)."""
        if self.min_id_count <= 1:
            return ids
        oov = np.repeat(np.array([oov_id(slot, self.vocab_size) for slot in slots], ids.dtype), sizes)
        return np.where(estimates < self.min_id_count, oov, ids)
