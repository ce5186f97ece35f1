"""Checkpoint transport: our CheckpointStore vs. a plain fsspec copy of the same bytes, on a loopback S3 endpoint.

    python bench/checkpoint.py [--mb 100] [--rounds 3] [--workers 8] [--in-process] [--out bench/results/checkpoint.md]

What runs, all in one go:

* an S3 endpoint on 127.0.0.1: moto's server (``python -m moto.server``) as a child process, so the endpoint
  does not share this process' GIL (as a real endpoint would not); ``--in-process`` uses moto's
  ``ThreadedMotoServer`` in this process instead. Fake credentials in the environment; nothing leaves the
  machine.
* a checkpoint directory shaped like ours, ``--mb`` in all (default 100 MB): ~85% in 36 server table shards
  ``tables/000/part-NNN-00000.gz`` of varying size (random bytes: gzip output does not compress further,
  and producing real gzip at this size would cost more than the upload), ``export/embedding.npz`` (uint64
  ids + float32 rows of dim 9: the rest), ``export/dense.npz`` and ``model.json``.
* per round (``--rounds``, default 5; the order of the two contenders alternates between rounds):

  - **save, ours**: ``CheckpointStore.upload_dir`` (sha256 of every file computed while it is read for
    the upload, ``--workers`` files at once) + ``commit`` (``model.json``, a listing that checks every file
    landed with its size, ``MANIFEST.json``, ``LATEST``);
  - **save, plain fsspec**: ``fs.put(local_dir, url, recursive=True)`` of the same directory (no hashing,
    no manifest);
  - **restore, ours**: ``CheckpointStore.download`` (manifest read, every file fetched then its size and
    sha256 checked, ``workers`` at once, local ``MANIFEST.json`` written);
  - **restore, plain fsspec**: ``fs.get(url, local_dir, recursive=True)``.

  Every transfer starts from an empty target (remote prefix / local directory); what one round wrote is
  deleted before the next.

MB/s = checkpoint bytes (10^6) / wall seconds of the operation; the table shows the median round and the
range. ours / plain = plain seconds / ours seconds of the same round (> 1: ours is faster), median over the
rounds. Target: save ratio >= 0.8. The table is printed and written to ``--out``. The default run takes about
15 s on the 2-core dev machine.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.checkpoint.store import CheckpointStore, make_id  # noqa: E402

BUCKET = "ckpt-bench"
FAKE_ENV = {
    "AWS_ACCESS_KEY_ID": "AKIABENCHFAKE0000000",
    "AWS_SECRET_ACCESS_KEY": "bench-fake-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_REGION": "us-east-1",
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
}


def log(msg: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Endpoint:
    """moto's S3 server on loopback, in a child process (default) or a thread of this one."""

    def __init__(self, in_process: bool):
        self.in_process = in_process
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._proc: subprocess.Popen | None = None
        self._server = None

    def __enter__(self) -> "Endpoint":
        if self.in_process:
            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.ERROR)
            self._server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
            self._server.start()
        else:
            self._proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:
            try:
                urllib.request.urlopen(f"{self.url}/moto-api/data.json", timeout=2).close()
                break
            except OSError:
                if self._proc is not None and self._proc.poll() is not None:
                    raise RuntimeError(f"moto server exited with {self._proc.returncode}")
                if time.time() > deadline:
                    raise RuntimeError(f"moto server on {self.url} did not come up")
                time.sleep(0.2)
        return self

    def __exit__(self, *exc) -> None:
        if self._server is not None:
            self._server.stop()
        if self._proc is not None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def make_checkpoint(root: Path, total_mb: float, seed: int = 0) -> dict:
    """A checkpoint directory shaped like ours, ``total_mb`` MB in all; returns its file count and bytes."""
    rng = np.random.default_rng(seed)
    total = int(total_mb * 1e6)
    emb_rows = int(total * 0.15) // (8 + 4 * 9)
    shard_bytes = total - emb_rows * (8 + 4 * 9) - 200_000
    weights = rng.lognormal(0.0, 0.6, size=36)
    sizes = (weights / weights.sum() * shard_bytes).astype(int)
    for i, size in enumerate(sizes):
        path = root / "tables" / "000" / f"part-{i:03d}-00000.gz"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(rng.bytes(int(size)))
    (root / "export").mkdir(parents=True, exist_ok=True)
    np.savez(root / "export" / "embedding.npz", ids=np.sort(rng.integers(0, 1 << 62, emb_rows, dtype=np.uint64)),
             rows=rng.standard_normal((emb_rows, 9), dtype=np.float32))
    np.savez(root / "export" / "dense.npz", **{f"fc_{i}.w_0": rng.standard_normal((256, 128), dtype=np.float32)
                                                for i in range(1)})
    (root / "model.json").write_text(json.dumps({"model": {"name": "dnn"}, "paddle_version": "2.6.2"}))
    files = [p for p in root.rglob("*") if p.is_file()]
    return {"files": len(files), "bytes": sum(p.stat().st_size for p in files),
            "largest": max(p.stat().st_size for p in files), "smallest": min(p.stat().st_size for p in files)}


def timed(fn) -> tuple[float, object]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def local_bytes(root: Path, skip: tuple[str, ...] = ()) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and p.name not in skip)


class _Retries(logging.Handler):
    """Counts the store's retry warnings: a round with retries measures the endpoint, not the store."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += 1
        log(f"store: {record.getMessage()}")


def run(args) -> dict:
    os.environ.update(FAKE_ENV)
    retries = _Retries()
    logging.getLogger("components.checkpoint.store").addHandler(retries)
    load = os.getloadavg()[0]
    work = Path(tempfile.mkdtemp(prefix="ckpt-bench-", dir=args.work))
    try:
        src = work / "src"
        t_gen, shape = timed(lambda: make_checkpoint(src, args.mb))
        log(f"generated {shape['files']} files, {shape['bytes'] / 1e6:.1f} MB in {t_gen:.1f}s under {src}")
        with Endpoint(args.in_process) as endpoint:
            os.environ["AWS_ENDPOINT_URL"] = endpoint.url
            import boto3
            import s3fs

            boto3.client("s3").create_bucket(Bucket=BUCKET)
            s3fs.S3FileSystem.clear_instance_cache()
            store = CheckpointStore(f"s3://{BUCKET}/ours", workers=args.workers)
            fs = store.fs  # the same S3FileSystem instance (and connection pool) for both contenders
            fs.pipe_file(f"{BUCKET}/warmup", b"x")  # session, credentials, connection pool
            fs.cat_file(f"{BUCKET}/warmup")
            rows: dict[str, list[float]] = {k: [] for k in ("save_ours", "save_plain", "restore_ours", "restore_plain")}
            for r in range(args.rounds):
                plain_url = f"{BUCKET}/plain/r{r}"
                ckpt_id = make_id(r, 0)

                def save_ours():
                    files = store.upload_dir(src, ckpt_id)
                    return store.commit(ckpt_id, files, {"paddle_version": "2.6.2", "round": r})

                def save_plain():
                    fs.put(str(src), plain_url, recursive=True)

                order = [("save_ours", save_ours), ("save_plain", save_plain)]
                for name, fn in (order if r % 2 == 0 else order[::-1]):
                    seconds, _ = timed(fn)
                    rows[name].append(seconds)
                    log(f"round {r}: {name} {seconds:.2f}s")
                remote = sum(fs.du(plain_url, total=False).values())
                assert remote == shape["bytes"], (remote, shape["bytes"])

                restore_ours_dir, restore_plain_dir = work / f"ours-{r}", work / f"plain-{r}"
                order = [("restore_ours", lambda: store.download(ckpt_id, restore_ours_dir)),
                         ("restore_plain", lambda: fs.get(plain_url, str(restore_plain_dir), recursive=True))]
                for name, fn in (order if r % 2 == 0 else order[::-1]):
                    seconds, _ = timed(fn)
                    rows[name].append(seconds)
                    log(f"round {r}: {name} {seconds:.2f}s")
                assert local_bytes(restore_plain_dir) == shape["bytes"]
                # ours: the same files plus MANIFEST.json (model.json is the commit's, of another size)
                assert local_bytes(restore_ours_dir, skip=("MANIFEST.json", "model.json")) == \
                    local_bytes(src, skip=("model.json",))

                shutil.rmtree(restore_ours_dir)
                shutil.rmtree(restore_plain_dir)
                fs.rm(plain_url, recursive=True)
                store.prune(keep_last=1)
        return {"shape": shape, "rows": rows, "load": load, "retries": retries.count}
    finally:
        shutil.rmtree(work, ignore_errors=True)


def table(result: dict, args) -> str:
    shape, rows = result["shape"], result["rows"]
    mb = shape["bytes"] / 1e6

    def cell(name: str) -> tuple[float, str, str]:
        secs = rows[name]
        med = statistics.median(secs)
        return med, f"{mb / med:,.1f}", f"{med:.2f} ({min(secs):.2f}-{max(secs):.2f})"

    s_ours, s_plain = cell("save_ours"), cell("save_plain")
    r_ours, r_plain = cell("restore_ours"), cell("restore_plain")
    # per-round ratios (the two contenders ran back to back), then their median: robust to load that comes
    # and goes on a shared machine
    save_ratio = statistics.median(p / o for p, o in zip(rows["save_plain"], rows["save_ours"]))
    restore_ratio = statistics.median(p / o for p, o in zip(rows["restore_plain"], rows["restore_ours"]))
    endpoint = "moto ThreadedMotoServer in the bench process" if args.in_process else \
        "moto server, child process"
    load = f"load avg {result['load']:.1f} at start"
    lines = [
        "# Checkpoint transport: CheckpointStore vs. plain fsspec copy (S3 on loopback)",
        "",
        f"{dt.datetime.now():%Y-%m-%d %H:%M} | {os.cpu_count()} CPU cores | {load} | endpoint: {endpoint} | "
        f"{shape['files']} files, {mb:.1f} MB (largest {shape['largest'] / 1e6:.1f} MB) | "
        f"{args.rounds} rounds, median (min-max) | CheckpointStore workers={args.workers} | "
        f"store retries during the run: {result['retries']}",
        "",
        "| operation | contender | MB/s | seconds | ours / plain |",
        "|---|---|---:|---:|---:|",
        f"| save | ours: `upload_dir` + `commit` (sha256 while uploading, manifest, LATEST) | {s_ours[1]} | "
        f"{s_ours[2]} | **{save_ratio:.2f}** (target >= 0.8) |",
        f"| save | plain: `fs.put(dir, url, recursive=True)` | {s_plain[1]} | {s_plain[2]} |  |",
        f"| restore | ours: `download` (size + sha256 of every file checked) | {r_ours[1]} | {r_ours[2]} | "
        f"**{restore_ratio:.2f}** |",
        f"| restore | plain: `fs.get(url, dir, recursive=True)` | {r_plain[1]} | {r_plain[2]} |  |",
        "",
        "MB/s = checkpoint bytes (10^6) / wall seconds (median round); ours / plain = plain seconds / ours seconds "
        "of the same round, median over rounds (> 1: ours is faster). Method: docstring of `bench/checkpoint.py`.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mb", type=float, default=100.0, help="checkpoint size in MB (default 100)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--workers", type=int, default=8, help="CheckpointStore workers (files at once)")
    parser.add_argument("--in-process", action="store_true", help="run moto's server in this process")
    parser.add_argument("--work", default=None, help="scratch directory (default: $TMPDIR)")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "results" / "checkpoint.md"))
    args = parser.parse_args(argv)
    result = run(args)
    report = table(result, args)
    print(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
        log(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
