"""Data prep: plan, count, convert in parallel, merge into a sharded MultiSlot dataset plus ``stats.json``.

Output layout (written into a temporary sibling directory and renamed into place at the end, so a failure never
leaves a half-written dataset)::

    out_dir/train/part-00000.txt ... part-<num_shards - 1>.txt
    out_dir/valid/part-00000.txt ... part-<num_shards - 1>.txt   (empty when valid_fraction = 0)
    out_dir/test/part-00000.txt  ... part-<num_shards - 1>.txt
    out_dir/columns/<split>/part-<n>/   (each shard's columnar copy: what Python readers load instead of the text,
                                         :func:`~components.data_prep.multislot.read_shards`)
    out_dir/stats.json
    out_dir/distinct_ids.npz   (the train split's distinct-id counter of each slot: read_distinct_ids)
    out_dir/transform/transform.json   (how a raw record becomes a row: components.data_prep.transform)
    out_dir/transform/id_counts.npy    (with data.min_id_count > 1: the train split's id-count sketch)

The stages, each a plain function, so that one machine (:func:`prepare_files`) and a Kubeflow fan-out (one pod
per group of units, then one merge: :mod:`components.data_prep.step`) run the same code:

1. :func:`~components.data_prep.plan.plan_files` lists the input, cuts it into units and fixes the schema
   (:mod:`components.data_prep.plan`);
2. when the plan counts ids (``min_id_count`` > 1, or the servers' admission needs the counts), the counting pass
   counts every unit's train ids into one sketch (:mod:`components.data_prep.counting`), in the convert pool;
3. :func:`convert` turns units into *parts* (a directory per unit: its rows per split and shard, its counts of
   clicks and of missing values, its distinct-id counters), a pool of processes over the units;
4. :func:`merge` checks the parts add up to the plan (and, day by day, the day's drift: :mod:`drift`),
   concatenates them per shard in unit order and writes ``stats.json``.

Where a row goes, decided row by row, never by which process converts it, so the dataset is byte for byte the same
whatever the number of processes or pods. ``split="random"``: a row is a test row when a hash of ``(seed, file
basename, byte offset of its line)`` falls below ``test_fraction``, a validation row when it falls in the
``valid_fraction`` above that. ``split="ordered"`` (logs in time order: the model is scored on the rows that came
after those it learned from): the files one after another are one stream of bytes, and a row is a test row when its
line starts in the last ``test_fraction`` of them, a validation row in the ``valid_fraction`` before that (the plan
knows where each file starts; a compressed file counts its decompressed bytes, which the plan reads once to measure).
Negative downsampling then leaves out train negatives by another hash of where they are
(:mod:`components.data_prep.plan`). Within a unit the rows of a split are dealt round-robin over the shards,
starting at shard ``unit index % num_shards``. Every sparse id is ``hashing.feature_id(slot, raw_value,
vocab_size)``, or its slot's OOV id under the count filter (:mod:`components.data_prep.id_counts`), so all ids lie in
``[0, vocab_size)``.

:func:`prepare_synthetic` writes the :mod:`synthetic` generator's rows the same way (one unit; the last
``round(rows * test_fraction)`` rows are the test split, the ``round(rows * valid_fraction)`` before them the validation
split: an ordered split of i.i.d. rows; ``stats["bayes"]`` holds the Bayes-optimal AUC/logloss on it).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from components.data_prep.counting import IdCountReport, count_ids, count_synthetic, merged_report
from components.data_prep.distinct import RELATIVE_ERROR, DistinctCounter, load_counters, save_counters
from components.data_prep.formats import BlockParser
from components.data_prep.hashing import HASH_FUNCTION
from components.data_prep.id_counts import CountSketch, IdCounts
from components.data_prep.columns import ColumnPieces, gather_columns, piece_listings
from components.data_prep.multislot import Schema, text_bytes
from components.data_prep.parsed import SlotIds
from components.data_prep.plan import (DROPPED, SPLITS, SYNTHETIC, TRAIN, DataPlan, check_split_sizes, plan_files,
                                       plan_in_full, plan_synthetic, synthetic_row_codes, synthetic_split_rows,
                                       unit_rows)
from components.data_prep.pool import default_processes, parallel_map
from components.data_prep.sources import UNIT_BYTES, DataPrepError
from components.data_prep.synthetic import (SyntheticRows, SyntheticSpec, bayes_metrics, category_id_tables,
                                            format_lines, generate)
from components.data_prep.transform import TRANSFORM_DIR, Transform

__all__ = ["SYNTHETIC", "DataPlan", "DataPrepError", "convert", "merge", "plan_files", "prepare", "prepare_files",
           "prepare_synthetic", "read_distinct_ids", "synthetic_split_rows"]

STATS_FILE = "stats.json"
DISTINCT_IDS_FILE = "distinct_ids.npz"  # in a dataset: the distinct-id counter of each slot (train rows)
RESULT_FILE = "result.json"  # in a part: what its unit held
DISTINCT_FILE = "distinct.npz"  # in a part: the distinct-id counter of each slot (train rows)
SKETCH_FILE = "id_counts.npy"  # beside the parts while they are converted: the counting pass's sketch
# Sees a dataset's stats and its train split's distinct-id counters before anything is written; returns
# stats["drift"], or raises DataPrepError to refuse the dataset (components.data_prep.step.drift_check).
DriftCheck = Callable[[dict, dict[str, DistinctCounter]], dict]
MALFORMED_EXAMPLES = 10
# Rows of synthetic data generated and written at a time (the hidden model is drawn once for all of them).
_SYNTHETIC_BLOCK = 1 << 16


# -- stages 2 and 3: count, convert ---------------------------------------------------------------------------------
def convert(plan: DataPlan, unit_indices: Sequence[int], parts_dir: str | os.PathLike,
            processes: Optional[int] = None, storage_options: Optional[Mapping] = None,
            whole_plan: Optional[DataPlan] = None) -> None:
    """Convert the plan's units ``unit_indices`` into parts under ``parts_dir`` (one directory per unit).

    A plan that counts ids counts every unit of its input first (the same sketch in every convert task, so each
    maps ids alike): those of ``whole_plan`` where the caller has the plan with every unit, else the input is
    planned again (:func:`~components.data_prep.plan.plan_in_full`)."""
    Path(parts_dir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".id-counts-", dir=parts_dir) as scratch:
        sketch_path = None
        if plan.count_ids and plan.fmt != SYNTHETIC:  # synthetic rows are counted where they are generated
            # Under the count filter the sketch is part of the transform: kept beside the parts for the merge, by
            # the task that converts unit 0 only (every task counts the same; one copy travels to the merge).
            keep = plan.min_id_count > 1 and 0 in unit_indices
            sketch_path = str(Path(parts_dir if keep else scratch) / SKETCH_FILE)
            count_ids(whole_plan or plan_in_full(plan, storage_options, processes), sketch_path, processes,
                      storage_options)
        work = _convert_synthetic if plan.fmt == SYNTHETIC else _convert_unit
        parallel_map(work, [(plan.to_dict(), i, str(parts_dir), dict(storage_options or {}), sketch_path)
                            for i in unit_indices], processes)


class _PartWriter:
    """A unit's rows, dealt to shards: one file per split (``<split>.txt``), its shards one after another, and their
    columnar copy (:class:`~components.data_prep.columns.ColumnPieces`)."""

    def __init__(self, root: Path, unit: int, num_shards: int, schema: Schema):
        self.root, self.unit, self.num_shards = root, unit, num_shards
        root.mkdir(parents=True)
        self.columns = ColumnPieces(root, num_shards, schema)
        # While the unit is converted each shard has a file of its own; close() joins them.
        self.files = {split: [open(root / f"{split}-{s:05d}.tmp", "wb") for s in range(num_shards)]
                      for split in SPLITS}
        self.rows = {split: 0 for split in SPLITS}
        self.clicks = {split: 0 for split in SPLITS}
        self.shard_rows = {split: [0] * num_shards for split in SPLITS}
        self.shard_bytes = {split: [0] * num_shards for split in SPLITS}
        self.dropped = 0  # train negatives left out by negative downsampling

    def write(self, text: pa.Array, labels: np.ndarray, codes: np.ndarray) -> None:
        """``codes``: each row's split code (its index in :data:`SPLITS`), or DROPPED."""
        for code, split in enumerate(SPLITS):
            rows = np.flatnonzero(codes == code)
            shard = (self.rows[split] + np.arange(len(rows)) + self.unit) % self.num_shards
            order = np.argsort(shard, kind="stable")
            taken = text.take(pa.array(rows[order]))
            ends = np.cumsum(np.bincount(shard, minlength=self.num_shards))
            for s, (start, end) in enumerate(zip(np.concatenate([[0], ends[:-1]]), ends)):
                if end > start:
                    data = text_bytes(taken, int(start), int(end))
                    self.files[split][s].write(data)
                    self.columns.add(split, s, data)
                    self.shard_rows[split][s] += int(end - start)
                    self.shard_bytes[split][s] += len(data)
            self.rows[split] += len(rows)
            self.clicks[split] += int(labels[rows].sum())
        self.dropped += int(np.count_nonzero(codes == DROPPED))

    def close(self) -> None:
        self.columns.close()
        for split, handles in self.files.items():
            for handle in handles:
                handle.close()
            with open(self.root / f"{split}.txt", "wb", buffering=0) as joined:
                for s in range(self.num_shards):
                    shard = self.root / f"{split}-{s:05d}.tmp"
                    with open(shard, "rb", buffering=0) as part:
                        _copy(part, joined, self.shard_bytes[split][s])
                    shard.unlink()


def _id_counts(plan: DataPlan, sketch: Optional[CountSketch]) -> Optional[IdCounts]:
    return IdCounts(sketch, plan.min_id_count, plan.vocab_size) if sketch is not None else None


def _convert_unit(plan_dict: dict, index: int, parts_dir: str, storage_options: dict,
                  sketch_path: Optional[str]) -> None:
    plan = DataPlan.from_dict(plan_dict)
    schema = Schema.from_dict(plan.schema)
    sketch = CountSketch.load(sketch_path) if sketch_path else None
    parser = BlockParser(plan.fmt, schema, plan.vocab_size, plan.weight_column, _id_counts(plan, sketch))
    report = IdCountReport(schema.sparse_slots, plan.min_id_count) if sketch else None
    root = Path(parts_dir) / f"unit-{index:05d}"
    writer = _PartWriter(root, index, plan.num_shards, schema)
    counters = [DistinctCounter() for _ in schema.sparse_slots]
    missing = np.zeros(len(schema.sparse_slots), np.int64)
    lines, malformed, examples = 0, 0, []
    try:
        for parsed, codes in unit_rows(plan, index, parser, storage_options):
            writer.write(parsed.text, parsed.labels, codes)
            for counter, ids in zip(counters, parsed.slot_ids):
                counter.add(ids.of_rows(codes == TRAIN))  # the train split's ids: what the servers will hold
            if report:
                report.add(parsed.slot_ids, codes)
            missing += parsed.missing
            malformed += len(parsed.malformed)
            examples += [{"line": lines + line + 1, "reason": reason}
                         for line, reason in parsed.malformed[:MALFORMED_EXAMPLES - len(examples)]]
            lines += len(parsed.line_starts)
    finally:
        writer.close()
    _write_result(root, writer, dict(zip(schema.sparse_slots, counters)), missing.tolist(), lines=lines,
                  malformed=malformed, examples=examples, **(report.save(root, sketch) if report else {}))


def _write_result(root: Path, writer: _PartWriter, counters: dict[str, DistinctCounter], missing: list[int],
                  **facts: Any) -> None:
    """``missing``: per sparse slot, the well-formed rows (of every split, before negative downsampling) without a
    value for it."""
    save_counters(root / DISTINCT_FILE, counters)
    result = {"rows": writer.rows, "clicks": writer.clicks, "shard_rows": writer.shard_rows,
              "shard_bytes": writer.shard_bytes, "dropped": writer.dropped, "missing": missing, **facts}
    (root / RESULT_FILE).write_text(json.dumps(result))


def _convert_synthetic(plan_dict: dict, index: int, parts_dir: str, storage_options: dict,
                       sketch_path: Optional[str]) -> None:
    """The synthetic rows, in memory whole: counted (when the plan counts ids) and converted in one pass."""
    plan = DataPlan.from_dict(plan_dict)
    spec = SyntheticSpec(**{**plan.synthetic["spec"], "cardinalities": tuple(plan.synthetic["spec"]["cardinalities"])})
    rows = plan.synthetic["rows"]
    data = generate(rows, plan.seed, spec)
    codes = synthetic_row_codes(plan, np.arange(rows), data.labels)
    id_tables = category_id_tables(spec, plan.vocab_size)
    slots = spec.sparse_slots
    sketch = count_synthetic(slots, id_tables, data.categories, codes == TRAIN) if plan.count_ids else None
    if plan.min_id_count > 1:  # the transform's, for the merge
        sketch.save(Path(parts_dir) / SKETCH_FILE)
    id_counts = _id_counts(plan, sketch)
    estimates = [id_counts.estimates(slot, table) if id_counts else None for slot, table in zip(slots, id_tables)]
    written = [id_counts.filtered(slot, table, found) if id_counts else table
               for slot, table, found in zip(slots, id_tables, estimates)]
    report = IdCountReport(slots, plan.min_id_count) if sketch else None
    counters = {slot: DistinctCounter() for slot in slots}
    root = Path(parts_dir) / f"unit-{index:05d}"
    writer = _PartWriter(root, index, plan.num_shards, Schema.from_dict(plan.schema))
    try:
        for start in range(0, rows, _SYNTHETIC_BLOCK):
            block = SyntheticRows(*(array[start:start + _SYNTHETIC_BLOCK] for array in data))
            block_codes = codes[start:start + len(block.labels)]
            writer.write(format_lines(block, spec, written), block.labels, block_codes)
            # A category is a value of its field's slot: one per row.
            slot_ids = [SlotIds(written[f], block.categories[:, f], np.arange(len(block.labels)), True, id_tables[f],
                                estimates[f]) for f in range(len(slots))]
            for counter, ids in zip(counters.values(), slot_ids):
                counter.add(ids.of_rows(block_codes == TRAIN).astype(np.uint64))
            if report:
                report.add(slot_ids, block_codes)
    finally:
        writer.close()
    test = codes == SPLITS.index("test")
    _write_result(root, writer, counters, [0] * len(counters), lines=rows, malformed=0, examples=[],
                  bayes=bayes_metrics(data.labels[test], data.probabilities[test]),
                  **(report.save(root, sketch) if report else {}))


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
    # After the count filter a slot's OOV id counts once, as any id.
    stats.update(distinct_ids={slot: c.count() for slot, c in counters.items()},
                 distinct_ids_exact={slot: c.is_exact for slot, c in counters.items()},
                 distinct_ids_relative_error=RELATIVE_ERROR)
    if plan.count_ids:
        stats.update(merged_report(plan, [parts[i] for i in range(len(plan.units))], results))
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
        units = {i: parts[i] for i in range(len(plan.units))}
        listings = piece_listings(units)
        for split in SPLITS:
            for s, rel in enumerate(stats["shards"][split]):
                gather_columns(staging / rel, split, s, units, listings)
        save_counters(staging / DISTINCT_IDS_FILE, counters)
        _save_transform(plan, parts_dirs, staging / TRANSFORM_DIR)
        (staging / STATS_FILE).write_text(json.dumps(stats, indent=2) + "\n", encoding="utf-8")
    return stats


def _save_transform(plan: DataPlan, parts_dirs: Iterable[str | os.PathLike], directory: Path) -> None:
    """The dataset's transform (:mod:`components.data_prep.transform`), with the sketch every convert task
    counted (they all count the same) when there is a count filter."""
    sketch_path = None
    if plan.min_id_count > 1:
        sketch_path = next((Path(d) / SKETCH_FILE for d in parts_dirs if (Path(d) / SKETCH_FILE).is_file()), None)
        if sketch_path is None:
            raise DataPrepError(f"no convert step kept the id counts ({SKETCH_FILE}) that data.min_id_count="
                                f"{plan.min_id_count} maps ids by: run the convert steps again (without cache)")
    transform = Transform.of_plan(plan, CountSketch.load(sketch_path) if sketch_path else None)
    if transform is not None:
        transform.save(directory, sketch_path)


def _merged_stats(plan: DataPlan, results: list[dict]) -> dict:
    """The dataset's stats from its units' results (all but the distinct ids and the drift); raises DataPrepError
    for parts that cannot make a dataset."""
    schema = Schema.from_dict(plan.schema)
    rows = {split: sum(r["rows"][split] for r in results) for split in SPLITS}
    examples = _malformed_examples(plan, results)
    malformed = {"count": sum(r["malformed"] for r in results), "limit": plan.max_malformed_fraction,
                 "examples": examples}
    records = sum(rows.values())
    dropped = sum(r["dropped"] for r in results)
    well_formed = records + dropped  # negative downsampling leaves well-formed rows out
    lines = well_formed + malformed["count"]
    malformed["fraction"] = malformed["count"] / lines if lines else 0.0
    if plan.max_malformed_fraction is not None and malformed["fraction"] > plan.max_malformed_fraction:
        shown = "\n".join(f"  {e['file']}:{e['line']}: {e['reason']}" for e in examples)
        raise DataPrepError(
            f"{malformed['count']} of {lines} lines in {plan.source!r} are malformed "
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
            check_split_sizes({s: rows[s] for s in needed}, plan.num_shards, plan.source)
            raise DataPrepError(f"a shard of the {split} split from {plan.source!r} got no row (rows per shard: "
                                f"{shard_rows[split]}); provide more input or lower num_shards")
    train_clicks = sum(r["clicks"]["train"] for r in results)
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
        # Of every well-formed row (all splits, before negative downsampling), those without a value for the slot.
        "missing": {slot: sum(r["missing"][s] for r in results) / well_formed
                    for s, slot in enumerate(schema.sparse_slots)},
        "negative_sample_rate": plan.negative_sample_rate,
        "negative_sampling": {"train_rows_before": rows["train"] + dropped, "train_rows_after": rows["train"],
                              "train_clicks_before": train_clicks, "train_clicks_after": train_clicks},
        "weight_column": plan.weight_column,
        "min_id_count": plan.min_id_count,
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


# -- one machine: every stage --------------------------------------------------------------------------------------
def prepare(plan: DataPlan, out_dir: str | os.PathLike, processes: Optional[int] = None,
            storage_options: Optional[Mapping] = None, check_drift: Optional[DriftCheck] = None) -> dict:
    """Convert every unit of ``plan`` (a pool of ``processes``) and merge them into ``out_dir``."""
    out = Path(out_dir)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{out.name}.parts-", dir=out.parent) as parts:
        convert(plan, range(len(plan.units)), parts, processes, storage_options, whole_plan=plan)
        return merge(plan, [parts], out, check_drift)


def prepare_files(out_dir: str | os.PathLike, *, uri: str, fmt: str, test_fraction: float, num_shards: int,
                  vocab_size: int, seed: int, max_malformed_fraction: float, valid_fraction: float = 0.0,
                  slots: Optional[Sequence[str]] = None, split: str = "random",
                  storage_options: Optional[Mapping] = None, processes: Optional[int] = None,
                  unit_bytes: int = UNIT_BYTES, negative_sample_rate: float = 1.0,
                  weight_column: Optional[str] = None, min_id_count: int = 1, embedx_threshold: float = 0.0) -> dict:
    """Convert the files at ``uri`` (format ``fmt``) into ``out_dir``; returns the stats dict.

    ``slots`` selects/orders sparse slots (see ``formats.schema_for``); ``storage_options`` go to fsspec (e.g.
    ``{"client_kwargs": {"endpoint_url": ...}}``). Malformed lines are skipped and counted; more than
    ``max_malformed_fraction`` of all non-blank lines is an error. ``embedx_threshold`` > 0 (the servers' admission)
    counts the train ids for ``stats["distinct_ids_seen_at_least"]`` even without the count filter.
    """
    plan = plan_files(uri=uri, fmt=fmt, test_fraction=test_fraction, num_shards=num_shards, vocab_size=vocab_size,
                      seed=seed, max_malformed_fraction=max_malformed_fraction, valid_fraction=valid_fraction,
                      slots=slots, split=split, storage_options=storage_options, unit_bytes=unit_bytes,
                      processes=processes, negative_sample_rate=negative_sample_rate, weight_column=weight_column,
                      min_id_count=min_id_count, count_ids=embedx_threshold > 0)
    return prepare(plan, out_dir, processes, storage_options)


def prepare_synthetic(out_dir: str | os.PathLike, *, rows: int, test_fraction: float, num_shards: int,
                      vocab_size: int, seed: int, valid_fraction: float = 0.0, spec: Optional[SyntheticSpec] = None,
                      negative_sample_rate: float = 1.0, min_id_count: int = 1, embedx_threshold: float = 0.0) -> dict:
    """Generate ``rows`` synthetic rows into ``out_dir``; returns the stats dict."""
    plan = plan_synthetic(rows=rows, test_fraction=test_fraction, num_shards=num_shards, vocab_size=vocab_size,
                          seed=seed, valid_fraction=valid_fraction, spec=spec,
                          negative_sample_rate=negative_sample_rate, min_id_count=min_id_count,
                          count_ids=embedx_threshold > 0)
    return prepare(plan, out_dir, processes=1)
