"""A docker-compose file for one PS job on one host, generated from the config, and its job spec file.

    python -m components.train.backends.docker_compose [overrides...] --out containers/docker-compose.yaml
    docker compose -f containers/docker-compose.yaml up --abort-on-container-failure

Services: ``prep`` builds the dataset into the ``dataset`` volume and exits; ``watch`` then takes the checkpoint
store's lease for the job and follows it (:func:`watch_from_spec`); ``ps-<i>`` servers start once it holds the lease;
``worker-<i>`` workers start once every server is ready for them (:func:`ready_endpoints`);
``evaluate`` scores the last checkpoint on the test split once every server and worker exited 0, writing the
report into the ``evaluation`` volume and ``EVALUATION.json`` into the store. In the ``serving`` profile
(``docker compose --profile serving up``; a plain ``up`` runs the job alone and ends), ``export`` then writes the
evaluated checkpoint into the export store (the ``exports`` volume, ``export.uri`` = :data:`EXPORT_MOUNT`) when its
test AUC passes ``eval.min_auc``, and ``serving`` runs the online server on it, published on 127.0.0.1:8080 only,
healthy once ``/v2/health/ready`` answers. Servers and workers run
``python -m components.ps.role`` with exactly the environment :func:`components.ps.contract.role_env` gives
their role (endpoints are the compose service names). The job spec is one file beside the compose file
(:func:`spec_path`), mounted read-only into every service at :data:`SPEC_MOUNT` and named on its command line.
Checkpoints go to the ``checkpoints`` volume (``checkpoint.uri`` = :data:`CHECKPOINT_MOUNT`) unless the config
names a remote store. The mount points are directories of the image (``containers/Dockerfile``), owned by the
non-root user. No service restarts itself: a PS job restarts whole (every role resumes from the run's newest
checkpoint), which compose cannot say. The file's ``x-ctr-ps`` block (:data:`RESTART_BLOCK`) tells a driver that
can (``containers/compose_up.py``) what to restart together (``watch`` and the roles, never ``prep``), how often
(``cluster.max_restarts``) and which exit statuses no restart mends; the driver names each run and counts its
attempts in two variables the roles' environment interpolates (:data:`RUN_VARIABLE`, :data:`ATTEMPT_VARIABLE`). A
plain ``docker compose up`` leaves them unset: attempt 0, and a failed role fails the job.

Compose has no launcher, so ``watch`` does what the other backends' launchers do besides starting roles: it holds
the store's lease while the job runs, cleans what a killed job left in the store before any role starts, and reads
the roles' heartbeat records under the one stall rule (:mod:`components.train.liveness`). A role that stalls, or a
lease that is lost (another run took the store over), makes it exit 1, and ``up --abort-on-container-failure``
(``containers/compose_up.py`` on podman) stops every container: the job stops, or the driver restarts it. It exits
0 once every worker recorded it is done, :data:`~components.ps.contract.STORE_REFUSED_EXIT` when the store refused
it or the lease was lost (no restart mends that). A plain ``up`` without the flag would leave the other containers
running.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path, PurePosixPath
from typing import Optional

import yaml

from components.config import ConfigError, CtrConfig, DataSource, ExportFormat, from_dict, register_configs, to_dict
from components.config_rules import is_remote_uri, validate
from components.export.serve_command import PUBLIC_KEY_ENV, READY_PATH, SERVING_PORT, serve_command
from components.export.store import export_store_uri
from components.ps import tls
from components.ps.contract import (RESTART_ENV, RUN_ID_ENV, STORE_REFUSED_EXIT, ClusterLayout, JobSpec, Role,
                                    host_layout, ready_probe_command, role_env)
# The container contract the pods use too: the scratch directory and the gloo port rule.
from components.train.backends.manifests import SCRATCH, gloo_port
from components.train.planner import job_plan
from components.train.restarts import NOT_RESTARTED

PROJECT = "ctr-ps"  # the compose project name, also the job id the gloo store prefixes its keys with
DATA_MOUNT = "/data"
CHECKPOINT_MOUNT = "/checkpoints"
EVALUATION_MOUNT = "/evaluation"
EXPORT_MOUNT = "/serving"  # the export store, written by `export`, read by `serving`
# Where the export signing key pair is made on first use and found (`export.signing_key=auto`: the per-user key of
# components/export/signing.py under HOME, /scratch): a volume, so that `serving` verifies with `export`'s key.
SIGNING_MOUNT = "/scratch/.config/paddle-ps-pipelines/export-signing"
SERVING_PROFILE = "serving"  # the services that serve: started by `--profile serving` only (they do not end)
JOB_NETWORK, STORE_NETWORK, SERVING_NETWORK = "job", "store", "serving"  # compose_networks
SPEC_MOUNT = "/etc/ctr-ps/job-spec.json"
# A sub-directory, not the mount itself: data prep stages a sibling directory and renames it into place.
DATA_DIR = f"{DATA_MOUNT}/dataset"
HEALTHCHECK_INTERVAL_S = 2
BASELINE_DIR = f"{DATA_MOUNT}/baseline"  # the fitted baseline, beside the dataset: prep fits it
PREPARE_COMMAND = "prepare-data"
EVALUATE_COMMAND = "evaluate"
EXPORT_COMMAND = "export"
WATCH_COMMAND = "watch"
WATCH_READY = f"{SCRATCH}/watch.ready"  # written once the watch holds the store's lease: the roles may start
# Set by the driver of a run (containers/compose_up.py), interpolated into the roles' environment: the run's id
# (a restarted attempt resumes only its own run's checkpoints) and the attempt.
RUN_VARIABLE, ATTEMPT_VARIABLE = "CTR_PS_RUN", "CTR_PS_ATTEMPT"
RESTART_BLOCK = "x-ctr-ps"  # compose ignores top-level x- keys; the driver reads its restart rule there
REGENERATE = "python -m components.train.backends.docker_compose --out containers/docker-compose.yaml"


def role_service_name(role: Role, index: int) -> str:
    return f"{'ps' if role is Role.SERVER else 'worker'}-{index}"


def compose_layout(cfg: CtrConfig) -> ClusterLayout:
    """Every process listens on ``cluster.paddle_port`` of its own container, named by its service (with TLS on,
    the rendezvous store listens on loopback behind server 0's terminator:
    :func:`components.ps.tls.store_on_loopback`)."""
    return host_layout(role_service_name, cfg.ps.servers, cfg.ps.workers, cfg.cluster.paddle_port, gloo_port(cfg),
                       job_id=PROJECT)


def ready_endpoints(layout: ClusterLayout, server: int) -> list[str]:
    """Where a server accepts TCP once workers may start (any one of them).

    Server 0 opens its PS port only after every process joined the gloo rendezvous it hosts, so before the
    workers start it is ready when its rendezvous store listens (what the local launcher waits for too).
    """
    endpoint = layout.server_endpoints[server]
    return [layout.gloo_endpoint, endpoint] if server == 0 else [endpoint]


def _local_path(uri: str) -> Optional[str]:
    return None if is_remote_uri(uri) else uri.removeprefix("file://")


def _check(cfg: CtrConfig) -> None:
    """What a compose file cannot do, refused before it is written."""
    checkpoint = cfg.checkpoint
    # LocalJob and the train step resolve a restore target when the job starts; a static file cannot.
    if checkpoint.resume != "none":
        raise ConfigError("checkpoint.resume", checkpoint.resume, "'none' in a compose file",
                          "a compose job always starts fresh; resume with python -m pipelines.ctr")
    if checkpoint.warm_start:
        raise ConfigError("checkpoint.warm_start", checkpoint.warm_start, "null in a compose file")
    if cfg.data.source is DataSource.files and _local_path(cfg.data.uri or "") is not None:
        raise ConfigError("data.uri", cfg.data.uri, "a remote fsspec URL (s3://...) in a compose file",
                          "the prep container sees no path of this machine")
    for key, uri, mount, volume in (("checkpoint.uri", checkpoint.uri, CHECKPOINT_MOUNT, "checkpoints"),
                                    ("export.uri", export_store_uri(cfg), EXPORT_MOUNT, "exports")):
        local = _local_path(uri)
        if local is not None and not PurePosixPath(local).is_relative_to(mount):
            raise ConfigError(key, uri, f"a path under {mount} (the shared {volume} volume) or a remote fsspec URL",
                              "any other local path exists in one container only")


def _escape(value: str) -> str:
    return value.replace("$", "$$")  # compose interpolates ${...}; $$ is a literal $


def tls_path(compose_path: Path) -> Path:
    """The directory of the job's TLS files beside a compose file: one sub-directory per role's service, mounted
    read-only at :data:`components.ps.tls.TLS_DIR` in that service only (its key is in no other container)."""
    return compose_path.with_name(f"{compose_path.stem}.tls")


def spec_path(compose_path: Path) -> Path:
    """The job spec file that goes with a compose file: beside it, named after it."""
    return compose_path.with_name(f"{compose_path.stem}.job-spec.json")


def fits_baseline(cfg: CtrConfig) -> bool:
    """Whether prep fits the baseline: the evaluation scores it (``eval.baseline``), or the model blends it in."""
    return cfg.eval.baseline or cfg.model.blend_baseline


def job_spec(cfg: CtrConfig) -> str:
    """The spec every service reads, as the file holds it (indented: it is the readable record of the job)."""
    # A compose job always starts fresh (_check), so nothing is restored and the shard count is the planner's; its data
    # is prepared inside the file, with the config's negative sample rate.
    spec = JobSpec(config=to_dict(cfg), plan=job_plan(cfg), data_dir=DATA_DIR, workdir=f"{SCRATCH}/work",
                   staging_dir=f"{SCRATCH}/staging", baseline=BASELINE_DIR if fits_baseline(cfg) else "")
    return json.dumps(json.loads(spec.to_json()), indent=2, sort_keys=True) + "\n"


def compose_file(cfg: CtrConfig, image: str, gpu_image: str, spec_file: str, tls_dir: str) -> dict:
    """The compose document for ``cfg``: data prep, ``ps.servers`` servers, ``ps.workers`` workers, evaluation.

    ``spec_file`` is the job spec's path relative to the compose file (compose resolves it from there). Workers
    run ``gpu_image`` and reserve ``cluster.workers.gpus`` GPUs each (distinct devices) when that is > 0, else
    ``image``. Storage credentials are passed through from the shell running ``docker compose`` by name only
    (``cluster.storage_secrets`` keys), never written into the file. With TLS on (:func:`components.ps.tls.tls_on`)
    each role speaks brpc's own TLS and reaches the store through its terminator (``python -m components.ps.tls``,
    in the role's container: it lives and dies with the role, and compose's readiness and exit rules stay the
    role's), its TLS files mounted from ``tls_dir/<service>`` (relative to the compose file), its host named
    ``localhost`` so that a worker's brpc client service binds loopback (:mod:`components.ps.tls`).
    """
    _check(cfg)
    hosts = compose_layout(cfg)
    secure = tls.tls_on(cfg, compose=True)
    layout = tls.store_on_loopback(hosts) if secure else hosts  # where the roles listen (the health checks ask)
    credentials = {name: None for secret in cfg.cluster.storage_secrets for name in secret.keys}
    store = [f"checkpoints:{CHECKPOINT_MOUNT}"] if _local_path(cfg.checkpoint.uri) is not None else []
    spec_volume = f"./{spec_file}:{SPEC_MOUNT}:ro"
    networks = compose_networks(cfg)
    job_networks = [name for name in networks if name != SERVING_NETWORK]

    def service(service_image: str, command: list[str], env: dict, volumes: list[str]) -> dict:
        return {"image": service_image, "user": str(cfg.cluster.run_as_user), "networks": list(job_networks),
                # An init as PID 1 forwards `docker compose down`'s SIGTERM and reaps Paddle's helper processes.
                "init": True,
                "restart": "no",  # the job decides: a failed role fails the job
                "command": [*command, SPEC_MOUNT],
                **({"environment": {**{k: _escape(v) for k, v in env.items()}, **credentials}}
                   if env or credentials else {}),
                "volumes": [spec_volume, *volumes]}

    def role_service(role: Role, index: int, service_image: str) -> dict:
        command, env, volumes = ["python", "-m", "components.ps.role"], role_env(hosts, role, index), []
        if secure:  # brpc's TLS preloaded, the store on loopback behind the terminator
            command = ["python", "-m", "components.ps.tls", "--", *command]
            volumes = [f"./{tls_dir}/{role_service_name(role, index)}:{tls.TLS_DIR}:ro"]
        role_doc = service(service_image, command, env, [f"dataset:{DATA_MOUNT}:ro", *store, *volumes])
        role_doc["environment"].update({RESTART_ENV: f"${{{ATTEMPT_VARIABLE}:-0}}",
                                        RUN_ID_ENV: f"${{{RUN_VARIABLE}:-{PROJECT}}}"})  # not escaped: interpolated
        return {**role_doc, "hostname": "localhost"} if secure else role_doc

    module = ["python", "-m", "components.train.backends.docker_compose"]
    services = {"prep": service(image, [*module, PREPARE_COMMAND], {}, [f"dataset:{DATA_MOUNT}"])}
    watch = service(image, [*module, WATCH_COMMAND], {}, store)
    watch["depends_on"] = {"prep": {"condition": "service_completed_successfully"}}
    watch["healthcheck"] = {"test": ["CMD", "test", "-f", WATCH_READY], "interval": f"{HEALTHCHECK_INTERVAL_S}s",
                            "timeout": f"{HEALTHCHECK_INTERVAL_S}s",
                            "retries": -(-int(cfg.ps.startup_timeout_s) // HEALTHCHECK_INTERVAL_S)}
    services["watch"] = watch
    for i in range(cfg.ps.servers):
        server = role_service(Role.SERVER, i, image)
        server["depends_on"] = {"prep": {"condition": "service_completed_successfully"},
                                "watch": {"condition": "service_healthy"}}
        # Retries span ps.startup_timeout_s, as long as the local launcher waits for a server.
        server["healthcheck"] = {"test": ["CMD", *ready_probe_command(ready_endpoints(layout, i))],
                                 "interval": f"{HEALTHCHECK_INTERVAL_S}s",
                                 "timeout": f"{HEALTHCHECK_INTERVAL_S}s",
                                 "retries": -(-int(cfg.ps.startup_timeout_s) // HEALTHCHECK_INTERVAL_S)}
        services[f"ps-{i}"] = server
    gpus = cfg.cluster.workers.gpus
    for i in range(cfg.ps.workers):
        worker = role_service(Role.WORKER, i, gpu_image if gpus > 0 else image)
        worker["depends_on"] = {f"ps-{s}": {"condition": "service_healthy"} for s in range(cfg.ps.servers)}
        if gpus > 0:
            # Explicit ids: with `count` every worker would get the same first GPUs of the host.
            device_ids = [str(d) for d in range(i * gpus, (i + 1) * gpus)]
            worker["deploy"] = {"resources": {"reservations": {"devices": [
                {"driver": "nvidia", "device_ids": device_ids, "capabilities": ["gpu"]}]}}}
        services[f"worker-{i}"] = worker
    evaluate = service(image, [*module, EVALUATE_COMMAND], {},
                       [f"dataset:{DATA_MOUNT}:ro", *store, f"evaluation:{EVALUATION_MOUNT}"])
    # Only a job whose every process (the watch too) exited 0 is evaluated.
    evaluate["depends_on"] = {name: {"condition": "service_completed_successfully"}
                              for name in services if name != "prep"}
    services["evaluate"] = evaluate
    volumes = {"dataset": {}, **({"checkpoints": {}} if store else {}), "evaluation": {}}
    # A single-file export is an artifact of the export step, not a store a server follows: nothing to serve here.
    if cfg.export.format is ExportFormat.sharded:
        exports = [f"exports:{EXPORT_MOUNT}"] if _local_path(export_store_uri(cfg)) is not None else []
        # The dataset too: its transform goes into the export, so the server takes raw records.
        export = service(image, [*module, EXPORT_COMMAND], {},
                         [f"dataset:{DATA_MOUNT}:ro", *store, *exports, f"signing:{SIGNING_MOUNT}"])
        export["depends_on"] = {"evaluate": {"condition": "service_completed_successfully"}}
        services["export"] = export
        services["serving"] = serving_service(cfg, image, credentials, [f"{v}:ro" for v in exports],
                                              [n for n in networks if n != JOB_NETWORK])
        for name in ("export", "serving"):
            services[name]["profiles"] = [SERVING_PROFILE]
        volumes.update({"exports": {}} if exports else {}, signing={})
    if cfg.export.format is not ExportFormat.sharded:
        del networks[SERVING_NETWORK]
    restarted = ["watch", *(name for name in services if name.startswith(("ps-", "worker-")))]
    return {"name": PROJECT, RESTART_BLOCK: {"max_restarts": cfg.cluster.max_restarts, "restart_together": restarted,
                                             "not_restarted_exits": list(NOT_RESTARTED)},
            "services": services, "volumes": volumes, "networks": networks}


def compose_networks(cfg: CtrConfig) -> dict[str, dict]:
    """The job's services talk on :data:`JOB_NETWORK`, an internal network (no route out of it, nothing published
    on it): only the job reaches the job. Only a remote store (data, checkpoints, exports) adds
    :data:`STORE_NETWORK`, a routed one, to reach it; the online server alone is on :data:`SERVING_NETWORK`, whose
    port is published on the host's loopback (a port is not published from an internal network)."""
    networks = {JOB_NETWORK: {"internal": True}, SERVING_NETWORK: {}}
    if any(is_remote_uri(uri) for uri in (cfg.data.uri, cfg.checkpoint.uri, export_store_uri(cfg))):
        networks[STORE_NETWORK] = {}
    return networks


def serving_service(cfg: CtrConfig, image: str, credentials: dict, exports: list[str], networks: list[str]) -> dict:
    """The online server on the export store (once ``export`` exited 0), on loopback only: the job's other
    services publish nothing, and it is on none of their networks. It verifies the export with ``export``'s public
    key (the ``signing`` volume)."""
    ready = f"http://127.0.0.1:{SERVING_PORT}{READY_PATH}"
    return {"image": image, "user": str(cfg.cluster.run_as_user), "networks": networks, "init": True, "restart": "no",
            "command": serve_command(export_store_uri(cfg), cfg.cluster.serving.name, host="0.0.0.0"),
            "environment": {PUBLIC_KEY_ENV: f"{SIGNING_MOUNT}/key.pub", **credentials},
            "volumes": [*exports, f"signing:{SIGNING_MOUNT}:ro"],
            "ports": [f"127.0.0.1:{SERVING_PORT}:{SERVING_PORT}"],
            "depends_on": {"export": {"condition": "service_completed_successfully"}},
            # urlopen raises on a refused connection and on any status but 2xx: not ready until the model loaded.
            "healthcheck": {"test": ["CMD", "python", "-c",
                                     f"import urllib.request; urllib.request.urlopen({ready!r}, timeout=2)"],
                            "interval": f"{HEALTHCHECK_INTERVAL_S}s", "timeout": f"{HEALTHCHECK_INTERVAL_S}s",
                            "retries": 60}}


def load_config(overrides: list[str]) -> CtrConfig:
    """The real conf/ composed with ``overrides``, container paths first so that overrides win; validated."""
    from hydra import compose, initialize_config_dir

    import conf

    register_configs()
    with initialize_config_dir(config_dir=str(Path(conf.__file__).parent), version_base="1.3"):
        raw = compose("config", overrides=[f"run_dir={SCRATCH}", f"checkpoint.uri={CHECKPOINT_MOUNT}",
                                           f"export.uri={EXPORT_MOUNT}", *overrides])
    cfg = from_dict(raw)
    validate(cfg)
    return cfg


def generate(overrides: list[str], out: Path, image: Optional[str] = None,
             gpu_image: Optional[str] = None) -> dict[Path, str]:
    """The compose YAML for ``out``, its job spec file (:func:`spec_path`) and, with TLS on, the job's TLS files
    (:func:`tls_path`: a new CA each time, so each generated file is a job of its own), by path; images default to
    the config's ``cluster.servers`` / ``cluster.workers`` image references (``name@digest`` when
    ``*.image.digest`` is set)."""
    cfg = load_config(overrides)
    spec, tls_dir = spec_path(out), tls_path(out)
    doc = compose_file(cfg, image or cfg.cluster.servers.image.reference,
                       gpu_image or cfg.cluster.workers.image.reference, spec.name, tls_dir.name)
    command = " ".join(["python -m components.train.backends.docker_compose", *overrides])
    header = f"# Generated by `{command}`; do not edit, regenerate.\n"
    plaintext = tls.plaintext_warning(cfg, compose=True)
    header += f"# {plaintext}\n" if plaintext else ""
    files = {out: header + yaml.safe_dump(doc, sort_keys=False, width=1 << 20), spec: job_spec(cfg)}
    if tls.tls_on(cfg, compose=True):
        for (role, index), role_files in tls.role_files(compose_layout(cfg)).items():
            files.update({tls_dir / role_service_name(role, index) / name: text for name, text in role_files.items()})
    return files


def write_files(files: dict[Path, str], run_as_user: int) -> None:
    """Write what :func:`generate` made, after removing an earlier job's TLS files; a TLS key is readable by its
    owner only, who is the containers' user (``cluster.run_as_user``) when this runs as root (the key is
    bind-mounted into the role's container)."""
    for tls_dir in {path.parent.parent for path in files if path.suffix == ".pem"}:
        shutil.rmtree(tls_dir, ignore_errors=True)
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        if path.suffix == ".pem":  # a role's key
            path.chmod(0o600)
            if os.geteuid() == 0:
                os.chown(path, run_as_user, -1)


def prepare_from_spec(spec_file: str) -> dict:
    """The ``prep`` service: build the dataset the job spec describes at its ``data_dir``."""
    from components.checkpoint.days import ledger_at
    from components.data_prep.step import prepare_dataset

    spec = JobSpec.load(spec_file)
    stats = prepare_dataset(spec.config, spec.data_dir, ledger_at)
    if spec.baseline:  # what the evaluation scores beside the model, and a model that blends it in scores with
        from components.evaluate.baseline_step import fit_baseline

        fit_baseline(spec.data_dir, spec.config["eval"]["baseline_rows"], spec.config["eval"]["baseline_features"],
                     spec.baseline)
    return stats


def evaluate_from_spec(spec_file: str, out_dir: str = EVALUATION_MOUNT) -> str:
    """The ``evaluate`` service: score the store's latest checkpoint on the test split into ``out_dir``
    (and ``EVALUATION.json`` at the store's root); returns the one-line summary it prints."""
    from components.checkpoint.store import CheckpointStore
    from components.evaluate.step import evaluate_checkpoint

    spec = JobSpec.load(spec_file)
    uri = spec.config["checkpoint"]["uri"]
    ckpt_id = CheckpointStore(uri).latest()
    if ckpt_id is None:
        raise SystemExit(f"error: no committed checkpoint in {uri}: the training services committed none")
    metrics, _ = evaluate_checkpoint(spec.config, spec.data_dir, "", {"uri": uri, "id": ckpt_id}, out_dir,
                                     baseline_dir=spec.baseline or None, compose=True)
    line = f"test auc={metrics['auc']:.4f} logloss={metrics['logloss']:.4f}"
    if "auc_ratio_to_bayes" in metrics:
        line += f" ({metrics['auc_ratio_to_bayes']:.3f} x Bayes auc {metrics['bayes_auc']:.4f})"
    return f"{line}, checkpoint {ckpt_id}; report: {out_dir}/report.html"


def watch_from_spec(spec_file: str, ready: Optional[str] = None) -> str:
    """The ``watch`` service: hold the store's lease for the job, clean what a killed job left in the store, say so
    in ``ready`` (default :data:`WATCH_READY`), then follow the roles' heartbeat records until every worker is done (:func:`liveness.watch`);
    raises :class:`~components.train.job.RoleFailed` for a role that stalls, a store error for a lost lease."""
    from components.checkpoint.lease import StoreLease, new_run_id
    from components.checkpoint.store import CheckpointStore
    from components.train import liveness
    from components.train.job import PsJobError, StopSignals, clean_store

    cfg = from_dict(JobSpec.load(spec_file).config)
    store, ps = CheckpointStore(cfg.checkpoint.uri), cfg.ps

    def stopped(signum: int) -> PsJobError:  # `compose down`, or the driver stopping a failed job: the lease goes back
        return PsJobError("watch", f"stopped by {signal.Signals(signum).name}; the store's lease is given back")

    with StopSignals(stopped), StoreLease(store, new_run_id()) as lease:
        clean_store(store)
        Path(ready or WATCH_READY).touch()
        started = time.monotonic()
        reader = liveness.Liveness(store, PROJECT, ps.stall_timeout_s, ps.startup_timeout_s + ps.stall_timeout_s)
        liveness.watch(reader, ps.servers, ps.workers, lease)
    return f"every worker is done after {time.monotonic() - started:.0f}s; no role stalled, the store's lease held"


def export_from_spec(spec_file: str, out_dir: str = f"{SCRATCH}/serving_model") -> str:
    """The ``export`` service: the checkpoint ``evaluate`` scored, as the next version of the export store, when its
    test AUC is at least ``eval.min_auc`` (the pipeline's gate); ``out_dir``: the version's copy the export step
    leaves as its artifact (in the container's scratch here). Returns the one-line summary it prints."""
    from components.checkpoint.evaluation import read_evaluation
    from components.export.step import export_serving_model

    spec = JobSpec.load(spec_file)
    cfg = from_dict(spec.config)
    evaluation = read_evaluation(cfg.checkpoint.uri)
    if evaluation is None:
        raise SystemExit(f"error: no evaluation in {cfg.checkpoint.uri}: the evaluate service recorded none")
    auc = evaluation["metrics"]["auc"]
    if auc < cfg.eval.min_auc:
        raise SystemExit(f"error: not exported: test AUC {auc:.4f} < eval.min_auc {cfg.eval.min_auc:g}")
    facts = export_serving_model(spec.config, "", {"uri": cfg.checkpoint.uri, "id": evaluation["checkpoint"]},
                                 out_dir, spec.data_dir)
    return f"version {facts['version']} ({facts['kind']}) of checkpoint {evaluation['checkpoint']} in {facts['store']}"


def main(argv: list[str]) -> int:
    if argv[:1] == [EXPORT_COMMAND] and len(argv) == 2:
        print(f"export: {export_from_spec(argv[1])}", flush=True)
        return 0
    if argv[:1] == [PREPARE_COMMAND] and len(argv) == 2:
        rows = prepare_from_spec(argv[1])["rows"]
        print(f"dataset ready: {rows['train']:,} train + {rows['test']:,} test rows", flush=True)
        return 0
    if argv[:1] == [WATCH_COMMAND] and len(argv) == 2:
        from components.checkpoint.store import CheckpointStoreError
        from components.train.job import PsJobError, PsJobStoreError

        try:
            print(f"watch: {watch_from_spec(argv[1])}", flush=True)
        except (PsJobStoreError, CheckpointStoreError) as err:  # the lease was refused or lost: no restart mends it
            print(f"error: {err}", file=sys.stderr, flush=True)
            return STORE_REFUSED_EXIT
        except PsJobError as err:  # a role stalled: the driver restarts the job, or stops it
            print(f"error: {err}", file=sys.stderr, flush=True)
            return 1
        return 0
    if argv[:1] == [EVALUATE_COMMAND] and len(argv) == 2:
        print(f"evaluation: {evaluate_from_spec(argv[1])}", flush=True)
        return 0
    parser = argparse.ArgumentParser(prog="python -m components.train.backends.docker_compose", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m pipelines.ctr")
    parser.add_argument("--out", required=True, type=Path,
                        help="the compose file to write; its job spec goes beside it (<name>.job-spec.json)")
    parser.add_argument("--image", help="prep and server image (default: cluster.servers.image)")
    parser.add_argument("--gpu-image",
                        help="worker image when cluster.workers.gpus > 0 (default: cluster.workers.image)")
    args = parser.parse_args(argv)
    try:
        cfg = load_config(args.overrides)
        files = generate(args.overrides, args.out, args.image, args.gpu_image)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    plaintext = tls.plaintext_warning(cfg, compose=True)
    if plaintext:
        print(plaintext, file=sys.stderr)
    write_files(files, cfg.cluster.run_as_user)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
