"""A server's sidecar: it puts the shards the server saved into the checkpoint store, and reports it alive.

Servers need not share a disk with the workers (they are separate pods), so each server uploads its own
table files. ``run_server()`` holds the GIL for the server's lifetime (no Python thread of the server runs
while it serves), so the uploader is a separate process (``python -m components.ps.shard_uploader``), started
by the server and ended with it (it dies with the server: :func:`components.ps.liveness.die_with_parent`). For
the same reason it is the sidecar that sends the server's heartbeats, on the server's stdout, each after the
server's brpc service answered (:class:`components.ps.liveness.Heartbeat`).

Protocol, all through the store (see :mod:`components.checkpoint.protocol`):

1. worker 0 has the servers save into a staging path (the same path string on every machine), then writes
   ``_upload/<ckpt_id>.request.json`` with that path;
2. each server's uploader sees the request, uploads the files under it that carry its server index
   (``part-<iii>-*`` sparse shards, ``part-<iii>.*`` dense slices) into ``<ckpt_id>/tables/...``, and
   writes ``_upload/<ckpt_id>.server-<i>.json`` with their sizes and checksums, or ``.server-<i>.error.json``;
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

from components.checkpoint.format import TABLES
from components.checkpoint.protocol import JOB_STORE_RETRIES
from components.checkpoint.store import CheckpointStore, CheckpointStoreError, redact
from components.ps.liveness import Heartbeat, brpc_answers, die_with_parent

log = logging.getLogger("shard_uploader")

UPLOADS = "_upload"
POLL_S = 0.3


def request_rel(ckpt_id: str) -> str:
    return f"{UPLOADS}/{ckpt_id}.request.json"


def answer_rel(ckpt_id: str, server: int, error: bool = False) -> str:
    return f"{UPLOADS}/{ckpt_id}.server-{server}{'.error' if error else ''}.json"


def own_files(tables_dir: Path, server: int) -> list[Path]:
    """The files a server wrote in a save: Paddle names them ``part-<server index>-<shard>`` / ``part-<index>``."""
    mine = re.compile(rf"^part-{server:03d}(-\d+)?(\.|$)")
    return sorted(p for p in tables_dir.rglob("part-*") if p.is_file() and mine.match(p.name))


def upload_shards(store: CheckpointStore, ckpt_id: str, tables_dir: Path, server: int) -> dict[str, dict]:
    entries = {}
    for path in own_files(tables_dir, server):
        rel = f"{TABLES}/{path.relative_to(tables_dir).as_posix()}"
        entries[rel] = store.upload_file(path, ckpt_id, rel)
        path.unlink()  # staged on this server's disk only until it is in the store
    return entries


def pending_requests(store: CheckpointStore, server: int, served: set[str]) -> list[tuple[str, dict]]:
    out = []
    for name in store.list_control(UPLOADS):
        if name.endswith(".request.json"):
            ckpt_id = name[: -len(".request.json")]
            if ckpt_id not in served:
                request = store.read_json(None, f"{UPLOADS}/{name}")
                if request is not None:
                    out.append((ckpt_id, request))
    return out


def serve(store: CheckpointStore, server: int, parent_pid: int) -> None:
    served: set[str] = set()
    while _alive(parent_pid):
        try:
            requests = pending_requests(store, server, served)
        except CheckpointStoreError as err:  # still unreachable after the store's retries: look again later
            log.warning("server %d: cannot list the upload requests (trying again): %s", server, err)
            requests = []
        for ckpt_id, request in requests:
            served.add(ckpt_id)
            try:
                entries = upload_shards(store, ckpt_id, Path(request["tables_dir"]), server)
                store.write_json(None, answer_rel(ckpt_id, server), {"files": entries})
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


def wait_for_servers(store: CheckpointStore, ckpt_id: str, servers: int, timeout_s: float) -> dict[str, dict]:
    """Worker 0's side: every server's uploaded entries, or an error naming the server that failed."""
    deadline = time.time() + timeout_s
    entries: dict[str, dict] = {}
    pending = set(range(servers))
    while pending:
        for server in sorted(pending):
            failure = store.read_json(None, answer_rel(ckpt_id, server, error=True))
            if failure is not None:
                raise RuntimeError(f"checkpoint {ckpt_id}: {failure['error']}")
            answer = store.read_json(None, answer_rel(ckpt_id, server))
            if answer is not None:
                entries.update(answer["files"])
                pending.discard(server)
        if pending and time.time() > deadline:
            raise TimeoutError(f"checkpoint {ckpt_id}: servers {sorted(pending)} did not upload their shards "
                               f"within {timeout_s:.0f}s")
        if pending:
            time.sleep(POLL_S)
    return entries


def collect_shards(store: CheckpointStore, ckpt_id: str, tables_dir: str, servers: int,
                   timeout_s: float) -> dict[str, dict]:
    """Worker 0's whole round: request the servers' shards saved under ``tables_dir``, wait for every
    server's entries, then remove the round's records from the control folder."""
    store.write_json(None, request_rel(ckpt_id), {"tables_dir": tables_dir})
    entries = wait_for_servers(store, ckpt_id, servers, timeout_s)
    for rel in (request_rel(ckpt_id),) + tuple(answer_rel(ckpt_id, i) for i in range(servers)):
        store.remove(rel)
    return entries


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
    args = parser.parse_args(argv)
    die_with_parent(args.parent_pid)
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(levelname)s: %(message)s", stream=sys.stdout)
    if args.endpoint:
        timeout_s = min(args.report_every, 5.0)
        Heartbeat("server", args.server, args.report_every,
                  healthy=lambda: brpc_answers(args.endpoint, timeout_s)).start()
    serve(CheckpointStore(args.store, retries=JOB_STORE_RETRIES), args.server, args.parent_pid)


if __name__ == "__main__":
    main(sys.argv[1:])
