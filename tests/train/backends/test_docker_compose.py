"""The container build (containers/Dockerfile, .dockerignore) and the generated docker-compose file.

No Docker engine runs these tests: the Dockerfile is parsed for what it promises (official Paddle 2.6.2 bases,
a non-root user that matches cluster.run_as_user, no credentials), and the compose document is checked for the
keys and references this project relies on, not against the full compose specification. The slow test runs
the committed file's services as local processes, each in a private mount namespace standing in for its container.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path, PurePosixPath

import pytest
import yaml

from components.checkpoint.store import CheckpointStore
from components.config import CtrConfig, SecretEnv, from_dict, to_dict, validate
from components.ps.contract import SPEC_ENV, ClusterLayout, Role, role_env
from components.train.backends import docker_compose as compose
from components.train.job import planned_config
from tests.conftest import FAKE_KEY_ID, FAKE_SECRET

from tests.conftest import ROOT
DOCKERFILE = ROOT / "containers" / "Dockerfile"
COMPOSE_YAML = ROOT / "containers" / "docker-compose.yaml"
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
    for path in (compose.SCRATCH, compose.DATA_MOUNT, compose.CHECKPOINT_MOUNT):
        assert re.search(rf"mkdir -p [^&]*{path}\b", run) and re.search(rf"chown [^&]*{path}\b", run), path


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
    return {k: v.replace("$$", "$") if isinstance(v, str) else v for k, v in service["environment"].items()}


def role_services(doc: dict) -> list[tuple[Role, int, dict]]:
    found = []
    for name, service in doc["services"].items():
        kind, _, index = name.partition("-")
        if kind in ("ps", "worker"):
            found.append((Role.SERVER if kind == "ps" else Role.WORKER, int(index), service))
    return found


def generated(*overrides: str, image: str = "cpu:1", gpu_image: str = "gpu:1") -> tuple[CtrConfig, dict]:
    cfg = compose.load_config(list(overrides))
    return cfg, compose.compose_file(cfg, image, gpu_image)


def test_committed_compose_file_is_what_the_default_config_generates():
    assert COMPOSE_YAML.read_text() == compose.generate([]), (
        f"{COMPOSE_YAML.relative_to(ROOT)} is stale: regenerate it with `{compose.REGENERATE}`")


@pytest.mark.parametrize("servers,workers", [(2, 2), (3, 1), (1, 4)])
def test_every_ps_service_gets_exactly_the_role_env_of_its_role(servers, workers):
    _, doc = generated(f"ps.servers={servers}", f"ps.workers={workers}")
    # Written out here rather than taken from compose.py: the endpoints are the compose service names.
    layout = ClusterLayout(server_endpoints=tuple(f"ps-{i}:36000" for i in range(servers)),
                           worker_endpoints=tuple(f"worker-{i}:36000" for i in range(workers)),
                           gloo_endpoint="ps-0:36018", job_id=compose.PROJECT)
    found = role_services(doc)
    assert sorted((role.value, i) for role, i, _ in found) == sorted(
        [("server", i) for i in range(servers)] + [("worker", i) for i in range(workers)])
    for role, index, service in found:
        env = container_env(service)
        expected = role_env(layout, role, index)
        assert set(env) - set(expected) == {SPEC_ENV}  # the only documented extra key without storage secrets
        assert {k: env[k] for k in expected} == expected
        assert service["command"] == ["python", "-m", "components.ps.role"]  # reads $PS_JOB_SPEC


def test_job_spec_in_the_committed_file_rebuilds_a_valid_config():
    doc = yaml.safe_load(COMPOSE_YAML.read_text())
    specs = {json.dumps(json.loads(container_env(s)[SPEC_ENV]), sort_keys=True) for s in doc["services"].values()}
    assert len(specs) == 1, "prep, servers and workers must share one job spec"
    spec = json.loads(specs.pop())
    cfg = from_dict(spec["config"])
    validate(cfg)
    assert to_dict(cfg) == to_dict(planned_config(compose.load_config([]), None)[0])  # shard_num resolved
    assert (cfg.ps.servers, cfg.ps.workers) == (2, 2)
    assert spec["restore"] is None
    # Data and checkpoints live in the volumes every role mounts; scratch paths are per container.
    assert PurePosixPath(spec["data_dir"]).is_relative_to(compose.DATA_MOUNT)
    assert PurePosixPath(cfg.checkpoint.uri).is_relative_to(compose.CHECKPOINT_MOUNT)
    assert PurePosixPath(spec["workdir"]).is_relative_to(compose.SCRATCH)
    for _, _, service in role_services(doc):
        assert {v.split(":")[1] for v in service["volumes"]} == {compose.DATA_MOUNT, compose.CHECKPOINT_MOUNT}


def test_compose_document_structure():
    doc = yaml.safe_load(COMPOSE_YAML.read_text())
    assert set(doc) == {"name", "services", "volumes"}
    services = doc["services"]
    for name, service in services.items():
        assert isinstance(service["image"], str) and service["image"]
        assert all(isinstance(part, str) for part in service["command"])
        assert service["user"] == str(CtrConfig().cluster.run_as_user)
        assert all(isinstance(v, str) for v in service["environment"].values())
        for volume in service["volumes"]:
            source, target, *mode = volume.split(":")
            assert source in doc["volumes"] and target.startswith("/") and mode in ([], ["ro"]), volume
        for target, dependency in service.get("depends_on", {}).items():
            assert target in services and dependency["condition"] in DEPENDENCY_CONDITIONS, (name, target)
            if dependency["condition"] == "service_healthy":
                assert services[target]["healthcheck"]["test"][0] == "CMD"
    assert "ports" not in str(doc)  # the PS ports stay on the job's own network
    assert services["ps-0"]["depends_on"] == {"prep": {"condition": "service_completed_successfully"}}
    assert services["worker-1"]["depends_on"] == {f"ps-{i}": {"condition": "service_healthy"} for i in range(2)}


def test_server_healthcheck_passes_only_while_the_ps_port_accepts_tcp():
    _, doc = generated()
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


def test_no_secret_values_in_the_committed_file():
    text = COMPOSE_YAML.read_text()
    assert not re.search(r"AKIA[0-9A-Z]{16}|-----BEGIN|aws_secret_access_key\s*[:=]", text, re.IGNORECASE)
    for service in yaml.safe_load(text)["services"].values():
        assert not [k for k in service["environment"] if SECRET_NAME.search(k)]


def test_storage_credentials_pass_through_by_name_only(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", FAKE_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", FAKE_SECRET)
    cfg = compose.load_config(["checkpoint.uri=s3://bucket/ctr"])
    secret = SecretEnv(name="ctr-storage", keys={"AWS_ACCESS_KEY_ID": "id", "AWS_SECRET_ACCESS_KEY": "secret"})
    cfg = dataclasses.replace(cfg, cluster=dataclasses.replace(cfg.cluster, storage_secrets=[secret]))
    doc = compose.compose_file(cfg, "cpu:1", "gpu:1")
    text = yaml.safe_dump(doc)
    assert FAKE_SECRET not in text and FAKE_KEY_ID not in text
    for service in doc["services"].values():
        env = service["environment"]
        assert env["AWS_ACCESS_KEY_ID"] is None and env["AWS_SECRET_ACCESS_KEY"] is None  # from the shell
    # A remote store needs no checkpoints volume.
    assert "checkpoints" not in doc["volumes"]
    assert all(compose.CHECKPOINT_MOUNT not in str(s["volumes"]) for s in doc["services"].values())


@pytest.mark.parametrize("override,key", [
    ("checkpoint.resume=latest", "checkpoint.resume"),
    ("checkpoint.warm_start=s3://b/run", "checkpoint.warm_start"),
    ("checkpoint.uri=/elsewhere/ckpt", "checkpoint.uri"),
])
def test_cli_refuses_what_a_compose_file_cannot_run(override, key, tmp_path, capsys):
    out = tmp_path / "compose.yaml"
    assert compose.main([override, "--out", str(out)]) == 2
    assert f"config key '{key}'" in capsys.readouterr().err and not out.exists()


def test_cli_refuses_data_files_on_this_machine(tmp_path, capsys):
    (tmp_path / "day_0.tsv").write_text("")
    assert compose.main(["data=criteo", f"data.uri={tmp_path}/day_0.tsv"]) == 2
    assert "config key 'data.uri'" in capsys.readouterr().err


def test_cli_writes_the_overridden_layout(tmp_path):
    out = tmp_path / "compose.yaml"
    assert compose.main(["ps.servers=3", "ps.workers=1", "--image", "reg/x@sha256:" + "0" * 64, "--out", str(out)]) == 0
    doc = yaml.safe_load(out.read_text())
    assert list(doc["services"]) == ["prep", "ps-0", "ps-1", "ps-2", "worker-0"]
    assert {s["image"] for s in doc["services"].values()} == {"reg/x@sha256:" + "0" * 64}
    assert out.read_text().startswith("# Generated by `python -m components.train.backends.docker_compose ps.servers=3 ps.workers=1`")


def test_prep_service_builds_the_dataset_its_job_spec_names(tmp_path, monkeypatch):
    _, doc = generated("data.rows=2000")
    prep = doc["services"]["prep"]
    assert prep["command"][-1] == compose.PREPARE_COMMAND
    spec = json.loads(container_env(prep)[SPEC_ENV])
    spec["data_dir"] = str(tmp_path / "data" / "dataset")  # the volume's stand-in
    monkeypatch.setenv(SPEC_ENV, json.dumps(spec))
    assert compose.main([compose.PREPARE_COMMAND]) == 0
    stats = json.loads((tmp_path / "data" / "dataset" / "stats.json").read_text())
    cfg = from_dict(spec["config"])
    assert sum(stats["rows"].values()) == 2000
    assert len(stats["shards"]["train"]) == cfg.ps.workers * cfg.data.shards_per_worker


# -- the committed file, run: each service a local process in its own mount namespace ----------------------

class EmulatedHost:
    """Stands in for Docker on this machine: a service runs its command with exactly its environment in a private
    mount namespace where /etc/hosts maps the service names to distinct loopback addresses, /scratch is its own,
    and each volume is one shared directory (read-only where the file says ``:ro``)."""

    MOUNT_POINTS = (compose.SCRATCH, compose.DATA_MOUNT, compose.CHECKPOINT_MOUNT)

    def __init__(self, doc: dict, root: Path):
        self.doc, self.root, self.processes = doc, root, []
        names = [n for n in doc["services"] if n != "prep"]
        self.hosts = root / "hosts"
        self.hosts.write_text(Path("/etc/hosts").read_text()  # keeps this machine's own name: gloo resolves it
                              + "".join(f"127.0.0.{i + 2} {name}\n" for i, name in enumerate(names)))
        self.volumes = {name: root / f"volume-{name}" for name in doc["volumes"]}
        for path in self.volumes.values():
            path.mkdir()
        self.created = [p for p in self.MOUNT_POINTS if not Path(p).exists()]
        for path in self.created:
            Path(path).mkdir()

    def start(self, name: str, command: list[str] | None = None, log: str | None = None) -> subprocess.Popen:
        service = self.doc["services"][name]
        scratch = self.root / f"scratch-{name}"
        scratch.mkdir(exist_ok=True)
        steps = [f"mount --bind {self.hosts} /etc/hosts", f"mount --bind {scratch} {compose.SCRATCH}"]
        for volume in service["volumes"]:
            source, target, *mode = volume.split(":")
            steps.append(f"mount --bind {self.volumes[source]} {target}")
            steps += [f"mount -o remount,bind,ro {target}"] if mode else []
        steps += [f"cd {compose.SCRATCH}", "exec " + shlex.join(command or service["command"])]
        env = {"PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin", "PYTHONUNBUFFERED": "1",
               "HOME": compose.SCRATCH, "TMPDIR": compose.SCRATCH, **container_env(service)}
        with open(self.root / (log or f"{name}.log"), "w") as out:
            process = subprocess.Popen(["unshare", "-m", "--propagation", "private", "sh", "-c", " && ".join(steps)],
                                       env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.processes.append(process)
        return process

    def log(self, name: str) -> str:
        return (self.root / f"{name}.log").read_text()[-3000:]

    def close(self) -> None:
        for process in self.processes:
            try:
                os.killpg(process.pid, signal.SIGKILL)  # Paddle leaves helper processes in the group
            except ProcessLookupError:
                pass
            process.wait()
        for path in self.created:
            Path(path).rmdir()


def _can_emulate() -> bool:
    return (os.geteuid() == 0 and shutil.which("unshare") is not None
            and subprocess.run(["unshare", "-m", "true"], capture_output=True).returncode == 0)


@pytest.mark.slow
@pytest.mark.skipif(not _can_emulate(), reason="needs root and unshare (private mount namespaces)")
def test_committed_compose_services_train_and_checkpoint_together(tmp_path):
    """What `docker compose up` does with the committed file, ordering included: prep, then the servers, then
    the workers once every server's healthcheck passes; every process exits 0 and a checkpoint is committed."""
    doc = yaml.safe_load(COMPOSE_YAML.read_text())
    host = EmulatedHost(doc, tmp_path)
    try:
        assert host.start("prep").wait(300) == 0, host.log("prep")
        servers = {name: host.start(name) for name in doc["services"] if name.startswith("ps-")}
        for name, server in servers.items():
            deadline = time.time() + 120
            while host.start(name, doc["services"][name]["healthcheck"]["test"][1:], f"{name}-probe.log").wait():
                assert server.poll() is None and time.time() < deadline, host.log(name)
                time.sleep(1)
        processes = {**servers, **{name: host.start(name) for name in doc["services"] if name.startswith("worker-")}}
        deadline = time.time() + 600
        while any(p.poll() is None for p in processes.values()):
            failed = [name for name, p in processes.items() if p.poll() not in (None, 0)]
            assert not failed and time.time() < deadline, "\n".join(f"{n}:\n{host.log(n)}" for n in failed or processes)
            time.sleep(1)
    finally:
        host.close()
    store = CheckpointStore(str(host.volumes["checkpoints"]))
    assert store.latest() and (host.volumes["checkpoints"] / store.latest() / "MANIFEST.json").exists()
    assert "@done" in host.log("worker-0") and "@done" in host.log("ps-1")
