"""What the train step runs: plain functions around the PS launcher (no KFP needed).

The checkpoint is not copied into the artifact store: the job writes it to ``cfg.checkpoint.uri``
(the checkpoint group's URI), and the ``Model`` artifact only points at it: ``metadata["uri"]`` and a
small JSON pointer file at ``checkpoint.path`` (:func:`read_pointer` reads either). The processes' logs
go into the ``logs`` artifact directory as ``<role>-<i>.log``.
"""

import contextlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

from components.config import from_dict
from components.train.planner import GIB, load_balance_lines, max_over_mean, size

POINTER_FORMAT = 1


def echo_now(line: str) -> None:
    """Print and flush: a task's stdout is a pipe (block-buffered), and progress must show as it happens."""
    print(line, flush=True)


def run_job(cfg: Any, data_dir: Path, log_dir: Path, echo: Callable[[str], None] = echo_now,
            data_uri: Optional[str] = None) -> Any:
    """The single dispatch point from ``cluster.backend`` to the code that runs a PS job.

    ``data_dir`` is the prepared dataset on this machine (local processes read it); ``data_uri`` is where it
    is stored remotely (the ``Dataset`` artifact's URI), which pods on Kubernetes fetch their shards from.
    """
    from components.config import ClusterBackend

    if cfg.cluster.backend is ClusterBackend.local:
        from components.train.launcher import run_local_job

        return run_local_job(cfg, data_dir, log_dir, echo=echo)
    from components.train.kubernetes_job import run_kubernetes_job

    stats_path = Path(data_dir) / "stats.json"
    stats = json.loads(stats_path.read_text()) if stats_path.is_file() else None
    return run_kubernetes_job(cfg, data_uri, log_dir, echo=echo, stats=stats)


def training_summary(result: Any, checkpoint_uri: str) -> dict:
    """What the Model artifact records about the run (JSON-safe): the store and the last checkpoint's id."""
    examples = sum(int(e["examples"]) for e in result.epochs)
    train_seconds = sum(float(e["seconds"]) for e in result.epochs)
    if not result.checkpoints:
        raise RuntimeError(f"the PS job committed no checkpoint to {checkpoint_uri} (nothing left to train "
                           f"after resuming from {(result.restored_from or {}).get('id')}?)")
    summary = {
        "uri": checkpoint_uri,
        "id": result.checkpoints[-1]["id"],
        "restored_from": (result.restored_from or {}).get("id"),
        "epochs": len(result.epochs),
        "examples": examples,
        "seconds": round(float(result.seconds), 3),
        "examples_per_s": round(examples / train_seconds, 1) if train_seconds > 0 else None,
    }
    if result.epochs:
        summary["final_train_auc"] = float(result.epochs[-1]["auc"])
    if result.plan:
        summary["memory_plan"] = result.plan.summary()
    load = result.checkpoints[-1].get("servers")
    if load:
        summary["server_rows"] = load["rows"]
        summary["server_rows_max_over_mean"] = round(max_over_mean(load["rows"]), 4)
    if result.server_memory and all(result.server_memory):
        summary["server_peak_rss_gib"] = [round(m["peak_rss"] / GIB, 3) for m in result.server_memory]
    return summary


def server_report(result: Any) -> list[str]:
    """After training: where the rows of the last checkpoint live and, for local servers, what they held."""
    lines = []
    load = result.checkpoints[-1].get("servers") if result.checkpoints else None
    if load and result.plan:
        lines += load_balance_lines(load, result.plan)
    if result.server_memory and all(result.server_memory):
        planned = f" (planned {size(result.plan.server_bytes)})" if result.plan else ""
        lines.append("server RSS: serving " + " | ".join(size(m["serving_rss"]) for m in result.server_memory)
                     + ", peak " + " | ".join(size(m["peak_rss"]) for m in result.server_memory) + planned)
    return lines


def write_pointer(path: str | os.PathLike, summary: dict) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps({"format": POINTER_FORMAT, **summary}, indent=2, sort_keys=True))


def read_pointer(path: str | os.PathLike, metadata: Optional[dict] = None) -> tuple[str, str]:
    """``(store uri, checkpoint id)`` a ``Model`` artifact points at: its metadata, else its pointer file."""
    pointer = metadata if metadata and metadata.get("uri") else json.loads(Path(path).read_text())
    return str(pointer["uri"]), str(pointer["id"])


@contextlib.contextmanager
def fetched_checkpoint(path: str | os.PathLike, metadata: Optional[dict] = None) -> Iterator[tuple[str, str, Path]]:
    """``(store uri, checkpoint id, local dir)`` of the checkpoint a ``Model`` artifact points at, fetched
    (export + model.json, verified) into a scratch directory that lives as long as the ``with`` block."""
    from components.checkpoint_store import fetch_for_scoring

    uri, ckpt_id = read_pointer(path, metadata)
    with tempfile.TemporaryDirectory() as scratch:
        yield uri, ckpt_id, fetch_for_scoring(uri, ckpt_id, Path(scratch) / ckpt_id)


def train_model(config: Any, data_dir: str, pointer_path: str, log_dir: str,
                echo: Callable[[str], None] = echo_now, data_uri: Optional[str] = None) -> dict:
    """Run the PS job of ``config`` on ``data_dir`` (stored at ``data_uri``: the Kubernetes backends need it);
    returns the summary for the Model artifact.

    The checkpoint goes to ``checkpoint.uri``; the pointer file to ``pointer_path``; the logs to
    ``log_dir`` (the launcher's per-role scratch directories are dropped from it after a successful job).
    """
    cfg = from_dict(config)
    result = run_job(cfg, Path(data_dir), Path(log_dir), echo=echo, data_uri=data_uri)
    shutil.rmtree(Path(log_dir) / "work", ignore_errors=True)  # kept on failure, for debugging
    summary = training_summary(result, cfg.checkpoint.uri)
    write_pointer(pointer_path, summary)
    for line in server_report(result):
        echo(line)
    echo(f"checkpoint: {summary['id']} in {cfg.checkpoint.uri} ({summary['epochs']} epoch(s) this run, "
         f"{summary['seconds']:.1f}s, {summary['examples_per_s'] or 0:,.0f} examples/s)")
    return summary


