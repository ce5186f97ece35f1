"""The ``slot`` and ``feasign`` formats (:mod:`components.data_prep.formats`): whitespace-separated
``name:value`` tokens, parsed by Arrow's string kernels."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from components.data_prep.parsed import (CRITEO_DENSE_DIM, CRITEO_SLOTS, MISSING_VALUE, ParsedBlock, ParseSettings,
                                         Reasons, WeightError, first_bad_weight, float_texts, join_columns,
                                         hashed_slots, lines_array, parse_floats, scan_lines)

FEASIGN_LABEL_SLOT = "1"
_UINT64_MAX = str((1 << 64) - 1)


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

    def split_off(self, name: str) -> tuple["_Tokens", pa.Array, np.ndarray]:
        """``(the other tokens, the values of the <name>:<value> tokens, the row of each)``."""
        prefix = f"{name}:"
        named = np.asarray(pc.starts_with(self.text, prefix))
        values = pc.utf8_slice_codeunits(pc.filter(self.text, pa.array(named)), len(prefix))
        rest = _Tokens(pc.filter(self.text, pa.array(~named)), self.parent[~named], self.rows)
        return rest, values, self.parent[named]


def _is(values: pa.Array, text: str) -> np.ndarray:
    return np.asarray(pc.fill_null(pc.equal(values, text), False))


def _feasign_tokens(tokens: _Tokens, reasons: Reasons) -> tuple[pa.Array, pa.Array]:
    """``(feasign, slot)`` of every ``<uint64 feasign>:<slot id>`` token (null where it is not one)."""
    feasign, slot, bad = tokens.pairs(r"^(?P<feasign>[0-9]+):(?P<slot>[0-9]+)$")
    length = np.asarray(pc.fill_null(pc.utf8_length(feasign), 0))
    too_big = (length > 20) | ((length == 20) & np.asarray(pc.fill_null(pc.greater(feasign, _UINT64_MAX), False)))
    wrong = bad | too_big
    messages = [f"token {t!r} is not <uint64 feasign>:<slot id>" if b else f"feasign {t.partition(':')[0]} does "
                "not fit in uint64" for t, b in zip(tokens.texts(wrong), bad[wrong])]
    reasons.add_first_token(tokens.parent, wrong, messages)
    return feasign, slot


def _labels_of(tokens: _Tokens, is_label: np.ndarray, values: pa.Array, reasons: Reasons, token: str,
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


def parse_tokens(parser: ParseSettings, block: bytes, starts: np.ndarray, blank: np.ndarray) -> ParsedBlock:
    """``slot`` and ``feasign`` lines: name:value tokens, a slot's values in line order."""
    schema = parser.schema
    lines = np.flatnonzero(~blank)
    tokens = _Tokens.of(pc.take(lines_array(block, starts), pa.array(lines)), len(lines))
    if schema.weighted:
        tokens, weight_texts, weight_rows = tokens.split_off(parser.weight_column)
    reasons = Reasons(len(lines))
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
        dense_values = parse_floats(dense_texts)
        nonfinite = np.isnan(dense_values)
        reasons.add_first_token(tokens.parent[is_dense], nonfinite, [
            f"dense_feature is not a finite number: {t!r}" for t in pc.filter(dense_texts, pa.array(nonfinite)).to_pylist()])
        slot_names = [slot[1:] for slot in schema.sparse_slots]  # slot C<n> is the file's slot n
    good = reasons.good
    keep = np.flatnonzero(good)
    if schema.weighted:
        weights = _row_weights(parser.weight_column, weight_texts, weight_rows, lines, keep)
    dense = np.zeros((len(keep), schema.dense_dim), np.float32)
    if parser.fmt == "slot":  # the good rows' dense values, as the float32 the text holds
        dense = dense_values[good[tokens.parent[is_dense]]].astype(np.float32).reshape(len(keep), CRITEO_DENSE_DIM)
    # Every slot's values of every row at once: sorted by slot, then row (a row's values in line order); a row
    # without a value of a slot gets MISSING_VALUE alone.
    row_of_line = np.full(len(lines), -1, np.int64)
    row_of_line[keep] = np.arange(len(keep))
    slot_index = np.asarray(pc.fill_null(pc.index_in(names, value_set=pa.array(slot_names)), -1))
    usable = good[tokens.parent] & (slot_index >= 0)
    slot_count, row_count = len(schema.sparse_slots), len(keep)
    token_slot, token_row = slot_index[usable].astype(np.int64), row_of_line[tokens.parent[usable]]
    per_row = np.bincount(token_slot * row_count + token_row, minlength=slot_count * row_count)
    missing_rows = (per_row == 0).reshape(slot_count, row_count).sum(axis=1).astype(np.int64)
    # The tokens are in row order: a stable radix sort by slot (uint16) puts them in (slot, row) order, a row's
    # values in line order; each (slot, row) then takes its place among the groups, a missing value its own.
    counts = np.maximum(per_row, 1)  # per slot, per row: its values (a missing value is one)
    group_start = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=group_start[1:])
    token_start = np.zeros(len(per_row) + 1, np.int64)
    np.cumsum(per_row, out=token_start[1:])
    by_slot = np.argsort(token_slot.astype(np.uint16) if slot_count < (1 << 16) else token_slot, kind="stable")
    group = (token_slot * row_count + token_row)[by_slot]
    missing_groups = np.flatnonzero(per_row == 0)
    order = np.empty(len(by_slot) + len(missing_groups), np.int64)
    order[group_start[group] + np.arange(len(group)) - token_start[group]] = by_slot
    order[group_start[missing_groups]] = len(by_slot) + np.arange(len(missing_groups))
    raw = pa.concat_arrays([pc.cast(pc.filter(values, pa.array(usable)), pa.binary()),
                            pa.array([MISSING_VALUE.encode()] * len(missing_groups), pa.binary())])
    rows = np.repeat(np.tile(np.arange(row_count), slot_count), counts)
    sizes = counts.reshape(slot_count, row_count).sum(axis=1)
    bounds = np.concatenate([[0], np.cumsum(sizes)])
    slot_ids, id_texts, _ = hashed_slots(parser, list(schema.sparse_slots), raw.take(pa.array(order)), sizes,
                                         [np.arange(size) for size in sizes],
                                         [rows[bounds[k]:bounds[k + 1]] for k in range(slot_count)])
    text = None
    if parser.with_text:
        texts = [pc.take(pa.array(["1 0", "1 1"]), pa.array(np.maximum(labels[keep], 0)))]
        if schema.weighted:
            texts.append(pc.binary_join_element_wise("1", float_texts(weights), " "))
        if parser.fmt == "slot":
            floats = float_texts(dense.ravel())
            dense_lists = pa.ListArray.from_arrays(
                pa.array(np.arange(0, len(floats) + 1, CRITEO_DENSE_DIM, dtype=np.int32)), floats)
            texts.append(pc.binary_join_element_wise(str(CRITEO_DENSE_DIM), pc.binary_join(dense_lists, " "), " "))
        lists = pa.ListArray.from_arrays(pa.array(np.concatenate([[0], np.cumsum(counts)]).astype(np.int32)),
                                         id_texts)
        slot_texts = pc.binary_join_element_wise(pc.cast(pa.array(counts), pa.string()), pc.binary_join(lists, " "),
                                                 " ")
        texts += [slot_texts.slice(k * row_count, row_count) for k in range(slot_count)]
        texts[-1] = pc.binary_join_element_wise(texts[-1], "\n", "")
        text = join_columns(texts)
    malformed = [(int(lines[i]), reasons.reason[i]) for i in np.flatnonzero(~good)]
    return ParsedBlock(starts, lines[keep], np.maximum(labels[keep], 0), text, slot_ids, missing_rows, malformed,
                       dense if parser.with_dense else None)


def _row_weights(weight_column: str, texts: pa.Array, rows: np.ndarray, lines: np.ndarray,
                 keep: np.ndarray) -> np.ndarray:
    """The weight of every kept row (``rows``: the row of each weight token); raises WeightError for the first kept
    row with none, several, or one that is not a number >= 0."""
    count = np.bincount(rows, minlength=len(lines))
    several = keep[count[keep] > 1]
    if len(several):
        raise WeightError(int(lines[several[0]]), f"the row has {count[several[0]]} {weight_column}:<weight> tokens; "
                                                  "every row needs exactly one: fix the input")
    weights = np.full(len(lines), np.nan)
    weights[rows] = parse_floats(texts)

    def text_of(kept: int) -> Optional[str]:
        token = np.flatnonzero(rows == keep[kept])
        return texts[int(token[0])].as_py() if len(token) else None

    first_bad_weight(lines[keep], weights[keep], text_of,
                     f"a {weight_column}:<weight> token, data.weight_column={weight_column}")
    return weights[keep]


def discover_feasign_slots(block: bytes, weight_column: Optional[str] = None) -> set[str]:
    """The sparse slots of a ``feasign`` block's well-formed lines (the schema, when ``data.slots`` names none);
    ``weight_column``: the name of the weight tokens, which are no slot."""
    starts, blank = scan_lines(block)
    lines = np.flatnonzero(~blank)
    tokens = _Tokens.of(pc.take(lines_array(block, starts), pa.array(lines)), len(lines))
    if weight_column is not None:
        tokens = tokens.split_off(weight_column)[0]
    reasons = Reasons(len(lines))
    feasign, slot = _feasign_tokens(tokens, reasons)
    _labels_of(tokens, _is(slot, FEASIGN_LABEL_SLOT), feasign, reasons, f"<0|1>:{FEASIGN_LABEL_SLOT}",
               f"label (slot {FEASIGN_LABEL_SLOT})")
    sparse = reasons.good[tokens.parent] & ~_is(slot, FEASIGN_LABEL_SLOT) & np.asarray(pc.is_valid(slot))
    return set(pc.unique(pc.filter(slot, pa.array(sparse))).to_pylist())
