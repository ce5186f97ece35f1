"""The counting pass, and what the convert pass reports from its counts (:mod:`id_counts`: the sketch, the filter).

A plan that counts ids (``data.min_id_count`` > 1, or an admission threshold on the servers, for which the memory
planner reads ``stats["distinct_ids_seen_at_least"]``) counts every unit's train ids before any unit is converted:
:func:`count_ids` cuts the units into one run of consecutive units per process of the pool, each process counts its
run into a sketch of its own, and the sketches are summed into the one file the convert pass maps. Memory: a sketch
(:data:`~components.data_prep.id_counts.SKETCH_BYTES`, 64 MiB) per process, and two in the process that sums them.

The convert pass keeps an :class:`IdCountReport` per unit; :func:`merged_report` turns the units' reports into the
dataset's stats.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Optional

import numpy as np

from components.data_prep.distinct import DistinctCounter, load_counters, save_counters
from components.data_prep.formats import BlockParser
from components.data_prep.id_counts import DEPTH, SEEN_AT_LEAST, WIDTH, CountSketch, oov_id, slot_keys
from components.data_prep.multislot import Schema
from components.data_prep.parsed import SlotIds
from components.data_prep.plan import DROPPED, SPLITS, TRAIN, DataPlan, unit_rows
from components.data_prep.pool import default_processes, parallel_map
from components.data_prep.sources import group_units

REPORT_FILE = "id_counts.npz"  # in a part: its report's distinct-id counters
_SEEN = "seen_at_least_"
_MAPPED = "mapped_"


def count_ids(plan: DataPlan, sketch_path: str | Path, processes: Optional[int] = None,
              storage_options: Optional[Mapping] = None) -> None:
    """Count the train ids of every unit of ``plan`` into the sketch at ``sketch_path``."""
    runs = group_units([plan.unit(int(unit["index"])) for unit in plan.units], processes or default_processes())
    with tempfile.TemporaryDirectory(prefix=".id-counts-", dir=Path(sketch_path).parent) as scratch:
        paths = [Path(scratch) / f"run-{i}.npy" for i in range(len(runs))]
        parallel_map(_count_run, [(plan.to_dict(), run, str(path), dict(storage_options or {}))
                                  for run, path in zip(runs, paths)], processes)
        total = CountSketch(np.load(paths[0]))
        for path in paths[1:]:
            total.merge(CountSketch.load(path))
        total.save(sketch_path)


def _count_run(plan_dict: dict, indices: Sequence[int], path: str, storage_options: dict) -> None:
    plan = DataPlan.from_dict(plan_dict)
    schema = Schema.from_dict(plan.schema)
    parser = BlockParser(plan.fmt, schema, plan.vocab_size, plan.weight_column, with_text=False)
    sketch = CountSketch()
    for index in indices:
        for parsed, codes in unit_rows(plan, index, parser, storage_options):
            for slot, ids in zip(schema.sparse_slots, parsed.slot_ids):
                found, counts = ids.row_counts(codes == TRAIN)
                sketch.add(slot_keys(slot, found), counts)
    sketch.save(path)


def count_synthetic(slots: Sequence[str], id_tables: Sequence[np.ndarray], categories: np.ndarray,
                    train: np.ndarray) -> CountSketch:
    """The sketch of synthetic rows (``categories[row, field]``, ``train``: the rows to count), which are in memory
    whole: each field's categories are counted, then their ids added."""
    sketch = CountSketch()
    for field, (slot, table) in enumerate(zip(slots, id_tables)):
        counts = np.bincount(categories[train, field], minlength=len(table))
        sketch.add(slot_keys(slot, table[counts > 0].astype(np.uint64)), counts[counts > 0])
    return sketch


class IdCountReport:
    """What a unit's convert pass learns from the counts: per threshold k of
    :data:`~components.data_prep.id_counts.SEEN_AT_LEAST`, the distinct train ids of every slot together (by their
    sketch keys) whose estimate is at least k; with the count filter, per slot the distinct ids it maps to the OOV
    id (in any split), and per split the rows holding one."""

    def __init__(self, slots: Sequence[str], min_id_count: int):
        self.slots, self.min_id_count = list(slots), min_id_count
        self.seen_at_least = {k: DistinctCounter() for k in SEEN_AT_LEAST}
        self.mapped = {slot: DistinctCounter() for slot in slots}
        self.rows_mapped = {split: 0 for split in SPLITS}

    def add(self, slot_ids: Sequence[SlotIds], codes: np.ndarray) -> None:
        """A block's ids (each slot's, with their unfiltered ids and estimates) and its rows' codes."""
        holds_oov = np.zeros(len(codes), bool)
        for slot, ids in zip(self.slots, slot_ids):
            trained = ids.present(codes == TRAIN)
            keys, estimates = slot_keys(slot, ids.unfiltered[trained]), ids.estimates[trained]
            for k, counter in self.seen_at_least.items():
                counter.add(keys[estimates >= k])
            if self.min_id_count > 1:
                rare = ids.estimates < self.min_id_count
                self.mapped[slot].add(ids.unfiltered[rare & ids.present(codes < DROPPED)])
                holds_oov[ids.row_of[rare[ids.value_of]]] = True
        for code, split in enumerate(SPLITS):
            self.rows_mapped[split] += int(np.count_nonzero(holds_oov & (codes == code)))

    def save(self, part: Path, sketch: CountSketch) -> dict:
        """Write the counters into the part directory; returns what goes into its result (``sketch``: the one the
        unit was converted with)."""
        save_counters(part / REPORT_FILE, {**{f"{_SEEN}{k}": c for k, c in self.seen_at_least.items()},
                                           **{f"{_MAPPED}{slot}": c for slot, c in self.mapped.items()}})
        return {"rows_mapped": self.rows_mapped, "id_sightings": sketch.counted}


def merged_report(plan: DataPlan, parts: Sequence[Path], results: Sequence[dict]) -> dict:
    """The dataset's stats of its units' reports (``parts``, ``results``: their directories and results)."""
    seen = {k: DistinctCounter() for k in SEEN_AT_LEAST}
    mapped = {slot: DistinctCounter() for slot in plan.schema["sparse_slots"]}
    for part in parts:
        for name, counter in load_counters(part / REPORT_FILE).items():
            target = seen[int(name[len(_SEEN):])] if name.startswith(_SEEN) else mapped[name[len(_MAPPED):]]
            target.merge(counter)
    stats = {"distinct_ids_seen_at_least": {str(k): c.count() for k, c in seen.items()},
             # A key's bucket holds sightings_per_counter of other keys' on average: how far estimates may be high.
             "id_counts": {"sketch": f"count-min, {DEPTH} x {WIDTH} uint32", "sightings": results[0]["id_sightings"],
                           "sightings_per_counter": results[0]["id_sightings"] / WIDTH}}
    if plan.min_id_count > 1:
        stats["oov"] = {"ids": {slot: oov_id(slot, plan.vocab_size) for slot in mapped},
                        "mapped_ids": {slot: c.count() for slot, c in mapped.items()},
                        "mapped_ids_exact": all(c.is_exact for c in mapped.values()),
                        "rows": {split: sum(r["rows_mapped"][split] for r in results) for split in SPLITS}}
    return stats

