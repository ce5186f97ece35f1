"""The sizing table of a large sparse table, as Markdown: servers, checkpoint bytes, save time and traffic per batch.

    python bench/sizing.py ROWS_PER_S [--ids 1e9 1e10] [--server-gib 256 512] [--dim 9] [--rule adagrad]
                           [--vocab-size N] [--batch-size 256] [--ids-per-example 26]

``ROWS_PER_S`` is how fast one server saves its rows (measure it: a checkpoint's ``saving`` progress lines report
rows/s per server). Nothing runs: the numbers are :func:`components.train.sizing.sizing_table` on the planner's
measured constants (bytes per row in a server, bytes per saved line, the geo workers' dense copies), printed with
the inputs they come from.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.config import SparseRule  # noqa: E402
from components.train.sizing import SizingInputs, sizing_markdown  # noqa: E402


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("rows_per_s", type=float, help="rows one server saves per second")
    parser.add_argument("--ids", type=float, nargs="+", default=[1e9, 1e10], help="distinct ids (table rows)")
    parser.add_argument("--server-gib", type=float, nargs="+", default=[256, 512],
                        help="memory one server may hold (its pod's limit), GiB")
    parser.add_argument("--dim", type=int, default=9, help="table.embedding_dim")
    parser.add_argument("--rule", default="adagrad", choices=[rule.value for rule in SparseRule], help="table.rule")
    parser.add_argument("--vocab-size", type=float, default=None,
                        help="the range ids are hashed into (default: the ids): their digits in a saved line")
    parser.add_argument("--batch-size", type=int, default=256, help="examples per batch of a worker thread")
    parser.add_argument("--ids-per-example", type=int, default=26, help="sparse ids per example")
    args = parser.parse_args(argv)
    inputs = SizingInputs(rows_per_s=args.rows_per_s, ids=tuple(int(n) for n in args.ids),
                          server_gib=tuple(args.server_gib), embedding_dim=args.dim, rule=SparseRule(args.rule),
                          vocab_size=int(args.vocab_size) if args.vocab_size else None, batch_size=args.batch_size,
                          ids_per_example=args.ids_per_example)
    table = sizing_markdown(inputs)
    print(table, end="")
    return table


if __name__ == "__main__":
    main()
