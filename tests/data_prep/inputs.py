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
