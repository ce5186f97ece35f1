"""The input formats, parsed a block of whole lines at a time, columnar, into MultiSlot text.

Formats (``data.format``):

* ``raw`` -- Criteo TSV: ``label \\t I1..I13 \\t C1..C26`` (40 fields, empty = missing). Dense:
  :func:`normalize_count`; missing dense -> 0. Slots ``C1``..``C26``.
* ``slot`` -- PaddleRec CTR-DNN text: ``click:<0|1>``, 13 x ``dense_feature:<float>`` (taken as is), then
  ``<n>:<id>`` for n = 1..26. Slot ``n`` is named ``C<n>`` so both Criteo formats share one schema.
* ``feasign`` -- PaddleRec production ``feasign:slot`` text: every token is ``<uint64 feasign>:<slot id>``;
  slot ``1`` carries the click label as its feasign (``0:1`` / ``1:1``); other slots are sparse and may hold
  several feasigns. No dense features. Slots are named by their id (``"2"``, ``"3"``, ...).

A slot absent from a line (``raw``: an empty field) gets the single value :data:`MISSING_VALUE`, hashed per slot
like any other value: Paddle's MultiSlot feed rejects empty slots. Each block counts the rows each slot is missing
from (``stats.json``'s ``missing``: a slot that stops arriving is a broken log pipeline, not a feature). Blank
lines are skipped; any other line that does not parse is malformed and reported with its reason, the first check it
fails (in the order the format lists its fields).

How it is fast (README: data prep): Arrow parses the block (its CSV reader for ``raw``, its string kernels for
the token formats); every column is dictionary-encoded, so each *distinct* value of a block is parsed, hashed
(:func:`components.data_prep.hashing.hash_arrow_values`) and formatted once; rows get their text by ``take`` and
one element-wise join builds the MultiSlot lines (:mod:`components.data_prep.multislot`), never value by value
in Python.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from components.data_prep.hashing import feature_id, hash_arrow_values, slot_prefix
from components.data_prep.multislot import Schema
from components.data_prep.sources import DataPrepError

FORMATS = ("raw", "slot", "feasign")
MISSING_VALUE = "<missing>"
CRITEO_DENSE_DIM = 13
CRITEO_SLOTS = tuple(f"C{index}" for index in range(1, 27))
RAW_COLUMNS = ("label", *(f"I{index}" for index in range(1, CRITEO_DENSE_DIM + 1)), *CRITEO_SLOTS)
FEASIGN_LABEL_SLOT = "1"
# log1p of Criteo counts: 16 ~ log1p(8.9e6); larger counts are clipped to 1.0.
DENSE_LOG_CAP = 16.0
_UINT64_MAX = str((1 << 64) - 1)


def normalize_count(value: float) -> float:
    """Criteo integer feature -> [0, 1]: ``min(log1p(max(value, 0)) / 16, 1)``.

    Negative values (a few Criteo columns have -1..-3) count as 0, like missing ones.
    """
    return min(math.log1p(max(value, 0.0)) / DENSE_LOG_CAP, 1.0)


def schema_for(fmt: str, slots: Optional[Sequence[str]], discovered: Optional[Sequence[str]] = None) -> Schema:
    """The schema of ``fmt``; ``slots`` picks (and orders) its sparse slots, by default all of them (``feasign``:
    ``discovered``, the slots seen in the input)."""
    if fmt not in FORMATS:
        raise DataPrepError(f"unknown input format {fmt!r}: use one of {list(FORMATS)}")
    if fmt == "feasign":
        if slots is None:
            return Schema(0, sorted(discovered or [], key=int))
        invalid = [slot for slot in slots if not _is_uint(slot) or slot == FEASIGN_LABEL_SLOT]
        if invalid:
            raise DataPrepError(f"feasign slots must be integer slot ids other than the label slot "
                                f"{FEASIGN_LABEL_SLOT!r}; got {invalid}")
        return Schema(0, list(slots))
    if slots is None:
        return Schema(CRITEO_DENSE_DIM, list(CRITEO_SLOTS))
    unknown = [slot for slot in slots if slot not in CRITEO_SLOTS]
    if unknown:
        raise DataPrepError(f"slots {unknown} do not exist in format {fmt!r}; available: {list(CRITEO_SLOTS)}")
    return Schema(CRITEO_DENSE_DIM, list(slots))


def _is_uint(text: str) -> bool:
    return text.isascii() and text.isdigit()


@dataclass
class SlotIds:
    """A sparse slot's ids in a block: occurrence ``i`` (a value of row ``row_of[i]``) has id ``ids[value_of[i]]``."""

    ids: np.ndarray
    value_of: np.ndarray
    row_of: np.ndarray

    def of_rows(self, rows: np.ndarray) -> np.ndarray:
        """The ids that occur in the rows where ``rows`` is true, each once."""
        present = np.zeros(len(self.ids), bool)
        present[self.value_of[rows[self.row_of]]] = True
        return self.ids[present]


@dataclass
class ParsedBlock:
    """The well-formed rows of one block, as MultiSlot text, and what was wrong with the others."""

    line_starts: np.ndarray  # int64, the offset within the block of every physical line (blank ones included)
    row_lines: np.ndarray  # int64, the 0-based line (within the block) of each well-formed row, in order
    labels: np.ndarray  # int64 per row
    text: pa.Array  # the MultiSlot line of each row, newline included
    slot_ids: list[SlotIds]  # per sparse slot
    missing: np.ndarray  # int64 per sparse slot: the rows without a value for it (its one value is MISSING_VALUE)
    malformed: list[tuple[int, str]]  # (0-based line within the block, reason), in line order


@dataclass(frozen=True)
class BlockParser:
    """Parses blocks of one format into rows of ``schema``, with ids in ``[0, vocab_size)``."""

    fmt: str
    schema: Schema
    vocab_size: int

    def parse(self, block: bytes) -> ParsedBlock:
        starts, blank = scan_lines(block)
        if self.fmt == "raw":
            return _parse_raw(self, block, starts, blank)
        return _parse_tokens(self, block, starts, blank)


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


def _lines_array(block: bytes, starts: np.ndarray) -> pa.Array:
    """Each line as an Arrow binary value (its newline included), without copying the block."""
    offsets = np.append(starts, len(block)).astype(np.int64)
    return pa.Array.from_buffers(pa.large_binary(), len(starts), [None, pa.py_buffer(offsets), pa.py_buffer(block)])


class _Reasons:
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


def _decode(values: pa.Array) -> list[str]:
    return [v.decode("utf-8", "replace") if isinstance(v, bytes) else v for v in values.to_pylist()]


def _parse_floats(texts: pa.Array) -> np.ndarray:
    """float64 of every text; NaN where it is not a finite number (each distinct text is parsed once)."""
    try:
        values = np.asarray(pc.cast(pc.cast(texts, pa.string()), pa.float64()), dtype=np.float64)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        values = np.array([_float_or_nan(t) for t in _decode(texts)], dtype=np.float64)
    return np.where(np.isfinite(values), values, np.nan)


def _float_or_nan(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.nan


def _float_texts(values: np.ndarray) -> pa.Array:
    """Dense values as float32 text: the shortest that reads back as the float32 the trainer feeds."""
    return pc.cast(pa.array(values.astype(np.float32)), pa.string())


def _id_texts(slot: str, values: pa.Array, vocab_size: int) -> tuple[np.ndarray, pa.Array]:
    """``(ids, "<id>" texts)`` of raw values of one slot (empty = :data:`MISSING_VALUE`)."""
    values = pc.if_else(pc.equal(pc.binary_length(values), 0), pa.scalar(MISSING_VALUE.encode(), values.type),
                        values)
    ids = hash_arrow_values(slot_prefix(slot), values) % np.uint64(vocab_size)
    return ids, pc.cast(pa.array(ids), pa.string())


def _join(columns: list[pa.Array]) -> pa.Array:
    return pc.binary_join_element_wise(*columns, " ") if len(columns) > 1 else columns[0]


def _read_raw(block: bytes, handler, count_type: pa.DataType) -> pa.Table:
    return pacsv.read_csv(
        pa.py_buffer(block),
        read_options=pacsv.ReadOptions(column_names=list(RAW_COLUMNS), use_threads=False,
                                       block_size=max(len(block), 1 << 16)),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False, double_quote=False, escape_char=False,
                                         newlines_in_values=False, ignore_empty_lines=False,
                                         invalid_row_handler=handler),
        convert_options=pacsv.ConvertOptions(
            column_types={name: count_type if name in RAW_COLUMNS[1:1 + CRITEO_DENSE_DIM] else pa.binary()
                          for name in RAW_COLUMNS},
            null_values=[""], strings_can_be_null=False, quoted_strings_can_be_null=False))


def _normalized_texts(counts: np.ndarray) -> pa.Array:
    """:func:`normalize_count` of every count, as the float32 text a shard holds."""
    return _float_texts(np.minimum(np.log1p(np.maximum(counts, 0.0)) / DENSE_LOG_CAP, 1.0))


_SMALL_COUNTS = 1 << 16


@functools.cache
def _small_count_texts() -> pa.Array:
    return _normalized_texts(np.arange(_SMALL_COUNTS, dtype=np.float64))


def _count_texts(counts: np.ndarray) -> tuple[pa.Array, np.ndarray]:
    """``(texts, index of each count's text)``: the small counts' texts are made once per process, the rare large
    counts' per distinct value."""
    counts = np.maximum(counts, 0)
    large = counts >= _SMALL_COUNTS
    if not large.any():
        return _small_count_texts(), counts
    distinct, inverse = np.unique(counts[large], return_inverse=True)
    index = counts.copy()
    index[large] = _SMALL_COUNTS + inverse
    return pa.concat_arrays([_small_count_texts(), _normalized_texts(distinct.astype(np.float64))]), index


def _parse_raw(parser: BlockParser, block: bytes, starts: np.ndarray, blank: np.ndarray) -> ParsedBlock:
    invalid: dict[int, str] = {}

    def handler(row) -> str:
        invalid[row.number - 1] = (f"expected {len(RAW_COLUMNS)} tab-separated fields (label, I1-I13, C1-C26), "
                                   f"found {row.actual_columns}")
        return "skip"

    try:  # Criteo's counts are integers: Arrow parses and checks them as it reads
        table = _read_raw(block, handler, pa.int64())
        counts_parsed = True
    except pa.ArrowInvalid:  # one is not an integer: read the counts as text and find which values are wrong
        invalid.clear()
        table = _read_raw(block, handler, pa.binary())
        counts_parsed = False
    parsed_lines = np.delete(np.arange(len(starts)), sorted(invalid)) if invalid else np.arange(len(starts))
    if table.num_rows != len(parsed_lines):
        raise DataPrepError(f"a block of raw TSV holds {len(starts)} lines but parsed into {table.num_rows} rows and "
                            f"{len(invalid)} bad ones: a carriage return ('\\r') other than before a newline?")
    rows = np.flatnonzero(~blank[parsed_lines])  # table rows that are not blank lines
    reasons = _Reasons(len(rows))
    schema = parser.schema

    def encoded(name: str) -> tuple[pa.Array, np.ndarray]:
        """A column's distinct values and, per row, the index of its value."""
        column = pc.dictionary_encode(table[name].combine_chunks())
        return column.dictionary, np.asarray(column.indices)[rows]

    label_dict, label_index = encoded("label")
    label_of = np.array([{"0": 0, "1": 1}.get(v, -1) for v in _decode(label_dict)], np.int64)
    labels = label_of[label_index] if len(label_of) else np.zeros(0, np.int64)
    bad_label = labels < 0
    shown = _decode(label_dict)
    reasons.add(bad_label, [f"label must be 0 or 1, got {shown[i]!r}" for i in label_index[bad_label]])
    # The label and the dense slot's count in one text: "1 <label> 13".
    head = ["1 0", "1 1"] if not schema.dense_dim else [f"1 0 {schema.dense_dim}", f"1 1 {schema.dense_dim}"]
    columns = [(pa.array(head), np.maximum(labels, 0))]
    for name in RAW_COLUMNS[1:1 + schema.dense_dim]:
        if counts_parsed:
            columns.append(_count_texts(np.asarray(table[name].combine_chunks().fill_null(0))[rows]))
            continue
        entries, index = encoded(name)
        empty = pc.equal(pc.binary_length(entries), 0)
        parsed = _parse_floats(pc.if_else(empty, pa.scalar(b"0", entries.type), entries))  # missing: 0
        bad = np.isnan(parsed)[index]
        if bad.any():
            shown = _decode(entries)
            reasons.add(bad, [f"{name} is not a finite number: {shown[i]!r}" for i in index[bad]])
        columns.append((_normalized_texts(np.nan_to_num(parsed)), index))
    good = reasons.good
    slot_ids, missing = [], np.zeros(len(schema.sparse_slots), np.int64)
    for position, slot in enumerate(schema.sparse_slots):
        entries, index = encoded(slot)
        ids, id_texts = _id_texts(slot, entries, parser.vocab_size)
        slot_ids.append(SlotIds(ids, index[good], np.arange(int(good.sum()))))
        missing[position] = np.count_nonzero(np.asarray(pc.equal(pc.binary_length(entries), 0), bool)[index[good]])
        columns.append((pc.binary_join_element_wise("1", id_texts, " "), index))
    last_text, last_index = columns[-1]
    columns[-1] = (pc.binary_join_element_wise(last_text, "\n", ""), last_index)  # per distinct value, not per row
    texts = [pc.take(text, pa.array(index[good])) for text, index in columns]
    wrong_width = [(line, reason) for line, reason in invalid.items() if not blank[line]]  # e.g. a line of spaces
    malformed = sorted([*wrong_width, *zip(parsed_lines[rows[~good]].tolist(), reasons.reason[~good].tolist())])
    return ParsedBlock(starts, parsed_lines[rows[good]], labels[good], _join(texts), slot_ids, missing, malformed)


@dataclass
class _Tokens:
    """The whitespace-separated tokens of ``rows`` lines: their text and the row each belongs to."""

    text: pa.Array
    parent: np.ndarray
    rows: int

    @classmethod
    def of(cls, lines: pa.Array, rows: int) -> "_Tokens":
        split = pc.ascii_split_whitespace(pc.cast(lines, pa.large_string()))
        flat = pc.list_flatten(split)
        parent = np.asarray(pc.list_parent_indices(split))
        nonempty = np.asarray(pc.greater(pc.utf8_length(flat), 0))
        return cls(pc.filter(flat, pa.array(nonempty)), parent[nonempty], rows)

    def pairs(self, pattern: str) -> tuple[pa.Array, pa.Array, np.ndarray]:
        """The two named groups of ``pattern`` in every token (null where it does not match), and where not."""
        found = pc.extract_regex(self.text, pattern)
        return pc.struct_field(found, [0]), pc.struct_field(found, [1]), np.asarray(pc.is_null(found))

    def texts(self, mask: np.ndarray) -> list[str]:
        return pc.filter(self.text, pa.array(mask)).to_pylist()


def _is(values: pa.Array, text: str) -> np.ndarray:
    return np.asarray(pc.fill_null(pc.equal(values, text), False))


def _feasign_tokens(tokens: _Tokens, reasons: _Reasons) -> tuple[pa.Array, pa.Array]:
    """``(feasign, slot)`` of every ``<uint64 feasign>:<slot id>`` token (null where it is not one)."""
    feasign, slot, bad = tokens.pairs(r"^(?P<feasign>[0-9]+):(?P<slot>[0-9]+)$")
    length = np.asarray(pc.fill_null(pc.utf8_length(feasign), 0))
    too_big = (length > 20) | ((length == 20) & np.asarray(pc.fill_null(pc.greater(feasign, _UINT64_MAX), False)))
    wrong = bad | too_big
    messages = [f"token {t!r} is not <uint64 feasign>:<slot id>" if b else f"feasign {t.partition(':')[0]} does "
                "not fit in uint64" for t, b in zip(tokens.texts(wrong), bad[wrong])]
    reasons.add_first_token(tokens.parent, wrong, messages)
    return feasign, slot


def _labels_of(tokens: _Tokens, is_label: np.ndarray, values: pa.Array, reasons: _Reasons, token: str,
               what: str) -> np.ndarray:
    """Each row's label: its one label token's value, which must be 0 or 1 (-1 where it is not)."""
    count = np.bincount(tokens.parent[is_label], minlength=tokens.rows)
    reasons.add(count != 1, [f"expected exactly one {token} token, found {c}" for c in count[count != 1]])
    single = is_label & (count == 1)[tokens.parent]
    texts = pc.filter(values, pa.array(single))
    labels = np.full(tokens.rows, -1, np.int64)
    labels[tokens.parent[single]] = np.asarray(pc.fill_null(pc.index_in(texts, pa.array(["0", "1"])), -1))
    bad_rows = tokens.parent[single][labels[tokens.parent[single]] < 0]
    bad = np.zeros(tokens.rows, bool)
    bad[bad_rows] = True
    shown = np.asarray(texts.to_pylist(), dtype=object)[labels[tokens.parent[single]] < 0]
    reasons.add(bad, [f"{what} must be 0 or 1, got {t!r}" for t in shown])
    return labels


def _parse_tokens(parser: BlockParser, block: bytes, starts: np.ndarray, blank: np.ndarray) -> ParsedBlock:
    """``slot`` and ``feasign`` lines: name:value tokens, a slot's values in line order."""
    schema = parser.schema
    lines = np.flatnonzero(~blank)
    tokens = _Tokens.of(pc.take(_lines_array(block, starts), pa.array(lines)), len(lines))
    reasons = _Reasons(len(lines))
    if parser.fmt == "feasign":
        values, names = _feasign_tokens(tokens, reasons)
        labels = _labels_of(tokens, _is(names, FEASIGN_LABEL_SLOT), values, reasons,
                            f"<0|1>:{FEASIGN_LABEL_SLOT}", f"label (slot {FEASIGN_LABEL_SLOT})")
        slot_names = list(schema.sparse_slots)
    else:
        names, values, not_pair = tokens.pairs(r"^(?P<name>[^:]*):(?P<value>.+)$")
        known = pa.array(["click", "dense_feature", *(slot[1:] for slot in CRITEO_SLOTS)])
        unknown = ~not_pair & ~np.asarray(pc.fill_null(pc.is_in(names, value_set=known), False))
        bad = not_pair | unknown
        shown = tokens.texts(bad)
        reasons.add_first_token(tokens.parent, bad, [
            f"token {t!r} is not name:value" if p else f"unknown slot {t.partition(':')[0]!r} in token {t!r}"
            for t, p in zip(shown, not_pair[bad])])
        labels = _labels_of(tokens, _is(names, "click"), values, reasons, "click:<0|1>", "label")
        is_dense = _is(names, "dense_feature")
        dense_count = np.bincount(tokens.parent[is_dense], minlength=len(lines))
        wrong = dense_count != CRITEO_DENSE_DIM
        reasons.add(wrong, [f"expected {CRITEO_DENSE_DIM} dense_feature values, found {c}" for c in dense_count[wrong]])
        dense_texts = pc.filter(values, pa.array(is_dense))
        dense_values = _parse_floats(dense_texts)
        nonfinite = np.isnan(dense_values)
        reasons.add_first_token(tokens.parent[is_dense], nonfinite, [
            f"dense_feature is not a finite number: {t!r}" for t in pc.filter(dense_texts, pa.array(nonfinite)).to_pylist()])
        slot_names = [slot[1:] for slot in schema.sparse_slots]  # slot C<n> is the file's slot n
    good = reasons.good
    keep = np.flatnonzero(good)
    texts = [pc.take(pa.array(["1 0", "1 1"]), pa.array(np.maximum(labels[keep], 0)))]
    if parser.fmt == "slot":
        floats = _float_texts(dense_values[good[tokens.parent[is_dense]]])
        per_row = pa.ListArray.from_arrays(pa.array(np.arange(0, len(floats) + 1, CRITEO_DENSE_DIM, dtype=np.int32)),
                                           floats)
        texts.append(pc.binary_join_element_wise(str(CRITEO_DENSE_DIM), pc.binary_join(per_row, " "), " "))
    row_of_line = np.full(len(lines), -1, np.int64)
    row_of_line[keep] = np.arange(len(keep))
    slot_index = np.asarray(pc.fill_null(pc.index_in(names, value_set=pa.array(slot_names)), -1))
    usable = good[tokens.parent] & (slot_index >= 0)
    slot_ids, missing_rows = [], np.zeros(len(schema.sparse_slots), np.int64)
    for position, slot in enumerate(schema.sparse_slots):
        mine = usable & (slot_index == position)
        rows = row_of_line[tokens.parent[mine]]
        missing = np.flatnonzero(np.bincount(rows, minlength=len(keep)) == 0)
        missing_rows[position] = len(missing)
        raw = pa.concat_arrays([pc.cast(pc.filter(values, pa.array(mine)), pa.binary()),
                                pa.array([MISSING_VALUE.encode()] * len(missing), pa.binary())])
        ids, id_texts = _id_texts(slot, raw, parser.vocab_size)
        rows = np.concatenate([rows, missing])
        order = np.argsort(rows, kind="stable")  # a row's values in line order, its missing value alone
        rows, ids = rows[order], ids[order]
        counts = np.bincount(rows, minlength=len(keep))
        per_row = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)),
                                           pc.take(id_texts, pa.array(order)))
        texts.append(pc.binary_join_element_wise(pc.cast(pa.array(counts), pa.string()),
                                                 pc.binary_join(per_row, " "), " "))
        slot_ids.append(SlotIds(ids, np.arange(len(ids)), rows))
    texts[-1] = pc.binary_join_element_wise(texts[-1], "\n", "")
    malformed = [(int(lines[i]), reasons.reason[i]) for i in np.flatnonzero(~good)]
    return ParsedBlock(starts, lines[keep], np.maximum(labels[keep], 0), _join(texts), slot_ids, missing_rows,
                       malformed)


def discover_feasign_slots(block: bytes) -> set[str]:
    """The sparse slots of a ``feasign`` block's well-formed lines (the schema, when ``data.slots`` names none)."""
    starts, blank = scan_lines(block)
    lines = np.flatnonzero(~blank)
    tokens = _Tokens.of(pc.take(_lines_array(block, starts), pa.array(lines)), len(lines))
    reasons = _Reasons(len(lines))
    feasign, slot = _feasign_tokens(tokens, reasons)
    _labels_of(tokens, _is(slot, FEASIGN_LABEL_SLOT), feasign, reasons, f"<0|1>:{FEASIGN_LABEL_SLOT}",
               f"label (slot {FEASIGN_LABEL_SLOT})")
    sparse = reasons.good[tokens.parent] & ~_is(slot, FEASIGN_LABEL_SLOT) & np.asarray(pc.is_valid(slot))
    return set(pc.unique(pc.filter(slot, pa.array(sparse))).to_pylist())


def raw_value_id(slot: str, value: str, vocab_size: int) -> int:
    """The id a raw value of ``slot`` gets (empty = missing), as data prep writes it."""
    return feature_id(slot, value or MISSING_VALUE, vocab_size)
