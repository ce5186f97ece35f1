"""A committed checkpoint's sparse table, one shard at a time (the next read meanwhile): what the serving export
converts.

The rows come from the servers' own shard files (``tables/NNN/part-SSS-XXXXX``, one per table shard, in the
directory ``model.json["sparse_table"]`` names) or, for geo and SSD checkpoints, whose servers cannot save, from
``export/embedding.npz`` (the workers' rows), split by ``id % shard_num`` (:mod:`components.table.sharding`). Either
way one shard's rows are in memory at a time: a shard file is fetched (when the checkpoint is in a store), parsed
and dropped, and ``embedding.npz`` is memory-mapped.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

import numpy as np

from components.checkpoint import format as ckpt_io
from components.config import TableConfig, section_from_dict
from components.table.accessor import read_sparse_shard
from components.table.sharding import default_shard_num

# Fetches one checkpoint file (a path relative to the checkpoint) to a local path, verified, which the
# reader removes once it has read it.
FetchFile = Callable[[str], Path]
_SHARD_FILE = re.compile(r"^part-\d{3}-(?P<shard>\d+)(\.gz)?$")


@dataclass
class TableShard:
    index: int
    ids: np.ndarray  # uint64, sorted; each is index modulo shard_num
    rows: np.ndarray  # [n, embedding_dim] float32: embed_w, embedx...


class CheckpointTable:
    """The sparse table of the committed checkpoint at ``root``, read shard by shard (:meth:`shards`).

    ``root`` holds at least the checkpoint's ``MANIFEST.json``, ``model.json`` and ``export/`` (checked against
    the manifest here). Table files are read through ``fetch`` when given (a checkpoint in a store, fetched one
    file at a time), else from ``root``, each checked against the manifest before it is parsed. Raises
    :class:`~components.checkpoint.CheckpointError` naming what is missing, altered or inconsistent.
    """

    def __init__(self, root: str | os.PathLike, fetch: Optional[FetchFile] = None):
        self.root = Path(root).resolve()
        self.manifest = ckpt_io.verify(self.root, parts=ckpt_io.SCORING_PARTS)
        self.manifest_sha256 = ckpt_io.file_digest(self.root / ckpt_io.MANIFEST)[1]
        self.meta: dict[str, Any] = json.loads((self.root / ckpt_io.MODEL_META).read_text())
        self.config: TableConfig = section_from_dict(TableConfig, self.meta["table"])
        self.shard_num = self.config.shard_num or default_shard_num(int(self.meta.get("servers") or 1))
        self.embedding_dim = self.config.embedding_dim
        self._fetch = fetch

    def dense(self) -> dict[str, np.ndarray]:
        """Every dense parameter by name (float32)."""
        with np.load(self.root / ckpt_io.EXPORT / ckpt_io.DENSE_FILE) as dense:
            return {name: dense[name] for name in dense.files}

    def shards(self) -> Iterator[TableShard]:
        """Every shard, ``0 .. shard_num - 1``, one at a time."""
        if self.meta.get("sparse_table"):
            yield from self._saved_shards(self.meta["sparse_table"].rstrip("/"))
        else:
            yield from self._exported_shards()

    def whole(self) -> tuple[np.ndarray, np.ndarray]:
        """``(ids sorted, rows)`` of the whole table in one process: memory grows with the table."""
        parts = list(self.shards())
        ids = np.concatenate([part.ids for part in parts])
        order = np.argsort(ids, kind="stable")
        return ids[order], np.concatenate([part.rows for part in parts])[order]

    def _saved_shards(self, table_dir: str) -> Iterator[TableShard]:
        files: dict[int, str] = {}
        for rel in self.manifest["files"]:
            folder, _, name = rel.rpartition("/")
            match = _SHARD_FILE.match(name)
            if folder == table_dir and match:
                files[int(match["shard"])] = rel
        if sorted(files) != list(range(self.shard_num)):
            raise ckpt_io.CheckpointError(f"{self.root}: {table_dir} holds files for shards {sorted(files)}, "
                                          f"model.json says shard_num {self.shard_num}")
        # The next shard is read while the caller writes this one: the parse (NumPy and Arrow, without the GIL)
        # overlaps the writing, for one more shard's rows in memory.
        with ThreadPoolExecutor(1) as pool:
            ahead = pool.submit(self._saved_shard, 0, files[0])
            for index in range(self.shard_num):
                shard = ahead.result()
                if index + 1 < self.shard_num:
                    ahead = pool.submit(self._saved_shard, index + 1, files[index + 1])
                yield shard

    def _saved_shard(self, index: int, rel: str) -> TableShard:
        with self._local(rel) as path:
            ids, rows = read_sparse_shard(path, self.config.rule, self.embedding_dim)
        misplaced = ids % np.uint64(self.shard_num) != np.uint64(index)
        if misplaced.any():
            raise ckpt_io.CheckpointError(f"{path} (shard {index} of {self.shard_num}) holds id "
                                          f"{ids[misplaced][0]}, which belongs to shard "
                                          f"{ids[misplaced][0] % np.uint64(self.shard_num)}")
        return TableShard(index, ids, rows)

    def _exported_shards(self) -> Iterator[TableShard]:
        path = self.root / ckpt_io.EXPORT / ckpt_io.EMBEDDING_FILE
        if not path.is_file():
            raise ckpt_io.CheckpointError(f"{self.root}: model.json names no sparse_table and there is no "
                                          f"{ckpt_io.EXPORT}/{ckpt_io.EMBEDDING_FILE}: the checkpoint holds no rows")
        arrays = npz_arrays(path)
        ids, rows = arrays["ids"], arrays["rows"]
        # A stable sort of the sorted ids by shard: each shard's ids stay sorted. Holds 8 bytes per id, not the rows.
        by_shard = np.argsort(ids % np.uint64(self.shard_num), kind="stable")
        bounds = np.searchsorted(ids[by_shard] % np.uint64(self.shard_num), np.arange(self.shard_num + 1))
        for index in range(self.shard_num):
            picked = by_shard[bounds[index]:bounds[index + 1]]
            yield TableShard(index, np.asarray(ids[picked], np.uint64), np.asarray(rows[picked], np.float32))

    @contextlib.contextmanager
    def _local(self, rel: str) -> Iterator[Path]:
        if self._fetch is not None:
            path = self._fetch(rel)
            try:
                yield path
            finally:
                path.unlink(missing_ok=True)
            return
        path = ckpt_io.checkpoint_file(self.root, rel)
        expected = self.manifest["files"][rel]
        if not path.is_file() or ckpt_io.file_digest(path) != (expected["size"], expected["sha256"]):
            raise ckpt_io.CheckpointError(f"checkpoint file {path} is missing or does not match its checksum in "
                                          f"{ckpt_io.MANIFEST} (truncated or altered)")
        yield path


def npz_arrays(path: Path) -> dict[str, np.ndarray]:
    """The arrays of an ``.npz`` file, memory-mapped where stored uncompressed (what ``np.savez`` writes)."""
    arrays = {}
    with zipfile.ZipFile(path) as archive, open(path, "rb") as raw:
        for info in archive.infolist():
            name = info.filename.removesuffix(".npy")
            if info.compress_type != zipfile.ZIP_STORED:
                with archive.open(info) as member:
                    arrays[name] = np.lib.format.read_array(member)
                continue
            raw.seek(info.header_offset + 26)  # the local header: name and extra field lengths, then the data
            name_len, extra_len = np.frombuffer(raw.read(4), "<u2")
            raw.seek(info.header_offset + 30 + int(name_len) + int(extra_len))
            read_header = (np.lib.format.read_array_header_1_0 if np.lib.format.read_magic(raw) == (1, 0)
                           else np.lib.format.read_array_header_2_0)
            shape, fortran, dtype = read_header(raw)
            arrays[name] = np.memmap(path, dtype=dtype, mode="r", offset=raw.tell(), shape=shape,
                                     order="F" if fortran else "C")
    return arrays
