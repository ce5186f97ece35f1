"""The online server on a trained run's export: raw records through the server against the shard path, latency,
rows/s beside the in-process model, memory against the table, and a delta applied while serving.

    python bench/serving.py [--rows 200000] [--requests 1000] [--work DIR] [--out bench/results/serving.md]

What runs, side by side in one process tree on this machine:

1. **A trained run.** ``--rows`` of the default synthetic generator as raw Criteo TSV
   (``components.data_prep.synthetic``), trained by the pipeline with the ``data=criteo`` defaults and two passes
   (``python -m pipelines.ctr data=criteo data.uri=... ps.epochs=2``): two checkpoints, the delivered one exported
   as version 1 of the run's export store, with its dataset's transform.
2. **Records = shards.** The file's last ``--check-rows`` lines are prepared by data prep alone (an ordered split,
   one shard per split, so in file order) and scored by the in-process model from those shards; the same lines,
   without their label, go to the server as KServe v1 instances (batches of 256). Max |difference|.
3. **Latency.** ``--requests`` single-instance v1 requests, one after another on one keep-alive connection:
   p50 / p99 of the client's time, beside the in-process ``predict_instances`` of the same instance.
4. **Rows/s at batch 256.** The same instances in batches of 256: the server (one client, then two concurrent
   ones) and the in-process model; the ratio is the serving overhead.
5. **Memory.** The server's RSS (anonymous and file-backed pages, from /proc) after it loaded the model, and after
   the requests above, with the resident pages of the version's shard files (smaps) beside their size: the rows
   are memory-mapped, so what is resident follows the rows requested, not the table.
6. **A delta while serving.** The run's other checkpoint exported as version 2 (a delta on version 1, with
   ``--poll-seconds 0.5`` on the server) while a client keeps sending requests: seconds from the version's
   publication to the first answer from it, and requests that failed (must be 0).

The table is printed and written to ``--out``. About 4 minutes on the 2-core dev machine with the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from bench.common import log, publish  # noqa: E402
from components.data_prep.multislot import Schema, read_shards  # noqa: E402
from components.data_prep.prepare import prepare_files  # noqa: E402
from components.data_prep.synthetic import write_raw_tsv  # noqa: E402
from components.export.model import InferenceModel  # noqa: E402

RESULTS = ROOT / "bench" / "results" / "serving.md"
BATCH = 256
NAME = "ctr"


def trained_run(work: Path, rows: int) -> Path:
    """The run directory of the pipeline trained on ``rows`` synthetic raw rows (reused when it finished before)."""
    data, run = work / "data.tsv", work / "run"
    if not data.exists():
        log(f"writing {rows:,} synthetic raw rows")
        write_raw_tsv(str(data), rows, seed=0)
    if not (run / "metrics.json").exists():
        log("training (python -m pipelines.ctr data=criteo, two passes)")
        subprocess.run([sys.executable, "-m", "pipelines.ctr", "data=criteo", f"data.uri={data}", "ps.epochs=2",
                        f"hydra.run.dir={run}"], cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
    return run


def dataset_of(run: Path) -> Path:
    (found,) = run.glob("kfp/*/merge-data/dataset")
    return found


def record_lines(work: Path, count: int) -> tuple[Path, list[bytes]]:
    """The last ``count`` lines of the run's data, in a file of their own."""
    with open(work / "data.tsv", "rb") as f:
        lines = f.read().splitlines()[-count:]
    path = work / "records.tsv"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path, lines


def shard_predictions(model: InferenceModel, records: Path, work: Path) -> tuple[np.ndarray, np.ndarray]:
    """``(labels, probabilities)`` of ``records`` prepared by data prep alone (an ordered split, one shard per split:
    the splits' shards one after another hold the records in file order) and scored from its shards."""
    out = work / "records-dataset"
    if out.exists():
        subprocess.run(["rm", "-rf", str(out)], check=True)
    stats = prepare_files(out, uri=str(records), fmt="raw", test_fraction=0.1, num_shards=1, split="ordered",
                          vocab_size=model.meta["vocab_size"], seed=0, max_malformed_fraction=0.0)
    shards = [out / rel for split in ("train", "valid", "test") for rel in stats["shards"][split]]
    labels, dense, sparse = read_shards(shards, Schema.from_dict(stats["schema"]))
    return labels, model.predict(dense, sparse)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """``python -m components.export.serving serve`` on a loopback port, stopped by SIGTERM at the end."""

    def __init__(self, store: Path, log_path: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "w")
        self.proc = subprocess.Popen([sys.executable, "-m", "components.export.serving", "serve", "--model",
                                      str(store), "--port", str(self.port), "--name", NAME, "--poll-seconds", "0.5"],
                                     cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)

    def __enter__(self) -> "Server":
        import httpx

        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with {self.proc.returncode}: see {self._log.name}")
            try:
                if httpx.get(f"{self.url}/v2/health/ready", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"the server was not ready within 120 s: see {self._log.name}")

    def __exit__(self, *exc) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
            self._log.close()

    def memory(self, store: Path) -> dict[str, int]:
        """The server's RssAnon and RssFile, and the resident bytes of the store's files it maps (the shards), in
        bytes (/proc/<pid>/status and smaps)."""
        status = Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
        fields = dict(line.split(":", 1) for line in status if line.startswith(("RssAnon", "RssFile")))
        memory = {key: int(value.split()[0]) * 1024 for key, value in fields.items()}
        memory["store"], mapped = 0, False
        for line in Path(f"/proc/{self.proc.pid}/smaps").read_text().splitlines():
            head = line.split()
            if re.fullmatch(r"[0-9a-f]+-[0-9a-f]+", head[0]):  # a mapping's first line: range, ..., its path if any
                mapped = len(head) >= 6 and head[5].startswith(f"{store}/")
            elif mapped and head[0] == "Rss:":
                memory["store"] += int(head[1]) * 1024
        return memory


def instances_of(lines: list[bytes]) -> list[list[str]]:
    """Serving instances: each line's fields without the label."""
    return [line.decode().split("\t")[1:] for line in lines]


def predict_v1(client, instances: list) -> tuple[np.ndarray, str]:
    response = client.post(f"/v1/models/{NAME}:predict", json={"instances": instances})
    response.raise_for_status()
    body = response.json()
    return np.asarray(body["predictions"], np.float32), body["model_version"]


def percentile_ms(seconds: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(seconds) * 1e3, q))


def latency(client, model: InferenceModel, instances: list, requests: int) -> dict[str, float]:
    served, local = [], []
    for index in range(requests):
        instance = [instances[index % len(instances)]]
        start = time.perf_counter()
        predict_v1(client, instance)
        served.append(time.perf_counter() - start)
        start = time.perf_counter()
        model.predict_instances(instance)
        local.append(time.perf_counter() - start)
    return {"p50": percentile_ms(served, 50), "p99": percentile_ms(served, 99),
            "local_p50": percentile_ms(local, 50), "local_p99": percentile_ms(local, 99)}


def rows_per_second(scorers: list, instances: list) -> float:
    """Rows/s over every batch of 256 of ``instances``, split among one thread per scorer (``scorer(batch)``)."""
    batches = [instances[i:i + BATCH] for i in range(0, len(instances) - BATCH + 1, BATCH)]
    threads = [threading.Thread(target=lambda score, mine: [score(batch) for batch in mine],
                                args=(score, batches[c::len(scorers)])) for c, score in enumerate(scorers)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return len(batches) * BATCH / (time.perf_counter() - start)


def delta_while_serving(server: Server, run: Path, store: Path, instance: list) -> dict[str, float]:
    """Export the run's other checkpoint (not version 1's) as the next version while a client keeps asking: seconds
    from the version's publication (its serving.json written) to the first answer from it, and failed requests."""
    import httpx

    served_id = json.loads((store / "v000001" / "serving.json").read_text())["source_checkpoint"]["id"]
    (other,) = [p for p in (run / "checkpoint").iterdir() if p.is_dir() and "-e000" in p.name and p.name != served_id]
    failures, first_new, stop = [0], [None], threading.Event()

    def keep_asking() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            while not stop.is_set():
                try:
                    _, version = predict_v1(client, [instance])
                except httpx.HTTPError:
                    failures[0] += 1
                    continue
                if version == "2" and first_new[0] is None:
                    first_new[0] = time.time()

    asker = threading.Thread(target=keep_asking)
    asker.start()
    try:
        subprocess.run([sys.executable, "-m", "components.export.serving", "export", "--checkpoint", str(other),
                        "--out", str(store), "--dataset", str(dataset_of(run))],
                       cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        deadline = time.time() + 60
        while first_new[0] is None and time.time() < deadline:
            time.sleep(0.05)
    finally:
        stop.set()
        asker.join()
    published = (store / "v000002" / "serving.json").stat().st_mtime
    manifest = json.loads((store / "v000002" / "serving.json").read_text())
    return {"kind": manifest["kind"], "written_rows": manifest["written_rows"], "rows": manifest["rows"],
            "applied_s": (first_new[0] - published) if first_new[0] else float("nan"), "failures": failures[0]}


def render(r: dict) -> str:
    mib = 1 << 20
    return "\n".join([
        f"## The online server (`python bench/serving.py`, {r['when']}, {r['cpus']} cores)",
        "",
        f"A run of `python -m pipelines.ctr data=criteo` on {r['rows']:,} synthetic raw rows, two passes; version 1 "
        f"of its export store ({r['table_rows']:,} rows of dim {r['dim']}, {r['table_bytes'] / mib:.1f} MiB of "
        "shard files) served by `python -m components.export.serving serve` on loopback; the in-process model is "
        "`InferenceModel.predict_instances` on the same instances.",
        "",
        "| what | server | in process | ratio |",
        "|---|---|---|---|",
        f"| raw records vs data prep's shards, max abs difference ({r['check_rows']:,} records) | "
        f"{r['max_diff']:.2e} | | |",
        f"| batch 1, p50 / p99 ms ({r['requests']:,} requests) | {r['latency']['p50']:.2f} / "
        f"{r['latency']['p99']:.2f} | {r['latency']['local_p50']:.2f} / {r['latency']['local_p99']:.2f} | |",
        f"| batch 256, rows/s (one client) | {r['served_rps']:,.0f} | {r['local_rps']:,.0f} | "
        f"**{r['served_rps'] / r['local_rps']:.2f}** |",
        f"| batch 256, rows/s (two clients) | {r['served_rps_2']:,.0f} | | "
        f"{r['served_rps_2'] / r['local_rps']:.2f} |",
        f"| RSS after loading: anonymous / file-backed MiB; of it the shard files | "
        f"{r['mem_loaded']['RssAnon'] / mib:.0f} / {r['mem_loaded']['RssFile'] / mib:.0f}; "
        f"{r['mem_loaded']['store'] / mib:.2f} of {r['table_bytes'] / mib:.1f} | | |",
        f"| RSS after the requests (the {r['check_rows']:,} records' rows looked up) | "
        f"{r['mem_after']['RssAnon'] / mib:.0f} / {r['mem_after']['RssFile'] / mib:.0f}; "
        f"{r['mem_after']['store'] / mib:.2f} of {r['table_bytes'] / mib:.1f} | | |",
        f"| delta applied while serving (version 2, {r['delta']['kind']}, {r['delta']['written_rows']:,} rows "
        f"written): s from publication to the first answer from it, requests failed | "
        f"{r['delta']['applied_s']:.2f} s, {r['delta']['failures']} failed | | |",
        "",
        "The server polls the store every 0.5 s here (`--poll-seconds`, default 10). File-backed pages are mostly "
        "Paddle's and Python's own libraries, which every process maps whatever the table; the shard files' resident "
        "pages (from /proc/<pid>/smaps) are the rows requested so far, not the table.",
        "",
    ])


def main(argv: list[str] | None = None) -> None:
    import httpx

    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--check-rows", type=int, default=5_000)
    parser.add_argument("--requests", type=int, default=1_000)
    parser.add_argument("--work", type=Path, default=ROOT / "build" / "bench-serving")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    work = args.work.absolute()
    work.mkdir(parents=True, exist_ok=True)
    run = trained_run(work, args.rows)
    store = work / "store"
    if store.exists():
        subprocess.run(["rm", "-rf", str(store)], check=True)
    subprocess.run(["cp", "-r", str(run / "checkpoint-serving"), str(store)], check=True)
    model = InferenceModel.load(store)
    manifest = model.meta
    records, lines = record_lines(work, args.check_rows)
    instances = instances_of(lines)
    labels, from_shards = shard_predictions(model, records, work)
    if labels.tolist() != [int(line.split(b"\t")[0]) for line in lines]:
        raise RuntimeError("data prep's shard holds the records in another order: the comparison would be wrong")
    result = {"when": time.strftime("%Y-%m-%d %H:%M"), "cpus": os.cpu_count(), "rows": args.rows,
              "check_rows": len(lines), "requests": args.requests, "dim": manifest["embedding_dim"],
              "table_rows": manifest["rows"],
              "table_bytes": sum(entry["size"] for rel, entry in manifest["files"].items() if rel.startswith("shards/"))}
    log(f"serving version {model.version} of {store}")
    with Server(store, work / "server.log") as server, httpx.Client(base_url=server.url, timeout=60) as client:
        result["mem_loaded"] = server.memory(store)
        served = np.concatenate([predict_v1(client, instances[i:i + BATCH])[0]
                                 for i in range(0, len(instances), BATCH)])
        result["max_diff"] = float(np.max(np.abs(served - from_shards)))
        log(f"records through the server vs shards: max abs difference {result['max_diff']:.2e}")
        result["latency"] = latency(client, model, instances, args.requests)
        log(f"batch 1: p50 {result['latency']['p50']:.2f} ms, p99 {result['latency']['p99']:.2f} ms")
        result["local_rps"] = rows_per_second([model.predict_instances], instances)
        result["served_rps"] = rows_per_second([lambda batch: predict_v1(client, batch)], instances)
        with httpx.Client(base_url=server.url, timeout=60) as other:
            result["served_rps_2"] = rows_per_second([lambda batch: predict_v1(client, batch),
                                                      lambda batch: predict_v1(other, batch)], instances)
        log(f"batch 256: {result['served_rps']:,.0f} rows/s served, {result['local_rps']:,.0f} in process")
        result["mem_after"] = server.memory(store)
        result["delta"] = delta_while_serving(server, run, store, instances[0])
        log(f"delta: served {result['delta']['applied_s']:.2f} s after publication, "
            f"{result['delta']['failures']} failed requests")
    publish(render(result), args.out)


if __name__ == "__main__":
    main()
