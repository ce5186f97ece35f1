"""The input formats, parsed a block of whole lines at a time, columnar, into MultiSlot text.

Formats (``data.format``):

* ``raw`` -- Criteo TSV: ``label \\t I1..I13 \\t C1..C26`` (40 fields, empty = missing). Dense:
  :func:`normalize_count`; missing dense -> 0. Slots ``C1``..``C26``.
* ``slot`` -- PaddleRec CTR-DNN text: ``click:<0|1>``, 13 x ``dense_feature:<float>`` (taken as is), then
  ``<n>:<id>`` for n = 1..26. Slot ``n`` is named ``C<n>`` so both Criteo formats share one schema.
* ``feasign`` -- PaddleRec production ``feasign:slot`` text: every token is ``<uint64 feasign>:<slot id>``;
  slot ``1`` carries the click label as its feasign (``0:1`` / ``1:1``); other slots are sparse and may hold
  several feasigns. No dense features. Slots are named by their id (``"2"``, ``"3"``, ...).

Row weights (``data.weight_column``): ``raw``, the 0-based column ``c >= 40`` of lines of ``c + 1`` fields (the
fields between the 40th and the weight are ignored); ``slot`` and ``feasign``, one ``<name>:<weight>`` token per
line (``weight:2.5``; in ``feasign`` a name that is not a slot id). A weight is a finite number >= 0 and every
well-formed row has one: a row without one, or with another, refuses the whole input
(:class:`~components.data_prep.parsed.WeightError`), since a silently skipped or reweighted row would change what
the model learns. It is written as the float slot ``weight`` right after the label.

The parsers are :mod:`raw_format` and :mod:`token_formats`, on the pieces of :mod:`parsed`.

A slot absent from a line (``raw``: an empty field) gets the single value :data:`MISSING_VALUE`, hashed per slot
like any other value: Paddle's MultiSlot feed rejects empty slots. Each block counts the rows each slot is missing
from (``stats.json``'s ``missing``: a slot that stops arriving is a broken log pipeline, not a feature). Blank
lines are skipped; any other line that does not parse is malformed and reported with its reason, the first check it
fails (in the order the format lists its fields).

How it is fast (README: data prep): Arrow parses the block (its CSV reader for ``raw``, its string kernels for
the token formats); every column is dictionary-encoded, so each *distinct* value of a block is parsed, hashed
(:func:`components.data_prep.hashing.hash_arrow_values`, every slot of the block in one pass) and formatted once;
rows get their text by ``take`` and one element-wise join builds the MultiSlot lines
(:mod:`components.data_prep.multislot`), never value by value in Python. The transform
(:mod:`components.data_prep.transform`) asks the same parse for the rows as arrays instead of text
(``with_text=False, with_dense=True``): a small block costs a few Arrow calls, not a few per slot.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Optional

from components.data_prep.hashing import feature_id
from components.data_prep.multislot import Schema
from components.data_prep.parsed import (CRITEO_DENSE_DIM, CRITEO_SLOTS, MISSING_VALUE, ParsedBlock, ParseSettings,
                                         scan_lines)
from components.data_prep.raw_format import RAW_COLUMNS, normalize_count, parse_raw
from components.data_prep.sources import DataPrepError
from components.data_prep.token_formats import FEASIGN_LABEL_SLOT, discover_feasign_slots, parse_tokens

__all__ = ["CRITEO_DENSE_DIM", "CRITEO_SLOTS", "FORMATS", "MISSING_VALUE", "BlockParser", "check_weight_column",
           "discover_feasign_slots", "normalize_count", "raw_value_id", "schema_for"]

FORMATS = ("raw", "slot", "feasign")


def schema_for(fmt: str, slots: Optional[Sequence[str]], discovered: Optional[Sequence[str]] = None,
               weighted: bool = False) -> Schema:
    """The schema of ``fmt``; ``slots`` picks (and orders) its sparse slots, by default all of them (``feasign``:
    ``discovered``, the slots seen in the input); ``weighted``: its rows carry a weight."""
    if fmt not in FORMATS:
        raise DataPrepError(f"unknown input format {fmt!r}: use one of {list(FORMATS)}")
    if fmt == "feasign":
        if slots is None:
            return Schema(0, sorted(discovered or [], key=int), weighted)
        invalid = [slot for slot in slots if not _is_uint(slot) or slot == FEASIGN_LABEL_SLOT]
        if invalid:
            raise DataPrepError(f"feasign slots must be integer slot ids other than the label slot "
                                f"{FEASIGN_LABEL_SLOT!r}; got {invalid}")
        return Schema(0, list(slots), weighted)
    if slots is None:
        return Schema(CRITEO_DENSE_DIM, list(CRITEO_SLOTS), weighted)
    unknown = [slot for slot in slots if slot not in CRITEO_SLOTS]
    if unknown:
        raise DataPrepError(f"slots {unknown} do not exist in format {fmt!r}; available: {list(CRITEO_SLOTS)}")
    return Schema(CRITEO_DENSE_DIM, list(slots), weighted)


def check_weight_column(fmt: str, weight_column: Optional[str]) -> None:
    """Raises DataPrepError for a ``data.weight_column`` that ``fmt`` cannot hold (see the module docstring)."""
    if weight_column is None:
        return
    if fmt == "raw":
        if not _is_uint(weight_column) or int(weight_column) < len(RAW_COLUMNS):
            raise DataPrepError(f"data.weight_column={weight_column!r}: raw input needs a 0-based column index "
                                f">= {len(RAW_COLUMNS)} (after Criteo's {len(RAW_COLUMNS)} fields), e.g. "
                                f"'{len(RAW_COLUMNS)}'")
        return
    # A slot line's other names; a feasign token is "<feasign>:<slot id>", so a weight named by digits is one.
    taken = {"click", "dense_feature", *(slot[1:] for slot in CRITEO_SLOTS)} if fmt == "slot" else set()
    plain = weight_column and ":" not in weight_column and not any(ch.isspace() for ch in weight_column)
    if not plain or weight_column in taken or (fmt == "feasign" and _is_uint(weight_column)):
        raise DataPrepError(f"data.weight_column={weight_column!r}: {fmt} input names its weight token "
                            "('weight' for 'weight:2.5') by a name without ':' or spaces that no other token has"
                            + (" (not digits: those are a slot id)" if fmt == "feasign" else ""))


def _is_uint(text: str) -> bool:
    return text.isascii() and text.isdigit()


class BlockParser(ParseSettings):
    """Parses blocks of one format into rows (:class:`~components.data_prep.parsed.ParseSettings`)."""

    def parse(self, block: bytes) -> ParsedBlock:
        starts, blank = scan_lines(block)
        if self.fmt == "raw":
            return parse_raw(self, block, starts, blank)
        return parse_tokens(self, block, starts, blank)


def raw_value_id(slot: str, value: str, vocab_size: int) -> int:
    """The id a raw value of ``slot`` gets (empty = missing), as data prep writes it."""
    return feature_id(slot, value or MISSING_VALUE, vocab_size)
