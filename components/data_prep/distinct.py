"""Distinct ids per slot in bounded memory: exact while small, a HyperLogLog sketch beyond.

The memory planner bounds a sparse table's rows by the distinct ids of the train split (``stats.json``). An exact
set of a slot's ids grows with the data; past :data:`EXACT_LIMIT` ids a slot switches to a HyperLogLog of
2^:data:`PRECISION` one-byte registers (16 KiB), whose estimate has a relative standard error of
``1.04 / sqrt(2^PRECISION)`` = :data:`RELATIVE_ERROR` (0.81%). Counters merge (a union of sets, the maximum of
registers), so each unit of the input counts its own ids and the dataset's count is their merge, whatever the
number of processes.
"""

from __future__ import annotations

import io
from collections.abc import Mapping
from os import PathLike
from typing import Optional

import numpy as np

from components.data_prep.hashing import mix64

EXACT_LIMIT = 1 << 16  # ids a slot's exact set may hold (512 KiB) before it becomes a sketch
PRECISION = 14
REGISTERS = 1 << PRECISION
RELATIVE_ERROR = 1.04 / np.sqrt(REGISTERS)
_SALT = np.uint64(0x9E3779B97F4A7C15)  # ids are small integers: salted and mixed, their bits are uniform


class DistinctCounter:
    """Distinct uint64 ids: an exact sorted set until :data:`EXACT_LIMIT`, then HyperLogLog registers."""

    def __init__(self) -> None:
        self.exact: Optional[np.ndarray] = np.zeros(0, np.uint64)
        self.registers: Optional[np.ndarray] = None
        self._pending: list[np.ndarray] = []
        self._pending_size = 0

    def add(self, ids: np.ndarray) -> None:
        if self.registers is not None:
            self._add_to_sketch(ids)
            return
        self._pending.append(np.asarray(ids, np.uint64))
        self._pending_size += len(ids)
        if self._pending_size >= EXACT_LIMIT:
            self._settle()

    def _settle(self) -> None:
        if self.registers is not None:
            return
        if self._pending:
            self.exact = np.unique(np.concatenate([self.exact, *self._pending]))
            self._pending, self._pending_size = [], 0
        if len(self.exact) > EXACT_LIMIT:
            self.registers = np.zeros(REGISTERS, np.uint8)
            self._add_to_sketch(self.exact)
            self.exact = None

    def _add_to_sketch(self, ids: np.ndarray) -> None:
        h = mix64(np.asarray(ids, np.uint64) ^ _SALT)
        bucket = (h >> np.uint64(64 - PRECISION)).astype(np.int64)
        rest = (h << np.uint64(PRECISION)) | np.uint64(1 << (PRECISION - 1))  # never 0: the rank is bounded
        np.maximum.at(self.registers, bucket, (64 - _bit_length(rest) + 1).astype(np.uint8))

    def merge(self, other: "DistinctCounter") -> None:
        other._settle()
        if other.registers is None:
            self.add(other.exact)
            return
        self._settle()
        if self.registers is None:
            self.registers = np.zeros(REGISTERS, np.uint8)
            self._add_to_sketch(self.exact)
            self.exact = None
        np.maximum(self.registers, other.registers, out=self.registers)

    def copy(self) -> "DistinctCounter":
        return DistinctCounter.from_bytes(self.to_bytes())

    @property
    def is_exact(self) -> bool:
        self._settle()
        return self.registers is None

    def count(self) -> int:
        self._settle()
        if self.registers is None:
            return int(len(self.exact))
        alpha = 0.7213 / (1 + 1.079 / REGISTERS)
        estimate = alpha * REGISTERS ** 2 / np.sum(np.ldexp(1.0, -self.registers.astype(np.int64)))
        zeros = int(np.count_nonzero(self.registers == 0))
        if estimate <= 2.5 * REGISTERS and zeros:  # small range: linear counting is more accurate
            estimate = REGISTERS * np.log(REGISTERS / zeros)
        return int(round(estimate))

    def to_bytes(self) -> bytes:
        self._settle()
        buffer = io.BytesIO()
        if self.registers is None:
            np.savez(buffer, exact=self.exact)
        else:
            np.savez(buffer, registers=self.registers)
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes) -> "DistinctCounter":
        counter = cls()
        with np.load(io.BytesIO(data)) as saved:
            if "registers" in saved:
                counter.registers, counter.exact = saved["registers"], None
            else:
                counter.exact = saved["exact"]
        return counter


def save_counters(path: str | PathLike, counters: Mapping[str, DistinctCounter]) -> None:
    """One ``.npz`` of a counter per slot, keyed by the slot's name."""
    np.savez(path, **{slot: np.frombuffer(c.to_bytes(), np.uint8) for slot, c in counters.items()})


def load_counters(path: str | PathLike) -> dict[str, DistinctCounter]:
    """What :func:`save_counters` wrote, in the slots' order."""
    with np.load(path) as saved:
        return {slot: DistinctCounter.from_bytes(saved[slot].tobytes()) for slot in saved.files}


def _bit_length(values: np.ndarray) -> np.ndarray:
    """Bits needed for each uint64 (exact: float64 holds each 32-bit half exactly)."""
    high = (values >> np.uint64(32)).astype(np.float64)
    low = (values & np.uint64(0xFFFFFFFF)).astype(np.float64)
    with np.errstate(divide="ignore"):
        return np.where(high > 0, 33 + np.floor(np.log2(np.maximum(high, 1))),
                        np.where(low > 0, 1 + np.floor(np.log2(np.maximum(low, 1))), 0)).astype(np.int64)
