"""The container build (containers/Dockerfile, .dockerignore) and the generated docker-compose file.

No container engine runs these tests: the Dockerfile is parsed for what it promises (official Paddle 2.6.2 bases,
a non-root user that matches cluster.run_as_user, no credentials), the compose document is checked for the keys
and references this project relies on (not against the full compose specification), and the commands of the
prep and evaluate services run here on their job spec. `containers/check.sh` builds the image and runs the
committed layout in real containers (CI runs it).
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path, PurePosixPath

import pytest
import yaml

from components.checkpoint.evaluation import read_evaluation
from components.checkpoint.lease import LEASE, StoreLease
from components.checkpoint.store import CheckpointStore
from components.config import CtrConfig, SecretEnv, from_dict, to_dict
from components.config_rules import validate
from components.data_prep.prepare import prepare_synthetic
from components.ps.contract import (RESTART_ENV, RUN_ID_ENV, SPEC_ENV, STORE_REFUSED_EXIT, ClusterLayout, Role,
                                    role_env)
from components.ps.liveness import LIVENESS, HeartbeatRecord
from components.ps.strategy import rpc_gflags
from components.ps.tls import TLS_DIR
from components.train.backends import docker_compose as compose
from tests.conftest import FAKE_KEY_ID, FAKE_SECRET
from tests.export.checkpoints import build_checkpoint

from tests.conftest import ROOT
DOCKERFILE = ROOT / "containers" / "Dockerfile"
COMPOSE_YAML = ROOT / "containers" / "docker-compose.yaml"
SPEC_JSON = ROOT / "containers" / "docker-compose.job-spec.json"
PADDLE_BASE = re.compile(r"^paddlepaddle/paddle:2\.6\.2(?P<gpu>-gpu-cuda[\d.]+-cudnn[\d.]+(-trt[\d.]+)?)?$")
SECRET_NAME = re.compile(r"AWS|SECRET|PASSWORD|TOKEN|CREDENTIAL|ACCESS_KEY", re.IGNORECASE)
DEPENDENCY_CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


# -- Dockerfile ---------------------------------------------------------------------------------------------

def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    instructions, pending = [], ""
    for line in path.read_text().splitlines():
        if not pending and (not line.strip() or line.lstrip().startswith("#")):
            continue
        pending += line.rstrip()
        if pending.endswith("\\"):
            pending = pending[:-1] + " "
            continue
        keyword, _, args = pending.strip().partition(" ")
        instructions.append((keyword.upper(), args.strip()))
        pending = ""
    return instructions


def substitute(text: str, args: dict[str, str]) -> str:
    return re.sub(r"\$\{(\w+)\}|\$(\w+)", lambda m: args[m.group(1) or m.group(2)], text)


def arg_defaults(instructions) -> tuple[dict[str, str], dict[str, str]]:
    """The ARG defaults declared before the first FROM (usable in FROM lines) and after it."""
    global_args, stage_args, seen_from = {}, {}, False
    for keyword, args in instructions:
        if keyword == "FROM":
            seen_from = True
        elif keyword == "ARG":
            name, _, default = args.partition("=")
            (stage_args if seen_from else global_args)[name] = default
    return global_args, stage_args


def env_pairs(instructions) -> dict[str, str]:
    return dict(token.split("=", 1)
                for keyword, args in instructions if keyword == "ENV" for token in shlex.split(args))


def test_dockerfile_builds_on_the_official_paddle_262_images():
    instructions = dockerfile_instructions(DOCKERFILE)
    global_args, _ = arg_defaults(instructions)
    stages, bases = {}, []
    for keyword, args in instructions:
        if keyword == "FROM":
            image, _, alias = substitute(args, global_args).partition(" AS ")
            if image not in stages:
                assert PADDLE_BASE.match(image), f"base {image!r} is not an official paddlepaddle/paddle:2.6.2 image"
                bases.append(image)
            if alias:
                stages[alias.strip()] = image
    assert len([b for b in bases if PADDLE_BASE.match(b)["gpu"]]) == 1 and len(bases) == 2, bases
    # The last FROM picks the flavour: the default is the CPU image, FLAVOR=gpu the GPU one.
    final = [args for keyword, args in instructions if keyword == "FROM"][-1]
    assert not PADDLE_BASE.match(stages[substitute(final, global_args)])["gpu"]
    assert PADDLE_BASE.match(stages[substitute(final, {**global_args, "FLAVOR": "gpu"})])["gpu"]


def test_dockerfile_runs_as_the_configured_non_root_user():
    instructions = dockerfile_instructions(DOCKERFILE)
    _, stage_args = arg_defaults(instructions)
    users = [substitute(args, stage_args) for keyword, args in instructions if keyword == "USER"]
    assert users, "the image must switch to a non-root USER"
    uid = int(users[-1].split(":")[0])  # numeric, so that Kubernetes' runAsNonRoot can verify it
    prod = yaml.safe_load((ROOT / "conf" / "cluster" / "prod.yaml").read_text())
    assert uid != 0 and uid == CtrConfig().cluster.run_as_user
    assert "run_as_user" not in prod  # prod pods run as the schema's user too


def test_dockerfile_scratch_and_volume_mount_points_match_the_compose_file():
    instructions = dockerfile_instructions(DOCKERFILE)
    env = env_pairs(instructions)
    assert env["PYTHONUNBUFFERED"] == "1"
    assert env["HOME"] == env["TMPDIR"] == compose.SCRATCH
    assert [args for keyword, args in instructions if keyword == "WORKDIR"][-1] == compose.SCRATCH
    # The directories must exist in the image, owned by the app user, for named volumes to be writable.
    run = " ".join(args for keyword, args in instructions if keyword == "RUN" and "chown" in args)
    for path in (compose.SCRATCH, compose.DATA_MOUNT, compose.CHECKPOINT_MOUNT, compose.EVALUATION_MOUNT,
                 compose.EXPORT_MOUNT):
        assert re.search(rf"mkdir -p [^&]*{path}\b", run) and re.search(rf"chown [^&]*{path}\b", run), path
    # The signing key's volume sits under HOME: made there, and owned with all of /scratch.
    assert PurePosixPath(compose.SIGNING_MOUNT).is_relative_to(compose.SCRATCH)
    assert re.search(rf"mkdir -p [^&]*{compose.SIGNING_MOUNT}\b", run)
    assert re.search(rf"chown -R [^&]*{compose.SCRATCH}\b", run)


def test_dockerfile_bakes_in_no_credentials():
    instructions = dockerfile_instructions(DOCKERFILE)
    global_args, stage_args = arg_defaults(instructions)
    for name, value in {**global_args, **stage_args, **env_pairs(instructions)}.items():
        assert not SECRET_NAME.search(name) and not SECRET_NAME.search(value), f"{name}={value}"
    copied = [args for keyword, args in instructions if keyword in ("COPY", "ADD")]
    assert copied and all(not re.search(r"\.env|\.pem|credentials|\.aws", args) for args in copied), copied


def test_dockerignore_keeps_local_state_out_of_the_build_context():
    ignored = {line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", "outputs", "multirun", "**/__pycache__", ".pytest_cache", ".env"} <= ignored


# -- the compose file ----------------------------------------------------------------------------------------

def container_env(service: dict) -> dict:
    """What the process sees: compose turns ``$$`` into ``$``; a null value is passed through from the shell."""
    return {k: v.replace("$$", "$") if isinstance(v, str) else v for k, v in service.get("environment", {}).items()}


def role_services(doc: dict) -> list[tuple[Role, int, dict]]:
    found = []
    for name, service in doc["services"].items():
        kind, _, index = name.partition("-")
        if kind in ("ps", "worker"):
            found.append((Role.SERVER if kind == "ps" else Role.WORKER, int(index), service))
    return found


def generated(*overrides: str, image: str = "cpu:1", gpu_image: str = "gpu:1") -> tuple[CtrConfig, dict]:
    cfg = compose.load_config(list(overrides))
    return cfg, compose.compose_file(cfg, image, gpu_image, "job.json", "job.tls")


def mounts(service: dict) -> dict[str, tuple[str, list[str]]]:
    """target -> (source, options) of a service's volumes."""
    found = {}
    for volume in service["volumes"]:
        source, target, *options = volume.split(":")
        found[target] = (source, options[0].split(",") if options else [])
    return found


def test_committed_compose_file_and_job_spec_are_what_the_default_config_generates():
    files = compose.generate([], COMPOSE_YAML)
    tls_dir = compose.tls_path(COMPOSE_YAML)
    # The TLS files are a new CA's each time: made for each job, never committed (.gitignore).
    assert {p for p in files if not p.is_relative_to(tls_dir)} == {COMPOSE_YAML, SPEC_JSON}
    for path in (COMPOSE_YAML, SPEC_JSON):
        assert path.read_text() == files[path], \
            f"{path.relative_to(ROOT)} is stale: regenerate it with `{compose.REGENERATE}`"


@pytest.mark.parametrize("servers,workers", [(2, 2), (3, 1), (1, 4)])
def test_every_ps_service_gets_exactly_the_role_env_of_its_role(servers, workers):
    _, doc = generated(f"ps.servers={servers}", f"ps.workers={workers}", "ps.tls=off")
    # Written out here rather than taken from compose.py: the endpoints are the compose service names.
    layout = ClusterLayout(server_endpoints=tuple(f"ps-{i}:36000" for i in range(servers)),
                           worker_endpoints=tuple(f"worker-{i}:36000" for i in range(workers)),
                           gloo_endpoint="ps-0:36018", job_id=compose.PROJECT)
    found = role_services(doc)
    assert sorted((role.value, i) for role, i, _ in found) == sorted(
        [("server", i) for i in range(servers)] + [("worker", i) for i in range(workers)])
    for role, index, service in found:
        # Nothing else without storage secrets but the run and its attempt, which the driver names (default:
        # attempt 0 of a run named after the project, what a plain `docker compose up` runs).
        assert container_env(service) == {**role_env(layout, role, index), RESTART_ENV: "${CTR_PS_ATTEMPT:-0}",
                                          RUN_ID_ENV: "${CTR_PS_RUN:-ctr-ps}"}
        assert service["command"] == ["python", "-m", "components.ps.role", compose.SPEC_MOUNT]


def test_with_tls_every_role_runs_behind_its_terminator_with_its_own_files_only():
    _, doc = generated()  # ps.tls=auto: on in a compose file
    hosts = ClusterLayout(server_endpoints=("ps-0:36000", "ps-1:36000"), worker_endpoints=("worker-0:36000",
                          "worker-1:36000"), gloo_endpoint="ps-0:36018", job_id=compose.PROJECT)
    for role, index, service in role_services(doc):
        name = f"{'ps' if role is Role.SERVER else 'worker'}-{index}"
        assert service["command"] == ["python", "-m", "components.ps.tls", "--",
                                      "python", "-m", "components.ps.role", compose.SPEC_MOUNT]
        # The host layout, as without TLS: the terminator moves the role onto loopback (ps/test_tls.py).
        assert container_env(service) == {**role_env(hosts, role, index), RESTART_ENV: "${CTR_PS_ATTEMPT:-0}",
                                          RUN_ID_ENV: "${CTR_PS_RUN:-ctr-ps}"}
        assert mounts(service)[TLS_DIR] == (f"./job.tls/{name}", ["ro"])
        assert service["hostname"] == "localhost"  # a worker's brpc client service binds loopback
    for name, service in doc["services"].items():
        if not name.startswith(("ps-", "worker-")):
            assert TLS_DIR not in mounts(service) and "hostname" not in service, name


def test_the_cli_writes_a_new_ca_per_job_and_each_key_readable_by_its_owner_only(tmp_path):
    out = tmp_path / "c.yaml"
    assert compose.main(["--out", str(out)]) == 0
    tls_dir = compose.tls_path(out)
    assert sorted(p.name for p in tls_dir.iterdir()) == ["ps-0", "ps-1", "worker-0", "worker-1"]
    doc = yaml.safe_load(out.read_text())
    for name in ("ps-0", "worker-1"):
        assert mounts(doc["services"][name])[TLS_DIR] == (f"./{tls_dir.name}/{name}", ["ro"])
        (pem,) = (tls_dir / name).glob("*.pem")  # its own certificate and key, no other role's
        assert pem.name == f"{'server' if name.startswith('ps') else 'worker'}-{name[-1]}.pem"
        assert pem.stat().st_mode & 0o777 == 0o600
    first_ca = (tls_dir / "ps-0" / "ca.crt").read_text()
    (tls_dir / "ps-9").mkdir()  # an earlier job's role: its files go with the new job's
    assert compose.main(["--out", str(out)]) == 0
    assert (tls_dir / "ps-0" / "ca.crt").read_text() != first_ca and not (tls_dir / "ps-9").exists()


def test_tls_off_across_hosts_is_said_in_the_file_and_on_stderr(tmp_path, capsys):
    out = tmp_path / "c.yaml"
    assert compose.main(["ps.tls=off", "--out", str(out)]) == 0
    assert "ps.tls=off" in capsys.readouterr().err
    assert out.read_text().splitlines()[1].startswith("# warning: ps.tls=off")
    assert not compose.tls_path(out).exists()


def test_the_job_spec_is_one_file_every_service_mounts_read_only():
    doc = yaml.safe_load(COMPOSE_YAML.read_text())
    for name, service in doc["services"].items():
        if name == "serving":  # the online server: it takes the export store, not the job
            continue
        assert SPEC_ENV not in container_env(service), name  # not a JSON blob in every environment
        assert mounts(service)[compose.SPEC_MOUNT] == (f"./{SPEC_JSON.name}", ["ro"]), name
        assert service["command"][-1] == compose.SPEC_MOUNT, name
    spec = json.loads(SPEC_JSON.read_text())
    cfg = from_dict(spec["config"])
    validate(cfg)
    assert to_dict(cfg) == to_dict(compose.load_config([]))  # the config as written: shard_num left to the planner
    assert (spec["plan"]["shard_num"], spec["plan"]["shard_source"]) == (16, "8 per server")
    assert (cfg.ps.servers, cfg.ps.workers) == (2, 2)
    assert spec["restore"] is None
    # Data and checkpoints live in the volumes every role mounts; scratch paths are per container.
    assert PurePosixPath(spec["data_dir"]).is_relative_to(compose.DATA_MOUNT)
    assert PurePosixPath(cfg.checkpoint.uri).is_relative_to(compose.CHECKPOINT_MOUNT)
    assert PurePosixPath(spec["workdir"]).is_relative_to(compose.SCRATCH)
    for role, index, service in role_services(doc):
        assert set(mounts(service)) == {compose.SPEC_MOUNT, compose.DATA_MOUNT, compose.CHECKPOINT_MOUNT, TLS_DIR}
    # Prep fits the baseline beside the dataset: what the evaluation scores and the model blends in.
    assert PurePosixPath(spec["baseline"]).is_relative_to(compose.DATA_MOUNT) and cfg.model.blend_baseline
    assert SPEC_JSON.read_text().startswith('{\n  "baseline": "/data/baseline",\n  "config": {\n')  # indented


def test_compose_document_structure():
    doc = yaml.safe_load(COMPOSE_YAML.read_text())
    assert set(doc) == {"name", "x-ctr-ps", "services", "volumes", "networks"}
    # A PS job restarts whole: the watch and every role together, never data prep; a configuration error, a refused
    # store and an unrunnable command line are not restarted.
    assert doc["x-ctr-ps"] == {"max_restarts": CtrConfig().cluster.max_restarts,
                               "restart_together": ["watch", "ps-0", "ps-1", "worker-0", "worker-1"],
                               "not_restarted_exits": [78, 74, 2]}
    services = doc["services"]
    assert list(services) == ["prep", "watch", "ps-0", "ps-1", "worker-0", "worker-1", "evaluate", "export",
                              "serving"]
    for name, service in services.items():
        assert isinstance(service["image"], str) and service["image"]
        assert all(isinstance(part, str) for part in service["command"])
        assert service["user"] == str(CtrConfig().cluster.run_as_user)
        # An init reaps Paddle's helper processes and forwards SIGTERM; the job, not compose, decides on restarts.
        assert service["init"] is True and service["restart"] == "no"
        assert all(isinstance(v, str) for v in service.get("environment", {}).values())
        for target, (source, options) in mounts(service).items():
            assert target.startswith("/") and set(options) <= {"ro"}, (name, target)
            assert source in doc["volumes"] or (target in (compose.SPEC_MOUNT, TLS_DIR) and source.startswith("./")), source
        for target, dependency in service.get("depends_on", {}).items():
            assert target in services and dependency["condition"] in DEPENDENCY_CONDITIONS, (name, target)
            if dependency["condition"] == "service_healthy":
                assert services[target]["healthcheck"]["test"][0] == "CMD"
    # The PS ports stay on the job's own network, internal (no route out); only the online server is published,
    # on loopback, from a network of its own.
    assert {name: service["ports"] for name, service in services.items() if "ports" in service} == {
        "serving": ["127.0.0.1:8080:8080"]}
    assert doc["networks"] == {"job": {"internal": True}, "serving": {}}
    assert {name: service["networks"] for name, service in services.items()} == {
        **{name: ["job"] for name in services if name != "serving"}, "serving": ["serving"]}
    # The roles start once the watch holds the store's lease (and cleaned it); it needs the dataset no more than they.
    assert services["watch"]["depends_on"] == {"prep": {"condition": "service_completed_successfully"}}
    assert services["watch"]["healthcheck"]["test"] == ["CMD", "test", "-f", compose.WATCH_READY]
    assert services["ps-0"]["depends_on"] == {"prep": {"condition": "service_completed_successfully"},
                                              "watch": {"condition": "service_healthy"}}
    assert services["worker-1"]["depends_on"] == {f"ps-{i}": {"condition": "service_healthy"} for i in range(2)}
    # Only a job whose every process exited 0, and that the watch saw to its end, is evaluated.
    assert services["evaluate"]["depends_on"] == {
        name: {"condition": "service_completed_successfully"}
        for name in ("watch", "ps-0", "ps-1", "worker-0", "worker-1")}
    assert mounts(services["evaluate"])[compose.DATA_MOUNT][1] == ["ro"]
    assert mounts(services["evaluate"])[compose.EVALUATION_MOUNT] == ("evaluation", [])


def test_a_remote_store_adds_a_routed_network_to_reach_it_and_a_single_file_export_no_serving_one():
    _, doc = generated("checkpoint.uri=s3://bucket/ckpt")
    assert doc["networks"] == {"job": {"internal": True}, "serving": {}, "store": {}}
    assert all(s["networks"] == (["serving", "store"] if name == "serving" else ["job", "store"])
               for name, s in doc["services"].items())
    _, doc = generated("export.format=single")
    assert doc["networks"] == {"job": {"internal": True}} and "serving" not in doc["services"]


def test_server_healthcheck_passes_only_while_the_ps_port_accepts_tcp():
    _, doc = generated("ps.tls=off")  # with TLS on, the same probe of the loopback ports (test_tls_* above)
    # Server 0 opens its PS port only after the workers joined its rendezvous store: it is ready when either listens.
    assert doc["services"]["ps-0"]["healthcheck"]["test"][-2:] == ["ps-0:36018", "ps-0:36000"]
    test = doc["services"]["ps-1"]["healthcheck"]["test"]
    assert test[0] == "CMD" and test[-1] == "ps-1:36000"
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        local_probe = [sys.executable, *test[2:-1], f"127.0.0.1:{listener.getsockname()[1]}"]  # CMD python ...
        assert subprocess.run(local_probe, cwd=ROOT).returncode == 0
    assert subprocess.run(local_probe, cwd=ROOT).returncode == 1  # now closed


@pytest.mark.parametrize("gpus", [0, 1, 2])
def test_workers_reserve_distinct_gpus_iff_configured(gpus):
    _, doc = generated(f"cluster.workers.gpus={gpus}")
    for role, index, service in role_services(doc):
        if role is Role.SERVER or gpus == 0:
            assert "deploy" not in service and service["image"] == "cpu:1"
            continue
        assert service["image"] == "gpu:1"
        (device,) = service["deploy"]["resources"]["reservations"]["devices"]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert device["device_ids"] == [str(d) for d in range(index * gpus, (index + 1) * gpus)]


def test_no_secret_values_in_the_committed_files():
    for path in (COMPOSE_YAML, SPEC_JSON):
        assert not re.search(r"AKIA[0-9A-Z]{16}|-----BEGIN|aws_secret_access_key\s*[:=]", path.read_text(), re.IGNORECASE)
    for service in yaml.safe_load(COMPOSE_YAML.read_text())["services"].values():
        assert not [k for k in service.get("environment", {}) if SECRET_NAME.search(k)]


def test_storage_credentials_pass_through_by_name_only(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    cfg = compose.load_config(["checkpoint.uri=s3://bucket/ctr"])
    secret = SecretEnv(name="ctr-storage", keys={"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret"})
    cfg = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, storage_secrets=[secret]))
    doc = compose.compose_file(cfg, "cpu:1", "gpu:1", "job.json", "job.tls")
    text = yaml.safe_dump(doc) + compose.job_spec(cfg)
    assert FAKE_SECRET not in text and FAKE_KEY_ID not in text
    for service in doc["services"].values():
        env = service["environment"]
        assert env["AWS_ACCESS_KEY_ID"] is None and env["AWS_SECRET_ACCESS_KEY"] is None  # from the shell
    # A remote store needs no checkpoints volume.
    assert "checkpoints" not in doc["volumes"]
    assert all(compose.CHECKPOINT_MOUNT not in mounts(s) for s in doc["services"].values())


@pytest.mark.parametrize("override,key", [
    ("checkpoint.resume=latest", "checkpoint.resume"),
    ("checkpoint.warm_start=s3://b/run", "checkpoint.warm_start"),
    ("checkpoint.uri=/elsewhere/ckpt", "checkpoint.uri"),
])
def test_cli_refuses_what_a_compose_file_cannot_run(override, key, tmp_path, capsys):
    out = tmp_path / "compose.yaml"
    assert compose.main([override, "--out", str(out)]) == 2
    assert f"config key '{key}'" in capsys.readouterr().err and not list(tmp_path.iterdir())


def test_cli_refuses_data_files_on_this_machine(tmp_path, capsys):
    (tmp_path / "day_0.tsv").write_text("")
    assert compose.main(["data=criteo", f"data.uri={tmp_path}/day_0.tsv", "--out", str(tmp_path / "c.yaml")]) == 2
    assert "config key 'data.uri'" in capsys.readouterr().err


def test_cli_writes_the_overridden_layout_and_its_spec_beside_it(tmp_path):
    out = tmp_path / "my-compose.yaml"
    assert compose.main(["ps.servers=3", "ps.workers=1", "--image", "reg/x@sha256:" + "0" * 64, "--out", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert list(doc["services"]) == ["prep", "watch", "ps-0", "ps-1", "ps-2", "worker-0", "evaluate", "export",
                                     "serving"]
    assert {s["image"] for s in doc["services"].values()} == {"reg/x@sha256:" + "0" * 64}
    assert out.read_text().startswith("# Generated by `python -m components.train.backends.docker_compose ps.servers=3 ps.workers=1`")
    spec = tmp_path / "my-compose.job-spec.json"
    assert mounts(doc["services"]["ps-2"])[compose.SPEC_MOUNT][0] == f"./{spec.name}"
    assert from_dict(json.loads(spec.read_text())["config"]).ps.servers == 3


def test_compress_reaches_every_process_through_the_job_spec(tmp_path):
    """Every PS service reads the one job spec; its config's ps.compress becomes the client flag each one parses."""
    out = tmp_path / "compose.yaml"
    assert compose.main(["ps.compress=gzip", "--out", str(out)]) == 0
    spec = json.loads((tmp_path / "compose.job-spec.json").read_text())
    assert spec["config"]["ps"]["compress"] == "gzip"
    assert "-pserver_communicate_compress_type=2" in rpc_gflags(from_dict(spec["config"])).split()


def test_prep_service_builds_the_dataset_its_job_spec_names(tmp_path):
    cfg = compose.load_config(["data.rows=2000"])
    spec = json.loads(compose.job_spec(cfg))
    spec["data_dir"] = str(tmp_path / "data" / "dataset")  # the volume's stand-in
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(spec))
    prep = compose.compose_file(cfg, "cpu:1", "gpu:1", "job.json", "job.tls")["services"]["prep"]
    assert prep["command"][-2:] == [compose.PREPARE_COMMAND, compose.SPEC_MOUNT]
    assert compose.main([compose.PREPARE_COMMAND, str(spec_file)]) == 0
    stats = json.loads((tmp_path / "data" / "dataset" / "stats.json").read_text())
    assert sum(stats["rows"].values()) == 2000
    assert len(stats["shards"]["train"]) == cfg.ps.workers * cfg.data.shards_per_worker


def test_evaluate_service_scores_the_latest_checkpoint_into_its_volume(tmp_path):
    data = tmp_path / "data"
    prepare_synthetic(data, rows=2000, test_fraction=0.25, num_shards=2, vocab_size=5000, seed=3)
    store = build_checkpoint(tmp_path / "checkpoint", data, "dnn").parent  # committed as a train job does
    spec = json.loads(compose.job_spec(compose.load_config([])))
    spec["config"]["checkpoint"]["uri"], spec["data_dir"] = str(store), str(data)
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(spec))
    line = compose.evaluate_from_spec(str(spec_file), str(tmp_path / "evaluation"))
    latest = CheckpointStore(str(store)).latest()
    metrics = json.loads((tmp_path / "evaluation" / "metrics.json").read_text())
    assert line.startswith(f"test auc={metrics['auc']:.4f} logloss={metrics['logloss']:.4f} (")
    assert f"checkpoint {latest}" in line and (tmp_path / "evaluation" / "report.html").exists()
    assert read_evaluation(str(store)) == {"checkpoint": latest, "metrics": metrics}


def test_evaluate_service_fails_in_one_line_without_a_checkpoint(tmp_path):
    spec = json.loads(compose.job_spec(compose.load_config([])))
    spec["config"]["checkpoint"]["uri"] = str(tmp_path / "empty")
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(spec))
    with pytest.raises(SystemExit, match=r"^error: no committed checkpoint in .*empty"):
        compose.evaluate_from_spec(str(spec_file), str(tmp_path / "evaluation"))


def _watch_spec(tmp_path, *overrides) -> Path:
    spec = json.loads(compose.job_spec(compose.load_config(["ps.progress_period_s=1", "ps.stall_timeout_s=3",
                                                            "ps.startup_timeout_s=2", *overrides])))
    spec["config"]["checkpoint"]["uri"] = str(tmp_path / "ckpt")  # the checkpoints volume's stand-in
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(spec))
    return spec_file


def _roles_once_the_watch_is_ready(tmp_path, ready: Path, silent: str = "") -> threading.Thread:
    """The compose job's roles (job id ``ctr-ps``): they start once the watch holds the lease, beat, and the workers
    end; ``silent`` beats once only (a hung role)."""
    def run() -> None:
        while not ready.exists():
            time.sleep(0.05)
        store = CheckpointStore(str(tmp_path / "ckpt"))
        records = {name: HeartbeatRecord(store, name.split("-")[0], int(name.split("-")[1]), compose.PROJECT)
                   for name in ("server-0", "server-1", "worker-0", "worker-1")}
        for _ in range(15):
            for name, record in records.items():
                if name != silent or record.seq == 0:
                    record.write()
            time.sleep(0.2)
        if not silent:
            records["worker-0"].write(done=True)
            records["worker-1"].write(done=True)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_the_watch_service_holds_the_lease_while_the_roles_beat_and_ends_with_the_workers(tmp_path):
    spec_file, ready = _watch_spec(tmp_path), tmp_path / "watch.ready"
    store = CheckpointStore(str(tmp_path / "ckpt"))
    store.write_json(None, f"{LIVENESS}/worker-1.json", {"role": "worker", "index": 1, "job": compose.PROJECT,
                                                         "seq": 99, "done": True})  # a killed job's: cleaned first
    roles = _roles_once_the_watch_is_ready(tmp_path, ready)
    line = compose.watch_from_spec(str(spec_file), str(ready))
    roles.join(10)
    assert line.startswith("every worker is done after ") and "no role stalled" in line
    assert store.read_json(None, LEASE) is None  # released: the next job may take the store


def test_the_watch_service_fails_in_one_line_on_a_stalled_role_or_a_store_another_job_holds(tmp_path, capsys,
                                                                                            monkeypatch):
    spec_file, ready = _watch_spec(tmp_path), tmp_path / "watch.ready"
    monkeypatch.setattr(compose, "WATCH_READY", str(ready))  # the container's path, here
    _roles_once_the_watch_is_ready(tmp_path, ready, silent="server-1")
    assert compose.main([compose.WATCH_COMMAND, str(spec_file)]) == 1
    error = capsys.readouterr().err
    assert error.startswith("error: PS job ctr-ps: server-1 reported nothing for ") and error.count("\n") == 1
    ready.unlink()
    with StoreLease(CheckpointStore(str(tmp_path / "ckpt")), "another-run"):  # no restart mends this one
        assert compose.main([compose.WATCH_COMMAND, str(spec_file)]) == STORE_REFUSED_EXIT
    error = capsys.readouterr().err
    assert error.startswith("error: ") and "another-run" in error and error.count("\n") == 1
    assert not ready.exists()  # no role may start on a store another job holds


def test_the_watch_service_gives_the_lease_back_when_it_is_stopped(tmp_path):
    """`compose down`, or the driver stopping a job another service failed, sends the watch SIGTERM: the next job on
    the store must not wait for its lease to expire."""
    spec_file, ready = _watch_spec(tmp_path), tmp_path / "watch.ready"
    script = (f"from components.train.backends import docker_compose as c; c.WATCH_READY = {str(ready)!r}; "
              f"import sys; sys.exit(c.main(['watch', {str(spec_file)!r}]))")
    watch = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert watch.poll() is None and time.monotonic() < deadline, watch.stderr.read()
            time.sleep(0.05)
        assert CheckpointStore(str(tmp_path / "ckpt")).read_json(None, LEASE) is not None
        watch.send_signal(signal.SIGTERM)
        assert watch.wait(30) == 1
    finally:
        watch.kill()
    assert watch.stderr.read().strip() == "error: stopped by SIGTERM; the store's lease is given back"
    assert CheckpointStore(str(tmp_path / "ckpt")).read_json(None, LEASE) is None


def test_the_serving_profile_exports_the_evaluated_model_and_serves_its_store_on_loopback():
    doc = yaml.safe_load(COMPOSE_YAML.read_text())
    services = doc["services"]
    # A plain `up` runs the job and ends; `--profile serving` adds the export and the server, which never ends.
    assert {name for name, s in services.items() if s.get("profiles")} == {"export", "serving"}
    assert all(services[name]["profiles"] == [compose.SERVING_PROFILE] for name in ("export", "serving"))
    export, serving = services["export"], services["serving"]
    assert export["depends_on"] == {"evaluate": {"condition": "service_completed_successfully"}}
    assert export["command"][-2:] == [compose.EXPORT_COMMAND, compose.SPEC_MOUNT]
    assert serving["depends_on"] == {"export": {"condition": "service_completed_successfully"}}
    spec = from_dict(json.loads(SPEC_JSON.read_text())["config"])
    assert spec.export.uri == compose.EXPORT_MOUNT
    assert serving["command"] == ["python", "-m", "components.export.serving", "serve", "--model",
                                  compose.EXPORT_MOUNT, "--host", "0.0.0.0", "--port", "8080", "--name", "ctr"]
    # The store and the signing key: written by the export, read-only to the server, which verifies with that key.
    assert mounts(export)[compose.EXPORT_MOUNT] == ("exports", [])
    assert mounts(serving)[compose.EXPORT_MOUNT] == ("exports", ["ro"])
    assert mounts(export)[compose.DATA_MOUNT] == ("dataset", ["ro"])  # its transform goes into the export
    assert mounts(export)[compose.SIGNING_MOUNT] == ("signing", [])
    assert mounts(serving)[compose.SIGNING_MOUNT] == ("signing", ["ro"])
    assert serving["environment"] == {"CTR_SERVING_PUBLIC_KEY": f"{compose.SIGNING_MOUNT}/key.pub"}
    assert serving["ports"] == ["127.0.0.1:8080:8080"] and serving["init"] is True


def test_the_serving_healthcheck_passes_only_once_the_server_answers_ready():
    import http.server
    import threading

    test = yaml.safe_load(COMPOSE_YAML.read_text())["services"]["serving"]["healthcheck"]["test"]
    assert test[:2] == ["CMD", "python"] and "http://127.0.0.1:8080/v2/health/ready" in test[-1]
    ready = threading.Event()

    class Health(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path == "/v2/health/ready" and ready.is_set() else 503)
            self.end_headers()

        def log_message(self, *args):
            pass

    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Health) as server:
        threading.Thread(target=server.serve_forever, daemon=True).start()
        probe = [sys.executable, *test[2:-1], test[-1].replace(":8080/", f":{server.server_address[1]}/")]
        try:
            assert subprocess.run(probe, capture_output=True).returncode == 1  # loading: 503
            ready.set()
            assert subprocess.run(probe, capture_output=True).returncode == 0
        finally:
            server.shutdown()


def test_a_single_file_export_gets_no_serving_services():
    _, doc = generated("export.format=single")
    assert list(doc["services"])[-1] == "evaluate" and "signing" not in doc["volumes"]


def test_the_export_service_exports_the_evaluated_checkpoint_past_the_auc_gate(tmp_path):
    from components.checkpoint.evaluation import record_evaluation
    from components.export.store import ExportStore

    data = tmp_path / "data"
    prepare_synthetic(data, rows=2000, test_fraction=0.25, num_shards=2, vocab_size=5000, seed=3)
    store = build_checkpoint(tmp_path / "checkpoint", data, "dnn").parent
    spec = json.loads(compose.job_spec(compose.load_config(["eval.min_auc=0.7"])))
    spec["config"]["checkpoint"]["uri"], spec["config"]["export"]["uri"] = str(store), str(tmp_path / "exports")
    spec["data_dir"] = str(data)
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(spec))
    with pytest.raises(SystemExit, match=r"^error: no evaluation in "):
        compose.export_from_spec(str(spec_file), str(tmp_path / "copy"))
    latest = CheckpointStore(str(store)).latest()
    record_evaluation(str(store), latest, {"auc": 0.69})
    with pytest.raises(SystemExit, match=r"^error: not exported: test AUC 0\.6900 < eval\.min_auc 0\.7$"):
        compose.export_from_spec(str(spec_file), str(tmp_path / "copy"))
    assert not (tmp_path / "exports").exists()
    record_evaluation(str(store), latest, {"auc": 0.71})
    line = compose.export_from_spec(str(spec_file), str(tmp_path / "copy"))
    assert line == f"version 1 (base) of checkpoint {latest} in {tmp_path / 'exports'}"
    exported = ExportStore(str(tmp_path / "exports"))
    assert exported.versions() == [1] and exported.manifest(1)["source_checkpoint"]["id"] == latest
    assert exported.manifest(1)["transform"]["input"]["format"] == "raw"  # the dataset's: raw records in
