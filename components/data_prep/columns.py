"""The writing of the shards' columnar copy (:func:`components.data_prep.multislot.save_columns`, which
:func:`~components.data_prep.multislot.read_shards` reads).

Each convert task keeps, per unit, the pieces of every split's shards it wrote (:class:`ColumnPieces`) and lists
them in :data:`COLUMN_PIECES` (name, text bytes, rows); the merge links a shard's pieces from every unit, in unit order,
beside the shard it concatenates from the same units, with an index of them. A shard any of whose units has no
copy (parts converted before the copy existed, served from a step cache) gets none: its readers parse its text.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from components.data_prep.multislot import COLUMNS_DIR, Schema, columns_dir, save_columns, write_columns_index
from components.data_prep.plan import SPLITS

COLUMN_PIECES = "column_pieces.json"
# A piece holds up to this much of a shard's text: few enough pieces to read fast, and a convert process holds at
# most this much text per split and shard, and one parse of it, beside its block.
COLUMN_PIECE_BYTES = 8 << 20


class ColumnPieces:
    """A unit's columnar copy as its rows are written: per split and shard, the text kept until it holds
    :data:`COLUMN_PIECE_BYTES`, then parsed into a piece (``<part>/columns/<split>/<shard>-<n>.npz``)."""

    def __init__(self, root: Path, num_shards: int, schema: Schema):
        self.root, self.num_shards, self.schema = root, num_shards, schema
        self.pieces: dict[str, list[list]] = {split: [[] for _ in range(num_shards)] for split in SPLITS}
        self.pending: dict[str, list[list[bytes]]] = {split: [[] for _ in range(num_shards)] for split in SPLITS}

    def add(self, split: str, shard: int, text: memoryview) -> None:
        pending = self.pending[split][shard]
        pending.append(bytes(text))
        if sum(map(len, pending)) >= COLUMN_PIECE_BYTES:
            self._flush(split, shard)

    def close(self) -> None:
        """Parse what is kept and list every piece."""
        for split in SPLITS:
            for shard in range(self.num_shards):
                self._flush(split, shard)
        (self.root / COLUMN_PIECES).write_text(json.dumps(self.pieces))

    def _flush(self, split: str, shard: int) -> None:
        text = b"".join(self.pending[split][shard])
        self.pending[split][shard] = []
        if not text:
            return
        directory = self.root / COLUMNS_DIR / split
        directory.mkdir(parents=True, exist_ok=True)
        name = f"{shard:05d}-{len(self.pieces[split][shard]):05d}.npz"
        rows = save_columns(text, self.schema, directory / name)
        self.pieces[split][shard].append([name, len(text), rows])


def piece_listings(parts: dict[int, Path]) -> dict[int, dict | None]:
    """Per unit, the pieces its convert task listed (:data:`COLUMN_PIECES`), or None for a part without a copy."""
    listings: dict[int, dict | None] = {}
    for unit, part in parts.items():
        try:
            listings[unit] = json.loads((part / COLUMN_PIECES).read_text())
        except (OSError, ValueError):
            listings[unit] = None
    return listings


def gather_columns(shard_path: Path, split: str, shard: int, parts: dict[int, Path],
                   listings: dict[int, dict | None]) -> None:
    """Link the columnar copy of the merged shard ``shard_path`` (``split``'s ``shard``) from every unit's part, in
    unit order; no copy when a unit has none of it (``listings``: :func:`piece_listings`)."""
    pieces, covered = [], 0
    for unit, part in sorted(parts.items()):
        try:
            listed = listings[unit][split][shard]
        except (TypeError, KeyError, IndexError):
            return
        pieces += [(unit, part / COLUMNS_DIR / split / name) for name, _, _ in listed]
        covered += sum(size for _, size, _ in listed)
    if covered != shard_path.stat().st_size:  # the copy must be of exactly this text
        return
    directory = columns_dir(shard_path)
    directory.mkdir(parents=True)
    names = []
    for unit, source in pieces:
        names.append(f"{unit:05d}-{source.name}")
        _link_or_copy(source, directory / names[-1])
    write_columns_index(directory, covered, names)


def _link_or_copy(source: Path, target: Path) -> None:
    """The parts and the dataset are artifacts, never written again: a hard link shares the piece's bytes."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)
