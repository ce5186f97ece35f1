"""A docker-compose file for one PS job on one host, generated from the config.

    python -m components.train.backends.docker_compose [overrides...] [--out containers/docker-compose.yaml]
    docker compose -f containers/docker-compose.yaml up --abort-on-container-failure

Services: ``prep`` builds the dataset into the ``dataset`` volume and exits; ``ps-<i>`` servers start once it
succeeded; ``worker-<i>`` workers start once every server is ready for them (:func:`ready_endpoints`).
Servers and workers run ``python -m components.ps.role`` with exactly the environment
:func:`components.ps.contract.role_env` gives their role (endpoints are the compose service names) plus the job
spec in ``PS_JOB_SPEC``. Checkpoints go to
the ``checkpoints`` volume (``checkpoint.uri`` = :data:`CHECKPOINT_MOUNT`) unless the config names a remote store.
The mount points are directories of the image (``containers/Dockerfile``), owned by the non-root user.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path, PurePosixPath
from typing import Optional

import yaml

from components.config import (ConfigError, CtrConfig, DataSource, from_dict, is_remote_uri, register_configs,
                               to_dict, validate)
from components.ps.contract import SPEC_ENV, ClusterLayout, JobSpec, Role, host_layout, ready_probe_command, role_env
# The container contract the pods use too: the scratch directory and the gloo port rule.
from components.train.backends.manifests import SCRATCH, gloo_port
from components.train.job import planned_config

PROJECT = "ctr-ps"  # the compose project name, also the job id the gloo store prefixes its keys with
DATA_MOUNT = "/data"
CHECKPOINT_MOUNT = "/checkpoints"
# A sub-directory, not the mount itself: data prep stages a sibling directory and renames it into place.
DATA_DIR = f"{DATA_MOUNT}/dataset"
HEALTHCHECK_INTERVAL_S = 2
PREPARE_COMMAND = "prepare-data"
REGENERATE = "python -m components.train.backends.docker_compose --out containers/docker-compose.yaml"


def compose_layout(cfg: CtrConfig) -> ClusterLayout:
    """Every process listens on ``cluster.paddle_port`` of its own container, named by its service."""
    return host_layout(lambda role, i: f"{'ps' if role is Role.SERVER else 'worker'}-{i}", cfg.ps.servers,
                       cfg.ps.workers, cfg.cluster.paddle_port, gloo_port(cfg), job_id=PROJECT)


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
    local = _local_path(checkpoint.uri)
    if local is not None and not PurePosixPath(local).is_relative_to(CHECKPOINT_MOUNT):
        raise ConfigError("checkpoint.uri", checkpoint.uri,
                          f"a path under {CHECKPOINT_MOUNT} (the shared checkpoints volume) or a remote fsspec URL",
                          "any other local path exists in one container only")


def _escape(value: str) -> str:
    return value.replace("$", "$$")  # compose interpolates ${...}; $$ is a literal $


def compose_file(cfg: CtrConfig, image: str, gpu_image: str) -> dict:
    """The compose document for ``cfg``: data prep, ``ps.servers`` servers, ``ps.workers`` workers.

    Workers run ``gpu_image`` and reserve ``cluster.workers.gpus`` GPUs each (distinct devices) when that is
    > 0, else ``image``. Storage credentials are passed through from the shell running ``docker compose`` by
    name only (``cluster.storage_secrets`` keys), never written into the file.
    """
    _check(cfg)
    layout = compose_layout(cfg)
    # A compose job always starts fresh (_check), so nothing is restored and the shard count is the planner's.
    spec = JobSpec(config=to_dict(planned_config(cfg, None)[0]), data_dir=DATA_DIR, workdir=f"{SCRATCH}/work",
                   staging_dir=f"{SCRATCH}/staging").to_json()
    credentials = {name: None for secret in cfg.cluster.storage_secrets for name in secret.keys}
    store_is_local = _local_path(cfg.checkpoint.uri) is not None
    role_volumes = [f"dataset:{DATA_MOUNT}:ro"] + ([f"checkpoints:{CHECKPOINT_MOUNT}"] if store_is_local else [])
    common = {
        "user": str(cfg.cluster.run_as_user),
        # An init as PID 1 forwards `docker compose down`'s SIGTERM and reaps Paddle's helper processes.
        "init": True,
    }

    def role_service(role: Role, index: int, service_image: str) -> dict:
        env = {**role_env(layout, role, index), SPEC_ENV: spec}
        return {"image": service_image, **common, "command": ["python", "-m", "components.ps.role"],
                "environment": {**{k: _escape(v) for k, v in env.items()}, **credentials},
                "volumes": list(role_volumes)}

    services = {"prep": {"image": image, **common,
                         "command": ["python", "-m", "components.train.backends.docker_compose", PREPARE_COMMAND],
                         "environment": {SPEC_ENV: _escape(spec), **credentials},
                         "volumes": [f"dataset:{DATA_MOUNT}"]}}
    for i in range(cfg.ps.servers):
        server = role_service(Role.SERVER, i, image)
        server["depends_on"] = {"prep": {"condition": "service_completed_successfully"}}
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
    volumes = {"dataset": {}, **({"checkpoints": {}} if store_is_local else {})}
    return {"name": PROJECT, "services": services, "volumes": volumes}


def load_config(overrides: list[str]) -> CtrConfig:
    """The real conf/ composed with ``overrides``, container paths first so that overrides win; validated."""
    from hydra import compose, initialize_config_dir

    import conf

    register_configs()
    with initialize_config_dir(config_dir=str(Path(conf.__file__).parent), version_base="1.3"):
        raw = compose("config", overrides=[f"run_dir={SCRATCH}", f"checkpoint.uri={CHECKPOINT_MOUNT}", *overrides])
    cfg = from_dict(raw)
    validate(cfg)
    return cfg


def generate(overrides: list[str], image: Optional[str] = None, gpu_image: Optional[str] = None) -> str:
    """The compose YAML; images default to the config's ``cluster.servers`` / ``cluster.workers`` image
    references (``name@digest`` when ``*.image.digest`` is set)."""
    cfg = load_config(overrides)
    doc = compose_file(cfg, image or cfg.cluster.servers.image.reference,
                       gpu_image or cfg.cluster.workers.image.reference)
    command = " ".join(["python -m components.train.backends.docker_compose", *overrides])
    header = f"# Generated by `{command}`; do not edit, regenerate.\n"
    return header + yaml.safe_dump(doc, sort_keys=False, width=1 << 20)


def prepare_from_spec() -> dict:
    """The ``prep`` service: build the dataset the job spec in ``$PS_JOB_SPEC`` describes at its ``data_dir``."""
    from components.data_prep.step import prepare_dataset

    spec = JobSpec.load(None)
    return prepare_dataset(spec.config, spec.data_dir)


def main(argv: list[str]) -> int:
    if argv[:1] == [PREPARE_COMMAND]:
        stats = prepare_from_spec()
        rows = stats["rows"]
        print(f"dataset ready: {rows['train']:,} train + {rows['test']:,} test rows", flush=True)
        return 0
    parser = argparse.ArgumentParser(prog="python -m components.train.backends.docker_compose", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("overrides", nargs="*", help="Hydra overrides, as for python -m pipelines.ctr")
    parser.add_argument("--out", help="file to write (default: stdout)")
    parser.add_argument("--image", help="prep and server image (default: cluster.servers.image)")
    parser.add_argument("--gpu-image",
                        help="worker image when cluster.workers.gpus > 0 (default: cluster.workers.image)")
    args = parser.parse_args(argv)
    try:
        text = generate(args.overrides, args.image, args.gpu_image)
    except ConfigError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
