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
                                         decode, first_bad_weight, float_texts, join_columns, parse_floats,
                                         hashed_slot_ids)
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
    used = [*RAW_COLUMNS, *field_names[len(RAW_COLUMNS):][-1:]]  # Criteo's and the weight
    return pacsv.read_csv(
        pa.py_buffer(block),
        read_options=pacsv.ReadOptions(column_names=field_names, use_threads=False,
                                       block_size=max(len(block), 1 << 16)),
        parse_options=pacsv.ParseOptions(delimiter="\t", quote_char=False, double_quote=False, escape_char=False,
                                         newlines_in_values=False, ignore_empty_lines=False,
                                         invalid_row_handler=handler),
        convert_options=pacsv.ConvertOptions(
            column_types={name: count_type if name in RAW_COLUMNS[1:1 + CRITEO_DENSE_DIM] else pa.binary()
                          for name in used},
            include_columns=used, null_values=[""], strings_can_be_null=False, quoted_strings_can_be_null=False))


def _normalized_texts(counts: np.ndarray) -> pa.Array:
    """:func:`normalize_count` of every count, as the float32 text a shard holds."""
    return float_texts(np.minimum(np.log1p(np.maximum(counts, 0.0)) / DENSE_LOG_CAP, 1.0))


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
    reasons = Reasons(len(rows))
    schema = parser.schema

    def encoded(name: str) -> tuple[pa.Array, np.ndarray]:
        """A column's distinct values and, per row, the index of its value."""
        column = pc.dictionary_encode(table[name].combine_chunks())
        return column.dictionary, np.asarray(column.indices)[rows]

    label_dict, label_index = encoded("label")
    label_of = np.array([{"0": 0, "1": 1}.get(v, -1) for v in decode(label_dict)], np.int64)
    labels = label_of[label_index] if len(label_of) else np.zeros(0, np.int64)
    bad_label = labels < 0
    shown = decode(label_dict)
    reasons.add(bad_label, [f"label must be 0 or 1, got {shown[i]!r}" for i in label_index[bad_label]])
    # The label (and the weight) and the dense slot's count in one text: "1 <label> [1 <weight>] 13".
    dense_count = [str(schema.dense_dim)] if schema.dense_dim else []
    if schema.weighted:
        weight_dict, weight_index = encoded(_RAW_WEIGHT)
        weights = parse_floats(weight_dict)
        weight_text = pc.binary_join_element_wise("1", float_texts(np.nan_to_num(weights)), *dense_count, " ")
        columns = [(pa.array(["1 0", "1 1"]), np.maximum(labels, 0)), (weight_text, weight_index)]
    else:
        columns = [(pa.array([" ".join(["1", label, *dense_count]) for label in "01"]), np.maximum(labels, 0))]
    for name in RAW_COLUMNS[1:1 + schema.dense_dim]:
        if counts_parsed:
            columns.append(_count_texts(np.asarray(table[name].combine_chunks().fill_null(0))[rows]))
            continue
        entries, index = encoded(name)
        empty = pc.equal(pc.binary_length(entries), 0)
        parsed = parse_floats(pc.if_else(empty, pa.scalar(b"0", entries.type), entries))  # missing: 0
        bad = np.isnan(parsed)[index]
        if bad.any():
            shown = decode(entries)
            reasons.add(bad, [f"{name} is not a finite number: {shown[i]!r}" for i in index[bad]])
        columns.append((_normalized_texts(np.nan_to_num(parsed)), index))
    good = reasons.good
    if schema.weighted:
        _check_raw_weights(parser.weight_column, parsed_lines[rows[good]], weight_dict, weight_index[good], weights,
                           sorted(line for line in short if not blank[line]))
    slot_ids, missing = [], np.zeros(len(schema.sparse_slots), np.int64)
    for position, slot in enumerate(schema.sparse_slots):
        entries, index = encoded(slot)
        ids, id_texts = hashed_slot_ids(parser, slot, entries, index[good], np.arange(int(good.sum())),
                                        one_per_row=True)
        slot_ids.append(ids)
        missing[position] = np.count_nonzero(np.asarray(pc.equal(pc.binary_length(entries), 0), bool)[index[good]])
        columns.append((pc.binary_join_element_wise("1", id_texts, " "), index))
    last_text, last_index = columns[-1]
    columns[-1] = (pc.binary_join_element_wise(last_text, "\n", ""), last_index)  # per distinct value, not per row
    text = None
    if parser.with_text:
        text = join_columns([pc.take(column, pa.array(index[good])) for column, index in columns])
    wrong_width = [(line, reason) for line, reason in invalid.items() if not blank[line]]  # e.g. a line of spaces
    malformed = sorted([*wrong_width, *zip(parsed_lines[rows[~good]].tolist(), reasons.reason[~good].tolist())])
    return ParsedBlock(starts, parsed_lines[rows[good]], labels[good], text, slot_ids, missing, malformed)


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
