"""The merge's side of the shards' columnar copy (:func:`components.data_prep.multislot.save_columns`).

Each convert task keeps, per unit, the pieces of every split's shards it wrote and lists them in
:data:`COLUMN_PIECES` (name, text bytes, rows); the merge links a shard's pieces from every unit, in unit order,
beside the shard it concatenates from the same units, with an index of them. A shard any of whose units has no
copy (parts converted before the copy existed, served from a step cache) gets none: its readers parse its text.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from components.data_prep.multislot import COLUMNS_DIR, columns_dir, write_columns_index

COLUMN_PIECES = "column_pieces.json"


def gather_columns(shard_path: Path, units: list[tuple[int, Path, str, int]]) -> bool:
    """Link the columnar copy of the merged shard ``shard_path`` from the ``(unit index, part directory, split,
    shard)`` it is made of, in order; False (and no copy) when one of them has none."""
    pieces, covered = [], 0
    for unit, part, split, shard in units:
        try:
            listed = json.loads((part / COLUMN_PIECES).read_text())[split][shard]
        except (OSError, ValueError, KeyError, IndexError):
            return False
        pieces += [(unit, part / COLUMNS_DIR / split / name, size) for name, size, _ in listed]
        covered += sum(size for _, size, _ in listed)
    if covered != shard_path.stat().st_size:  # the copy must be of exactly this text
        return False
    directory = columns_dir(shard_path)
    directory.mkdir(parents=True)
    names = []
    for unit, source, _ in pieces:
        names.append(f"{unit:05d}-{source.name}")
        _link_or_copy(source, directory / names[-1])
    write_columns_index(directory, covered, names)
    return True


def _link_or_copy(source: Path, target: Path) -> None:
    """The parts and the dataset are artifacts, never written again: a hard link shares the piece's bytes."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
