"""Where data prep's input comes from: the files a URI names, cut into work units, read in blocks of whole lines.

A URI may be a local path, an ``s3://...`` (or any fsspec) URL, a glob, or a directory (every non-hidden file
below it). Files are never copied whole to local disk: a unit is read in blocks (ranged reads on object stores).

**Units.** An uncompressed file is cut into byte ranges of :data:`UNIT_BYTES`; a unit owns the lines that *start*
inside its range (the line that crosses its end is finished by reading on), so every line belongs to exactly one
unit, whatever the cut. A compressed file (``.gz``, ``.bz2``, ... by extension) cannot be entered in the middle:
it is one unit, read through its decompressor. Units are numbered in file order, then offset order, and data prep
writes its output in that order, so the dataset does not depend on how units are spread over processes or pods.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Optional

import fsspec
from fsspec.utils import infer_compression

# A unit of work: large enough that its per-unit cost (a process task, a few files) is noise, small enough that
# a 2-core machine and a 16-pod fan-out both get many (a 1M-row Criteo file holds 8). The output depends on it
# (rows are dealt to shards per unit), so it is a constant of the format, not a setting.
UNIT_BYTES = 32 << 20
# How much of a unit is parsed at once: bounds a process's memory whatever the input size.
READ_BYTES = 8 << 20


class DataPrepError(ValueError):
    """Input data or settings that cannot produce a dataset; the message says how to fix it."""


class NoInputFiles(DataPrepError):
    """Nothing matches the input URI."""


@dataclass(frozen=True)
class InputFile:
    url: str
    size: int
    fingerprint: str  # what changes when the file does: its ETag / mtime, and size

    @property
    def compressed(self) -> bool:
        return infer_compression(self.url) is not None


@dataclass(frozen=True)
class Unit:
    """Lines of ``url`` that start in ``[start, end)`` (a compressed file: all of it, ``end`` = its stored size)."""

    index: int
    url: str
    start: int
    end: int
    compressed: bool

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: Mapping) -> "Unit":
        return cls(index=int(raw["index"]), url=str(raw["url"]), start=int(raw["start"]), end=int(raw["end"]),
                   compressed=bool(raw["compressed"]))


def list_inputs(uri: str, storage_options: Optional[Mapping] = None) -> list[InputFile]:
    """The files ``uri`` names (file, glob or directory), sorted, with their sizes and fingerprints."""
    options = dict(storage_options or {})
    try:
        fs, _, paths = fsspec.get_fs_token_paths(uri, storage_options=options)
        found: dict[str, dict] = {}
        for path in paths:
            try:
                info = fs.info(path)
            except FileNotFoundError:
                continue
            if info.get("type") == "directory":
                for child, child_info in sorted(fs.find(path, detail=True).items()):
                    if not posixpath.basename(child).startswith((".", "_")):
                        found[child] = child_info
            else:
                found[path] = info
    except (OSError, ValueError) as err:
        raise DataPrepError(f"cannot list {uri!r}: {err}") from err
    if not found:
        raise NoInputFiles(f"no input file matches {uri!r}: check the path, bucket and glob pattern "
                              "(a directory URI takes every non-hidden file below it)")
    local = "file" in (fs.protocol if isinstance(fs.protocol, tuple) else (fs.protocol,))
    return [InputFile(url=path if local else fs.unstrip_protocol(path), size=int(info.get("size") or 0),
                      fingerprint=_fingerprint(info))
            for path, info in sorted(found.items())]


def _fingerprint(info: Mapping) -> str:
    version = next((str(info[key]) for key in ("ETag", "etag", "mtime", "LastModified", "last_modified", "created")
                    if info.get(key) is not None), "")
    return f"{info.get('size')}:{version}"


def plan_units(files: list[InputFile], unit_bytes: int = UNIT_BYTES) -> list[Unit]:
    """Every file cut into units of ``unit_bytes`` (a compressed or empty file: one unit)."""
    units: list[Unit] = []
    for file in files:
        if file.compressed or file.size <= unit_bytes:
            bounds = [(0, file.size)]
        else:
            bounds = [(start, min(start + unit_bytes, file.size)) for start in range(0, file.size, unit_bytes)]
        units += [Unit(len(units) + i, file.url, start, end, file.compressed) for i, (start, end) in enumerate(bounds)]
    return units


def group_units(units: list[Unit], groups: int) -> list[list[int]]:
    """Unit indices in at most ``groups`` runs of consecutive units with about equal bytes (one run per pod)."""
    total = sum(max(u.end - u.start, 1) for u in units)
    runs: list[list[int]] = [[] for _ in range(min(groups, len(units)))]
    done = 0
    for unit in units:
        # The run a unit falls into by the bytes before its middle: runs stay consecutive and balanced.
        middle = done + max(unit.end - unit.start, 1) / 2
        runs[min(int(middle * len(runs) / total), len(runs) - 1)].append(unit.index)
        done += max(unit.end - unit.start, 1)
    return [run for run in runs if run]


def read_blocks(unit: Unit, storage_options: Optional[Mapping] = None,
                read_bytes: int = READ_BYTES) -> Iterator[tuple[int, bytes]]:
    """``(offset of the block's first byte in the file, block)`` for the unit's lines, a block of whole lines at a
    time (the last line of a file may lack its newline). Offsets of a compressed file are in its decompressed
    stream."""
    options = dict(storage_options or {})
    if unit.compressed:
        with fsspec.open(unit.url, "rb", compression="infer", **options) as f:
            yield from _whole_lines(lambda: f.read(read_bytes), 0)
        return
    with fsspec.open(unit.url, "rb", **options) as f:
        start, end = _line_start(f, unit.start), _line_start(f, unit.end)
        f.seek(start)
        remaining = [end - start]

        def read() -> bytes:
            data = f.read(min(read_bytes, remaining[0]))
            remaining[0] -= len(data)
            return data

        yield from _whole_lines(read, start)


def lines_before(unit: Unit, storage_options: Optional[Mapping] = None) -> int:
    """The lines of the unit's file before the unit's first line, counted by reading up to it (for an error's line
    number only: a unit's own lines are counted as it is read)."""
    if unit.start == 0:
        return 0
    with fsspec.open(unit.url, "rb", **dict(storage_options or {})) as f:
        remaining, newlines = unit.start - 1, 0
        while remaining:
            data = f.read(min(READ_BYTES, remaining))
            if not data:
                break
            newlines, remaining = newlines + data.count(b"\n"), remaining - len(data)
    return newlines + 1  # the unit starts after the newline at or after its start - 1 (_line_start)


def _line_start(f, position: int) -> int:
    """The offset of the first line that starts at or after ``position`` (the file's size if none does)."""
    if position == 0:
        return 0
    f.seek(position - 1)
    return position - 1 + len(f.readline())  # through the newline at or after position - 1


def _whole_lines(read, offset: int) -> Iterator[tuple[int, bytes]]:
    carry = b""
    while True:
        data = read()
        if not data:
            break
        data = carry + data
        cut = data.rfind(b"\n") + 1
        if cut:
            yield offset, data[:cut]
            offset += cut
        carry = data[cut:]
    if carry:
        yield offset, carry
