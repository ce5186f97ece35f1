#!/usr/bin/env python3
"""``docker compose up --abort-on-container-failure`` for podman hosts whose tools cannot do it themselves.

    containers/compose_up.py containers/docker-compose.yaml

podman-compose 1.0.x (Debian 12) starts every service at once, ignoring ``depends_on`` conditions, and podman
runs a container's healthcheck only from systemd timers, which a host without systemd (a CI container) lacks.
So this script starts the services itself: podman-compose creates the project (network, volumes, containers:
``up --no-start``), then each service starts once its ``depends_on`` conditions hold:

* ``service_started``: the dependency was started;
* ``service_healthy``: its healthcheck, run with ``podman healthcheck run`` every ``interval``, passed, before
  ``retries`` failures in a row;
* ``service_completed_successfully``: it exited 0.

Services in a profile (the online server's, which never ends) are left out, as a plain ``docker compose up`` leaves
them: this runs the job. Every container's output is printed as it comes, prefixed with its service name. As soon as a container exits
non-zero, fails its healthcheck, or the whole run exceeds ``--timeout``, the running containers are stopped and
the script says what failed, where, and how long the others took to stop.

A PS job restarts whole, which compose cannot say; the generated file says it in its ``x-ctr-ps`` block
(``components/train/backends/docker_compose.py``): which services restart together (the watch and the roles),
how often (``max_restarts``, from ``cluster.max_restarts``; ``--max-restarts`` overrides it) and which exit
statuses no restart mends (a configuration error, a refused store). When one of those services fails otherwise,
its group is stopped, removed and created again with the next attempt in ``CTR_PS_ATTEMPT``; every role then
resumes from the newest checkpoint the run committed, the run being the one this script named in ``CTR_PS_RUN``
when it created the project. Data prep is not run again. Exit status: 0 when every service exited 0, 1
otherwise. Needs only the standard library and PyYAML (a dependency of podman-compose). Remove the
project afterwards with ``podman-compose -p PROJECT -f FILE down -v`` and ``podman network rm PROJECT_job
PROJECT_serving PROJECT_store`` (podman-compose 1.0 leaves the networks behind).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

import yaml

POLL_S = 0.5
STOP_TIMEOUT_S = 10  # SIGTERM, then SIGKILL, as `docker compose` stops containers
RESTART_BLOCK = "x-ctr-ps"
RUN_VARIABLE, ATTEMPT_VARIABLE = "CTR_PS_RUN", "CTR_PS_ATTEMPT"  # interpolated into the roles' environment
CHECKPOINT_EVENT = "@checkpoint "  # a worker's line once a checkpoint committed: its id and pass, as JSON
PROGRESS_EVENT = "@progress "  # a worker's report: its pass and the examples it trained in it so far


def seconds(duration: str) -> float:
    """A compose duration (``2s``, ``1m30s``, ``500ms``) in seconds."""
    parts = re.findall(r"(\d+(?:\.\d+)?)(ms|us|s|m|h)", duration)
    if not parts or "".join(n + u for n, u in parts) != duration:
        raise ValueError(f"not a compose duration: {duration!r}")
    scale = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    return sum(float(n) * scale[u] for n, u in parts)


@dataclass
class Service:
    name: str
    container: str
    depends_on: dict[str, str]  # dependency -> condition
    healthcheck: Optional[dict]
    logs: Optional[subprocess.Popen] = None  # `podman logs --follow`: ends when the container exits
    started_at: Optional[float] = None
    exit_code: Optional[int] = None
    exited_at: Optional[float] = None
    healthy: bool = False
    probe_failures: int = 0
    next_probe: float = 0.0

    @property
    def started(self) -> bool:
        return self.logs is not None

    @property
    def running(self) -> bool:
        return self.started and self.exit_code is None


def start_order(doc: dict) -> list[str]:
    """The services in an order that starts every dependency first (compose refuses cycles too)."""
    services = doc["services"]
    order: list[str] = []

    def visit(name: str, path: tuple[str, ...]) -> None:
        if name in order:
            return
        if name in path:
            raise ValueError(f"dependency cycle: {' -> '.join(path + (name,))}")
        for dependency in services[name].get("depends_on", {}):
            if dependency not in services:
                raise ValueError(f"service {name!r} depends on {dependency!r}, which the file does not define")
            visit(dependency, path + (name,))
        order.append(name)

    for name in services:
        visit(name, ())
    return order


@dataclass(frozen=True)
class RestartRule:
    """The file's ``x-ctr-ps`` block: the services restarted together, how often, and when never."""

    max_restarts: int = 0
    together: tuple[str, ...] = ()
    not_restarted_exits: frozenset[int] = field(default_factory=frozenset)

    def restarts(self, service: Service) -> bool:
        return service.name in self.together and service.exit_code not in self.not_restarted_exits


def restart_rule(doc: dict) -> RestartRule:
    block = doc.get(RESTART_BLOCK)
    if not block:
        return RestartRule()
    return RestartRule(int(block["max_restarts"]), tuple(block["restart_together"]),
                       frozenset(int(code) for code in block["not_restarted_exits"]))


def load(path: Path) -> tuple[str, list[Service], RestartRule]:
    """The compose file's project, the services to run (in start order) and what to restart together."""
    doc = yaml.safe_load(path.read_text())
    project = doc.get("name") or path.parent.resolve().name
    services = []
    for name in start_order(doc):
        spec = doc["services"][name]
        if spec.get("profiles"):
            continue
        depends = spec.get("depends_on", {})
        if isinstance(depends, list):  # the short form means service_started
            depends = {d: {"condition": "service_started"} for d in depends}
        services.append(Service(name, spec.get("container_name", f"{project}_{name}_1"),
                                {d: c.get("condition", "service_started") for d, c in depends.items()},
                                spec.get("healthcheck")))
    return project, services, restart_rule(doc)


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", *args], capture_output=True, text=True, check=check)


class Run:
    def __init__(self, services: list[Service]):
        self.services = {s.name: s for s in services}
        self.lock = threading.Lock()
        self.width = max(len(name) for name in self.services)
        self.checkpoint: Optional[tuple[str, float, int]] = None  # the newest one committed: (id, when, pass)
        self.trained: dict[str, tuple[int, int]] = {}  # worker -> (pass, examples in it), its last report
        self.attempt_started = time.monotonic()

    def say(self, line: str) -> None:
        with self.lock:
            print(line, flush=True)

    def start(self, service: Service) -> Optional[str]:
        """Start the container and relay its output; the reason it could not start, if so."""
        # Not `start --attach`: podman's own complaints (no systemd for healthcheck timers, no syslog) would be
        # mixed into the service's output.
        started = podman("start", service.container, check=False)
        if started.returncode != 0:
            return f"{service.name} could not start: {started.stderr.strip()}"
        service.started_at = time.monotonic()
        service.logs = subprocess.Popen(["podman", "logs", "--follow", service.container],
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        threading.Thread(target=self._relay, args=(service,), daemon=True).start()
        return None

    def _relay(self, service: Service) -> None:
        for line in service.logs.stdout:
            self.say(f"{service.name:<{self.width}} | {line.rstrip()}")
            try:  # a line garbled by native output is skipped: the next one tells
                if line.startswith(CHECKPOINT_EVENT):
                    event = json.loads(line[len(CHECKPOINT_EVENT):])
                    # A checkpoint inside a pass (chunk > 0) keeps that pass's examples: none counted after it.
                    done = int(event["epoch"]) if not event.get("chunk") else None
                    self.checkpoint = (event["id"], time.monotonic(), done)
                elif line.startswith(PROGRESS_EVENT) and service.name.startswith("worker-"):
                    event = json.loads(line[len(PROGRESS_EVENT):])
                    self.trained[service.name] = (int(event["epoch"]), int(event["examples"]))
            except (ValueError, KeyError, TypeError):
                pass

    def examples_again(self) -> Optional[int]:
        """The examples the workers reported in the passes after the newest checkpoint (all of them without one):
        a restart trains them again; None when a checkpoint inside a pass makes that count unknown here."""
        done = self.checkpoint[2] if self.checkpoint else 0
        if done is None:
            return None
        return sum(n for epoch, n in self.trained.values() if epoch > done)

    def poll_exits(self) -> None:
        for service in self.services.values():
            if service.running and service.logs.poll() is not None:
                state = podman("inspect", "--format", "{{.State.Status}} {{.State.ExitCode}}", service.container)
                status, code = state.stdout.split()
                if status in ("exited", "stopped"):
                    service.exit_code = int(code)
                    service.exited_at = time.monotonic()

    def probe(self, service: Service, now: float) -> Optional[str]:
        """Run a due healthcheck; the reason the service can never become healthy, if so."""
        check = service.healthcheck
        if service.healthy or not service.running or now < service.next_probe:
            return None
        service.next_probe = now + seconds(check.get("interval", "30s"))
        if podman("healthcheck", "run", service.container, check=False).returncode == 0:
            service.healthy = True
            self.say(f"{service.name:<{self.width}} | (healthy after {now - service.started_at:.1f}s)")
            return None
        service.probe_failures += 1
        retries = int(check.get("retries", 3))
        if service.probe_failures >= retries:
            return f"{service.name} failed its healthcheck {retries} times in a row"
        return None

    def blocked(self, service: Service) -> tuple[bool, Optional[str]]:
        """(whether ``service`` may start now, the reason it never can)."""
        ready = True
        for name, condition in service.depends_on.items():
            dependency = self.services[name]
            if condition == "service_completed_successfully":
                if dependency.exit_code not in (None, 0):
                    return False, f"{name} exited with code {dependency.exit_code}"
                ready &= dependency.exit_code == 0
            elif condition == "service_healthy":
                if dependency.exit_code is not None and not dependency.healthy:
                    return False, f"{name} exited with code {dependency.exit_code} before it was healthy"
                ready &= dependency.healthy
            else:
                ready &= dependency.started
        return ready, None

    def first_failed(self) -> Optional[Service]:
        failed = [s for s in self.services.values() if s.exit_code not in (None, 0)]
        return min(failed, key=lambda s: s.exited_at) if failed else None

    def failure(self) -> Optional[str]:
        first = self.first_failed()
        return f"{first.name} exited with code {first.exit_code}{signal_note(first.exit_code)}" if first else None

    def up(self, deadline: float) -> Optional[str]:
        """Run every service to its end (by ``deadline``, on the monotonic clock); the reason the run failed, or
        None."""
        timeout_s = deadline - time.monotonic()
        while True:
            now = time.monotonic()
            self.poll_exits()
            reason = self.failure()
            for service in self.services.values():
                if reason:
                    break
                if not service.started:
                    ready, reason = self.blocked(service)
                    if ready:
                        reason = self.start(service)
                elif service.healthcheck:
                    reason = self.probe(service, now)
            if reason:
                return reason
            if all(s.exit_code == 0 for s in self.services.values()):
                return None
            if now > deadline:
                pending = [s.name for s in self.services.values() if s.exit_code is None]
                return f"not done in the {timeout_s:.0f}s left: {', '.join(pending)} still pending or running"
            time.sleep(POLL_S)

    def stop_all(self) -> list[str]:
        """Stop every running container; a line per container saying how it ended."""
        stopping_at = time.monotonic()
        running = [s for s in self.services.values() if s.running]
        # A paused container (`podman pause`: a hung role, as the fault tests make one) takes no signal, and podman
        # refuses to stop it: resumed first, it is stopped with the others.
        paused = [s.container for s in running if podman("inspect", "--format", "{{.State.Status}}", s.container,
                                                         check=False).stdout.strip() == "paused"]
        if paused:
            podman("unpause", *paused, check=False)
        if running:
            podman("stop", "--time", str(STOP_TIMEOUT_S), *[s.container for s in running], check=False)
        for service in running:
            service.logs.wait()
        self.poll_exits()
        lines = []
        for service in self.services.values():
            if not service.started:
                lines.append(f"{service.name}: not started")
            elif service in running:
                lines.append(f"{service.name}: stopped {service.exited_at - stopping_at:.1f}s after the failure "
                             f"(exit code {service.exit_code})")
            else:
                lines.append(f"{service.name}: exited with code {service.exit_code}")
        return lines


def signal_note(code: int) -> str:
    names = {137: "SIGKILL", 143: "SIGTERM", 139: "SIGSEGV", 134: "SIGABRT"}
    return f" ({names[code]})" if code in names else ""


def create(compose: list[str], services: list[Service], env: dict, only: bool = True) -> Optional[str]:
    """Create the containers of ``services`` (podman-compose ``up --no-start``; those of every service in the file
    unless ``only``); what went wrong, if anything."""
    named = ["--no-deps", *(s.name for s in services)] if only else []
    created = subprocess.run([*compose, "up", "--no-start", *named], capture_output=True, text=True, env=env)
    missing = [s.container for s in services if podman("container", "exists", s.container, check=False).returncode]
    if created.returncode != 0 or missing:  # podman-compose 1.0 exits 0 when a `podman create` failed
        return f"{created.stdout}{created.stderr}podman-compose did not create {', '.join(missing) or 'the project'}"
    return None


def restart(run: Run, rule: RestartRule, compose: list[str], env: dict, attempt: int, project: str) -> Optional[str]:
    """Stop and remove the restart group's containers, create them again for ``attempt`` (every other service
    keeps its state: data prep stays done); what went wrong, if anything."""
    for line in run.stop_all():
        run.say(f"{project}:   {line}")
    group = [run.services[name] for name in rule.together]
    podman("rm", "--force", *(s.container for s in group), check=False)
    env[ATTEMPT_VARIABLE] = str(attempt)
    fresh = [Service(s.name, s.container, s.depends_on, s.healthcheck) for s in group]
    problem = create(compose, fresh, env)
    run.services.update({s.name: s for s in fresh})
    run.trained.clear()
    run.attempt_started = time.monotonic()
    return problem


def restart_line(run: Run, project: str, reason: str, attempt: int, rule: RestartRule) -> str:
    """``restart 1 of 2: ...``: what failed, what the next attempt resumes from and what it trains again (the shape
    of the local launcher's line)."""
    if run.checkpoint:
        ckpt_id, since, _ = run.checkpoint
        start = f"resumes from checkpoint {ckpt_id}, the newest this run committed"
    else:
        since = run.attempt_started
        start = "starts from the beginning again (this run committed no checkpoint)"
    again = run.examples_again()
    examples = f"at least {again:,} examples to train again" if again is not None else "the pass so far to train again"
    return (f"{project}: restart {attempt} of {rule.max_restarts}: {reason}; attempt {attempt + 1} of "
            f"{rule.max_restarts + 1} {start}; {examples} ({time.monotonic() - since:.0f}s of training lost)")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("file", type=Path, help="the compose file")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds the whole run may take")
    parser.add_argument("--podman-compose", default="podman-compose", help="the podman-compose command")
    parser.add_argument("--max-restarts", type=int,
                        help=f"whole-job restarts after a role failed (default: the file's {RESTART_BLOCK} block)")
    args = parser.parse_args(argv)
    project, services, rule = load(args.file)
    if args.max_restarts is not None:
        rule = RestartRule(args.max_restarts, rule.together, rule.not_restarted_exits)
    # The run's name: a restarted attempt resumes only this run's checkpoints, never an earlier run's in the store.
    env = {**os.environ, RUN_VARIABLE: f"{project}-{uuid.uuid4().hex[:12]}", ATTEMPT_VARIABLE: "0"}
    # -p: podman-compose 1.0 ignores the file's `name` and would name the project after the folder.
    compose = [args.podman_compose, "-p", project, "-f", str(args.file)]
    # Every service's container, those of a profile too: podman-compose 1.0 ignores profiles (check.sh starts the
    # serving ones itself).
    problem = create(compose, services, env, only=False)
    if problem:
        print(f"{problem} from {args.file}", file=sys.stderr)
        return 1
    run = Run(services)
    deadline = time.monotonic() + args.timeout
    attempt = 0
    while True:
        reason = run.up(deadline)
        if reason is None:
            run.say(f"{project}: every service exited 0{f' (after {attempt} restarts)' if attempt else ''}")
            for service in run.services.values():
                run.say(f"{project}:   {service.name}: ran {service.exited_at - service.started_at:.1f}s")
            return 0
        failed = run.first_failed()
        if failed is None or not rule.restarts(failed) or attempt >= rule.max_restarts:
            break
        attempt += 1
        run.say(restart_line(run, project, reason, attempt, rule))
        problem = restart(run, rule, compose, env, attempt, project)
        if problem:
            reason = problem
            break
    limit = (f" (after {attempt} restarts, cluster.max_restarts={rule.max_restarts})"
             if failed is not None and rule.restarts(failed) else "")
    run.say(f"{project}: FAILED: {reason}{limit}; stopping the running containers")
    for line in run.stop_all():
        run.say(f"{project}:   {line}")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
