"""The ``raw`` format (Criteo TSV, :mod:`components.data_prep.formats`), parsed by Arrow's CSV reader."""

from __future__ import annotations

import functools
import math
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv

from components.data_prep.parsed import (CRITEO_DENSE_DIM, CRITEO_SLOTS, ParsedBlock, ParseSettings, Reasons,
                                         binary_lengths, decode, first_bad_weight, float_texts, hashed_slots,
                                         join_columns, parse_floats)
from components.data_prep.sources import DataPrepError

RAW_COLUMNS = ("label", *(f"I{index}" for index in range(1, CRITEO_DENSE_DIM + 1)), *CRITEO_SLOTS)
# log1p of Criteo counts: 16 ~ log1p(8.9e6); larger counts are clipped to 1.0.
DENSE_LOG_CAP = 16.0
_RAW_WEIGHT = "weight"  # the weight's column in a raw block's table
_SMALL_COUNTS = 1 << 16


def normalize_count(value: float) -> float:
    """Criteo integer feature -> [0, 1]: ``min(log1p(max(value, 0)) / 16, 1)``.

    Negative values (a few Criteo columns have -1..-3) count as 0, like missing ones.
    """
    return min(math.log1p(max(value, 0.0)) / DENSE_LOG_CAP, 1.0)


def _raw_columns(weight_column: Optional[str]) -> list[str]:
    """The names of a raw line's fields: Criteo's, then up to the weight (the fields between are ignored)."""
    if weight_column is None:
        return list(RAW_COLUMNS)
    return [*RAW_COLUMNS, *(f"_{i}" for i in range(len(RAW_COLUMNS), int(weight_column))), _RAW_WEIGHT]


def _read_raw(block: bytes, handler, count_type: pa.DataType, field_names: list[str]) -> pa.Table:
    return pacsv.read_csv(
        pa.py_buffer(block),
        read_options=pacsv.ReadOptions(column_names=field_names, use_threads=False,
                                       block_size=max(len(block), 1 << 16)),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False, double_quote=False, escape_char=False,
                                         newlines_in_values=False, ignore_empty_lines=False,
                                         invalid_row_handler=handler),
        convert_options=_convert_options(count_type, len(field_names) > len(RAW_COLUMNS)))


_DICTIONARY = pa.dictionary(pa.int32(), pa.binary())


@functools.lru_cache(maxsize=8)
def _convert_options(count_type: pa.DataType, weighted: bool) -> pacsv.ConvertOptions:
    """Criteo's columns and the weight (the fields between are ignored): the counts as ``count_type``, every other
    column dictionary-encoded as it is read (each distinct value is then parsed, hashed and formatted once)."""
    used = [*RAW_COLUMNS, *([_RAW_WEIGHT] if weighted else [])]
    dense = RAW_COLUMNS[1:1 + CRITEO_DENSE_DIM]
    return pacsv.ConvertOptions(
        column_types={name: count_type if name in dense and count_type == pa.int64() else _DICTIONARY
                      for name in used},
        include_columns=used, null_values=[""], strings_can_be_null=False, quoted_strings_can_be_null=False)


def _dictionary(column: pa.ChunkedArray) -> pa.DictionaryArray:
    """A dictionary-encoded column as one array (a block is read as one chunk)."""
    if column.num_chunks == 1:
        return column.chunk(0)
    return pc.dictionary_encode(pc.cast(column, column.type.value_type).combine_chunks())


def _normalized(counts: np.ndarray) -> np.ndarray:
    """:func:`normalize_count` of every count, as the float32 a shard holds (its text reads back as it)."""
    return np.minimum(np.log1p(np.maximum(counts, 0.0)) / DENSE_LOG_CAP, 1.0).astype(np.float32)


@functools.cache
def _small_count_values() -> np.ndarray:
    return _normalized(np.arange(_SMALL_COUNTS, dtype=np.float64))


@functools.cache
def _small_count_texts() -> pa.Array:
    return float_texts(_small_count_values())


def _count_values(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``(values, index of each count's value)``: the small counts' values are made once per process, the rare
    large counts' per distinct value (:func:`_count_texts` gives the values' texts)."""
    counts = np.maximum(counts, 0)
    large = counts >= _SMALL_COUNTS
    if not large.any():
        return _small_count_values(), counts
    distinct, inverse = np.unique(counts[large], return_inverse=True)
    index = counts.copy()
    index[large] = _SMALL_COUNTS + inverse
    return np.concatenate([_small_count_values(), _normalized(distinct.astype(np.float64))]), index


def _count_texts(values: np.ndarray) -> pa.Array:
    """The texts of :func:`_count_values`' values."""
    if len(values) == _SMALL_COUNTS:
        return _small_count_texts()
    return pa.concat_arrays([_small_count_texts(), float_texts(values[_SMALL_COUNTS:])])


def parse_raw(parser: ParseSettings, block: bytes, starts: np.ndarray, blank: np.ndarray) -> ParsedBlock:
    """A block of raw TSV lines (``starts``, ``blank``: :func:`~components.data_prep.parsed.scan_lines`)."""
    invalid: dict[int, str] = {}
    short: set[int] = set()  # weighted input: lines with Criteo's fields but no weight
    field_names = _raw_columns(parser.weight_column)
    described = "label, I1-I13, C1-C26" + (f", ..., the weight in column {parser.weight_column}"
                                           if parser.weight_column else "")

    def handler(row) -> str:
        invalid[row.number - 1] = (f"expected {len(field_names)} tab-separated fields ({described}), "
                                   f"found {row.actual_columns}")
        if len(RAW_COLUMNS) <= row.actual_columns < len(field_names):
            short.add(row.number - 1)
        return "skip"

    try:  # Criteo's counts are integers: Arrow parses and checks them as it reads
        table = _read_raw(block, handler, pa.int64(), field_names)
        counts_parsed = True
    except pa.ArrowInvalid:  # one is not an integer: read the counts as text and find which values are wrong
        invalid.clear()
        short.clear()
        table = _read_raw(block, handler, pa.binary(), field_names)
        counts_parsed = False
    parsed_lines = np.delete(np.arange(len(starts)), sorted(invalid)) if invalid else np.arange(len(starts))
    if table.num_rows != len(parsed_lines):
        raise DataPrepError(f"a block of raw TSV holds {len(starts)} lines but parsed into {table.num_rows} rows and "
                            f"{len(invalid)} bad ones: a carriage return ('\\r') other than before a newline?")
    rows = np.flatnonzero(~blank[parsed_lines])  # table rows that are not blank lines
    all_rows = len(rows) == table.num_rows
    reasons = Reasons(len(rows))
    schema = parser.schema

    def encoded(name: str) -> tuple[pa.Array, np.ndarray]:
        """A column's distinct values and, per row, the index of its value."""
        column = _dictionary(table[name])
        index = np.asarray(column.indices)
        return column.dictionary, (index if all_rows else index[rows])

    label_dict, label_index = encoded("label")
    shown = decode(label_dict)
    label_of = np.array([{"0": 0, "1": 1}.get(v, -1) for v in shown], np.int64)
    labels = label_of[label_index] if len(label_of) else np.zeros(0, np.int64)
    bad_label = labels < 0
    if bad_label.any():
        reasons.add(bad_label, [f"label must be 0 or 1, got {shown[i]!r}" for i in label_index[bad_label]])
    if schema.weighted:
        weight_dict, weight_index = encoded(_RAW_WEIGHT)
        weights = parse_floats(weight_dict)
    dense = []  # per dense column: (its distinct float32 values, per row the index of its value)
    for name in RAW_COLUMNS[1:1 + schema.dense_dim]:
        if counts_parsed:
            column = table[name]
            counts = np.asarray((column.chunk(0) if column.num_chunks == 1 else column).fill_null(0))
            dense.append(_count_values(counts if all_rows else counts[rows]))
            continue
        entries, index = encoded(name)
        empty = pc.equal(pc.binary_length(entries), 0)
        parsed = parse_floats(pc.if_else(empty, pa.scalar(b"0", entries.type), entries))  # missing: 0
        bad = np.isnan(parsed)[index]
        if bad.any():
            shown = decode(entries)
            reasons.add(bad, [f"{name} is not a finite number: {shown[i]!r}" for i in index[bad]])
        dense.append((_normalized(np.nan_to_num(parsed)), index))
    good = reasons.good
    kept = np.flatnonzero(good)
    if schema.weighted:
        _check_raw_weights(parser.weight_column, parsed_lines[rows[good]], weight_dict, weight_index[good], weights,
                           sorted(line for line in short if not blank[line]))
    slots = list(schema.sparse_slots)
    encoded_slots = [encoded(slot) for slot in slots]
    slot_ids, id_texts, slot_starts = hashed_slots(
        parser, slots, pa.concat_arrays([entries for entries, _ in encoded_slots]),
        [len(entries) for entries, _ in encoded_slots], [index[kept] for _, index in encoded_slots],
        [np.arange(len(kept))] * len(slots), one_per_row=True)
    missing = np.array([np.count_nonzero(binary_lengths(entries)[index[kept]] == 0)
                        for entries, index in encoded_slots], np.int64)
    text = None
    if parser.with_text:
        # The label (and the weight) and the dense slot's count in one text: "1 <label> [1 <weight>] 13".
        dense_count = [str(schema.dense_dim)] if schema.dense_dim else []
        if schema.weighted:
            weight_text = pc.binary_join_element_wise("1", float_texts(np.nan_to_num(weights)), *dense_count, " ")
            columns = [(pa.array(["1 0", "1 1"]), np.maximum(labels, 0)), (weight_text, weight_index)]
        else:
            columns = [(pa.array([" ".join(["1", label, *dense_count]) for label in "01"]), np.maximum(labels, 0))]
        columns += [(_count_texts(values) if counts_parsed else float_texts(values), index)
                    for values, index in dense]
        slot_texts = pc.binary_join_element_wise("1", id_texts, " ")
        columns += [(slot_texts.slice(slot_starts[k], slot_starts[k + 1] - slot_starts[k]), index)
                    for k, (_, index) in enumerate(encoded_slots)]
        last_text, last_index = columns[-1]
        columns[-1] = (pc.binary_join_element_wise(last_text, "\n", ""), last_index)  # per distinct value
        text = join_columns([pc.take(column, pa.array(index[kept])) for column, index in columns])
    dense_rows = None
    if parser.with_dense:
        dense_rows = np.zeros((len(kept), schema.dense_dim), np.float32)
        for position, (values, index) in enumerate(dense):
            dense_rows[:, position] = values[index[kept]]
    wrong_width = [(line, reason) for line, reason in invalid.items() if not blank[line]]  # e.g. a line of spaces
    malformed = sorted([*wrong_width, *zip(parsed_lines[rows[~good]].tolist(), reasons.reason[~good].tolist())])
    return ParsedBlock(starts, parsed_lines[rows[good]], labels[good], text, slot_ids, missing, malformed, dense_rows)


def _check_raw_weights(weight_column: str, lines: np.ndarray, entries: pa.Array, index: np.ndarray,
                       weights: np.ndarray, short: list[int]) -> None:
    """Raises WeightError for the first of the well-formed rows (their ``lines``; ``index``: of each row's weight in
    ``entries``, the distinct weights, parsed as ``weights``) whose weight is empty, not a number or negative, or of
    the ``short`` lines (Criteo's fields but no weight)."""
    def text_of(row: int) -> Optional[str]:
        if row >= len(index):  # a short line
            return None
        return decode(entries.slice(int(index[row]), 1))[0] or None  # an empty field: no weight

    row_weights = np.concatenate([weights[index], np.full(len(short), np.nan)])  # an empty field parses as NaN
    first_bad_weight(np.concatenate([lines, np.array(short, np.int64)]), row_weights, text_of,
                     f"data.weight_column={weight_column}")
