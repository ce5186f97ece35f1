"""The transform: a raw record (or a serving instance) -> dense values and slot ids, exactly as data prep made them.

There is one implementation: data prep's own parser (:class:`~components.data_prep.formats.BlockParser`). Data
prep asks it for MultiSlot text; the transform asks the same parse for the rows as arrays instead
(``with_text=False, with_dense=True``): the float32 dense values the text is formatted from and the slot ids it
holds (:class:`~components.data_prep.parsed.ParsedBlock`), so serving's ids are the shards' ids by construction
(not by a second parser kept in step by a test), without formatting text and reading it back.

A serving instance (no label, no weight) is first written as a line of the training format with a placeholder label
(and weight 1 when the dataset is weighted), after its values are checked (:class:`InstanceError`).

A :class:`Transform` describes itself fully in :meth:`Transform.to_dict` (``transform.json``): data prep writes it
into every dataset (``transform/``, with the train split's id-count sketch when ``data.min_id_count > 1``), and the
export copies it into every version, so an old export keeps serving with its own transform.
"""

from __future__ import annotations

import functools
import json
import re
import math
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

import numpy as np

from components.data_prep.formats import BlockParser
from components.data_prep.hashing import HASH_FUNCTION, check_hash_function, slot_prefix
from components.data_prep.id_counts import DEPTH, OOV_VALUE, WIDTH, CountSketch, IdCounts, oov_id
from components.data_prep.multislot import RaggedIds, Schema, read_shard_bytes
from components.data_prep.parsed import CRITEO_DENSE_DIM, CRITEO_SLOTS, MISSING_VALUE
from components.data_prep.plan import SYNTHETIC, DataPlan
from components.data_prep.raw_format import DENSE_LOG_CAP, RAW_COLUMNS
from components.data_prep.token_formats import FEASIGN_LABEL_SLOT

TRANSFORM_DIR = "transform"  # inside a dataset and inside an export version
TRANSFORM_FILE = "transform.json"
ID_COUNTS_FILE = "id_counts.npy"  # the train split's id-count sketch, kept when data.min_id_count > 1
# Version 1 is the only one so far. A later version keeps version 1's code path beside its own (from_dict
# dispatches on the number), so that an export made with version 1 keeps serving with its own transform.
TRANSFORM_VERSION = 1
_SLOT_DENSE = "dense_feature"  # the slot format's dense token, an instance's column of 13 values
_SLOT_LABEL = "click"


class TransformError(ValueError):
    """A ``transform/`` directory this code cannot read (unknown version, missing or inconsistent file)."""


class InstanceError(ValueError):
    """A serving instance that is not a record of the training format; one line naming its index and field."""


@dataclass(frozen=True)
class Records:
    """Rows as the model reads them: ``dense`` float32 ``[n, dense_dim]``, per sparse slot its ids, and the lines
    that did not parse (``(0-based line, reason)``; they have no row)."""

    dense: np.ndarray
    sparse: list[RaggedIds]
    malformed: list[tuple[int, str]]


@dataclass(frozen=True)
class Transform:
    """How data prep turned records of ``fmt`` into the rows of ``schema`` (the plan's settings that decide it)."""

    fmt: str  # raw | slot | feasign (synthetic rows are raw records)
    schema: Schema
    vocab_size: int
    weight_column: Optional[str] = None
    min_id_count: int = 1
    id_counts: Optional[CountSketch] = field(default=None, compare=False, repr=False)  # min_id_count > 1

    def __post_init__(self) -> None:
        if self.min_id_count > 1 and self.id_counts is None:
            raise TransformError(f"a transform with min_id_count={self.min_id_count} needs the train split's id "
                                 f"counts ({ID_COUNTS_FILE})")

    @classmethod
    def of_plan(cls, plan: DataPlan, id_counts: Optional[CountSketch] = None) -> Optional["Transform"]:
        """The transform of a data plan; ``id_counts``: its sketch (kept only under a count filter). Synthetic rows
        are raw Criteo records (:func:`~components.data_prep.synthetic.write_raw_tsv`), so their transform is the
        raw one; a generator not shaped like Criteo (13 counts, C1..C26) has no raw record form: None."""
        schema = Schema.from_dict(plan.schema)
        fmt = plan.fmt
        if fmt == SYNTHETIC:
            if schema.dense_dim != CRITEO_DENSE_DIM or tuple(schema.sparse_slots) != CRITEO_SLOTS:
                return None
            fmt = "raw"
        sketch = id_counts if plan.min_id_count > 1 else None
        return cls(fmt, schema, plan.vocab_size, plan.weight_column, plan.min_id_count, sketch)

    # -- what it is ------------------------------------------------------------------------------------------------
    @property
    def columns(self) -> list[str]:
        """The instance columns in order (the training input's, without label and weight)."""
        if self.fmt == "raw":
            return list(RAW_COLUMNS[1:])
        if self.fmt == "slot":
            return [_SLOT_DENSE, *(slot[1:] for slot in CRITEO_SLOTS)]
        return list(self.schema.sparse_slots)

    def to_dict(self) -> dict[str, Any]:
        """Everything a client needs to map a raw record as training did (``transform.json``)."""
        slots = list(self.schema.sparse_slots)
        return {
            "transform_version": TRANSFORM_VERSION,
            "input": {"format": self.fmt, "columns": self._training_columns(), "instance_columns": self.columns,
                      "label_column": self._label_column(), "weight_column": self.weight_column,
                      "ignored_at_serving": "the label and weight columns: an instance holds neither"},
            "schema": self.schema.to_dict(),
            "ids": {"hash_function": HASH_FUNCTION, "vocab_size": self.vocab_size,
                    "key": "the slot's key prefix followed by the value's UTF-8 text",
                    "slot_key_prefix": {slot: slot_prefix(slot).decode() for slot in slots},
                    "slot_of_column": self._slot_of_column()},
            "missing": {"value": MISSING_VALUE, "rule": self._missing_rule()},
            "id_counts": {"min_id_count": self.min_id_count, "oov_value": OOV_VALUE,
                          "rule": "an id whose train-split count estimate is below min_id_count is written as its "
                                  "slot's OOV id (the id of the value oov_value); 1: no filter",
                          "oov_ids": ({slot: oov_id(slot, self.vocab_size) for slot in slots}
                                      if self.min_id_count > 1 else {}),
                          "file": ID_COUNTS_FILE if self.min_id_count > 1 else None,
                          "sketch": f"count-min, {DEPTH} x {WIDTH} uint32 of train rows (components.data_prep."
                                    "id_counts): an id's key is mix64(id ^ hash64('<slot>\\x1fid-count')), its "
                                    "estimate the least of its buckets"},
            "dense": self._dense_rule(),
            "format_specifics": self._specifics(),
        }

    def _training_columns(self) -> list[str]:
        if self.fmt == "raw":
            weight = [] if self.weight_column is None else [f"column {self.weight_column}: the weight"]
            return [*RAW_COLUMNS, *weight]
        return [self._label_column(), *self.columns, *([self.weight_column] if self.weight_column else [])]

    def _label_column(self) -> str:
        return {"raw": "label", "slot": _SLOT_LABEL, "feasign": f"slot {FEASIGN_LABEL_SLOT}"}[self.fmt]

    def _slot_of_column(self) -> dict[str, str]:
        if self.fmt == "slot":
            return {slot[1:]: slot for slot in self.schema.sparse_slots}
        return {slot: slot for slot in self.schema.sparse_slots}

    def _missing_rule(self) -> str:
        if self.fmt == "raw":
            return "an empty field of a slot is the value <missing>, hashed like any other; an empty count is 0"
        return "a slot without a token in the line has the single value <missing>, hashed like any other"

    def _dense_rule(self) -> dict[str, Any]:
        if self.fmt == "raw":
            return {"columns": list(RAW_COLUMNS[1:1 + CRITEO_DENSE_DIM]), "rule": "min(log1p(max(x, 0)) / log_cap, 1)",
                    "log_cap": DENSE_LOG_CAP, "missing": 0.0, "dtype": "float32"}
        if self.fmt == "slot":
            return {"columns": [_SLOT_DENSE] * CRITEO_DENSE_DIM, "rule": "taken as is", "missing": None,
                    "dtype": "float32"}
        return {"columns": [], "rule": "no dense features"}

    def _specifics(self) -> dict[str, Any]:
        if self.fmt == "raw":
            return {"separator": "\t", "fields": len(RAW_COLUMNS) if self.weight_column is None
                    else int(self.weight_column) + 1}
        if self.fmt == "slot":
            return {"token": "<name>:<value>, whitespace-separated", "label": f"{_SLOT_LABEL}:<0|1>",
                    "dense": f"{CRITEO_DENSE_DIM} x {_SLOT_DENSE}:<float>", "slot_token": "<n>:<value> for slot C<n>",
                    "several_values": True}
        return {"token": "<uint64 feasign>:<slot id>, whitespace-separated",
                "label": f"<0|1>:{FEASIGN_LABEL_SLOT}", "value": "the feasign's decimal text",
                "several_values": True}

    # -- reading and writing --------------------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any], directory: Optional[Path] = None) -> "Transform":
        """The transform ``to_dict`` described (``directory``: where its sketch is, when it has a count filter)."""
        version = data.get("transform_version")
        if version != TRANSFORM_VERSION:
            raise TransformError(f"transform version {version!r} is not one this code reads (it reads version "
                                 f"{TRANSFORM_VERSION}): serve it with the version of the code that exported it")
        check_hash_function(data["ids"]["hash_function"], "the transform")
        min_id_count = int(data["id_counts"]["min_id_count"])
        sketch = None
        if min_id_count > 1:
            path = Path(directory or ".") / ID_COUNTS_FILE
            if not path.is_file():
                raise TransformError(f"{path} is missing: the transform filters ids below min_id_count="
                                     f"{min_id_count} by the train split's counts it holds")
            sketch = CountSketch.load(path)
            if sketch.table.shape != (DEPTH, WIDTH):
                raise TransformError(f"{path} holds a {sketch.table.shape} sketch, expected {(DEPTH, WIDTH)}")
        return cls(data["input"]["format"], Schema.from_dict(data["schema"]), int(data["ids"]["vocab_size"]),
                   data["input"]["weight_column"], min_id_count, sketch)

    @classmethod
    def load(cls, directory: str | os.PathLike) -> "Transform":
        """The transform of a ``transform/`` directory; its sketch (if any) memory-mapped, not read."""
        path = Path(directory) / TRANSFORM_FILE
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise TransformError(f"{path} is missing") from None
        except ValueError as err:
            raise TransformError(f"{path} is not valid JSON ({err})") from None
        return cls.from_dict(data, Path(directory))

    def save(self, directory: str | os.PathLike, sketch_path: Optional[str | os.PathLike] = None) -> list[str]:
        """Write ``transform.json`` (and the sketch from ``sketch_path`` when there is a count filter) into
        ``directory``; returns the file names written."""
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / TRANSFORM_FILE).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n")
        if self.min_id_count <= 1:
            return [TRANSFORM_FILE]
        if sketch_path is not None:  # the file data prep already wrote: copied in the kernel, not saved anew
            shutil.copyfile(sketch_path, directory / ID_COUNTS_FILE)
        else:
            self.id_counts.save(directory / ID_COUNTS_FILE)
        return [TRANSFORM_FILE, ID_COUNTS_FILE]

    # -- the transform itself -------------------------------------------------------------------------------------
    def rows_of_records(self, data: bytes, name: str = "records") -> Records:
        """Lines of the training format (label, and weight when weighted, included) -> the rows data prep writes
        for them; ``name``: what a reader error calls the input."""
        if not data.strip():  # no line at all (Arrow's CSV reader refuses an empty block): no rows
            _, dense, sparse, _ = read_shard_bytes(b"", self.schema, name)
            return Records(dense, sparse, [])
        parsed = self._parser.parse(data)
        return Records(parsed.dense, parsed.sparse(), parsed.malformed)

    @functools.cached_property
    def _parser(self) -> BlockParser:
        """Data prep's parser of this transform's blocks, asked for the rows' arrays rather than their text."""
        id_counts = IdCounts(self.id_counts, self.min_id_count, self.vocab_size) if self.id_counts else None
        return BlockParser(self.fmt, self.schema, self.vocab_size, self.weight_column, id_counts, with_text=False,
                           with_dense=True)

    def rows_of_instances(self, instances: list) -> Records:
        """Serving instances (each a list of the :attr:`columns`' values in order, or an object keyed by column;
        a missing key, ``None`` or ``""`` is a missing value) -> their rows; raises :class:`InstanceError`."""
        if not isinstance(instances, list):
            raise InstanceError(f"instances must be a list, got {type(instances).__name__}")
        plain = self._plain_raw_line if self.fmt == "raw" else (lambda instance: None)
        lines = [line if (line := plain(instance)) is not None else self._line(index, self._fields(index, instance))
                 for index, instance in enumerate(instances)]
        records = self.rows_of_records(("\n".join(lines) + "\n").encode() if lines else b"", "instances")
        if records.malformed:  # every instance is one non-blank line: line i is instance i
            line, reason = records.malformed[0]
            raise InstanceError(f"instance {line}: {reason}")
        return records

    def _plain_raw_line(self, instance: Any) -> Optional[str]:
        """The line of a raw list instance whose every field is text that passes :meth:`_fields`' checks as a whole
        (the common case: one join and one search per instance, a few calls for its dense fields), the line
        :meth:`_line` makes of it; None: any other instance, checked (and refused) field by field."""
        if type(instance) is not list or len(instance) != len(self._columns):
            return None
        try:
            text = "\t".join(instance)
        except TypeError:  # a value that is not text: a number, None, ...
            return None
        if text.count("\t") != len(instance) - 1 or "\n" in text or "\r" in text:
            return None
        for position in self._dense_positions:
            value = instance[position]
            if value and not (value.isdigit() and value.isascii()) and not _is_finite_number(value):
                return None
        return "0\t" + text + self._raw_weight_fields

    @functools.cached_property
    def _dense_positions(self) -> tuple[int, ...]:
        return tuple(position for position, column in enumerate(self._columns) if column in self._dense_columns)

    @functools.cached_property
    def _raw_weight_fields(self) -> str:
        """What a raw instance's line ends with after its fields: the fields up to its weight 1 (weighted input)."""
        if self.weight_column is None:
            return ""
        return "\t" + "\t".join([""] * (int(self.weight_column) - len(RAW_COLUMNS)) + ["1"])

    def _fields(self, index: int, instance: Any) -> dict[str, Any]:
        """The instance's values by column (absent: missing), checked to be columns and of a usable type."""
        columns = self._columns
        if isinstance(instance, list):
            if len(instance) > len(columns):
                raise InstanceError(f"instance {index}, field {len(columns)}: too many fields, the {self.fmt} "
                                    f"input has {len(columns)} ({columns[0]}..{columns[-1]})")
            if len(instance) < len(columns):
                raise InstanceError(f"instance {index}, field {columns[len(instance)]}: absent; a list instance "
                                    f"holds all {len(columns)} fields (null or \"\" for a missing value)")
            values = dict(zip(columns, instance))
        elif isinstance(instance, dict):
            unknown = [key for key in instance if key not in self._column_set]
            if unknown:
                raise InstanceError(f"instance {index}, field {unknown[0]}: unknown column; the {self.fmt} input's "
                                    f"columns are {columns[0]}..{columns[-1]}")
            values = dict(instance)
        else:
            raise InstanceError(f"instance {index}: expected a list or an object, got {type(instance).__name__}")
        check, forbidden, dense = self._check_value, self._forbidden.search, self._dense_columns
        for column, value in values.items():
            # A plain text value that passes every check below, at the cost of one search (the common case).
            if type(value) is str and column != _SLOT_DENSE and (
                    not value or (forbidden(value) is None and (column not in dense or _is_finite_number(value)))):
                continue
            check(index, column, value)
        return values

    @functools.cached_property
    def _columns(self) -> tuple[str, ...]:
        return tuple(self.columns)

    @functools.cached_property
    def _column_set(self) -> frozenset[str]:
        return frozenset(self.columns)

    @functools.cached_property
    def _dense_columns(self) -> frozenset[str]:
        return frozenset(column for column in self.columns if self._is_dense(column))

    @functools.cached_property
    def _forbidden(self) -> re.Pattern:
        """What a value may not hold: a raw field no tab or newline, a token's value no whitespace."""
        return re.compile("[\t\n\r]" if self.fmt == "raw" else r"\s")

    def _check_value(self, index: int, column: str, value: Any) -> None:
        several = self.fmt != "raw" and column != _SLOT_DENSE  # a token slot may hold several values
        items = value if isinstance(value, list) and (several or column == _SLOT_DENSE) else [value]
        if column == _SLOT_DENSE and value is not None and len(items) != CRITEO_DENSE_DIM:
            raise InstanceError(f"instance {index}, field {column}: expected {CRITEO_DENSE_DIM} numbers, got "
                                f"{len(items) if isinstance(value, list) else type(value).__name__}")
        for item in items:
            if item is None or item == "":
                continue
            if isinstance(item, bool) or not isinstance(item, (str, int, float)):
                kind = "a string or a number" + (" or a list of them" if several else "")
                raise InstanceError(f"instance {index}, field {column}: expected {kind}, got "
                                    f"{type(item).__name__ if not isinstance(item, list) else 'a list'}")
            text = str(item)
            if self.fmt == "raw" and self._forbidden.search(text):
                raise InstanceError(f"instance {index}, field {column}: a tab or newline inside a value")
            if self.fmt != "raw" and self._forbidden.search(text):
                raise InstanceError(f"instance {index}, field {column}: whitespace inside a value")
            if column in self._dense_columns and not _is_finite_number(text):
                raise InstanceError(f"instance {index}, field {column}: not a finite number: {text!r}")

    def _is_dense(self, column: str) -> bool:
        return column == _SLOT_DENSE or (self.fmt == "raw" and column in RAW_COLUMNS[1:1 + CRITEO_DENSE_DIM])

    def _line(self, index: int, values: dict[str, Any]) -> str:
        """The instance as a line of the training format, with label 0 (and weight 1 when weighted)."""
        def texts(column: str) -> list[str]:
            value = values.get(column)
            items = value if isinstance(value, list) else [value]
            return [str(item) for item in items if item is not None and item != ""]

        if self.fmt == "raw":  # a raw value is never a list (checked)
            fields = ["0", *("" if (value := values.get(column)) is None or value == "" else str(value)
                             for column in self._columns)]
            if self.weight_column is not None:
                fields += [""] * (int(self.weight_column) - len(RAW_COLUMNS)) + ["1"]
            return "\t".join(fields)
        weight = [f"{self.weight_column}:1"] if self.weight_column is not None else []
        if self.fmt == "slot":
            tokens = [f"{_SLOT_LABEL}:0", *(f"{column}:{text}" for column in self._columns for text in texts(column))]
        else:
            tokens = [f"0:{FEASIGN_LABEL_SLOT}", *(f"{text}:{column}" for column in self._columns
                                                   for text in texts(column))]
        return " ".join(tokens + weight)


def _is_finite_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False
