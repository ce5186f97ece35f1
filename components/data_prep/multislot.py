"""The on-disk training format: Paddle ``MultiSlotDataFeed`` text.

One example per line. For each slot, in schema order, the number of values then the
values, all separated by single spaces:

* ``click`` -- int64, exactly 1 value (0 or 1);
* ``weight`` -- float, exactly 1 value >= 0: the row's importance weight, only in a
  weighted dataset (``data.weight_column``; :attr:`Schema.weighted`);
* ``dense`` -- float, exactly ``dense_dim`` values; the slot is omitted entirely when
  ``dense_dim == 0``;
* each sparse slot -- int64 feature ids, at least 1 value (Paddle's feed rejects an
  empty slot), several allowed.

Example with ``dense_dim=2`` and two sparse slots::

    1 0 2 0.5 0.25 1 1234 2 77 78

Floats are written with ``%.6g``. :meth:`Schema.slot_names` gives the slot order the
trainer must use when it declares its Paddle feed variables.
"""

from __future__ import annotations

import json
import math
import zipfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

import numpy as np

LABEL_SLOT = "click"
WEIGHT_SLOT = "weight"
DENSE_SLOT = "dense"
_RESERVED_SLOTS = frozenset({LABEL_SLOT, WEIGHT_SLOT, DENSE_SLOT})
_FLOAT_SLOTS = frozenset({WEIGHT_SLOT, DENSE_SLOT})


@dataclass(frozen=True)
class Schema:
    """Which slots a MultiSlot line holds: the label, its weight (``weighted``), ``dense_dim`` floats, sparse
    slots."""

    dense_dim: int
    sparse_slots: list[str] = field(default_factory=list)
    weighted: bool = False

    def __post_init__(self) -> None:
        if self.dense_dim < 0:
            raise ValueError(f"dense_dim must be >= 0, got {self.dense_dim}")
        if not self.sparse_slots:
            raise ValueError("a schema needs at least one sparse slot")
        if len(set(self.sparse_slots)) != len(self.sparse_slots):
            raise ValueError(f"sparse slot names must be unique: {self.sparse_slots}")
        clashes = _RESERVED_SLOTS.intersection(self.sparse_slots)
        if clashes:
            raise ValueError(f"sparse slots may not be named {sorted(clashes)}: reserved")
        for name in self.sparse_slots:
            if not name or any(ch.isspace() for ch in name):
                raise ValueError(f"slot names must be non-empty without whitespace: {name!r}")

    def slot_names(self) -> list[str]:
        """Slot order of every line: ``["click", "weight", "dense", *sparse]`` (no "weight" if unweighted, no
        "dense" if dim 0)."""
        weight = [WEIGHT_SLOT] if self.weighted else []
        dense = [DENSE_SLOT] if self.dense_dim else []
        return [LABEL_SLOT, *weight, *dense, *self.sparse_slots]

    def slot_dtypes(self) -> list[str]:
        """Paddle dtype of each slot in :meth:`slot_names` order."""
        return ["float32" if name in _FLOAT_SLOTS else "int64" for name in self.slot_names()]

    def to_dict(self) -> dict:
        # An unweighted schema's dict is the one from before weights existed: the fingerprints and stored metas of
        # earlier datasets and checkpoints stay equal to today's.
        weighted = {"weighted": True} if self.weighted else {}
        return {"dense_dim": self.dense_dim, "sparse_slots": list(self.sparse_slots), **weighted}

    @classmethod
    def from_dict(cls, data: dict) -> Schema:
        return cls(dense_dim=int(data["dense_dim"]), sparse_slots=list(data["sparse_slots"]),
                   weighted=bool(data.get("weighted", False)))


def format_line(
    label: int, dense: Sequence[float], sparse: Sequence[Sequence[int]], schema: Schema, weight: float = 1.0
) -> str:
    """One MultiSlot line (without newline) for one example (``weight``: written if the schema is weighted)."""
    if label not in (0, 1):
        raise ValueError(f"label must be 0 or 1, got {label!r}")
    if not (math.isfinite(weight) and weight >= 0):
        raise ValueError(f"weight must be a finite number >= 0, got {weight!r}")
    if len(dense) != schema.dense_dim:
        raise ValueError(f"expected {schema.dense_dim} dense values, got {len(dense)}")
    if len(sparse) != len(schema.sparse_slots):
        raise ValueError(f"expected {len(schema.sparse_slots)} sparse slots, got {len(sparse)}")
    tokens = ["1", str(int(label))]
    if schema.weighted:
        tokens += ["1", format_float(weight)]
    if schema.dense_dim:
        tokens.append(str(schema.dense_dim))
        tokens.extend(format_float(value) for value in dense)
    for name, ids in zip(schema.sparse_slots, sparse):
        if len(ids) == 0:
            raise ValueError(f"sparse slot {name!r} is empty; every slot needs >= 1 id")
        tokens.append(str(len(ids)))
        tokens.extend(str(int(feature)) for feature in ids)
    return " ".join(tokens)


def text_bytes(values, start: int = 0, end: int | None = None) -> memoryview:
    """The bytes of lines ``start:end`` of an Arrow string array without nulls (lines built with their
    newline), without copying them: what a shard file receives."""
    import pyarrow as pa

    end = len(values) if end is None else end
    wide = pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type)
    offsets = np.frombuffer(values.buffers()[1], np.int64 if wide else np.int32)
    first, last = offsets[values.offset + start], offsets[values.offset + end]
    return memoryview(values.buffers()[2])[first:last]


def format_float(value: float) -> str:
    """Compact float text used for dense values."""
    return f"{value:.6g}"


class ParsedLine(NamedTuple):
    label: int
    dense: list[float]
    sparse: list[list[int]]
    weight: float = 1.0  # an unweighted line's rows weigh 1


def parse_line(line: str, schema: Schema) -> ParsedLine:
    """Inverse of :func:`format_line`; raises ``ValueError`` saying what is wrong."""
    tokens = line.split()
    position = 0

    def take_slot(name: str, exact: int | None) -> list[str]:
        nonlocal position
        if position >= len(tokens):
            raise ValueError(f"line ends before slot {name!r}")
        count_text = tokens[position]
        if not count_text.isdigit():
            raise ValueError(f"slot {name!r}: value count {count_text!r} is not an integer")
        count = int(count_text)
        if exact is not None and count != exact:
            raise ValueError(f"slot {name!r} must have {exact} values, has {count}")
        if count == 0:
            raise ValueError(f"slot {name!r} is empty")
        values = tokens[position + 1 : position + 1 + count]
        if len(values) != count:
            raise ValueError(f"slot {name!r} announces {count} values, line has {len(values)}")
        position += 1 + count
        return values

    (label_text,) = take_slot(LABEL_SLOT, 1)
    if label_text not in ("0", "1"):
        raise ValueError(f"label must be 0 or 1, got {label_text!r}")
    weight = 1.0
    if schema.weighted:
        (weight_text,) = take_slot(WEIGHT_SLOT, 1)
        weight = float(weight_text)
        if not (math.isfinite(weight) and weight >= 0):
            raise ValueError(f"weight must be a finite number >= 0, got {weight_text!r}")
    dense: list[float] = []
    if schema.dense_dim:
        dense = [float(value) for value in take_slot(DENSE_SLOT, schema.dense_dim)]
        if not all(math.isfinite(value) for value in dense):
            raise ValueError(f"dense values must be finite: {dense}")
    sparse = [[int(value) for value in take_slot(name, None)] for name in schema.sparse_slots]
    if position != len(tokens):
        raise ValueError(f"{len(tokens) - position} unexpected trailing tokens")
    return ParsedLine(int(label_text), dense, sparse, weight)


class RaggedIds(NamedTuple):
    """Ids of one sparse slot for n rows: row i is ``values[offsets[i]:offsets[i + 1]]``."""

    values: np.ndarray  # int64
    offsets: np.ndarray  # int64, length n + 1, offsets[0] == 0

    def row(self, index: int) -> np.ndarray:
        return self.values[self.offsets[index] : self.offsets[index + 1]]


def read_shards(paths: Iterable[str | Path], schema: Schema, with_weights: bool = False) -> tuple:
    """Load MultiSlot shards into arrays (rows in file order, files in the given order).

    Returns ``(labels int64[n], dense float32[n, dense_dim], sparse)`` where ``sparse``
    has one :class:`RaggedIds` per schema sparse slot; ``with_weights``: ``(labels, dense,
    sparse, weights float64[n])``, the weights all 1 in an unweighted schema. Parsing is
    vectorised per file; ids must be below 2**53 (guaranteed by ``hashing.MAX_VOCAB_SIZE``).
    Raises ``ValueError`` naming the file and line of the first malformed example. A shard's columnar copy (data
    prep writes one beside it: :func:`save_columns`) is read instead of its text when it is of this very text.
    """
    parts = []  # a file's columnar copy's pieces, else its text's rows: joined once, whatever their number
    for path in paths:
        copy = _columnar_copy(Path(path), schema)
        parts += copy if copy is not None else [_read_shard(str(path), Path(path).read_bytes(), schema)]
    return _joined(parts or [_no_rows(schema)], schema, with_weights)


def read_shard_bytes(data: bytes, schema: Schema, name: str) -> tuple:
    """:func:`read_shards` of MultiSlot text held in memory (``name``: what an error calls it): the one reader, so
    rows a transform turns into MultiSlot text (:mod:`components.data_prep.transform`) read exactly as the
    trainer's shards do. Returns ``(labels, dense, sparse, weights)``."""
    return _joined([_read_shard(name, data, schema)], schema, True)


def _joined(per_file: list["_Shard"], schema: Schema, with_weights: bool) -> tuple:
    labels = np.concatenate([shard.labels for shard in per_file])
    dense = np.concatenate([shard.dense for shard in per_file])
    sparse = []
    for slot_index in range(len(schema.sparse_slots)):
        parts = [shard.sparse[slot_index] for shard in per_file]
        starts = np.cumsum([0] + [len(part.values) for part in parts[:-1]])
        shifted = [part.offsets[1:] + start for part, start in zip(parts, starts)]
        offsets = np.concatenate([np.zeros(1, np.int64), *shifted])
        sparse.append(RaggedIds(np.concatenate([part.values for part in parts]), offsets))
    if with_weights:
        return labels, dense, sparse, np.concatenate([shard.weights for shard in per_file])
    return labels, dense, sparse


# -- the columnar copy -------------------------------------------------------------------------------------------
# Data prep parses the text it writes once more, block by block, and keeps the arrays beside each shard
# (``<split>/part-00000.txt`` -> ``columns/<split>/part-00000/``: ``index.json`` and its pieces in file order, apart
# from the split's directory, which holds the shards alone), so that the steps that
# read a dataset in Python (the baseline's fit, the evaluation's load count and scores) load arrays instead of
# parsing text again: on 800k Criteo-like rows 7 s of parsing against 0.3 s. The text stays the truth: a copy whose
# recorded size is not the text's, or that cannot be read whole, is passed over and the text parsed.
COLUMNS_DIR = "columns"
COLUMNS_INDEX = "index.json"


def columns_dir(shard_path: str | Path) -> Path:
    """Where the columnar copy of the text shard ``shard_path`` (``<dataset>/<split>/<name>.txt``) lives."""
    path = Path(shard_path)
    return path.parent.parent / COLUMNS_DIR / path.parent.name / path.stem


def save_columns(text: bytes, schema: Schema, path: Path) -> int:
    """The rows of MultiSlot ``text`` as arrays in ``path`` (``.npz``), each in the smallest type that holds it
    (a Criteo row: 1 byte a slot's count, 4 or 8 an id): the labels, the dense values, the weights of a weighted
    schema, each row's count of values per slot (``[rows, slots]``) and the ids, slot after slot; returns the rows."""
    shard = _read_shard(str(path), text, schema)
    counts = np.stack([np.diff(slot.offsets) for slot in shard.sparse], axis=1)
    ids = np.concatenate([slot.values for slot in shard.sparse])
    arrays = {"labels": shard.labels.astype(np.int8), "dense": shard.dense,
              "counts": counts.astype(np.min_scalar_type(int(counts.max(initial=0)))),
              "ids": ids.astype(np.result_type(np.min_scalar_type(int(ids.min(initial=0))),
                                               np.min_scalar_type(int(ids.max(initial=0)))))}
    if schema.weighted:
        arrays["weights"] = shard.weights
    # As np.savez lays it out, with a fixed time in the zip's entries (savez stamps the clock's): a dataset is the
    # same bytes however often and wherever it is prepared.
    with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED, allowZip64=True) as archive:
        for name, array in arrays.items():
            with archive.open(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), "w",
                              force_zip64=True) as entry:
                np.lib.format.write_array(entry, np.ascontiguousarray(array), allow_pickle=False)
    return len(shard.labels)


def write_columns_index(directory: Path, text_bytes_covered: int, pieces: list[str]) -> None:
    """Name the pieces of a shard's columnar copy, in the text's order, and the size of the text they are of."""
    (directory / COLUMNS_INDEX).write_text(json.dumps({"text_bytes": text_bytes_covered, "pieces": pieces}))


def _columnar_copy(shard_path: Path, schema: Schema) -> list[_Shard] | None:
    """The pieces of the shard's columnar copy, or None when it has none that is of its text."""
    directory = columns_dir(shard_path)
    try:
        index = json.loads((directory / COLUMNS_INDEX).read_text())
        if index["text_bytes"] != shard_path.stat().st_size:
            return None
        return [_load_piece(directory / name, schema) for name in index["pieces"]]
    except (OSError, ValueError, KeyError, TypeError, zipfile.BadZipFile):
        return None


def _load_piece(path: Path, schema: Schema) -> _Shard:
    with np.load(path, allow_pickle=False) as arrays:
        labels, dense, counts = arrays["labels"].astype(np.int64), arrays["dense"], arrays["counts"]
        ids = arrays["ids"].astype(np.int64)
        rows = len(labels)
        weights = arrays["weights"] if schema.weighted else np.ones(rows, np.float64)
    if (dense.shape != (rows, schema.dense_dim) or counts.shape != (rows, len(schema.sparse_slots))
            or len(weights) != rows or len(ids) != counts.sum()):
        raise ValueError(f"{path}: the arrays do not hold the same rows")
    offsets = np.zeros((rows + 1, counts.shape[1]), np.int64)
    np.cumsum(counts, axis=0, out=offsets[1:])
    starts = np.concatenate([[0], np.cumsum(offsets[-1])])
    sparse = [RaggedIds(ids[starts[slot]:starts[slot + 1]], np.ascontiguousarray(offsets[:, slot]))
              for slot in range(counts.shape[1])]
    return _Shard(labels, dense.astype(np.float32), sparse, weights)


class _Shard(NamedTuple):
    labels: np.ndarray
    dense: np.ndarray
    sparse: list[RaggedIds]
    weights: np.ndarray


def _no_rows(schema: Schema) -> _Shard:
    empty = RaggedIds(np.zeros(0, np.int64), np.zeros(1, np.int64))
    return _Shard(np.zeros(0, np.int64), np.zeros((0, schema.dense_dim), np.float32),
                  [empty for _ in schema.sparse_slots], np.zeros(0, np.float64))


def _read_shard(path: str, data: bytes, schema: Schema) -> _Shard:
    if not data.strip():
        return _no_rows(schema)
    tokens, tokens_per_line = _parse_numbers(path, data)
    # Non-blank lines only; their tokens are contiguous runs.
    line_numbers = np.flatnonzero(tokens_per_line) + 1
    tokens_per_line = tokens_per_line[line_numbers - 1]
    line_starts = np.concatenate([[0], np.cumsum(tokens_per_line)[:-1]]).astype(np.int64)
    cursor = line_starts.copy()

    def check(bad_rows: np.ndarray, reason: str) -> None:
        if bad_rows.any():
            first = int(np.flatnonzero(bad_rows)[0])
            raise ValueError(f"{path}:{line_numbers[first]}: {reason}")

    def take_counts(name: str) -> np.ndarray:
        check(cursor >= line_starts + tokens_per_line, f"line ends before slot {name!r}")
        counts_float = tokens[cursor]
        counts = counts_float.astype(np.int64)
        check((counts < 1) | (counts != counts_float), f"slot {name!r} has a bad value count")
        check(
            cursor + 1 + counts > line_starts + tokens_per_line,
            f"slot {name!r} announces more values than the line has",
        )
        return counts

    check(take_counts(LABEL_SLOT) != 1, "click slot must hold exactly one value")
    labels_float = tokens[cursor + 1]
    check(~np.isin(labels_float, (0.0, 1.0)), "label must be 0 or 1")
    cursor += 2
    weights = np.ones(len(cursor), np.float64)
    if schema.weighted:
        check(take_counts(WEIGHT_SLOT) != 1, "weight slot must hold exactly one value")
        weights = tokens[cursor + 1]
        check(~(np.isfinite(weights) & (weights >= 0)), "weight must be a finite number >= 0")
        cursor += 2
    dense = np.zeros((len(cursor), schema.dense_dim), np.float32)
    if schema.dense_dim:
        dense_counts = take_counts(DENSE_SLOT)
        check(dense_counts != schema.dense_dim, f"dense slot must hold {schema.dense_dim} values")
        dense = tokens[(cursor + 1)[:, None] + np.arange(schema.dense_dim)].astype(np.float32)
        cursor += 1 + schema.dense_dim
    sparse = []
    for name in schema.sparse_slots:
        counts = take_counts(name)
        offsets = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        # Token index of every value: row start + position within the row.
        value_index = np.repeat(cursor + 1 - offsets[:-1], counts) + np.arange(offsets[-1])
        sparse.append(RaggedIds(tokens[value_index].astype(np.int64), offsets))
        cursor += 1 + counts
    check(cursor != line_starts + tokens_per_line, "unexpected trailing tokens")
    return _Shard(labels_float.astype(np.int64), dense, sparse, weights)


def _parse_numbers(path: str, data: bytes) -> tuple[np.ndarray, np.ndarray]:
    """All whitespace-separated numbers of ``data`` as float64, and the number of them on each line.

    Arrow splits the lines and converts the tokens in C++ (correctly rounded, as ``float()``: 5x faster on CPU than
    the digit arithmetic in NumPy it replaced, on Criteo-like shards). A token Arrow refuses is looked at again by
    ``float()``, which also takes what Arrow does not (``1_000``): the values are ``float()``'s.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    line_ends = np.flatnonzero(np.frombuffer(data, np.uint8) == ord("\n")) + 1
    if not len(line_ends) or line_ends[-1] != len(data):
        line_ends = np.append(line_ends, len(data))
    offsets = np.concatenate([[0], line_ends]).astype(np.int64)
    # Not validated as UTF-8: the ASCII kernels go by bytes, and a token that is no number fails the cast.
    lines = pc.ascii_trim_whitespace(pa.LargeStringArray.from_buffers(
        len(line_ends), pa.py_buffer(offsets), pa.py_buffer(data)))
    filled = pc.greater(pc.binary_length(lines), 0)
    tokens = pc.ascii_split_whitespace(pc.filter(lines, filled))  # a blank line would split into one empty token
    tokens_per_line = np.zeros(len(lines), np.int64)
    tokens_per_line[filled.to_numpy(zero_copy_only=False)] = pc.list_value_length(tokens).to_numpy()
    flat = tokens.flatten()
    try:
        return pc.cast(flat, pa.float64()).to_numpy(), tokens_per_line
    except pa.ArrowInvalid:
        pass
    texts = pc.cast(flat, pa.large_binary()).to_pylist()  # bytes: float() takes them, whatever the encoding
    try:
        return np.array([float(text) for text in texts], np.float64), tokens_per_line
    except ValueError:
        bad = next(index for index, text in enumerate(texts) if not _is_float(text))
        line = int(np.searchsorted(np.cumsum(tokens_per_line), bad, side="right")) + 1
        raise ValueError(f"{path}:{line}: {texts[bad]!r} is not a number") from None


def _is_float(text: bytes) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
