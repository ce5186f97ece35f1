"""Data prep: plan, convert in parallel, merge into a sharded MultiSlot dataset plus ``stats.json``.

Output layout (written into a temporary sibling directory and renamed into place at the end, so a failure never
leaves a half-written dataset)::

    out_dir/train/part-00000.txt ... part-<num_shards - 1>.txt
    out_dir/valid/part-00000.txt ... part-<num_shards - 1>.txt   (empty when valid_fraction = 0)
    out_dir/test/part-00000.txt  ... part-<num_shards - 1>.txt
    out_dir/stats.json
    out_dir/distinct_ids.npz   (the train split's distinct-id counter of each slot: read_distinct_ids)

Three stages, each a plain function, so that one machine (:func:`prepare_files`) and a Kubeflow fan-out (one pod
per group of units, then one merge: :mod:`components.data_prep.step`) run the same code:

1. :func:`plan_files` lists the input (:mod:`components.data_prep.sources`), cuts it into units and fixes the schema
   (``feasign`` without ``data.slots``: the slots seen in the input, discovered in a parallel pass);
2. :func:`convert` turns units into *parts* (a directory per unit: its rows per split and shard, its counts of
   clicks and of missing values, its distinct-id counters), a pool of processes over the units;
3. :func:`merge` checks the parts add up to the plan (and, day by day, the day's drift: :mod:`drift`),
   concatenates them per shard in unit order and writes ``stats.json``.

Where a row goes, decided row by row, never by which process converts it, so the dataset is byte for byte the same
whatever the number of processes or pods. ``split="random"``: a row is a test row when a hash of ``(seed, file
basename, byte offset of its line)`` falls below ``test_fraction``, a validation row when it falls in the
``valid_fraction`` above that. ``split="ordered"`` (logs in time order: the model is scored on the rows that came
after those it learned from): the files one after another are one stream of bytes, and a row is a test row when its
line starts in the last ``test_fraction`` of them, a validation row in the ``valid_fraction`` before that (the plan
knows where each file starts; a compressed file counts its decompressed bytes, which the plan reads once to measure).
Within a unit the rows of a split are dealt round-robin over the shards, starting at shard ``unit index %
num_shards``. Every sparse id is ``hashing.feature_id(slot, raw_value, vocab_size)``, so all ids lie in ``[0,
vocab_size)``.

:func:`prepare_synthetic` writes the :mod:`synthetic` generator's rows the same way (one unit; the last
``round(rows * test_fraction)`` rows are the test split, the ``round(rows * valid_fraction)`` before them the validation
split: an ordered split of i.i.d. rows; ``stats["bayes"]`` holds the Bayes-optimal AUC/logloss on it).
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from components.config import ints_from_struct
from components.data_prep.distinct import RELATIVE_ERROR, DistinctCounter, load_counters, save_counters
from components.data_prep.formats import BlockParser, discover_feasign_slots, schema_for
from components.data_prep.hashing import HASH_FUNCTION, MAX_VOCAB_SIZE, hash64, mix64
from components.data_prep.multislot import Schema, text_bytes
from components.data_prep.sources import (UNIT_BYTES, DataPrepError, InputFile, Unit, list_inputs, plan_units,
                                          read_blocks)
from components.data_prep.synthetic import (SyntheticRows, SyntheticSpec, bayes_metrics, category_id_tables,
                                            format_lines, generate)

__all__ = ["DataPrepError", "prepare_files", "prepare_synthetic", "read_distinct_ids"]

SPLITS = ("train", "valid", "test")  # a row's split code is its index here
SPLIT_RULES = ("random", "ordered")  # data.split
STATS_FILE = "stats.json"
DISTINCT_IDS_FILE = "distinct_ids.npz"  # in a dataset: the distinct-id counter of each slot (train rows)
RESULT_FILE = "result.json"  # in a part: what its unit held
DISTINCT_FILE = "distinct.npz"  # in a part: the distinct-id counter of each slot (train rows)
# Sees a dataset's stats and its train split's distinct-id counters before anything is written; returns
# stats["drift"], or raises DataPrepError to refuse the dataset (components.data_prep.step.drift_check).
DriftCheck = Callable[[dict, dict[str, DistinctCounter]], dict]
MALFORMED_EXAMPLES = 10
SYNTHETIC = "synthetic"
# Rows of synthetic data generated and written at a time (the hidden model is drawn once for all of them).
_SYNTHETIC_BLOCK = 1 << 16


def default_processes() -> int:
    """The cores this process may run on (a pod's CPU limit shows as its affinity where the runtime sets it)."""
    return len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class DataPlan:
    """What data prep will do, decided before any row is converted. JSON-safe (and Struct-safe: no nulls, ints
    that may come back as floats): it travels to every pod as a pipeline parameter."""

    fmt: str  # raw | slot | feasign | synthetic
    schema: dict
    units: list[dict]  # sources.Unit, as dicts (synthetic: one unit without a file); ordered split: + "position"
    vocab_size: int
    seed: int
    test_fraction: float
    num_shards: int
    fingerprint: str  # of the input files and these settings: it changes when the dataset would
    source: Optional[str] = None  # the input URI (None for synthetic data)
    max_malformed_fraction: Optional[float] = None
    synthetic: Optional[dict] = None  # {"rows", "spec"}
    valid_fraction: float = 0.0
    split: str = "random"  # SPLIT_RULES
    input_bytes: Optional[int] = None  # ordered split: the bytes of every file together (compressed: decompressed)
    day: Optional[str] = None  # day partitions: the day the input is (components.days)

    def to_dict(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, raw: Mapping) -> "DataPlan":
        raw = ints_from_struct(dict(raw))
        return cls(**{k: raw[k] for k in cls.__dataclass_fields__ if k in raw})

    def unit(self, index: int) -> Unit:
        """The unit numbered ``index`` (a convert task's plan holds only its own units)."""
        return Unit.from_dict(self._unit_dict(index))

    def input_position(self, index: int) -> int:
        """Ordered split: where unit ``index``'s file starts in the files one after another."""
        return int(self._unit_dict(index)["position"])

    def _unit_dict(self, index: int) -> dict:
        return next(unit for unit in self.units if int(unit["index"]) == index)


def _fingerprint(settings: Mapping, inputs: Iterable[str]) -> str:
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode())
    for entry in inputs:
        digest.update(entry.encode() + b"\0")
    return digest.hexdigest()[:32]


def plan_files(*, uri: str, fmt: str, test_fraction: float, num_shards: int, vocab_size: int, seed: int,
               max_malformed_fraction: float, valid_fraction: float = 0.0, slots: Optional[Sequence[str]] = None,
               split: str = "random", day: Optional[str] = None, storage_options: Optional[Mapping] = None,
               unit_bytes: int = UNIT_BYTES, processes: Optional[int] = None) -> DataPlan:
    """List the input, cut it into units and fix the schema; raises DataPrepError for input that cannot work.

    ``day``: the day partition ``uri`` is (recorded in ``stats.json``)."""
    _check_settings(test_fraction, valid_fraction, num_shards, vocab_size)
    if not 0.0 <= max_malformed_fraction <= 1.0:
        raise DataPrepError(f"max_malformed_fraction must be in [0, 1], got {max_malformed_fraction}")
    if split not in SPLIT_RULES:
        raise DataPrepError(f"unknown split {split!r}: use one of {list(SPLIT_RULES)}")
    schema_for(fmt, slots, ["2"])  # an unknown format or slot fails before the input is listed
    files = list_inputs(uri, storage_options)
    units = plan_units(files, unit_bytes)
    discovered = None
    if fmt == "feasign" and slots is None:
        found = _map(_discover_unit, [(u.to_dict(), dict(storage_options or {})) for u in units], processes)
        discovered = sorted(set().union(*found), key=int)
        if not discovered:
            raise DataPrepError(f"{uri!r} holds no well-formed feasign line with a sparse slot: expected "
                                "'<feasign>:<slot>' tokens with the label as '<0|1>:1'")
    schema = schema_for(fmt, slots, discovered)
    unit_dicts, input_bytes = [u.to_dict() for u in units], None
    if split == "ordered":
        positions, input_bytes = _input_positions(files, units, storage_options, processes)
        unit_dicts = [{**unit, "position": position} for unit, position in zip(unit_dicts, positions)]
    settings = dict(fmt=fmt, schema=schema.to_dict(), vocab_size=vocab_size, seed=seed, test_fraction=test_fraction,
                    valid_fraction=valid_fraction, num_shards=num_shards,
                    max_malformed_fraction=max_malformed_fraction, split=split, day=day, hash=HASH_FUNCTION)
    return DataPlan(source=uri, units=unit_dicts, input_bytes=input_bytes,
                    fingerprint=_fingerprint(settings, (f"{f.url} {f.fingerprint}" for f in files)), **{
                        k: v for k, v in settings.items() if k != "hash"})


def _input_positions(files: list[InputFile], units: list[Unit], storage_options: Optional[Mapping],
                     processes: Optional[int]) -> tuple[list[int], int]:
    """``(where each unit's file starts, the bytes of all files)`` with the files one after another; a compressed
    file's rows have offsets in its decompressed stream, so it counts as the bytes it decompresses to (measured by
    reading it, in parallel: its header does not know)."""
    sizes = {file.url: file.size for file in files}
    compressed = [unit for unit in units if unit.compressed]
    measured = _map(_decompressed_bytes, [(u.to_dict(), dict(storage_options or {})) for u in compressed], processes)
    sizes.update({unit.url: size for unit, size in zip(compressed, measured)})
    starts, total = {}, 0
    for file in files:
        starts[file.url], total = total, total + sizes[file.url]
    return [starts[unit.url] for unit in units], total


def _decompressed_bytes(unit: dict, storage_options: dict) -> int:
    return sum(len(block) for _, block in read_blocks(Unit.from_dict(unit), storage_options))


def plan_synthetic(*, rows: int, test_fraction: float, num_shards: int, vocab_size: int, seed: int,
                   valid_fraction: float = 0.0, spec: Optional[SyntheticSpec] = None) -> DataPlan:
    _check_settings(test_fraction, valid_fraction, num_shards, vocab_size)
    spec = spec or SyntheticSpec()
    sizes = synthetic_split_rows(rows, test_fraction, valid_fraction)
    _check_split_sizes({split: n for split, n in zip(SPLITS, sizes) if split != "valid" or valid_fraction},
                       num_shards)
    settings = dict(fmt=SYNTHETIC, schema=spec.schema.to_dict(), vocab_size=vocab_size, seed=seed,
                    test_fraction=test_fraction, valid_fraction=valid_fraction, num_shards=num_shards,
                    max_malformed_fraction=None, synthetic={"rows": rows, "spec": spec.to_dict()}, split="ordered")
    unit = Unit(0, SYNTHETIC, 0, rows, compressed=False)
    return DataPlan(source=None, units=[unit.to_dict()], fingerprint=_fingerprint({**settings, "hash": HASH_FUNCTION},
                                                                                  ()), **settings)


def synthetic_split_rows(rows: int, test_fraction: float, valid_fraction: float) -> tuple[int, int, int]:
    """Rows of (train, valid, test): the test rows last, the validation rows before them."""
    test, valid = round(rows * test_fraction), round(rows * valid_fraction)
    return rows - test - valid, valid, test


def _check_settings(test_fraction: float, valid_fraction: float, num_shards: int, vocab_size: int) -> None:
    if not 0.0 < test_fraction < 1.0:
        raise DataPrepError(f"test_fraction must be in (0, 1), got {test_fraction}")
    if not 0.0 <= valid_fraction < 1.0 - test_fraction:
        raise DataPrepError(f"valid_fraction must be in [0, 1 - test_fraction), got {valid_fraction}")
    if num_shards < 1:
        raise DataPrepError(f"num_shards must be >= 1, got {num_shards}")
    if not 1 <= vocab_size <= MAX_VOCAB_SIZE:
        raise DataPrepError(f"vocab_size must be in [1, 2**53], got {vocab_size}")


def _check_split_sizes(rows: Mapping[str, int], num_shards: int, uri: Optional[str] = None) -> None:
    """Every shard must get a row: an empty split (or shard) is an error, never a dataset."""
    where = f" from {uri!r}" if uri else ""
    for split, count in rows.items():
        if count < num_shards:
            raise DataPrepError(
                f"the {split} split{where} has {count} rows but num_shards={num_shards} needs at "
                f"least one row per shard (rows per split: {dict(rows)}); provide more input, "
                "lower num_shards, or change test_fraction")


# -- stage 2: convert -----------------------------------------------------------------------------------------------
def _map(fn: Callable, items: Sequence, processes: Optional[int]) -> list:
    """``fn`` over ``items`` in a pool of ``processes`` (default: every core); in this process when one will do."""
    processes = min(processes or default_processes(), len(items))
    if processes <= 1:
        return [fn(*item) for item in items]
    # fork costs nothing but is safe only while this process has one thread (a lock another thread held at the
    # fork stays held in the child); else spawn, which starts each worker afresh (a second of imports).
    single_threaded = len(os.listdir("/proc/self/task")) == 1 if os.path.isdir("/proc/self/task") else False
    with ProcessPoolExecutor(processes, mp_context=get_context("fork" if single_threaded else "spawn")) as pool:
        return list(pool.map(fn, *zip(*items)))


def _discover_unit(unit: dict, storage_options: dict) -> set[str]:
    slots: set[str] = set()
    for _, block in read_blocks(Unit.from_dict(unit), storage_options):
        slots |= discover_feasign_slots(block)
    return slots


def convert(plan: DataPlan, unit_indices: Sequence[int], parts_dir: str | os.PathLike,
            processes: Optional[int] = None, storage_options: Optional[Mapping] = None) -> None:
    """Convert the plan's units ``unit_indices`` into parts under ``parts_dir`` (one directory per unit)."""
    Path(parts_dir).mkdir(parents=True, exist_ok=True)
    work = _convert_synthetic if plan.fmt == SYNTHETIC else _convert_unit
    _map(work, [(plan.to_dict(), i, str(parts_dir), dict(storage_options or {})) for i in unit_indices], processes)


class _PartWriter:
    """A unit's rows, dealt to shards: one file per split (``<split>.txt``), its shards one after another."""

    def __init__(self, root: Path, unit: int, num_shards: int):
        self.root, self.unit, self.num_shards = root, unit, num_shards
        root.mkdir(parents=True)
        # While the unit is converted each shard has a file of its own; close() joins them.
        self.files = {split: [open(root / f"{split}-{s:05d}.tmp", "wb") for s in range(num_shards)]
                      for split in SPLITS}
        self.rows = {split: 0 for split in SPLITS}
        self.clicks = {split: 0 for split in SPLITS}
        self.shard_rows = {split: [0] * num_shards for split in SPLITS}
        self.shard_bytes = {split: [0] * num_shards for split in SPLITS}

    def write(self, text: pa.Array, labels: np.ndarray, splits: np.ndarray) -> None:
        """``splits``: each row's split code (its index in :data:`SPLITS`)."""
        for code, split in enumerate(SPLITS):
            rows = np.flatnonzero(splits == code)
            shard = (self.rows[split] + np.arange(len(rows)) + self.unit) % self.num_shards
            order = np.argsort(shard, kind="stable")
            taken = text.take(pa.array(rows[order]))
            ends = np.cumsum(np.bincount(shard, minlength=self.num_shards))
            for s, (start, end) in enumerate(zip(np.concatenate([[0], ends[:-1]]), ends)):
                if end > start:
                    data = text_bytes(taken, int(start), int(end))
                    self.files[split][s].write(data)
                    self.shard_rows[split][s] += int(end - start)
                    self.shard_bytes[split][s] += len(data)
            self.rows[split] += len(rows)
            self.clicks[split] += int(labels[rows].sum())

    def close(self) -> None:
        for split, handles in self.files.items():
            for handle in handles:
                handle.close()
            with open(self.root / f"{split}.txt", "wb", buffering=0) as joined:
                for s in range(self.num_shards):
                    shard = self.root / f"{split}-{s:05d}.tmp"
                    with open(shard, "rb", buffering=0) as part:
                        _copy(part, joined, self.shard_bytes[split][s])
                    shard.unlink()


def _row_splits(plan: DataPlan, index: int, offsets: np.ndarray) -> np.ndarray:
    """Each row's split code (its line's byte offset in the file of unit ``index``). Random: test when a hash of
    (seed, file basename, offset) is below test_fraction, validation when it is below test_fraction +
    valid_fraction, else train. Ordered: test when the line starts in the last test_fraction of the input's bytes,
    validation in the valid_fraction before that, else train."""
    if plan.split == "ordered":
        where = plan.input_position(index) + offsets
        valid_from = (1.0 - plan.test_fraction - plan.valid_fraction) * plan.input_bytes
        return (where >= valid_from).astype(np.uint8) + (where >= (1.0 - plan.test_fraction) * plan.input_bytes)
    unit = plan.unit(index)
    file_key = np.uint64(hash64(f"{plan.seed}\x1f{posixpath.basename(unit.url)}".encode()))
    keys = mix64(mix64(offsets.astype(np.uint64)) ^ file_key)
    uniform = (keys >> np.uint64(11)).astype(np.float64) * 2.0 ** -53  # the top 53 bits
    codes = np.zeros(len(offsets), np.uint8)
    codes[uniform < plan.test_fraction + plan.valid_fraction] = SPLITS.index("valid")
    codes[uniform < plan.test_fraction] = SPLITS.index("test")
    return codes


def _convert_unit(plan_dict: dict, index: int, parts_dir: str, storage_options: dict) -> None:
    plan = DataPlan.from_dict(plan_dict)
    unit = plan.unit(index)
    schema = Schema.from_dict(plan.schema)
    parser = BlockParser(plan.fmt, schema, plan.vocab_size)
    root = Path(parts_dir) / f"unit-{index:05d}"
    writer = _PartWriter(root, index, plan.num_shards)
    counters = [DistinctCounter() for _ in schema.sparse_slots]
    missing = np.zeros(len(schema.sparse_slots), np.int64)
    lines, malformed, examples = 0, 0, []
    try:
        for offset, block in read_blocks(unit, storage_options):
            try:
                parsed = parser.parse(block)
            except pa.ArrowInvalid as err:  # what not even the malformed-line handling can read
                raise DataPrepError(f"{unit.url} (from byte {offset}) cannot be read as data.format={plan.fmt}: "
                                    f"{str(err).splitlines()[0][:200]}; check data.format and data.uri") from None
            splits = _row_splits(plan, index, offset + parsed.line_starts[parsed.row_lines])
            writer.write(parsed.text, parsed.labels, splits)
            for counter, ids in zip(counters, parsed.slot_ids):
                counter.add(ids.of_rows(splits == 0))  # the train split's ids: what the servers will hold
            missing += parsed.missing
            malformed += len(parsed.malformed)
            examples += [{"line": lines + line + 1, "reason": reason}
                         for line, reason in parsed.malformed[:MALFORMED_EXAMPLES - len(examples)]]
            lines += len(parsed.line_starts)
    finally:
        writer.close()
    _write_result(root, writer, dict(zip(schema.sparse_slots, counters)), missing.tolist(), lines=lines,
                  malformed=malformed, examples=examples)


def _write_result(root: Path, writer: _PartWriter, counters: dict[str, DistinctCounter], missing: list[int],
                  **facts: Any) -> None:
    """``missing``: per sparse slot, the rows (of every split) without a value for it."""
    save_counters(root / DISTINCT_FILE, counters)
    result = {"rows": writer.rows, "clicks": writer.clicks, "shard_rows": writer.shard_rows,
              "shard_bytes": writer.shard_bytes, "missing": missing, **facts}
    (root / RESULT_FILE).write_text(json.dumps(result))


def _convert_synthetic(plan_dict: dict, index: int, parts_dir: str, storage_options: dict) -> None:
    plan = DataPlan.from_dict(plan_dict)
    spec = SyntheticSpec(**{**plan.synthetic["spec"], "cardinalities": tuple(plan.synthetic["spec"]["cardinalities"])})
    rows = plan.synthetic["rows"]
    train_rows, valid_rows, _ = synthetic_split_rows(rows, plan.test_fraction, plan.valid_fraction)
    data = generate(rows, plan.seed, spec)
    id_tables = category_id_tables(spec, plan.vocab_size)
    root = Path(parts_dir) / f"unit-{index:05d}"
    writer = _PartWriter(root, index, plan.num_shards)
    try:
        for start in range(0, rows, _SYNTHETIC_BLOCK):
            block = SyntheticRows(*(array[start:start + _SYNTHETIC_BLOCK] for array in data))
            position = np.arange(start, start + len(block.labels))
            splits = (position >= train_rows).astype(np.uint8) + (position >= train_rows + valid_rows)
            writer.write(format_lines(block, spec, id_tables), block.labels, splits)
    finally:
        writer.close()
    counters = {slot: DistinctCounter() for slot in spec.schema.sparse_slots}
    for field, (table, counter) in enumerate(zip(id_tables, counters.values())):
        counter.add(np.unique(table[data.categories[:train_rows, field]]).astype(np.uint64))
    _write_result(root, writer, counters, [0] * len(counters), lines=rows, malformed=0, examples=[],
                  bayes=bayes_metrics(data.labels[train_rows + valid_rows:], data.probabilities[train_rows + valid_rows:]))


# -- stage 3: merge -------------------------------------------------------------------------------------------------
def find_parts(parts_dirs: Iterable[str | os.PathLike]) -> dict[int, Path]:
    """Unit index -> its part directory, across the directories the convert stages wrote."""
    found: dict[int, Path] = {}
    for directory in parts_dirs:
        for result in sorted(Path(directory).glob(f"unit-*/{RESULT_FILE}")):
            index = int(result.parent.name.split("-")[1])
            if index in found:
                raise DataPrepError(f"unit {index} was converted twice: {found[index]} and {result.parent}")
            found[index] = result.parent
    return found


def merge(plan: DataPlan, parts_dirs: Iterable[str | os.PathLike], out_dir: str | os.PathLike,
          check_drift: Optional[DriftCheck] = None) -> dict:
    """Check the parts, concatenate them per shard in unit order into ``out_dir`` and write ``stats.json`` and
    ``distinct_ids.npz``; ``check_drift`` (day partitions) fills ``stats["drift"]`` or refuses the dataset before
    any of it is written."""
    parts = find_parts(parts_dirs)
    missing = sorted(set(range(len(plan.units))) - set(parts))
    if missing:
        raise DataPrepError(f"units {missing[:10]} of {len(plan.units)} were not converted: a convert step failed "
                            "or did not run")
    results = [json.loads((parts[i] / RESULT_FILE).read_text()) for i in range(len(plan.units))]
    stats = _merged_stats(plan, results)
    counters = {slot: DistinctCounter() for slot in plan.schema["sparse_slots"]}
    for i in range(len(plan.units)):
        for slot, counter in load_counters(parts[i] / DISTINCT_FILE).items():
            counters[slot].merge(counter)
    stats.update(distinct_ids={slot: c.count() for slot, c in counters.items()},
                 distinct_ids_exact={slot: c.is_exact for slot, c in counters.items()},
                 distinct_ids_relative_error=RELATIVE_ERROR)
    stats["drift"] = check_drift(stats, counters) if check_drift else None
    with _atomic_directory(Path(out_dir)) as staging:
        gathers = []  # (output shard, [(unit's split file, offset of the shard in it, bytes)])
        for split in SPLITS:
            (staging / split).mkdir()
            for s, rel in enumerate(stats["shards"][split]):
                gathers.append((staging / rel, [(parts[i] / f"{split}.txt", sum(r["shard_bytes"][split][:s]),
                                                 r["shard_bytes"][split][s]) for i, r in enumerate(results)]))
        # One thread per output file: the copies run in the kernel, which lets go of the GIL, so they use every core.
        with ThreadPoolExecutor(default_processes()) as pool:
            list(pool.map(lambda gather: _gather(*gather), gathers))
        save_counters(staging / DISTINCT_IDS_FILE, counters)
        (staging / STATS_FILE).write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return stats


def _merged_stats(plan: DataPlan, results: list[dict]) -> dict:
    """The dataset's stats from its units' results (all but the distinct ids and the drift); raises DataPrepError
    for parts that cannot make a dataset."""
    schema = Schema.from_dict(plan.schema)
    rows = {split: sum(r["rows"][split] for r in results) for split in SPLITS}
    examples = _malformed_examples(plan, results)
    malformed = {"count": sum(r["malformed"] for r in results), "limit": plan.max_malformed_fraction,
                 "examples": examples}
    records = sum(rows.values())
    malformed["fraction"] = malformed["count"] / (records + malformed["count"]) if records + malformed["count"] else 0.0
    if plan.max_malformed_fraction is not None and malformed["fraction"] > plan.max_malformed_fraction:
        shown = "\n".join(f"  {e['file']}:{e['line']}: {e['reason']}" for e in examples)
        raise DataPrepError(
            f"{malformed['count']} of {records + malformed['count']} lines in {plan.source!r} are malformed "
            f"(fraction {malformed['fraction']:.4f} > max_malformed_fraction {plan.max_malformed_fraction}); fix "
            f"the input or the format setting, or raise max_malformed_fraction. First bad lines:\n{shown}")
    if records == 0:
        raise DataPrepError(f"no data rows in {plan.source!r}: the matched files hold no valid, non-blank lines "
                            f"({malformed['count']} malformed); check the URI and the format {plan.fmt!r}")
    shard_rows = {split: [sum(r["shard_rows"][split][s] for r in results) for s in range(plan.num_shards)]
                  for split in SPLITS}
    needed = [split for split in SPLITS if split != "valid" or plan.valid_fraction]
    for split in needed:  # every shard of every split gets a row (the pods each read one)
        if min(shard_rows[split]) == 0:
            _check_split_sizes({s: rows[s] for s in needed}, plan.num_shards, plan.source)
            raise DataPrepError(f"a shard of the {split} split from {plan.source!r} got no row (rows per shard: "
                                f"{shard_rows[split]}); provide more input or lower num_shards")
    return {
        "format": plan.fmt,
        "source": plan.source,
        "day": plan.day,
        "schema": schema.to_dict(),
        "slot_names": schema.slot_names(),
        "vocab_size": plan.vocab_size,
        "hash_function": HASH_FUNCTION,
        "seed": plan.seed,
        "split": plan.split,
        "test_fraction": plan.test_fraction,
        "valid_fraction": plan.valid_fraction,
        "rows": rows,
        "ctr": {split: sum(r["clicks"][split] for r in results) / rows[split] if rows[split] else None
                for split in SPLITS},
        # Of every row (all splits), those without a value for the slot.
        "missing": {slot: sum(r["missing"][s] for r in results) / records
                    for s, slot in enumerate(schema.sparse_slots)},
        "malformed": malformed,
        "shards": {split: [f"{split}/part-{s:05d}.txt" for s in range(plan.num_shards)] for split in SPLITS},
        "shard_rows": shard_rows,
        "bayes": results[0].get("bayes"),
        "generator": (plan.synthetic or {}).get("spec"),
        "prep": {"units": len(plan.units), "fingerprint": plan.fingerprint},
    }


def read_distinct_ids(dataset_dir: str | os.PathLike) -> dict[str, DistinctCounter]:
    """The train split's distinct-id counter of each slot of a dataset :func:`merge` wrote (what the servers will
    hold: day by day, the ids the checkpoint store has seen grow by them)."""
    return load_counters(Path(dataset_dir) / DISTINCT_IDS_FILE)


def _gather(target: Path, pieces: list[tuple[Path, int, int]]) -> None:
    """``target`` written as the ``(file, offset, size)`` pieces one after another."""
    with open(target, "wb", buffering=0) as out:
        for path, offset, size in pieces:
            with open(path, "rb", buffering=0) as source:
                _copy(source, out, size, offset)


def _copy(source, target, size: int, offset: Optional[int] = None) -> None:
    """``size`` bytes of ``source`` (from ``offset``, else its position) to ``target``'s position (unbuffered
    files), in the kernel."""
    while size:
        copied = os.copy_file_range(source.fileno(), target.fileno(), size, offset)
        if not copied:
            raise DataPrepError(f"{source.name} ends {size} bytes early: the part is truncated")
        size -= copied
        offset = None if offset is None else offset + copied


def _malformed_examples(plan: DataPlan, results: list[dict]) -> list[dict]:
    """The first malformed lines, by file and line number (a unit counts its lines from its own start)."""
    examples, lines_before = [], {}
    for i, result in enumerate(results):
        url = plan.units[i]["url"]  # the merge's plan holds every unit, in order
        examples += [{"file": url, "line": lines_before.get(url, 0) + e["line"], "reason": e["reason"]}
                     for e in result["examples"]]
        lines_before[url] = lines_before.get(url, 0) + result["lines"]
    return examples[:MALFORMED_EXAMPLES]


@contextmanager
def _atomic_directory(out_dir: Path) -> Iterator[Path]:
    """Yield a staging directory beside ``out_dir``; rename it to ``out_dir`` on success.

    An existing ``out_dir`` is replaced only if it is empty or a previous dataset
    (has ``stats.json``), so a wrong path cannot wipe unrelated files.
    """
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / STATS_FILE).exists():
        raise DataPrepError(
            f"{out_dir} exists and is not a dataset (no {STATS_FILE}); refusing to overwrite it. "
            "Choose an empty or new out_dir.")
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


# -- one machine: all three stages ----------------------------------------------------------------------------------
def prepare(plan: DataPlan, out_dir: str | os.PathLike, processes: Optional[int] = None,
            storage_options: Optional[Mapping] = None, check_drift: Optional[DriftCheck] = None) -> dict:
    """Convert every unit of ``plan`` (a pool of ``processes``) and merge them into ``out_dir``."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.parts-", dir=out.parent) as parts:
        convert(plan, range(len(plan.units)), parts, processes, storage_options)
        return merge(plan, [parts], out, check_drift)


def prepare_files(out_dir: str | os.PathLike, *, uri: str, fmt: str, test_fraction: float, num_shards: int,
                  vocab_size: int, seed: int, max_malformed_fraction: float, valid_fraction: float = 0.0,
                  slots: Optional[Sequence[str]] = None, split: str = "random",
                  storage_options: Optional[Mapping] = None, processes: Optional[int] = None,
                  unit_bytes: int = UNIT_BYTES) -> dict:
    """Convert the files at ``uri`` (format ``fmt``) into ``out_dir``; returns the stats dict.

    ``slots`` selects/orders sparse slots (see ``formats.schema_for``); ``storage_options`` go to fsspec (e.g.
    ``{"client_kwargs": {"endpoint_url": ...}}``). Malformed lines are skipped and counted; more than
    ``max_malformed_fraction`` of all non-blank lines is an error.
    """
    plan = plan_files(uri=uri, fmt=fmt, test_fraction=test_fraction, num_shards=num_shards, vocab_size=vocab_size,
                      seed=seed, max_malformed_fraction=max_malformed_fraction, valid_fraction=valid_fraction,
                      slots=slots, split=split, storage_options=storage_options, unit_bytes=unit_bytes,
                      processes=processes)
    return prepare(plan, out_dir, processes, storage_options)


def prepare_synthetic(out_dir: str | os.PathLike, *, rows: int, test_fraction: float, num_shards: int,
                      vocab_size: int, seed: int, valid_fraction: float = 0.0,
                      spec: Optional[SyntheticSpec] = None) -> dict:
    """Generate ``rows`` synthetic rows into ``out_dir``; returns the stats dict."""
    plan = plan_synthetic(rows=rows, test_fraction=test_fraction, num_shards=num_shards, vocab_size=vocab_size,
                          seed=seed, valid_fraction=valid_fraction, spec=spec)
    return prepare(plan, out_dir, processes=1)
