"""Raw Criteo-like input for the data-prep tests of downsampling and id counts: slots of growing cardinality, so
that the small ones hold only frequent ids and the large ones many rare ones."""

from __future__ import annotations

import gzip
import random
from pathlib import Path


def raw_line(rng: random.Random, ids_per_slot_step: int = 40) -> str:
    """One raw row; slot ``s`` draws its ids from ``ids_per_slot_step * (s + 1) + 1`` values."""
    dense = [str(rng.randint(0, 300)) if rng.random() > 0.2 else "" for _ in range(13)]
    sparse = [f"{rng.randint(0, ids_per_slot_step * (slot + 1)):08x}" if rng.random() > 0.1 else ""
              for slot in range(26)]
    return "\t".join([str(int(rng.random() < 0.25)), *dense, *sparse])


def write_inputs(root: Path, lines: int = 3000) -> Path:
    """Two plain files and a gzip file of raw rows under ``root``, matched by ``{root}/part-*``."""
    rng = random.Random(11)
    root.mkdir(parents=True)
    (root / "part-a.tsv").write_text("".join(raw_line(rng) + "\n" for _ in range(lines)))
    (root / "part-b.tsv").write_text("".join(raw_line(rng) + "\n" for _ in range(lines // 2)))
    with gzip.open(root / "part-c.tsv.gz", "wt") as f:
        f.write("".join(raw_line(rng) + "\n" for _ in range(lines // 3)))
    return root


def split_lines(out: Path, stats: dict, split: str) -> list[str]:
    """Every line of a split, in shard order."""
    return [line for rel in stats["shards"][split] for line in (out / rel).read_text().splitlines()]


def dataset_files(out: Path) -> dict[str, bytes]:
    return {str(path.relative_to(out)): path.read_bytes() for path in sorted(out.rglob("*")) if path.is_file()}


# -- records of every format, for the transform (tests/data_prep/test_transform.py, tests/export/test_raw_input.py) --
WEIGHT_COLUMN = {"raw": "40", "slot": "weight", "feasign": "w"}


def slot_line(rng: random.Random, weighted: bool = False) -> str:
    """A ``slot`` row: 13 dense values, each slot with 0 (missing), 1 or 2 values."""
    tokens = [f"click:{int(rng.random() < 0.25)}", *(f"dense_feature:{rng.random() * 10:.4g}" for _ in range(13))]
    for slot in range(1, 27):
        tokens += [f"{slot}:{rng.randint(0, 20 * slot):x}" for _ in range(rng.choice((0, 1, 1, 1, 2)))]
    return " ".join(tokens + ([f"weight:{rng.randint(0, 6) * 0.5:g}"] if weighted else []))


def feasign_line(rng: random.Random, weighted: bool = False) -> str:
    """A ``feasign`` row: the label token, then slots 2..9 with 0 (missing), 1 or 2 feasigns each."""
    tokens = [f"{int(rng.random() < 0.25)}:1"]
    for slot in range(2, 10):
        tokens += [f"{rng.randint(0, 60 * slot)}:{slot}" for _ in range(rng.choice((0, 1, 1, 2)))]
    return " ".join(tokens + ([f"w:{rng.randint(0, 6) * 0.5:g}"] if weighted else []))


def record_lines(fmt: str, count: int, weighted: bool = False, seed: int = 5) -> list[str]:
    rng = random.Random(seed)
    if fmt == "raw":
        return [raw_line(rng) + (f"\t{rng.randint(0, 6) * 0.5:g}" if weighted else "") for _ in range(count)]
    return [(slot_line if fmt == "slot" else feasign_line)(rng, weighted) for _ in range(count)]


def prepare_records(out: Path, fmt: str, lines: list[str], vocab_size: int, weighted: bool = False,
                    min_id_count: int = 1) -> dict:
    """``lines`` written to ``out``.txt and prepared into ``out`` as one shard per split, in order (an ordered
    split): the train, valid and test shards one after another hold the rows of ``lines``, in order."""
    source = out.with_suffix(".txt")
    source.parent.mkdir(parents=True, exist_ok=True)
    source.write_text("\n".join(lines) + "\n")
    from components.data_prep.prepare import prepare_files

    return prepare_files(out, uri=str(source), fmt=fmt, test_fraction=0.25, valid_fraction=0.1, num_shards=1,
                         vocab_size=vocab_size, seed=3, max_malformed_fraction=0.0, split="ordered",
                         weight_column=WEIGHT_COLUMN[fmt] if weighted else None, min_id_count=min_id_count)


def shard_files(out: Path, stats: dict) -> list[Path]:
    """Every shard of a :func:`prepare_records` dataset, in the order of its input's rows."""
    return [out / rel for split in ("train", "valid", "test") for rel in stats["shards"][split]]


def instances_of(fmt: str, line: str, columns: list[str], weighted: bool = False) -> dict:
    """The serving instance (an object by column, missing values left out) of a record line made above."""
    if fmt == "raw":
        fields = line.split("\t")[1:40]
        return {column: value for column, value in zip(columns, fields) if value}
    values: dict[str, list] = {}
    for token in line.split()[1:]:  # the label first
        name, value = token.split(":")
        if fmt == "slot" and name != "weight":
            values.setdefault(name, []).append(float(value) if name == "dense_feature" else value)
        elif fmt == "feasign" and name != "w":
            values.setdefault(value, []).append(int(name))
    return values
