"""A server's sidecar that puts the shards it saved into the checkpoint store.

Servers need not share a disk with the workers (they are separate pods), so each server uploads its own
table files. ``run_server()`` holds the GIL for the server's lifetime, so the uploader is a separate process
(``python -m components.ps.shard_uploader``), started by the server and ended with it.

Protocol, all through the store (see :mod:`components.checkpoint.protocol`):

1. worker 0 has the servers save into a staging path (the same path string on every machine), then writes
   ``_upload/<ckpt_id>.request.json`` with that path;
2. each server's uploader sees the request, uploads the files under it that carry its server index
   (``part-<iii>-*`` sparse shards, ``part-<iii>.*`` dense slices) into ``<ckpt_id>/tables/...``, and
   writes ``_upload/<ckpt_id>.server-<i>.json`` with their sizes and checksums, or ``.server-<i>.error.json``;
3. worker 0 waits for every server's answer, removes the round's records and commits the checkpoint with
   the entries (:func:`collect_shards`).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

from components.checkpoint.format import TABLES
from components.checkpoint.store import CheckpointStore

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
    store.fs.invalidate_cache()
    try:
        names = [Path(p).name for p in store.fs.ls(store.fs_path(None, UPLOADS), detail=False)]
    except FileNotFoundError:
        return []
    out = []
    for name in sorted(names):
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
        for ckpt_id, request in pending_requests(store, server, served):
            served.add(ckpt_id)
            try:
                entries = upload_shards(store, ckpt_id, Path(request["tables_dir"]), server)
                store.write_json(None, answer_rel(ckpt_id, server), {"files": entries})
            except Exception as err:  # reported to worker 0, which fails the job with it
                store.write_json(None, answer_rel(ckpt_id, server, error=True),
                                 {"error": f"server {server}: {type(err).__name__}: {store.redact(str(err))}"})
        time.sleep(POLL_S)


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
        store.fs.rm_file(store.fs_path(None, rel))
    return entries


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True)
    parser.add_argument("--server", type=int, required=True)
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    serve(CheckpointStore(args.store), args.server, args.parent_pid)


if __name__ == "__main__":
    main(sys.argv[1:])
