"""Stage 1 of data prep, the plan: what will be done, decided before any row is converted, and the rule that sends
each row to its split (:func:`row_codes`), which every pass applies alike.

:func:`plan_files` lists the input (:mod:`components.data_prep.sources`), cuts it into units and fixes the schema
(``feasign`` without ``data.slots``: the slots seen in the input, discovered in a parallel pass);
:func:`plan_synthetic` plans the :mod:`synthetic` generator's rows as one unit. :mod:`components.data_prep.prepare`
describes the split rules; negative downsampling (``negative_sample_rate`` < 1) leaves a train row of label 0 out
when a hash of where the row is (``(seed, file basename, byte offset of its line)``; synthetic rows: their
position), salted unlike the split's hash, falls at or above the rate. Validation and test rows are all kept, and
so is every positive. Like the split, it is decided row by row, whatever the number of processes or pods.
"""

from __future__ import annotations

import hashlib
import json
import posixpath
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Optional

import numpy as np
import pyarrow as pa

from components.config import ints_from_struct
from components.data_prep.formats import BlockParser, check_weight_column, discover_feasign_slots, schema_for
from components.data_prep.hashing import HASH_FUNCTION, MAX_VOCAB_SIZE, hash64, mix64
from components.data_prep.parsed import ParsedBlock, WeightError
from components.data_prep.pool import parallel_map
from components.data_prep.sources import (UNIT_BYTES, DataPrepError, InputFile, Unit, lines_before, list_inputs,
                                          plan_units, read_blocks)
from components.data_prep.synthetic import SyntheticSpec

SPLITS = ("train", "valid", "test")  # a row's split code is its index here
TRAIN = SPLITS.index("train")
DROPPED = len(SPLITS)  # the code of a train negative that negative downsampling leaves out
SPLIT_RULES = ("random", "ordered")  # data.split
SYNTHETIC = "synthetic"
_NEGATIVE_SAMPLING_SALT = "negative-sampling"


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
    unit_bytes: Optional[int] = None  # files: how the input was cut into units
    negative_sample_rate: float = 1.0  # of the train split's negatives, those kept
    weight_column: Optional[str] = None  # where each row's weight is (formats)
    min_id_count: int = 1  # rarer train ids are written as their slot's OOV id (components.data_prep.id_counts)
    count_ids: bool = False  # a counting pass runs first: for min_id_count > 1, or for the servers' admission

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


def _row_settings(negative_sample_rate: float, min_id_count: int, count_ids: bool,
                  weight_column: Optional[str] = None) -> dict:
    """The plan's settings of issue 21's features, those not off: a plan without them fingerprints as it did
    before they existed, so the datasets made then stay current."""
    if not 0.0 < negative_sample_rate <= 1.0:
        raise DataPrepError(f"negative_sample_rate must be in (0, 1] (1: keep every negative), got "
                            f"{negative_sample_rate}")
    if min_id_count < 1:
        raise DataPrepError(f"min_id_count must be >= 1 (1: no count filter), got {min_id_count}")
    settings = dict(negative_sample_rate=negative_sample_rate, weight_column=weight_column, min_id_count=min_id_count,
                    count_ids=count_ids or min_id_count > 1)
    return {k: v for k, v in settings.items() if v != DataPlan.__dataclass_fields__[k].default}


def plan_files(*, uri: str, fmt: str, test_fraction: float, num_shards: int, vocab_size: int, seed: int,
               max_malformed_fraction: float, valid_fraction: float = 0.0, slots: Optional[Sequence[str]] = None,
               split: str = "random", day: Optional[str] = None, storage_options: Optional[Mapping] = None,
               unit_bytes: int = UNIT_BYTES, processes: Optional[int] = None, negative_sample_rate: float = 1.0,
               weight_column: Optional[str] = None, min_id_count: int = 1, count_ids: bool = False) -> DataPlan:
    """List the input, cut it into units and fix the schema; raises DataPrepError for input that cannot work.

    ``day``: the day partition ``uri`` is (recorded in ``stats.json``); ``count_ids``: count the train ids even
    when ``min_id_count`` is 1 (for ``stats["distinct_ids_seen_at_least"]``)."""
    _check_settings(test_fraction, valid_fraction, num_shards, vocab_size)
    if not 0.0 <= max_malformed_fraction <= 1.0:
        raise DataPrepError(f"max_malformed_fraction must be in [0, 1], got {max_malformed_fraction}")
    if split not in SPLIT_RULES:
        raise DataPrepError(f"unknown split {split!r}: use one of {list(SPLIT_RULES)}")
    rows = _row_settings(negative_sample_rate, min_id_count, count_ids, weight_column)
    schema_for(fmt, slots, ["2"])  # an unknown format or slot fails before the input is listed
    check_weight_column(fmt, weight_column)
    files = list_inputs(uri, storage_options)
    units = plan_units(files, unit_bytes)
    discovered = None
    if fmt == "feasign" and slots is None:
        found = parallel_map(_discover_unit, [(u.to_dict(), dict(storage_options or {}), weight_column)
                                              for u in units], processes)
        discovered = sorted(set().union(*found), key=int)
        if not discovered:
            raise DataPrepError(f"{uri!r} holds no well-formed feasign line with a sparse slot: expected "
                                "'<feasign>:<slot>' tokens with the label as '<0|1>:1'")
    schema = schema_for(fmt, slots, discovered, weighted=weight_column is not None)
    unit_dicts, input_bytes = [u.to_dict() for u in units], None
    if split == "ordered":
        positions, input_bytes = _input_positions(files, units, storage_options, processes)
        unit_dicts = [{**unit, "position": position} for unit, position in zip(unit_dicts, positions)]
    settings = dict(fmt=fmt, schema=schema.to_dict(), vocab_size=vocab_size, seed=seed, test_fraction=test_fraction,
                    valid_fraction=valid_fraction, num_shards=num_shards,
                    max_malformed_fraction=max_malformed_fraction, split=split, day=day, hash=HASH_FUNCTION, **rows)
    return DataPlan(source=uri, units=unit_dicts, input_bytes=input_bytes, unit_bytes=unit_bytes,
                    fingerprint=_fingerprint(settings, (f"{f.url} {f.fingerprint}" for f in files)), **{
                        k: v for k, v in settings.items() if k != "hash"})


def plan_in_full(plan: DataPlan, storage_options: Optional[Mapping] = None,
                 processes: Optional[int] = None) -> DataPlan:
    """``plan`` with every unit of its input (a convert task's holds its own only; the counting pass counts them
    all), the input listed and cut again as it was; raises DataPrepError if the input changed since it was
    planned."""
    if plan.fmt == SYNTHETIC:
        return plan
    full = plan_files(uri=plan.source, fmt=plan.fmt, test_fraction=plan.test_fraction, num_shards=plan.num_shards,
                      vocab_size=plan.vocab_size, seed=plan.seed, max_malformed_fraction=plan.max_malformed_fraction,
                      valid_fraction=plan.valid_fraction, slots=plan.schema["sparse_slots"], split=plan.split,
                      day=plan.day, storage_options=storage_options, unit_bytes=plan.unit_bytes, processes=processes,
                      negative_sample_rate=plan.negative_sample_rate, weight_column=plan.weight_column,
                      min_id_count=plan.min_id_count, count_ids=plan.count_ids)
    if full.fingerprint != plan.fingerprint:
        raise DataPrepError(f"the input at {plan.source!r} changed since data prep planned it (fingerprint "
                            f"{plan.fingerprint}, now {full.fingerprint}): run data prep again")
    return full


def _discover_unit(unit: dict, storage_options: dict, weight_column: Optional[str]) -> set[str]:
    slots: set[str] = set()
    for _, block in read_blocks(Unit.from_dict(unit), storage_options):
        slots |= discover_feasign_slots(block, weight_column)
    return slots


def _input_positions(files: list[InputFile], units: list[Unit], storage_options: Optional[Mapping],
                     processes: Optional[int]) -> tuple[list[int], int]:
    """``(where each unit's file starts, the bytes of all files)`` with the files one after another; a compressed
    file's rows have offsets in its decompressed stream, so it counts as the bytes it decompresses to (measured by
    reading it, in parallel: its header does not know)."""
    sizes = {file.url: file.size for file in files}
    compressed = [unit for unit in units if unit.compressed]
    measured = parallel_map(_decompressed_bytes, [(u.to_dict(), dict(storage_options or {})) for u in compressed],
                            processes)
    sizes.update({unit.url: size for unit, size in zip(compressed, measured)})
    starts, total = {}, 0
    for file in files:
        starts[file.url], total = total, total + sizes[file.url]
    return [starts[unit.url] for unit in units], total


def _decompressed_bytes(unit: dict, storage_options: dict) -> int:
    return sum(len(block) for _, block in read_blocks(Unit.from_dict(unit), storage_options))


def plan_synthetic(*, rows: int, test_fraction: float, num_shards: int, vocab_size: int, seed: int,
                   valid_fraction: float = 0.0, spec: Optional[SyntheticSpec] = None, negative_sample_rate: float = 1.0,
                   min_id_count: int = 1, count_ids: bool = False) -> DataPlan:
    _check_settings(test_fraction, valid_fraction, num_shards, vocab_size)
    spec = spec or SyntheticSpec()
    sizes = synthetic_split_rows(rows, test_fraction, valid_fraction)
    check_split_sizes({split: n for split, n in zip(SPLITS, sizes) if split != "valid" or valid_fraction},
                      num_shards)
    settings = dict(fmt=SYNTHETIC, schema=spec.schema.to_dict(), vocab_size=vocab_size, seed=seed,
                    test_fraction=test_fraction, valid_fraction=valid_fraction, num_shards=num_shards,
                    max_malformed_fraction=None, synthetic={"rows": rows, "spec": spec.to_dict()}, split="ordered",
                    **_row_settings(negative_sample_rate, min_id_count, count_ids))
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


def check_split_sizes(rows: Mapping[str, int], num_shards: int, uri: Optional[str] = None) -> None:
    """Every shard must get a row: an empty split (or shard) is an error, never a dataset."""
    where = f" from {uri!r}" if uri else ""
    for split, count in rows.items():
        if count < num_shards:
            raise DataPrepError(
                f"the {split} split{where} has {count} rows but num_shards={num_shards} needs at "
                f"least one row per shard (rows per split: {dict(rows)}); provide more input, "
                "lower num_shards, or change test_fraction")


# -- where each row goes --------------------------------------------------------------------------------------------
def _uniform(positions: np.ndarray, key: str) -> np.ndarray:
    """A uniform draw in [0, 1) per position, from a hash of (``key``, position)."""
    hashed = mix64(mix64(positions.astype(np.uint64)) ^ np.uint64(hash64(key.encode())))
    return (hashed >> np.uint64(11)).astype(np.float64) * 2.0 ** -53  # the top 53 bits


def _downsampled(plan: DataPlan, codes: np.ndarray, labels: np.ndarray, positions: np.ndarray,
                 where: str) -> np.ndarray:
    """``codes`` with the train negatives that negative downsampling leaves out marked DROPPED (``where``: what
    the positions are positions in)."""
    if plan.negative_sample_rate < 1.0:
        kept = _uniform(positions, f"{where}\x1f{_NEGATIVE_SAMPLING_SALT}") < plan.negative_sample_rate
        codes[(codes == TRAIN) & (labels == 0) & ~kept] = DROPPED
    return codes


def row_codes(plan: DataPlan, index: int, offsets: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each row's code (its split's index in :data:`SPLITS`, or :data:`DROPPED`), from its line's byte offset in
    the file of unit ``index``. Random: test when a hash of (seed, file basename, offset) is below test_fraction,
    validation when it is below test_fraction + valid_fraction, else train. Ordered: test when the line starts in
    the last test_fraction of the input's bytes, validation in the valid_fraction before that, else train."""
    where = f"{plan.seed}\x1f{posixpath.basename(plan.unit(index).url)}"
    if plan.split == "ordered":
        position = plan.input_position(index) + offsets
        valid_from = (1.0 - plan.test_fraction - plan.valid_fraction) * plan.input_bytes
        codes = (position >= valid_from).astype(np.uint8) + (position >= (1.0 - plan.test_fraction) * plan.input_bytes)
    else:
        uniform = _uniform(offsets, where)
        codes = np.zeros(len(offsets), np.uint8)
        codes[uniform < plan.test_fraction + plan.valid_fraction] = SPLITS.index("valid")
        codes[uniform < plan.test_fraction] = SPLITS.index("test")
    return _downsampled(plan, codes, labels, offsets, where)


def synthetic_row_codes(plan: DataPlan, positions: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """Each synthetic row's code by its position: the test rows last, the validation rows before them."""
    train_rows, valid_rows, _ = synthetic_split_rows(plan.synthetic["rows"], plan.test_fraction, plan.valid_fraction)
    codes = (positions >= train_rows).astype(np.uint8) + (positions >= train_rows + valid_rows)
    return _downsampled(plan, codes, labels, positions, f"{plan.seed}\x1f{SYNTHETIC}")


def unit_rows(plan: DataPlan, index: int, parser: BlockParser,
              storage_options: Optional[Mapping] = None) -> Iterator[tuple[ParsedBlock, np.ndarray]]:
    """``(parsed block, each row's code)`` of unit ``index``, block by block; raises DataPrepError naming the
    file for a block the format cannot read, and the file and line of a row without a usable weight."""
    unit, lines = plan.unit(index), 0
    for offset, block in read_blocks(unit, storage_options):
        try:
            parsed = parser.parse(block)
        except pa.ArrowInvalid as err:  # what not even the malformed-line handling can read
            raise DataPrepError(f"{unit.url} (from byte {offset}) cannot be read as data.format={plan.fmt}: "
                                f"{str(err).splitlines()[0][:200]}; check data.format and data.uri") from None
        except WeightError as err:
            line = lines_before(unit, storage_options) + lines + err.line + 1
            raise DataPrepError(f"{unit.url}:{line}: {err}") from None
        yield parsed, row_codes(plan, index, offset + parsed.line_starts[parsed.row_lines], parsed.labels)
        lines += len(parsed.line_starts)
