"""What a block parser yields, and the pieces the formats' parsers (:mod:`raw_format`, :mod:`token_formats`)
share: the line scan, the reasons a row is malformed, float parsing and text, a slot's hashed (and counted) ids, and
the weight check. :mod:`components.data_prep.formats` describes the formats.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.data_prep.hashing import hash_arrow_values, prefix_state, slot_prefix
from components.data_prep.id_counts import IdCounts
from components.data_prep.multislot import RaggedIds, Schema
from components.data_prep.sources import DataPrepError

MISSING_VALUE = "<missing>"
CRITEO_DENSE_DIM = 13
CRITEO_SLOTS = tuple(f"C{index}" for index in range(1, 27))


@dataclass(frozen=True)
class ParseSettings:
    """What a block is parsed by: its format, the rows' ``schema`` with ids in ``[0, vocab_size)``;
    ``weight_column``: where a weighted schema's weights are; ``id_counts``: estimates every id's train rows and
    maps the rare ones (the convert pass, once the counting pass has counted); ``with_text``: False leaves the
    rows' MultiSlot lines unjoined (the counting pass reads the ids only); ``with_dense``: the rows' dense values
    as an array too (:attr:`ParsedBlock.dense`: the transform reads rows as arrays, not as text)."""

    fmt: str
    schema: Schema
    vocab_size: int
    weight_column: Optional[str] = None
    id_counts: Optional[IdCounts] = None
    with_text: bool = True
    with_dense: bool = False


class WeightError(DataPrepError):
    """A well-formed row without a usable weight; ``line``: the row's 0-based line within its block (the reader of
    the unit names the file and line)."""

    def __init__(self, line: int, message: str):
        super().__init__(message)
        self.line = line


@dataclass
class SlotIds:
    """A sparse slot's ids in a block: occurrence ``i`` (a value of row ``row_of[i]``) has id ``ids[value_of[i]]``.

    With id counts (:class:`~components.data_prep.id_counts.IdCounts`): ``unfiltered``, each value's id before the
    count filter, and ``estimates``, its train rows as counted."""

    ids: np.ndarray
    value_of: np.ndarray
    row_of: np.ndarray
    one_per_row: bool = False  # every row holds exactly one value (raw input)
    unfiltered: Optional[np.ndarray] = None
    estimates: Optional[np.ndarray] = None

    def present(self, rows: np.ndarray) -> np.ndarray:
        """Per value: whether a row where ``rows`` is true holds it."""
        present = np.zeros(len(self.ids), bool)
        present[self.value_of[rows[self.row_of]]] = True
        return present

    def of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The ids that occur in the rows where ``rows`` is true, each once."""
        return self.ids[self.present(rows)]

    def row_counts(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(ids, of the rows where rows is true how many hold each)``: a row holding an id twice counts once; an
        id may come twice (two values that hash to it), its counts to be added."""
        taken = rows[self.row_of]
        if self.one_per_row:
            counts = np.bincount(self.value_of[taken], minlength=len(self.ids))
            return self.ids[counts > 0], counts[counts > 0]
        owners, ids = self.row_of[taken], self.ids[self.value_of[taken]]
        order = np.lexsort((ids, owners))
        owners, ids = owners[order], ids[order]
        first = np.ones(len(ids), bool)
        first[1:] = (owners[1:] != owners[:-1]) | (ids[1:] != ids[:-1])
        return np.unique(ids[first], return_counts=True)

    def ragged(self, rows: int) -> RaggedIds:
        """The ids of each of the block's ``rows`` rows, in the order its MultiSlot line holds them (every row
        holds a value of every slot; ``row_of`` is sorted)."""
        values = self.ids[self.value_of].astype(np.int64)
        if self.one_per_row:
            return RaggedIds(values, np.arange(rows + 1, dtype=np.int64))
        offsets = np.zeros(rows + 1, np.int64)
        np.cumsum(np.bincount(self.row_of, minlength=rows), out=offsets[1:])
        return RaggedIds(values, offsets)


@dataclass
class ParsedBlock:
    """The well-formed rows of one block, as MultiSlot text, and what was wrong with the others."""

    line_starts: np.ndarray  # int64, the offset within the block of every physical line (blank ones included)
    row_lines: np.ndarray  # int64, the 0-based line (within the block) of each well-formed row, in order
    labels: np.ndarray  # int64 per row
    text: Optional[pa.Array]  # the MultiSlot line of each row, newline included (None: not asked for)
    slot_ids: list[SlotIds]  # per sparse slot
    missing: np.ndarray  # int64 per sparse slot: the rows without a value for it (its one value is MISSING_VALUE)
    malformed: list[tuple[int, str]]  # (0-based line within the block, reason), in line order
    # float32 [rows, dense_dim], the values the MultiSlot text holds (None: not asked for, ParseSettings.with_dense)
    dense: Optional[np.ndarray] = None

    def sparse(self) -> list[RaggedIds]:
        """Per sparse slot the rows' ids, as the reader of the MultiSlot text gets them."""
        return [ids.ragged(len(self.labels)) for ids in self.slot_ids]


_WHITESPACE = np.zeros(256, bool)
_WHITESPACE[list(b" \t\r\v\f")] = True


def scan_lines(block: bytes) -> tuple[np.ndarray, np.ndarray]:
    """``(start offset of every line, whether it is blank)``; the block's last line may lack its newline.

    Blank: empty or whitespace only (checked byte by byte only for the rare lines that start with whitespace).
    """
    data = np.frombuffer(block, np.uint8)
    ends = np.flatnonzero(data == 10)
    if len(data) and data[-1] != 10:
        ends = np.append(ends, len(data))
    starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64) if len(ends) else np.zeros(0, np.int64)
    blank = ends == starts
    candidates = np.flatnonzero(~blank & _WHITESPACE[data[np.minimum(starts, max(len(data) - 1, 0))]])
    blank[candidates] = [not block[starts[i]:ends[i]].strip() for i in candidates]
    return starts, blank


def lines_array(block: bytes, starts: np.ndarray) -> pa.Array:
    """Each line as an Arrow binary value (its newline included), without copying the block."""
    offsets = np.append(starts, len(block)).astype(np.int64)
    return pa.Array.from_buffers(pa.large_binary(), len(starts), [None, pa.py_buffer(offsets), pa.py_buffer(block)])


class Reasons:
    """The first reason each row is malformed (checks run in the format's field order)."""

    def __init__(self, rows: int):
        self.reason = np.full(rows, None, dtype=object)

    def add(self, bad: np.ndarray, reasons) -> None:
        """``reasons``: one per row where ``bad``, in row order (or one for all); rows already malformed keep theirs."""
        new = bad & (self.reason == None)  # noqa: E711 - elementwise
        if new.any():
            self.reason[new] = reasons if isinstance(reasons, str) else np.asarray(reasons, dtype=object)[new[bad]]

    def add_first_token(self, parent: np.ndarray, bad: np.ndarray, messages: Sequence[str]) -> None:
        """Rows with a bad token, each with the message of its first one (``messages``: one per bad token)."""
        rows, first = np.unique(parent[bad], return_index=True)
        marked = np.zeros(len(self.reason), bool)
        marked[rows] = True
        self.add(marked, np.asarray(messages, dtype=object)[first])

    @property
    def good(self) -> np.ndarray:
        return self.reason == None  # noqa: E711


def decode(values: pa.Array) -> list[str]:
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in values.to_pylist()]


def binary_lengths(values: pa.Array) -> np.ndarray:
    """The byte length of every value of an Arrow string or binary array, read from its offsets."""
    if not len(values):
        return np.zeros(0, np.int64)
    wide = pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type)
    offsets = np.frombuffer(values.buffers()[1], np.int64 if wide else np.int32)
    return np.diff(offsets[values.offset:values.offset + len(values) + 1])


def parse_floats(texts: pa.Array) -> np.ndarray:
    """float64 of every text; NaN where it is not a finite number (each distinct text is parsed once)."""
    try:
        values = np.asarray(pc.cast(pc.cast(texts, pa.string()), pa.float64()), dtype=np.float64)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        values = np.array([_float_or_nan(t) for t in decode(texts)], dtype=np.float64)
    return np.where(np.isfinite(values), values, np.nan)


def _float_or_nan(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def float_texts(values: np.ndarray) -> pa.Array:
    """Floats (dense values, weights) as float32 text: the shortest that reads back as the float32 the trainer
    feeds."""
    return pc.cast(pa.array(values.astype(np.float32)), pa.string())


def hashed_slots(parser: ParseSettings, slots: Sequence[str], values: pa.Array, sizes: np.ndarray,
                 value_of: Sequence[np.ndarray], row_of: Sequence[np.ndarray],
                 one_per_row: bool = False) -> tuple[list[SlotIds], Optional[pa.Array], np.ndarray]:
    """The :class:`SlotIds` of every slot ``slots[k]`` from its raw values (binary, empty = :data:`MISSING_VALUE`):
    the next ``sizes[k]`` of ``values``; all slots are hashed (and counted) in one pass. ``value_of``, ``row_of``:
    per slot, as :class:`SlotIds` holds them.

    Returns ``(slot ids, texts, starts)``: with ``parser.with_text`` every value's "<id>" text (the id after the
    count filter; None without), slot ``k``'s from ``starts[k]`` to ``starts[k + 1]``."""
    sizes = np.asarray(sizes, np.int64)
    starts = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    values = pc.if_else(pc.equal(pc.binary_length(values), 0), pa.scalar(MISSING_VALUE.encode(), values.type), values)
    unfiltered = hash_arrow_values(np.repeat(_prefix_states(tuple(slots)), sizes), values) % np.uint64(
        parser.vocab_size)
    ids, estimates = unfiltered, None
    if parser.id_counts is not None:
        estimates = parser.id_counts.estimates_slots(slots, sizes, unfiltered)
        ids = parser.id_counts.filtered_slots(slots, sizes, unfiltered, estimates)
    found = []
    for k in range(len(slots)):
        part = slice(starts[k], starts[k + 1])
        if estimates is None:
            found.append(SlotIds(ids[part], value_of[k], row_of[k], one_per_row))
        else:
            found.append(SlotIds(ids[part], value_of[k], row_of[k], one_per_row, unfiltered[part], estimates[part]))
    texts = pc.cast(pa.array(ids), pa.string()) if parser.with_text else None
    return found, texts, starts


@functools.lru_cache(maxsize=256)
def _prefix_states(slots: tuple[str, ...]) -> np.ndarray:
    """FNV-1a's state after each slot's key prefix (once per process and schema)."""
    return np.array([prefix_state(slot_prefix(slot)) for slot in slots], np.uint64)


def first_bad_weight(lines: np.ndarray, weights: np.ndarray, text_of: Callable[[int], Optional[str]],
                     what: str) -> None:
    """Raises WeightError for the first row (in line order) whose weight is missing, not a finite number (NaN)
    or negative; ``text_of(i)``: row i's weight as written (None: it has none); ``what``: where it was looked for."""
    bad = np.flatnonzero(np.isnan(weights) | (weights < 0))
    if len(bad):
        first = int(bad[np.argmin(lines[bad])])
        text = text_of(first)
        problem = ("has no weight" if text is None else f"has weight {text!r}, which is "
                   + ("negative" if weights[first] < 0 else "not a finite number"))
        raise WeightError(int(lines[first]), f"the row {problem} ({what}); every row needs a finite weight >= 0: "
                                             "fix the input or unset data.weight_column")


def join_columns(columns: list[pa.Array]) -> pa.Array:
    return pc.binary_join_element_wise(*columns, " ") if len(columns) > 1 else columns[0]
