"""A server's sidecar: it puts the shards the server saved into the checkpoint store, and reports it alive.

Servers need not share a disk with the workers (they are separate pods), so each server uploads its own
table files. ``run_server()`` holds the GIL for the server's lifetime (no Python thread of the server runs
while it serves), so the uploader is a separate process (``python -m components.ps.shard_uploader``), started
by the server and ended with it (it dies with the server: :func:`components.ps.liveness.die_with_parent`). For
the same reason it is the sidecar that sends the server's heartbeats, on the server's stdout and into its heartbeat
record in the store, each after the server's brpc service answered (:class:`components.ps.liveness.Heartbeat`).

Protocol, all through the store (see :mod:`components.checkpoint.protocol`):

1. worker 0 announces the save (``_upload/<ckpt_id>.saving.json`` with the staging path, the same path string on
   every machine: :func:`announce_save`), then has the servers save into it. While a server writes, its uploader
   reports the rows written so far (a progress event each time they grew): a long save is work, not a hang, and
   the launchers' stall rule sees it (:mod:`components.train.liveness`);
2. worker 0 writes ``_upload/<ckpt_id>.request.json``; each server's uploader uploads the files under the path
   that carry its server index (``part-<iii>-*`` sparse shards, ``part-<iii>.*`` dense slices) into
   ``<ckpt_id>/tables/...`` (reporting the bytes uploaded so far), and writes ``_upload/<ckpt_id>.server-<i>.json``
   with their sizes and checksums, the rows of its shards and, when asked, how many rows it saved last time that
   this save lacks (evicted), or ``.server-<i>.error.json``;
3. worker 0 waits for every server's answer, removes the round's records and commits the checkpoint with
   the entries (:func:`collect_shards`).

A store that does not answer for a while (an endpoint restarting) does not end the uploader: each store call
is retried with backoff (:data:`components.checkpoint.protocol.JOB_STORE_RETRIES` tries), and a listing that
still fails is tried again at the next poll. An upload that fails for good is answered with the error file,
which worker 0 quotes when it fails the job.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import sys
import time
from pathlib import Path
from typing import Optional

import numpy as np

from components.checkpoint.format import TABLES
from components.checkpoint.protocol import JOB_STORE_RETRIES
from components.checkpoint.store import CheckpointStore, CheckpointStoreError
from components.redaction import redact
from components.ps.brpc_tls import client_context
from components.ps.contract import PROGRESS, emit
from components.ps.liveness import Heartbeat, HeartbeatRecord, brpc_answers, die_with_parent
from components.table.sharding import distinct_ids

log = logging.getLogger("shard_uploader")

UPLOADS = "_upload"
POLL_S = 0.3


def request_rel(ckpt_id: str) -> str:
    return f"{UPLOADS}/{ckpt_id}.request.json"


def saving_rel(ckpt_id: str) -> str:
    return f"{UPLOADS}/{ckpt_id}.saving.json"


def answer_rel(ckpt_id: str, server: int, error: bool = False) -> str:
    return f"{UPLOADS}/{ckpt_id}.server-{server}{'.error' if error else ''}.json"


def own_files(tables_dir: Path, server: int) -> list[Path]:
    """The files a server wrote in a save: Paddle names them ``part-<server index>-<shard>`` / ``part-<index>``."""
    mine = re.compile(rf"^part-{server:03d}(-\d+)?(\.|$)")
    return sorted(p for p in tables_dir.rglob("part-*") if p.is_file() and mine.match(p.name))


def is_sparse_shard(path: Path) -> bool:
    """A sparse table's shard file (``part-<server>-<shard>``), one row per line; dense slices are ``part-<server>``."""
    return re.match(r"^part-\d{3}-\d+$", path.name) is not None


def count_lines(path: Path, start: int = 0) -> tuple[int, int]:
    """``(newlines from byte start on, the file's size then)``, read in blocks."""
    lines, size = 0, start
    with open(path, "rb") as f:
        f.seek(start)
        for block in iter(lambda: f.read(8 << 20), b""):
            lines += block.count(b"\n")
            size += len(block)
    return lines, size


def shard_ids(path: Path) -> np.ndarray:
    """The sorted feature ids of a saved shard file (each line starts with its id)."""
    with open(path, "rb") as f:
        ids = [int(line.split(b" ", 1)[0]) for line in f if line.strip()]
    return distinct_ids(np.asarray(ids, dtype=np.uint64))


class SaveWatch:
    """The rows a server has written so far into its shard files of one save (counted as they grow)."""

    def __init__(self, tables_dir: Path, server: int):
        self.tables_dir, self.server = tables_dir, server
        self.read: dict[Path, tuple[int, int]] = {}  # file -> (lines counted, bytes counted)
        self.started = time.time()

    def rows(self) -> int:
        for path in own_files(self.tables_dir, self.server) if self.tables_dir.is_dir() else []:
            if is_sparse_shard(path):
                lines, size = self.read.get(path, (0, 0))
                more, size = count_lines(path, size)
                self.read[path] = (lines + more, size)
        return sum(lines for lines, _ in self.read.values())


class EvictionCount:
    """Per shard, the ids this server saved last time (on its own disk): how many a new save no longer holds."""

    def __init__(self, workdir: Path):
        self.dir = workdir / "saved-ids"

    def evicted(self, shard_files: list[Path]) -> int:
        self.dir.mkdir(parents=True, exist_ok=True)
        total, compared = 0, True
        for path in shard_files:
            ids, previous = shard_ids(path), self.dir / f"{path.name}.npy"
            if previous.is_file():
                total += int(np.setdiff1d(np.load(previous), ids, assume_unique=True).size)
            else:
                compared = False
            np.save(previous, ids)
        return total if compared else None


def upload_shards(store: CheckpointStore, ckpt_id: str, tables_dir: Path, server: int,
                  evictions: Optional[EvictionCount] = None, heartbeat: Optional[HeartbeatRecord] = None) -> dict:
    """Upload this server's files of one save; returns the answer: ``files`` (entries), ``rows`` (lines of its
    sparse shards), ``evicted`` (with ``evictions``: rows of its last save this one lacks; None the first time).
    ``heartbeat``: the server's heartbeat record, which says each file sent is work."""
    files, rows, uploaded = {}, 0, 0
    mine = own_files(tables_dir, server)
    shards = [p for p in mine if is_sparse_shard(p)]
    evicted = evictions.evicted(shards) if evictions is not None else None
    for path in mine:
        rel = f"{TABLES}/{path.relative_to(tables_dir).as_posix()}"
        if path in shards:
            rows += count_lines(path)[0]
        files[rel] = store.upload_file(path, ckpt_id, rel)
        uploaded += files[rel]["size"]
        emit(PROGRESS, role="server", index=server, state="uploading", checkpoint=ckpt_id, bytes=uploaded)
        if heartbeat is not None:
            heartbeat.write(work="uploading")
        path.unlink()  # staged on this server's disk only until it is in the store
    return {"files": files, "rows": rows, "evicted": evicted}


def control_records(store: CheckpointStore, suffix: str, served: set[str]) -> list[tuple[str, dict]]:
    """``(checkpoint id, record)`` of the control folder's ``<id><suffix>`` records whose id is not in ``served``."""
    out = []
    for name in store.list_control(UPLOADS):
        if name.endswith(suffix):
            ckpt_id = name[: -len(suffix)]
            if ckpt_id not in served:
                record = store.read_json(None, f"{UPLOADS}/{name}")
                if record is not None:
                    out.append((ckpt_id, record))
    return out


def pending_requests(store: CheckpointStore, server: int, served: set[str]) -> list[tuple[str, dict]]:
    return control_records(store, ".request.json", served)


def serve(store: CheckpointStore, server: int, parent_pid: int, workdir: Optional[Path] = None,
          heartbeat: Optional[HeartbeatRecord] = None) -> None:
    """Watch the saves and answer the upload requests while the server ``parent_pid`` lives; ``heartbeat``: the
    server's heartbeat record, which says each time its save advanced (work, not a hang)."""
    served: set[str] = set()
    watches: dict[str, SaveWatch] = {}
    reported: dict[str, int] = {}
    evictions = EvictionCount(workdir) if workdir is not None else None
    while _alive(parent_pid):
        try:
            for ckpt_id, record in control_records(store, ".saving.json", served | set(watches)):
                watches[ckpt_id] = SaveWatch(Path(record["tables_dir"]), server)
            requests = pending_requests(store, server, served)
        except CheckpointStoreError as err:  # still unreachable after the store's retries: look again later
            log.warning("server %d: cannot list the upload requests (trying again): %s", server, err)
            requests = []
        for ckpt_id, watch in watches.items():
            rows = watch.rows()
            if rows > reported.get(ckpt_id, 0):  # only growth is progress: a save that stopped writing is silent
                reported[ckpt_id] = rows
                emit(PROGRESS, role="server", index=server, state="saving", checkpoint=ckpt_id, rows=rows,
                     rows_per_s=rows / max(time.time() - watch.started, 1e-9))
                if heartbeat is not None:
                    heartbeat.write(work="saving")
        for ckpt_id, request in requests:
            served.add(ckpt_id)
            watches.pop(ckpt_id, None)
            reported.pop(ckpt_id, None)
            try:
                answer = upload_shards(store, ckpt_id, Path(request["tables_dir"]), server,
                                       evictions if request.get("count_evicted") else None, heartbeat)
                store.write_json(None, answer_rel(ckpt_id, server), answer)
            except Exception as err:  # reported to worker 0, which fails the job with it
                report_failure(store, ckpt_id, server, err)
        time.sleep(POLL_S)


def report_failure(store: CheckpointStore, ckpt_id: str, server: int, err: Exception) -> None:
    """The error file worker 0 waits for; if even that cannot be written, the server's log has the error (and
    worker 0 fails on the same store)."""
    message = f"server {server}: {type(err).__name__}: {redact(str(err), store.storage_options)}"
    log.error("checkpoint %s: %s", ckpt_id, message)
    try:
        store.write_json(None, answer_rel(ckpt_id, server, error=True), {"error": message})
    except CheckpointStoreError as failed:
        log.error("checkpoint %s: cannot write the error file either: %s", ckpt_id, failed)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


def wait_for_servers(store: CheckpointStore, ckpt_id: str, servers: int, timeout_s: float) -> list[dict]:
    """Worker 0's side: every server's answer (:func:`upload_shards`), in server order, or an error naming the
    server that failed."""
    deadline = time.time() + timeout_s
    answers: dict[int, dict] = {}
    pending = set(range(servers))
    while pending:
        for server in sorted(pending):
            failure = store.read_json(None, answer_rel(ckpt_id, server, error=True))
            if failure is not None:
                raise RuntimeError(f"checkpoint {ckpt_id}: {failure['error']}")
            answer = store.read_json(None, answer_rel(ckpt_id, server))
            if answer is not None:
                answers[server] = answer
                pending.discard(server)
        if pending and time.time() > deadline:
            raise TimeoutError(f"checkpoint {ckpt_id}: servers {sorted(pending)} did not upload their shards "
                               f"within {timeout_s:.0f}s")
        if pending:
            time.sleep(POLL_S)
    return [answers[server] for server in range(servers)]


def announce_save(store: CheckpointStore, ckpt_id: str, tables_dir: str) -> None:
    """Before worker 0 has the servers save into ``tables_dir``: their uploaders report the rows as they are written."""
    store.write_json(None, saving_rel(ckpt_id), {"tables_dir": tables_dir})


def collect_shards(store: CheckpointStore, ckpt_id: str, tables_dir: str, servers: int, timeout_s: float,
                   count_evicted: bool = False) -> list[dict]:
    """Worker 0's whole round after the save: request the servers' shards saved under ``tables_dir``, wait for
    every server's answer, then remove the round's records from the control folder."""
    store.write_json(None, request_rel(ckpt_id), {"tables_dir": tables_dir, "count_evicted": count_evicted})
    answers = wait_for_servers(store, ckpt_id, servers, timeout_s)
    for rel in (saving_rel(ckpt_id), request_rel(ckpt_id)) + tuple(answer_rel(ckpt_id, i) for i in range(servers)):
        store.remove(rel)
    return answers


def clear_records(store: CheckpointStore) -> list[str]:
    """Remove what an earlier job left in the control folder (it was killed mid-round); returns the names.
    Only for a job that holds the store's lease (:mod:`components.checkpoint.lease`)."""
    names = store.list_control(UPLOADS)
    for name in names:
        store.remove(f"{UPLOADS}/{name}")
    return names


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--server", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    parser.add_argument("--endpoint", help="the server's brpc host:port: report it alive while it answers")
    parser.add_argument("--report-every", type=float, default=5.0, help="seconds between heartbeats")
    parser.add_argument("--workdir", help="the server's own directory: the ids of its last save (eviction counts)")
    args = parser.parse_args(argv)
    die_with_parent(args.parent_pid)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(levelname)s: %(message)s", stream=sys.stdout)
    heartbeat = HeartbeatRecord.from_env(args.store, "server", args.server)
    if args.endpoint:
        timeout_s, context = min(args.report_every, 5.0), client_context()  # the role's TLS, when it has it
        Heartbeat("server", args.server, args.report_every,
                  healthy=lambda: brpc_answers(args.endpoint, timeout_s, context), record=heartbeat).start()
    serve(CheckpointStore(args.store, retries=JOB_STORE_RETRIES), args.server, args.parent_pid,
          Path(args.workdir) if args.workdir else None, heartbeat)


if __name__ == "__main__":
    main(sys.argv[1:])
