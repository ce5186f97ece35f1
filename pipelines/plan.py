"""``plan=true``: what a run would do, printed before anything starts (no step, no PS process, no checkpoint).

Every number comes from the code the run itself uses: the data plan of the data-prep step
(:func:`components.data_prep.step.data_plan`: the files, their sizes, the shards), the job preparation of the
train step (:func:`components.train.job.plan_job`: the restore target, the job's plan: ``shard_num``, the memory plan),
the plan of every other process (:func:`components.train.process_plan.plan_processes`: workers, the evaluate and export
steps, a serving replica; on Kubeflow the steps' memory requests it sets), the bytes the job's workers and servers
exchange (:func:`components.train.network_plan.plan_network`), the local launcher's layout
(:func:`components.train.backends.local.local_layout`). The memory plan bounds the rows by ``table.vocab_size``:
the distinct ids that bound them tighter are counted by data prep.
"""

from __future__ import annotations

from collections import defaultdict

from components.config import CtrConfig, DataSource, PipelineRunner
from components.data_prep.prepare import SYNTHETIC, synthetic_split_rows
from components.data_prep.step import data_plan
from components.train.job import PreparedJob, plan_job, plan_lines, resolve_plan
from components.train.network_plan import plan_network
from components.train.planner import MIB, size
from components.train.process_plan import ProcessesPlan, data_shape, plan_processes, step_memories


def plan_lines_of(cfg: CtrConfig) -> list[str]:
    """The plan of ``cfg`` (a local run's config: :func:`pipelines.local.local_config`), as lines to print."""
    on_kubeflow = cfg.cluster.runner is PipelineRunner.kubeflow
    lines = ["plan: what this command would run (nothing was started; run it without plan=true to start)"]
    lines += [f"  {line}" for line in (_remote_data_lines(cfg) if on_kubeflow else data_lines(cfg))]
    lines.append(f"  model       {cfg.model.name.value}, hidden {list(cfg.model.hidden)}; mode {cfg.ps.mode.value}, "
                 f"up to {cfg.ps.epochs} epoch(s), batch {cfg.ps.batch_size} per worker thread")
    if on_kubeflow:
        # The cluster's storage is read with the cluster's credentials, by the train step: a fresh start assumed.
        plan = resolve_plan(cfg, None, None)
        processes = plan_processes(cfg, data_shape(cfg), plan)
        job_lines = ["checkpoint  resume/warm-start resolved by the train step in the cluster's storage",
                     *plan_lines(plan.memory)]
        lines += [f"  {line}" for line in job_lines + processes.lines() + [plan_network(cfg, processes.data).line()]
                  + step_lines(cfg, processes) + pod_lines(cfg)]
    else:
        from components.checkpoint.store import CheckpointStore

        job = plan_job(cfg, None, CheckpointStore(cfg.checkpoint.uri))
        processes = plan_processes(cfg, data_shape(cfg), job.plan)
        lines += [f"  {line}" for line in plan_lines(job.plan.memory) + processes.lines()
                  + [plan_network(cfg, processes.data).line()] + process_lines(job)]
        lines.append(f"  checkpoint  {job.store.display_uri}: "
                     f"{job.restore.describe() if job.restore else 'a fresh start'}; keeps the last "
                     f"{cfg.checkpoint.keep_last}, one every {cfg.checkpoint.every_passes} pass(es)")
        lines.append(f"  outputs     {cfg.run_dir}")
    return lines


def data_lines(cfg: CtrConfig) -> list[str]:
    """The input as the data-prep step plans it: files and sizes (or synthetic rows), and the shards."""
    plan = data_plan(cfg)
    workers = cfg.ps.workers
    shards = (f"shards      {plan.num_shards} train shard(s), {plan.num_shards // workers} per worker "
              f"(data.shards_per_worker); worker i reads shards i, i+{workers}, ...")
    if plan.fmt == SYNTHETIC:
        train, valid, test = synthetic_split_rows(plan.synthetic["rows"], plan.test_fraction, plan.valid_fraction)
        return [f"data        synthetic: {plan.synthetic['rows']:,} rows ({train:,} train, {valid:,} validation, "
                f"{test:,} test), seed {plan.seed}", shards]
    sizes: dict[str, int] = defaultdict(int)
    for unit in plan.units:  # a file's units cover it end to end: its size is where the last one ends
        sizes[unit["url"]] = max(sizes[unit["url"]], int(unit["end"]))
    lines = [f"data        {len(sizes)} file(s) of data.format={plan.fmt}, {_size(sum(sizes.values()))} in "
             f"{len(plan.units)} unit(s); rows are counted by data prep"]
    lines += [f"              {url}  {nbytes:,} B" for url, nbytes in list(sizes.items())[:10]]
    if len(sizes) > 10:
        lines.append(f"              ... and {len(sizes) - 10} more")
    return lines + [shards]


def _size(nbytes: int) -> str:
    return size(nbytes) if nbytes >= MIB else f"{nbytes:,} B"


def _remote_data_lines(cfg: CtrConfig) -> list[str]:
    what = (f"{cfg.data.uri} (data.format={cfg.data.format.value}), listed by the run's first step"
            if cfg.data.source is DataSource.files else f"synthetic: {cfg.data.rows:,} rows")
    return [f"data        {what}"]


def process_lines(job: PreparedJob) -> list[str]:
    """The local backend's processes, on the ports free now (the job picks its own when it starts)."""
    from components.train.backends.local import local_layout

    ps = job.cfg.ps
    layout = local_layout(ps.servers, ps.workers, ps.host, job.run_id)
    roles = ([f"server-{i} {endpoint}" for i, endpoint in enumerate(layout.server_endpoints)]
             + [f"worker-{i} {endpoint}" for i, endpoint in enumerate(layout.worker_endpoints)])
    return [f"processes   {ps.servers} server(s) + {ps.workers} worker(s) on this machine: {', '.join(roles)}; "
            f"rendezvous {layout.gloo_endpoint} (ports free now; the job picks its own when it starts)"]


def step_lines(cfg: CtrConfig, processes: ProcessesPlan) -> list[str]:
    """The memory the planned Kubeflow steps get (:func:`components.train.process_plan.step_memories`), as the compiled
    pipeline requests it."""
    memories = step_memories(cfg, processes)
    return ["steps       memory " + "; ".join(f"{step} {quantity} ({source})"
                                              for step, (quantity, source) in memories.items())]


def pod_lines(cfg: CtrConfig) -> list[str]:
    cluster = cfg.cluster

    def pods(role: str, count: int, pod) -> str:
        gpus = f", {pod.gpus} GPU(s)" if pod.gpus else ""
        return f"{count} {role} pod(s) ({pod.cpu} CPU, {pod.memory}{gpus}, {pod.image.reference})"

    return [f"pods        {cluster.backend.value} in namespace {cluster.namespace}: "
            f"{pods('server', cfg.ps.servers, cluster.servers)} + {pods('worker', cfg.ps.workers, cluster.workers)}, "
            f"port {cluster.paddle_port}"]
