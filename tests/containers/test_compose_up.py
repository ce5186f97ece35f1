"""containers/compose_up.py, the podman driver of the compose file: the start order and the depends_on
conditions it enforces (no container engine runs here; containers/check.sh runs the driver for real)."""

import importlib.util
import sys

import pytest
import yaml

from tests.conftest import ROOT

COMPOSE_YAML = ROOT / "containers" / "docker-compose.yaml"
_spec = importlib.util.spec_from_file_location("compose_up", ROOT / "containers" / "compose_up.py")
compose_up = sys.modules["compose_up"] = importlib.util.module_from_spec(_spec)  # dataclasses look it up there
_spec.loader.exec_module(compose_up)
STARTED = object()  # stands for the log follower of a started container


def run_of_committed_file():
    _, services, _ = compose_up.load(COMPOSE_YAML)
    return compose_up.Run(services)


def test_services_start_after_their_dependencies_under_podman_compose_names():
    project, services, _ = compose_up.load(COMPOSE_YAML)
    assert project == "ctr-ps"
    # The serving profile's services (export, serving) are left out, as a plain `docker compose up` leaves them.
    assert [s.name for s in services] == ["prep", "watch", "ps-0", "ps-1", "worker-0", "worker-1", "evaluate"]
    assert {s.name: s.container for s in services}["ps-1"] == "ctr-ps_ps-1_1"
    worker = {s.name: s for s in services}["worker-0"]
    assert worker.depends_on == {"ps-0": "service_healthy", "ps-1": "service_healthy"}


def test_cycles_and_unknown_dependencies_are_refused():
    with pytest.raises(ValueError, match="dependency cycle: a -> b -> a"):
        compose_up.start_order({"services": {"a": {"depends_on": ["b"]}, "b": {"depends_on": ["a"]}}})
    with pytest.raises(ValueError, match="'a' depends on 'c', which the file does not define"):
        compose_up.start_order({"services": {"a": {"depends_on": {"c": {"condition": "service_started"}}}}})


@pytest.mark.parametrize("text,seconds", [("2s", 2.0), ("1m30s", 90.0), ("500ms", 0.5), ("1h", 3600.0)])
def test_compose_durations(text, seconds):
    assert compose_up.seconds(text) == seconds


@pytest.mark.parametrize("text", ["2", "2x", "s", "2s junk"])
def test_bad_durations_are_refused(text):
    with pytest.raises(ValueError, match="not a compose duration"):
        compose_up.seconds(text)


def test_a_server_starts_only_once_prep_exited_0_and_the_watch_holds_the_lease_and_never_after_prep_failed():
    run = run_of_committed_file()
    prep, watch, server = run.services["prep"], run.services["watch"], run.services["ps-0"]
    assert run.blocked(server) == (False, None)  # prep not started
    prep.logs = STARTED
    assert run.blocked(server) == (False, None)  # running
    prep.exit_code = 0
    assert run.blocked(watch) == (True, None) and run.blocked(server) == (False, None)
    watch.logs, watch.healthy = STARTED, True  # it holds the store's lease
    assert run.blocked(server) == (True, None)
    prep.exit_code = 1
    assert run.blocked(server) == (False, "prep exited with code 1")


def test_a_worker_waits_for_every_server_to_be_healthy():
    run = run_of_committed_file()
    worker = run.services["worker-1"]
    for name in ("ps-0", "ps-1"):
        run.services[name].logs = STARTED
    run.services["ps-0"].healthy = True
    assert run.blocked(worker) == (False, None)
    run.services["ps-1"].healthy = True
    assert run.blocked(worker) == (True, None)


def test_a_server_that_exits_before_it_was_healthy_blocks_the_workers_for_good():
    run = run_of_committed_file()
    server = run.services["ps-1"]
    server.logs, server.exit_code = STARTED, 137
    assert run.blocked(run.services["worker-0"]) == (False, "ps-1 exited with code 137 before it was healthy")


def test_the_first_failure_is_the_one_reported():
    run = run_of_committed_file()
    for name, code, at in (("worker-0", 143, 12.0), ("ps-1", 137, 10.0), ("prep", 0, 1.0)):
        service = run.services[name]
        service.logs, service.exit_code, service.exited_at = STARTED, code, at
    assert run.failure() == "ps-1 exited with code 137 (SIGKILL)"


def test_the_committed_file_is_what_the_driver_reads():
    # The driver honours only what the generator writes: depends_on conditions and CMD healthchecks.
    doc = yaml.safe_load(COMPOSE_YAML.read_text())
    conditions = {c["condition"] for s in doc["services"].values() for c in s.get("depends_on", {}).values()}
    assert conditions <= {"service_started", "service_healthy", "service_completed_successfully"}
    for service in doc["services"].values():
        if "healthcheck" in service:
            assert compose_up.seconds(service["healthcheck"]["interval"]) > 0
            assert int(service["healthcheck"]["retries"]) > 0


class FakeLogs:
    """A container's `podman logs --follow`: it ends once the container is stopped."""

    def __init__(self, container: str, stopped: set):
        self.container, self.stopped = container, stopped

    def wait(self):
        assert self.container in self.stopped, f"waiting for good on {self.container}'s log"

    def poll(self):
        return 0 if self.container in self.stopped else None


def test_a_paused_container_is_resumed_before_the_job_is_stopped(monkeypatch):
    """A hung role made with `podman pause` takes no signal and podman refuses to stop it: the driver resumes it
    first, or it would wait on its log for good."""
    run = run_of_committed_file()
    paused, stopped, calls = {"ctr-ps_worker-1_1"}, set(), []

    def podman(*args, check=True):
        calls.append(args[0])
        if args[0] == "inspect":
            container, template = args[-1], args[2]
            status = "paused" if container in paused else "exited" if container in stopped else "running"
            return type("Done", (), {"stdout": f"{status} 143" if "ExitCode" in template else status})()
        if args[0] == "unpause":
            paused.difference_update(args[1:])
        if args[0] == "stop":
            stopped.update(c for c in args[3:] if c not in paused)
        return type("Done", (), {"stdout": ""})()

    monkeypatch.setattr(compose_up, "podman", podman)
    for name in ("ps-0", "worker-1"):
        service = run.services[name]
        service.logs = FakeLogs(service.container, stopped)
    lines = run.stop_all()
    assert calls.index("unpause") < calls.index("stop") and not paused
    assert "worker-1: stopped" in " ".join(lines) and "ps-0: stopped" in " ".join(lines)


def test_the_committed_file_restarts_the_watch_and_the_roles_together_unless_no_restart_mends_the_exit():
    run = run_of_committed_file()
    rule = compose_up.load(COMPOSE_YAML)[2]
    assert rule.max_restarts == 2
    for name, code, restarted in (("worker-1", 137, True), ("ps-0", 143, True), ("watch", 1, True),
                                  ("worker-0", 78, False), ("ps-1", 74, False), ("watch", 74, False),
                                  ("prep", 1, False), ("evaluate", 1, False)):
        service = run.services[name]
        service.exit_code = code
        assert rule.restarts(service) is restarted, (name, code)
    assert compose_up.restart_rule({"services": {}}).max_restarts == 0  # a file without the block: no restart


def test_a_restart_recreates_only_the_group_for_the_next_attempt_of_the_same_run(monkeypatch):
    run = run_of_committed_file()
    rule = compose_up.load(COMPOSE_YAML)[2]
    prep, worker = run.services["prep"], run.services["worker-1"]
    prep.logs, prep.exit_code = STARTED, 0
    worker.logs, worker.exit_code, worker.exited_at = STARTED, 137, 5.0
    calls, created = [], []

    def podman(*args, check=True):
        calls.append(args)
        return type("Done", (), {"stdout": "", "returncode": 0})()

    def compose_run(command, capture_output, text, env):
        created.append((command, env[compose_up.ATTEMPT_VARIABLE], env[compose_up.RUN_VARIABLE]))
        return type("Done", (), {"stdout": "", "stderr": "", "returncode": 0})()

    monkeypatch.setattr(compose_up, "podman", podman)
    monkeypatch.setattr(compose_up.subprocess, "run", compose_run)
    monkeypatch.setattr(run, "stop_all", lambda: [])
    env = {compose_up.RUN_VARIABLE: "ctr-ps-run1", compose_up.ATTEMPT_VARIABLE: "0"}
    assert compose_up.restart(run, rule, ["podman-compose", "-p", "ctr-ps", "-f", "x.yaml"], env, 1, "ctr-ps") is None
    group = ["watch", "ps-0", "ps-1", "worker-0", "worker-1"]
    assert ("rm", "--force", *(f"ctr-ps_{name}_1" for name in group)) in calls
    # Created again with the next attempt, under the run's own name: the roles resume its newest checkpoint.
    assert created == [(["podman-compose", "-p", "ctr-ps", "-f", "x.yaml", "up", "--no-start", "--no-deps", *group],
                        "1", "ctr-ps-run1")]
    assert run.services["prep"] is prep and prep.exit_code == 0  # data prep is not run again
    assert all(not run.services[name].started and run.services[name].exit_code is None for name in group)
    assert run.blocked(run.services["watch"]) == (True, None)  # it starts again at once: prep stays done


def test_the_restart_line_names_the_checkpoint_the_next_attempt_resumes_from_and_what_it_trains_again():
    run = run_of_committed_file()
    rule = compose_up.RestartRule(2, ("watch",), frozenset())

    def relay(service: str, *lines: str) -> None:
        run.services[service].logs = type("Logs", (), {"stdout": [f"{line}\n" for line in lines]})()
        run._relay(run.services[service])

    relay("worker-0", '@progress {"role": "worker", "index": 0, "epoch": 1, "examples": 3000}')
    relay("worker-1", '@progress {"role": "worker", "index": 1, "epoch": 1, "examples": 2000}',
          "W1205 12:00:00 a native line", '@progress {"role": "worker", "epoch": 1, "examp')  # garbled: skipped
    line = compose_up.restart_line(run, "ctr-ps", "worker-1 exited with code 137 (SIGKILL)", 1, rule)
    assert line.startswith("ctr-ps: restart 1 of 2: worker-1 exited with code 137 (SIGKILL); attempt 2 of 3 starts "
                           "from the beginning again (this run committed no checkpoint); at least 5,000 examples to "
                           "train again (")
    relay("worker-0", '@checkpoint {"id": "20261205T120000Z-e0001-s0", "epoch": 1, "chunk": 0}',
          '@progress {"role": "worker", "index": 0, "epoch": 2, "examples": 700}')
    relay("worker-1", '@progress {"role": "worker", "index": 1, "epoch": 2, "examples": 600}')
    line = compose_up.restart_line(run, "ctr-ps", "ps-0 exited with code 137 (SIGKILL)", 2, rule)
    assert ("attempt 3 of 3 resumes from checkpoint 20261205T120000Z-e0001-s0, the newest this run committed; at least "
            "1,300 examples to train again (0s of training lost)") in line
    relay("worker-0", '@checkpoint {"id": "20261205T120100Z-e0001-s1", "epoch": 1, "chunk": 3}')  # inside pass 2
    assert compose_up.restart_line(run, "ctr-ps", "x", 2, rule).endswith(
        "; the pass so far to train again (0s of training lost)")
