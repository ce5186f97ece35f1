"""A minimal hand-written Paddle fleet PS script: the baseline ``bench/throughput.py`` compares our train step with.

Self-contained on purpose (it imports nothing from ``components``): its own net, strategy and loops, written the
way a Paddle PS tutorial writes them. The role comes from the usual Paddle PS environment (``TRAINING_ROLE``,
``PADDLE_PSERVERS_IP_PORT_LIST``, ...), so it runs under ``python -m paddle.distributed.launch --server_num S
--worker_num W`` as well as under any launcher that sets those variables.

Net: 26 sparse slots -> ``sparse_embedding`` (one shared table) -> sum pool, concat with the 13 dense floats ->
MLP (relu) -> logit; sigmoid cross-entropy loss plus an AUC op (as tutorials fetch it). Async PS, Adam on dense
parameters, an explicit SparseAccessor/adagrad table.

Two training loops (``--loop``):

* ``feed``: read the worker's shard files in Python, parse MultiSlot lines, batch them into numpy arrays and LoD
  tensors and call ``exe.run(feed=...)`` per batch (fetching the loss). ``--max-seconds`` caps it.
* ``dataset``: ``QueueDataset`` (``pipe_command="cat"``) + ``exe.train_from_dataset``.

Each worker prints one ``@bench {json}`` line: ``loop_start``/``first_batch``/``loop_end`` (epoch seconds),
``examples``, ``batches``, ``capped`` and, for ``feed``, the seconds spent in ``exe.run``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

import numpy as np

DENSE_DIM = 13
NUM_SLOTS = 26
TABLE = "hw_embedding"


def import_paddle():
    """Paddle in static mode. kfp's proto-plus ships a top-level ``proto`` package that shadows the one
    Paddle's trainer imports (``from proto import trainer_desc_pb2``): alias Paddle's own in its place."""
    import paddle

    sys.modules["proto"] = importlib.import_module("paddle.base.proto")
    importlib.import_module("paddle.base.proto.trainer_desc_pb2")
    paddle.enable_static()
    return paddle


def build_net(paddle, args):
    label = paddle.static.data("label", [-1, 1], "int64")
    dense = paddle.static.data("dense_input", [-1, DENSE_DIM], "float32")
    slots = [paddle.static.data(f"s{i}", [-1, 1], "int64", lod_level=1) for i in range(NUM_SLOTS)]
    pooled = []
    for slot in slots:
        emb = paddle.static.nn.sparse_embedding(slot, size=[args.vocab, args.emb_dim],
                                                param_attr=paddle.ParamAttr(name=TABLE))
        pooled.append(paddle.static.nn.sequence_pool(paddle.reshape(emb, [-1, args.emb_dim]), "sum"))
    x = paddle.concat(pooled + [dense], axis=1)
    for width in args.hidden:
        x = paddle.static.nn.fc(x, width, activation="relu")
    logit = paddle.static.nn.fc(x, 1)
    loss = paddle.mean(paddle.nn.functional.binary_cross_entropy_with_logits(logit, paddle.cast(label, "float32")))
    prob = paddle.nn.functional.sigmoid(logit)
    _, _, auc_states = paddle.static.auc(paddle.concat([1 - prob, prob], axis=1), label)
    return [label, dense] + slots, loss, auc_states


def strategy(fleet, args):
    s = fleet.DistributedStrategy()
    s.a_sync = True
    s.a_sync_configs = {"k_steps": 0}
    p = f"table_parameters.{TABLE}."
    table = {
        p + "table_class": "MemorySparseTable",
        p + "shard_num": 16,
        p + "accessor.accessor_class": "SparseAccessor",
        p + "accessor.fea_dim": args.emb_dim + 2,
        p + "accessor.embedx_dim": args.emb_dim - 1,
    }
    for part in ("embed_sgd_param", "embedx_sgd_param"):
        k = f"{p}accessor.{part}."
        table.update({k + "name": "SparseAdaGradSGDRule", k + "adagrad.learning_rate": 2.0,
                      k + "adagrad.initial_range": 1e-4, k + "adagrad.weight_bounds": [-10.0, 10.0],
                      k + "adagrad.initial_g2sum": 3.0})
    s.sparse_table_configs = {TABLE: table}
    return s


# -- the exe.run(feed) loop's Python reader ---------------------------------------------------------------
def read_batches(files, batch_size):
    """Yield lists of parsed rows ``(label, dense[13], [ids per slot])`` from MultiSlot text."""
    batch = []
    for path in files:
        with open(path) as f:
            for line in f:
                tok = line.split()
                label = int(tok[1])
                n = int(tok[2])
                dense = [float(v) for v in tok[3:3 + n]]
                pos, sparse = 3 + n, []
                for _ in range(NUM_SLOTS):
                    c = int(tok[pos])
                    sparse.append([int(v) for v in tok[pos + 1:pos + 1 + c]])
                    pos += 1 + c
                batch.append((label, dense, sparse))
                if len(batch) == batch_size:
                    yield batch
                    batch = []
    if batch:
        yield batch


def to_feed(paddle, batch, place):
    feed = {"label": np.array([[r[0]] for r in batch], dtype="int64"),
            "dense_input": np.array([r[1] for r in batch], dtype="float32")}
    for i in range(NUM_SLOTS):
        ids = [r[2][i] for r in batch]
        flat = np.array([v for row in ids for v in row], dtype="int64").reshape(-1, 1)
        feed[f"s{i}"] = paddle.base.create_lod_tensor(flat, [[len(row) for row in ids]], place)
    return feed


def feed_loop(paddle, exe, loss, files, args):
    place = paddle.CPUPlace()
    main = paddle.static.default_main_program()
    out = {"examples": 0, "batches": 0, "capped": False, "exe_seconds": 0.0, "first_batch": None}
    out["loop_start"] = time.time()
    for batch in read_batches(files, args.batch_size):
        feed = to_feed(paddle, batch, place)
        t = time.time()
        if out["first_batch"] is None:
            out["first_batch"] = t
        exe.run(main, feed=feed, fetch_list=[loss])
        out["exe_seconds"] += time.time() - t
        out["examples"] += len(batch)
        out["batches"] += 1
        if args.max_batches and out["batches"] >= args.max_batches or \
                args.max_seconds and time.time() - out["loop_start"] >= args.max_seconds:
            out["capped"] = True
            break
    out["loop_end"] = time.time()
    return out


def dataset_loop(paddle, exe, feeds, auc_states, files, args):
    dataset = paddle.distributed.QueueDataset()
    dataset.init(use_var=feeds, pipe_command="cat", batch_size=args.batch_size, thread_num=args.threads)
    dataset.set_filelist(files)
    start = time.time()
    exe.train_from_dataset(program=paddle.static.default_main_program(), dataset=dataset)
    end = time.time()
    scope = paddle.static.global_scope()
    # The AUC op's bucket counts hold every example this worker trained on.
    examples = int(sum(np.array(scope.find_var(v.name).get_tensor()).sum() for v in auc_states[2:]))
    return {"examples": examples, "batches": -(-examples // args.batch_size), "capped": False,
            "loop_start": start, "first_batch": start, "loop_end": end}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", required=True, help="dataset dir with stats.json and train/part-*.txt")
    ap.add_argument("--loop", choices=["feed", "dataset"], default="feed")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--emb-dim", type=int, default=9)
    ap.add_argument("--hidden", type=int, nargs="+", default=[256, 128])
    ap.add_argument("--vocab", type=int, default=1 << 20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--lr", type=float, default=0.001)
    ap.add_argument("--max-seconds", type=float, default=0, help="feed loop: stop after this long (0: no cap)")
    ap.add_argument("--max-batches", type=int, default=0, help="feed loop: stop after this many batches")
    args = ap.parse_args()

    paddle = import_paddle()
    import paddle.distributed.fleet as fleet

    fleet.init(is_collective=False)
    feeds, loss, auc_states = build_net(paddle, args)
    optimizer = fleet.distributed_optimizer(paddle.optimizer.Adam(learning_rate=args.lr), strategy(fleet, args))
    optimizer.minimize(loss)

    if fleet.is_server():
        fleet.init_server()
        fleet.run_server()  # until worker 0 stops the servers
        return

    exe = paddle.static.Executor(paddle.CPUPlace())
    exe.run(paddle.static.default_startup_program())
    fleet.init_worker()
    fleet.barrier_worker()
    stats = json.load(open(os.path.join(args.data, "stats.json")))
    shards = [os.path.join(args.data, p) for p in stats["shards"]["train"]]
    files = shards[fleet.worker_index()::fleet.worker_num()]
    if args.loop == "feed":
        result = feed_loop(paddle, exe, loss, files, args)
    else:
        result = dataset_loop(paddle, exe, feeds, auc_states, files, args)
    result.update(worker=fleet.worker_index(), loop=args.loop,
                  rows=sum(stats["shard_rows"]["train"][fleet.worker_index()::fleet.worker_num()]))
    print("@bench " + json.dumps(result), flush=True)

    fleet.barrier_worker()
    fleet.stop_worker()
    fleet.barrier_worker()
    if fleet.worker_index() == 0:
        fleet.fleet._runtime_handle._worker.stop_server()


if __name__ == "__main__":
    main()
