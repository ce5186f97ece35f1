"""Data-prep entry points: build a sharded MultiSlot dataset plus ``stats.json``.

Output layout (written into a temporary sibling directory and renamed into place at
the end, so a failure never leaves a half-written dataset)::

    out_dir/train/part-00000.txt ... part-<num_shards - 1>.txt
    out_dir/test/part-00000.txt  ... part-<num_shards - 1>.txt
    out_dir/stats.json

Rows go round-robin over the shards of their split. Every sparse id is
``hashing.feature_id(slot, raw_value, vocab_size)``, so all ids lie in
``[0, vocab_size)``.

* :func:`prepare_synthetic` -- the :mod:`synthetic` generator; the last
  ``round(rows * test_fraction)`` rows are the test split (rows are i.i.d.), and
  ``stats["bayes"]`` holds the Bayes-optimal AUC/logloss on it.
* :func:`prepare_files` -- real files in a :mod:`readers` format, streamed in chunks.
  A line is a test row when a hash of ``(seed, file basename, line number)`` falls below
  ``test_fraction``: deterministic, independent of chunking and of where the files live.
"""

from __future__ import annotations

import itertools
import json
import os
import posixpath
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

import numpy as np

from components.data_prep.hashing import MAX_VOCAB_SIZE, feature_ids, hash64_many
from components.data_prep.multislot import Schema, format_float
from components.data_prep.readers import DataPrepError, Malformed, Record, open_reader
from components.data_prep.synthetic import (
    SyntheticRows,
    SyntheticSpec,
    bayes_metrics,
    category_id_tables,
    format_lines,
    generate,
)

__all__ = ["DataPrepError", "prepare_files", "prepare_synthetic"]

SPLITS = ("train", "test")
STATS_FILE = "stats.json"
MALFORMED_EXAMPLES = 10
_CHUNK_RECORDS = 8192
# Distinct-id sets merge their pending ids once this many have piled up.
_DISTINCT_MERGE_THRESHOLD = 1 << 20


def prepare_synthetic(
    out_dir: str | os.PathLike,
    *,
    rows: int,
    test_fraction: float,
    num_shards: int,
    vocab_size: int,
    seed: int,
    spec: SyntheticSpec | None = None,
) -> dict:
    """Generate ``rows`` synthetic rows into ``out_dir``; returns the stats dict."""
    _check_settings(test_fraction, num_shards, vocab_size)
    spec = spec or SyntheticSpec()
    test_rows = round(rows * test_fraction)
    train_rows = rows - test_rows
    _check_split_sizes({"train": train_rows, "test": test_rows}, num_shards)
    data = generate(rows, seed, spec)
    id_tables = category_id_tables(spec, vocab_size)
    distinct = {
        slot: len(np.unique(table[data.categories[:train_rows, field]]))
        for field, (slot, table) in enumerate(zip(spec.sparse_slots, id_tables))
    }
    with _atomic_directory(Path(out_dir)) as staging, ExitStack() as files:
        writers = {split: _ShardWriter(staging, split, num_shards, files) for split in SPLITS}
        # Text is formatted a block at a time: it takes ~3x the memory of the arrays.
        for start in range(0, rows, _CHUNK_RECORDS * 8):
            block = SyntheticRows(*(array[start : start + _CHUNK_RECORDS * 8] for array in data))
            lines = format_lines(block, spec, id_tables)
            for row, (label, line) in enumerate(zip(block.labels.tolist(), lines), start=start):
                writers["train" if row < train_rows else "test"].write(line, label)
        files.close()
        stats = _stats(
            fmt="synthetic",
            source=None,
            schema=spec.schema,
            writers=writers,
            distinct_ids=distinct,
            malformed=_MalformedLog(),
            vocab_size=vocab_size,
            seed=seed,
            test_fraction=test_fraction,
            max_malformed_fraction=None,
            bayes=bayes_metrics(data.labels[train_rows:], data.probabilities[train_rows:]),
            generator=spec.to_dict(),
        )
        _write_stats(staging, stats)
    return stats


def prepare_files(
    out_dir: str | os.PathLike,
    *,
    uri: str,
    fmt: str,
    test_fraction: float,
    num_shards: int,
    vocab_size: int,
    seed: int,
    max_malformed_fraction: float,
    slots: Sequence[str] | None = None,
    storage_options: Mapping | None = None,
) -> dict:
    """Convert the files at ``uri`` (format ``fmt``) into ``out_dir``; returns the stats dict.

    ``slots`` selects/orders sparse slots (see ``readers.open_reader``);
    ``storage_options`` go to fsspec (e.g. ``{"client_kwargs": {"endpoint_url": ...}}``).
    Malformed lines are skipped and counted; more than ``max_malformed_fraction`` of
    all non-blank lines is an error.
    """
    _check_settings(test_fraction, num_shards, vocab_size)
    if not 0.0 <= max_malformed_fraction <= 1.0:
        raise DataPrepError(
            f"max_malformed_fraction must be in [0, 1], got {max_malformed_fraction}"
        )
    schema, stream = open_reader(fmt, uri, slots, storage_options)
    malformed = _MalformedLog()
    distinct = _DistinctIds(schema.sparse_slots)
    with _atomic_directory(Path(out_dir)) as staging, ExitStack() as files:
        writers = {split: _ShardWriter(staging, split, num_shards, files) for split in SPLITS}
        for chunk in _records_in_chunks(stream, malformed):
            _write_chunk(chunk, schema, writers, distinct, test_fraction, vocab_size, seed)
        files.close()
        records = writers["train"].rows + writers["test"].rows
        malformed.check(uri, max_malformed_fraction, records)
        if records == 0:
            raise DataPrepError(
                f"no data rows in {uri!r}: the matched files hold no valid, non-blank lines "
                f"({malformed.count} malformed); check the URI and the format {fmt!r}"
            )
        split_rows = {split: writer.rows for split, writer in writers.items()}
        _check_split_sizes(split_rows, num_shards, uri)
        stats = _stats(
            fmt=fmt,
            source=uri,
            schema=schema,
            writers=writers,
            distinct_ids=distinct.counts(),
            malformed=malformed,
            vocab_size=vocab_size,
            seed=seed,
            test_fraction=test_fraction,
            max_malformed_fraction=max_malformed_fraction,
            bayes=None,
            generator=None,
        )
        _write_stats(staging, stats)
    return stats


def _check_settings(test_fraction: float, num_shards: int, vocab_size: int) -> None:
    if not 0.0 < test_fraction < 1.0:
        raise DataPrepError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if num_shards < 1:
        raise DataPrepError(f"num_shards must be >= 1, got {num_shards}")
    if not 1 <= vocab_size <= MAX_VOCAB_SIZE:
        raise DataPrepError(f"vocab_size must be in [1, 2**53], got {vocab_size}")


def _check_split_sizes(rows: Mapping[str, int], num_shards: int, uri: str | None = None) -> None:
    """Every shard must get a row: an empty split (or shard) is an error, never a dataset."""
    where = f" from {uri!r}" if uri else ""
    for split, count in rows.items():
        if count < num_shards:
            raise DataPrepError(
                f"the {split} split{where} has {count} rows but num_shards={num_shards} needs at "
                f"least one row per shard (rows per split: {dict(rows)}); provide more input, "
                "lower num_shards, or change test_fraction"
            )


class _MalformedLog:
    """Counts malformed lines and keeps the first few for error messages and stats."""

    def __init__(self) -> None:
        self.count = 0
        self.examples: list[dict] = []

    def add(self, bad: Malformed) -> None:
        self.count += 1
        if len(self.examples) < MALFORMED_EXAMPLES:
            example = {"file": bad.source, "line": bad.line_number, "reason": bad.reason}
            self.examples.append(example)

    def fraction(self, records: int) -> float:
        total = records + self.count
        return self.count / total if total else 0.0

    def check(self, uri: str, limit: float, records: int) -> None:
        fraction = self.fraction(records)
        if fraction > limit:
            shown = "\n".join(
                f"  {example['file']}:{example['line']}: {example['reason']}"
                for example in self.examples
            )
            raise DataPrepError(
                f"{self.count} of {records + self.count} lines in {uri!r} are malformed "
                f"(fraction {fraction:.4f} > max_malformed_fraction {limit}); fix the input "
                f"or the format setting, or raise max_malformed_fraction. First bad lines:\n"
                f"{shown}"
            )


class _ShardWriter:
    """Round-robin writer over ``num_shards`` files of one split; tracks rows and clicks."""

    def __init__(self, root: Path, split: str, num_shards: int, files: ExitStack) -> None:
        (root / split).mkdir()
        self.relative_paths = [f"{split}/part-{index:05d}.txt" for index in range(num_shards)]
        self._handles = [
            files.enter_context(open(root / path, "w", encoding="ascii", newline="\n"))
            for path in self.relative_paths
        ]
        self.shard_rows = [0] * num_shards
        self.rows = 0
        self.clicks = 0

    def write(self, line: str, label: int) -> None:
        shard = self.rows % len(self._handles)
        self._handles[shard].write(line + "\n")
        self.shard_rows[shard] += 1
        self.rows += 1
        self.clicks += label


class _DistinctIds:
    """Exact distinct-id count per slot, memory bounded by the distinct ids themselves."""

    def __init__(self, slots: Sequence[str]) -> None:
        self._slots = list(slots)
        self._known = [np.zeros(0, np.int64) for _ in slots]
        self._pending: list[list[np.ndarray]] = [[] for _ in slots]
        self._pending_size = [0] * len(slots)

    def add(self, slot_index: int, ids: np.ndarray) -> None:
        self._pending[slot_index].append(ids)
        self._pending_size[slot_index] += len(ids)
        if self._pending_size[slot_index] >= _DISTINCT_MERGE_THRESHOLD:
            self._merge(slot_index)

    def _merge(self, slot_index: int) -> None:
        pending = [self._known[slot_index], *self._pending[slot_index]]
        self._known[slot_index] = np.unique(np.concatenate(pending))
        self._pending[slot_index] = []
        self._pending_size[slot_index] = 0

    def counts(self) -> dict[str, int]:
        for slot_index in range(len(self._slots)):
            self._merge(slot_index)
        return {slot: len(known) for slot, known in zip(self._slots, self._known)}


def _records_in_chunks(
    stream: Iterable[Record | Malformed], malformed: _MalformedLog
) -> Iterator[list[Record]]:
    chunk: list[Record] = []
    for item in stream:
        if isinstance(item, Malformed):
            malformed.add(item)
            continue
        chunk.append(item)
        if len(chunk) == _CHUNK_RECORDS:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def _test_mask(records: Sequence[Record], test_fraction: float, seed: int) -> np.ndarray:
    keys = [
        f"{seed}\x1f{posixpath.basename(record.source)}\x1f{record.line_number}".encode()
        for record in records
    ]
    # Top 53 bits of the hash as a uniform float in [0, 1).
    uniform = (hash64_many(keys) >> np.uint64(11)).astype(np.float64) * 2.0**-53
    return uniform < test_fraction


def _write_chunk(
    records: Sequence[Record],
    schema: Schema,
    writers: Mapping[str, _ShardWriter],
    distinct: _DistinctIds,
    test_fraction: float,
    vocab_size: int,
    seed: int,
) -> None:
    is_test = _test_mask(records, test_fraction, seed)
    columns: list[list[str]] = [["1 1" if record.label else "1 0" for record in records]]
    if schema.dense_dim:
        prefix = f"{schema.dense_dim} "
        columns.append([prefix + " ".join(map(format_float, record.dense)) for record in records])
    for slot_index, slot in enumerate(schema.sparse_slots):
        values_per_record = [record.sparse[slot_index] for record in records]
        counts = np.fromiter(map(len, values_per_record), np.int64, len(records))
        ids = feature_ids(slot, itertools.chain.from_iterable(values_per_record), vocab_size)
        distinct.add(slot_index, ids[np.repeat(~is_test, counts)])
        id_texts = list(map(str, ids.tolist()))
        if (counts == 1).all():
            columns.append(["1 " + text for text in id_texts])
        else:
            ends = np.cumsum(counts).tolist()
            starts = [0, *ends[:-1]]
            columns.append(
                [
                    f"{end - start} " + " ".join(id_texts[start:end])
                    for start, end in zip(starts, ends)
                ]
            )
    for record, test, tokens in zip(records, is_test.tolist(), zip(*columns)):
        writers["test" if test else "train"].write(" ".join(tokens), record.label)


def _stats(
    *,
    fmt: str,
    source: str | None,
    schema: Schema,
    writers: Mapping[str, _ShardWriter],
    distinct_ids: Mapping[str, int],
    malformed: _MalformedLog,
    vocab_size: int,
    seed: int,
    test_fraction: float,
    max_malformed_fraction: float | None,
    bayes: Mapping[str, float] | None,
    generator: Mapping | None,
) -> dict:
    rows = {split: writer.rows for split, writer in writers.items()}
    return {
        "format": fmt,
        "source": source,
        "schema": schema.to_dict(),
        "slot_names": schema.slot_names(),
        "vocab_size": vocab_size,
        "seed": seed,
        "test_fraction": test_fraction,
        "rows": rows,
        "ctr": {split: writer.clicks / writer.rows for split, writer in writers.items()},
        "distinct_ids": dict(distinct_ids),
        "malformed": {
            "count": malformed.count,
            "fraction": malformed.fraction(sum(rows.values())),
            "limit": max_malformed_fraction,
            "examples": malformed.examples,
        },
        "shards": {split: writer.relative_paths for split, writer in writers.items()},
        "shard_rows": {split: writer.shard_rows for split, writer in writers.items()},
        "bayes": dict(bayes) if bayes is not None else None,
        "generator": dict(generator) if generator is not None else None,
    }


def _write_stats(root: Path, stats: Mapping) -> None:
    (root / STATS_FILE).write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")


@contextmanager
def _atomic_directory(out_dir: Path) -> Iterator[Path]:
    """Yield a staging directory beside ``out_dir``; rename it to ``out_dir`` on success.

    An existing ``out_dir`` is replaced only if it is empty or a previous dataset
    (has ``stats.json``), so a wrong path cannot wipe unrelated files.
    """
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / STATS_FILE).exists():
        raise DataPrepError(
            f"{out_dir} exists and is not a dataset (no {STATS_FILE}); refusing to overwrite it. "
            "Choose an empty or new out_dir."
        )
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.staging-", dir=out_dir.parent))
    try:
        yield staging
        os.chmod(staging, 0o755)  # mkdtemp creates 0700; the dataset is read by other users
        if out_dir.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, retired / out_dir.name)
            os.replace(staging, out_dir)
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(staging, out_dir)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
