"""What the benchmark scripts share: timestamped progress lines, and publishing the table a run made."""

from __future__ import annotations

import time
from pathlib import Path


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def publish(table: str, out: Path) -> None:
    """Print the table and write it to ``out`` (by default the script's file under bench/results/)."""
    print(table)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(table)
    log(f"wrote {out}")
