"""Streaming readers for real CTR input formats on any fsspec URL.

A URI may be a local path, an ``s3://...`` (or any fsspec) URL, a glob, or a
directory (every non-hidden file below it). Compressed files are decompressed by
extension (``compression="infer"``). Files are read line by line, so inputs larger
than memory work.

Each reader yields, per non-blank line, either a :class:`Record` (label, normalised
dense values, raw sparse values per slot) or a :class:`Malformed` (file, 1-based line,
reason). Sparse values stay raw strings here; ``prepare`` hashes them to ids.

Formats (``fmt``):

* ``raw`` -- Criteo TSV: ``label \\t I1..I13 \\t C1..C26`` (40 fields, empty = missing).
  Dense: :func:`normalize_count`; missing dense -> 0. Slots ``C1``..``C26``.
* ``slot`` -- PaddleRec CTR-DNN text: ``click:<0|1>``, 13 x ``dense_feature:<float>``
  (taken as is), then ``<n>:<id>`` for n = 1..26. Slot ``n`` is named ``C<n>`` so both
  Criteo formats share one schema.
* ``feasign`` -- PaddleRec production ``feasign:slot`` text: every token is
  ``<uint64 feasign>:<slot id>``; slot ``1`` carries the click label as its feasign
  (``0:1`` / ``1:1``); other slots are sparse and may hold several feasigns. No dense
  features. Slots are named by their id (``"2"``, ``"3"``, ...); by default the schema
  is every slot seen in a first pass over the input (a second read).

A slot absent from a line gets the single value :data:`MISSING_VALUE`, hashed per slot
like any other value: Paddle's MultiSlot feed rejects empty slots.
"""

from __future__ import annotations

import hashlib
import math
import posixpath
from collections.abc import Iterator, Mapping, Sequence
from typing import NamedTuple

import fsspec

from components.data_prep.multislot import Schema

FORMATS = ("raw", "slot", "feasign")
MISSING_VALUE = "<missing>"
CRITEO_DENSE_DIM = 13
CRITEO_SLOTS = tuple(f"C{index}" for index in range(1, 27))
FEASIGN_LABEL_SLOT = "1"
# log1p of Criteo counts: 16 ~ log1p(8.9e6); larger counts are clipped to 1.0.
DENSE_LOG_CAP = 16.0


class DataPrepError(ValueError):
    """Input data or settings that cannot produce a dataset; the message says how to fix."""


class Record(NamedTuple):
    label: int
    dense: tuple[float, ...]
    sparse: tuple[tuple[str, ...], ...]  # raw values per schema slot, never empty
    source: str
    line_number: int


class Malformed(NamedTuple):
    source: str
    line_number: int
    reason: str


def normalize_count(value: float) -> float:
    """Criteo integer feature -> [0, 1]: ``min(log1p(max(value, 0)) / 16, 1)``.

    Negative values (a few Criteo columns have -1..-3) count as 0, like missing ones.
    """
    return min(math.log1p(max(value, 0.0)) / DENSE_LOG_CAP, 1.0)


def _matched_files(uri: str, storage_options: Mapping | None) -> tuple[fsspec.AbstractFileSystem, list[str]]:
    fs, _, paths = fsspec.get_fs_token_paths(uri, storage_options=dict(storage_options or {}))
    files: list[str] = []
    for path in paths:
        if fs.isdir(path):
            files.extend(
                found
                for found in sorted(fs.find(path))
                if not posixpath.basename(found).startswith((".", "_"))
            )
        elif fs.isfile(path):
            files.append(path)
    if not files:
        raise DataPrepError(
            f"no input file matches {uri!r}: check the path, bucket and glob pattern "
            "(a directory URI takes every non-hidden file below it)"
        )
    return fs, files


def list_input_files(uri: str, storage_options: Mapping | None = None) -> list[str]:
    """URLs of the files ``uri`` names (file, glob or directory), in sorted order."""
    fs, files = _matched_files(uri, storage_options)
    local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
    return files if local else [fs.unstrip_protocol(path) for path in files]


def input_fingerprint(uri: str, storage_options: Mapping | None = None) -> str:
    """``"<n> file(s), sha256:<hex>"`` over the files ``uri`` names and fsspec's ``ukey`` of each (its size and
    modification time or ETag): it changes when a file is added, removed or rewritten, so a cache keyed on it
    (the pipeline's data prep) does not return a dataset of older files for the same glob."""
    fs, files = _matched_files(uri, storage_options)
    digest = hashlib.sha256()
    for path in files:
        digest.update(f"{path}\0{fs.ukey(path)}\n".encode())
    return f"{len(files)} file(s), sha256:{digest.hexdigest()}"


def iter_lines(uri: str, storage_options: Mapping | None = None) -> Iterator[tuple[str, int, str]]:
    """``(file URL, 1-based line number, line without its newline)`` for every line."""
    for url in list_input_files(uri, storage_options):
        with fsspec.open(
            url,
            "rt",
            compression="infer",
            encoding="utf-8",
            errors="replace",
            **dict(storage_options or {}),
        ) as handle:
            for line_number, line in enumerate(handle, start=1):
                yield url, line_number, line.rstrip("\r\n")


def open_reader(
    fmt: str,
    uri: str,
    slots: Sequence[str] | None = None,
    storage_options: Mapping | None = None,
) -> tuple[Schema, Iterator[Record | Malformed]]:
    """Schema and record stream for ``uri`` in format ``fmt`` (one of :data:`FORMATS`).

    ``slots`` picks (and orders) the sparse slots to keep; by default all of the
    format's slots (``feasign``: every slot present in the input).
    """
    if fmt == "raw":
        schema = Schema(CRITEO_DENSE_DIM, _select_slots(fmt, CRITEO_SLOTS, slots))
        return schema, _read_raw_criteo(uri, schema, storage_options)
    if fmt == "slot":
        schema = Schema(CRITEO_DENSE_DIM, _select_slots(fmt, CRITEO_SLOTS, slots))
        return schema, _read_paddlerec_slot(uri, schema, storage_options)
    if fmt == "feasign":
        if slots is None:
            declared = discover_feasign_slots(uri, storage_options)
        else:
            declared = list(slots)
            invalid = [
                slot for slot in declared if not _is_uint(slot) or slot == FEASIGN_LABEL_SLOT
            ]
            if invalid:
                raise DataPrepError(
                    f"feasign slots must be integer slot ids other than the label slot "
                    f"{FEASIGN_LABEL_SLOT!r}; got {invalid}"
                )
        schema = Schema(0, declared)
        return schema, _read_feasign(uri, schema, storage_options)
    raise DataPrepError(f"unknown input format {fmt!r}: use one of {list(FORMATS)}")


def discover_feasign_slots(uri: str, storage_options: Mapping | None = None) -> list[str]:
    """Sparse slot ids present in well-formed ``feasign`` lines, in numeric order."""
    seen: set[str] = set()
    for _, _, line in iter_lines(uri, storage_options):
        parsed = _parse_feasign_line(line, None)
        if not isinstance(parsed, str):
            seen.update(parsed[1])
    if not seen:
        raise DataPrepError(
            f"{uri!r} holds no well-formed feasign line with a sparse slot: expected "
            "'<feasign>:<slot>' tokens with the label as '<0|1>:1'"
        )
    return sorted(seen, key=int)


def _select_slots(fmt: str, available: Sequence[str], requested: Sequence[str] | None) -> list[str]:
    if requested is None:
        return list(available)
    unknown = [slot for slot in requested if slot not in available]
    if unknown:
        raise DataPrepError(
            f"slots {unknown} do not exist in format {fmt!r}; available: {list(available)}"
        )
    return list(requested)


def _parse_label(text: str) -> int | None:
    return {"0": 0, "1": 1}.get(text)


def _parse_float(text: str) -> float | None:
    try:
        value = float(text)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def _is_uint(text: str) -> bool:
    return text.isascii() and text.isdigit()


def _read_raw_criteo(
    uri: str, schema: Schema, storage_options: Mapping | None
) -> Iterator[Record | Malformed]:
    expected_fields = 1 + CRITEO_DENSE_DIM + len(CRITEO_SLOTS)
    slot_columns = [1 + CRITEO_DENSE_DIM + CRITEO_SLOTS.index(slot) for slot in schema.sparse_slots]
    for source, line_number, line in iter_lines(uri, storage_options):
        if not line.strip():
            continue
        fields = line.split("\t")
        if len(fields) != expected_fields:
            yield Malformed(
                source,
                line_number,
                f"expected {expected_fields} tab-separated fields (label, I1-I13, C1-C26), "
                f"found {len(fields)}",
            )
            continue
        label = _parse_label(fields[0])
        if label is None:
            yield Malformed(source, line_number, f"label must be 0 or 1, got {fields[0]!r}")
            continue
        dense = []
        for position, text in enumerate(fields[1 : 1 + CRITEO_DENSE_DIM], start=1):
            value = _parse_float(text) if text else 0.0
            if value is None:
                reason = f"I{position} is not a finite number: {text!r}"
                yield Malformed(source, line_number, reason)
                break
            dense.append(normalize_count(value))
        else:
            sparse = tuple((fields[column] or MISSING_VALUE,) for column in slot_columns)
            yield Record(label, tuple(dense), sparse, source, line_number)


def _read_paddlerec_slot(
    uri: str, schema: Schema, storage_options: Mapping | None
) -> Iterator[Record | Malformed]:
    # File slot "n" is schema slot "C<n>"; slots left out of the schema are skipped.
    slot_by_file_name = {slot[1:]: slot for slot in CRITEO_SLOTS}
    position_of = {slot: index for index, slot in enumerate(schema.sparse_slots)}
    for source, line_number, line in iter_lines(uri, storage_options):
        if not line.strip():
            continue
        parsed = _parse_slot_line(line, slot_by_file_name, position_of)
        if isinstance(parsed, str):
            yield Malformed(source, line_number, parsed)
        else:
            label, dense, sparse = parsed
            yield Record(label, dense, sparse, source, line_number)


def _parse_slot_line(
    line: str, slot_by_file_name: Mapping[str, str], position_of: Mapping[str, int]
) -> tuple[int, tuple[float, ...], tuple[tuple[str, ...], ...]] | str:
    """Parsed slot-format line, or the reason it is malformed."""
    labels: list[str] = []
    dense_texts: list[str] = []
    sparse: list[list[str]] = [[] for _ in position_of]
    for token in line.split():
        name, separator, value = token.partition(":")
        if not separator or not value:
            return f"token {token!r} is not name:value"
        if name == "click":
            labels.append(value)
        elif name == "dense_feature":
            dense_texts.append(value)
        elif name in slot_by_file_name:
            position = position_of.get(slot_by_file_name[name])
            if position is not None:
                sparse[position].append(value)
        else:
            return f"unknown slot {name!r} in token {token!r}"
    if len(labels) != 1:
        return f"expected exactly one click:<0|1> token, found {len(labels)}"
    label = _parse_label(labels[0])
    if label is None:
        return f"label must be 0 or 1, got {labels[0]!r}"
    if len(dense_texts) != CRITEO_DENSE_DIM:
        return f"expected {CRITEO_DENSE_DIM} dense_feature values, found {len(dense_texts)}"
    dense = tuple(_parse_float(text) for text in dense_texts)
    if None in dense:
        bad = dense_texts[dense.index(None)]
        return f"dense_feature is not a finite number: {bad!r}"
    return label, dense, tuple(tuple(values) or (MISSING_VALUE,) for values in sparse)


def _read_feasign(
    uri: str, schema: Schema, storage_options: Mapping | None
) -> Iterator[Record | Malformed]:
    position_of = {slot: index for index, slot in enumerate(schema.sparse_slots)}
    for source, line_number, line in iter_lines(uri, storage_options):
        if not line.strip():
            continue
        parsed = _parse_feasign_line(line, position_of)
        if isinstance(parsed, str):
            yield Malformed(source, line_number, parsed)
            continue
        label, values_by_slot = parsed
        sparse = tuple(
            tuple(values_by_slot.get(slot, ())) or (MISSING_VALUE,) for slot in schema.sparse_slots
        )
        yield Record(label, (), sparse, source, line_number)


def _parse_feasign_line(
    line: str, keep: Mapping[str, int] | None
) -> tuple[int, dict[str, list[str]]] | str:
    """``(label, feasigns by slot)`` of a feasign line, or the reason it is malformed.

    Slots not in ``keep`` are dropped (as PaddleRec's reader does); ``keep=None`` keeps all.
    """
    labels: list[str] = []
    values_by_slot: dict[str, list[str]] = {}
    for token in line.split():
        feasign, separator, slot = token.rpartition(":")
        if not separator or not _is_uint(feasign) or not _is_uint(slot):
            return f"token {token!r} is not <uint64 feasign>:<slot id>"
        if len(feasign) > 19 and int(feasign) >= 1 << 64:
            return f"feasign {feasign} does not fit in uint64"
        if slot == FEASIGN_LABEL_SLOT:
            labels.append(feasign)
        elif keep is None or slot in keep:
            values_by_slot.setdefault(slot, []).append(feasign)
    if len(labels) != 1:
        return f"expected exactly one label token <0|1>:{FEASIGN_LABEL_SLOT}, found {len(labels)}"
    label = _parse_label(labels[0])
    if label is None:
        return f"label (slot {FEASIGN_LABEL_SLOT}) must be 0 or 1, got {labels[0]!r}"
    return label, values_by_slot
