"""The local driver (``python -m pipelines.ctr``) as a user runs it: stopped, killed, or refused up front.

Every process of a run mentions its run directory on its command line (the step's executor input, the PS
roles' job specs, the sidecars' store, Paddle's ``cat`` readers), which is how these tests find them.
"""

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from components.ps.contract import endpoint_accepts
from tests.conftest import ROOT, job_processes, listening_sockets

CLI = [sys.executable, "-m", "pipelines.ctr"]


def _env():
    return {**os.environ, "PYTHONPATH": str(ROOT)}


class Driver:
    """``python -m pipelines.ctr`` in the background; collects its output, and every socket its run listens on."""

    def __init__(self, run_dir: Path, *overrides: str):
        self.run_dir = run_dir
        self.popen = subprocess.Popen([*CLI, *overrides, f"hydra.run.dir={run_dir}"], cwd=ROOT, env=_env(),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                      start_new_session=True)  # its own process group, as from a terminal
        self.lines: list[str] = []
        self.sockets: set[tuple[str, int]] = set()
        self._done = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._sample, daemon=True).start()

    def _read(self):
        for line in self.popen.stdout:
            self.lines.append(line)
        self._done.set()

    def _sample(self):
        # From the start: server 0's gloo rendezvous store listens only until the workers have met.
        while not self._done.is_set():
            self.sockets |= listening_sockets(str(self.run_dir))
            time.sleep(0.05)

    def wait_for(self, text: str, timeout_s: float = 240):
        deadline = time.time() + timeout_s
        while not any(text in line for line in self.lines):
            assert self.popen.poll() is None, "".join(self.lines[-30:])
            assert time.time() < deadline, f"no {text!r} within {timeout_s}s:\n" + "".join(self.lines[-30:])
            time.sleep(0.1)


@pytest.mark.parametrize("sig,group", [(signal.SIGTERM, False), (signal.SIGKILL, False),
                                       pytest.param(signal.SIGKILL, True, marks=pytest.mark.slow)],
                         ids=["SIGTERM", "SIGKILL", "SIGKILL-to-the-process-group"])
def test_stopping_or_killing_the_driver_mid_training_leaves_no_process_and_no_port(tmp_path, sig, group):
    """SIGTERM (a closed terminal, ``timeout``, a CI cancel) or SIGKILL of the driver while the PS job trains:
    within 10 s no process of the run is left and none of its ports takes a connection. Meanwhile, nothing of
    the run listened on every interface (0.0.0.0, ::): every socket was bound to ps.host.

    SIGKILL to the driver's whole process group also kills the train step (the PS job's launcher) at once:
    then the roles, their sidecars and what Paddle forked die with their parents (PR_SET_PDEATHSIG)."""
    run_dir = tmp_path / "run"
    driver = Driver(run_dir, "experiment=tiny", "ps.epochs=500", "ps.progress_period_s=1")
    driver.wait_for("  epoch 1: 14,000/14,000 examples (100%)")  # the console's line for a finished pass
    assert len(job_processes(str(run_dir))) >= 4  # step, server, worker, sidecar (and more)
    sockets = set(driver.sockets)
    # server 0's PS port and its gloo rendezvous store, and worker 0's gloo transport at least
    assert len(sockets) >= 3, sockets
    assert {address for address, _ in sockets} == {"127.0.0.1"}, sockets

    if group:
        os.killpg(driver.popen.pid, sig)
    else:
        os.kill(driver.popen.pid, sig)
    stopped_at = time.time()
    while job_processes(str(run_dir)) and time.time() - stopped_at < 10:
        time.sleep(0.1)
    assert not job_processes(str(run_dir)), f"left after {sig.name}: {job_processes(str(run_dir))}"
    assert not [port for _, port in sockets if endpoint_accepts(f"127.0.0.1:{port}")]
    code = driver.popen.wait(10)
    assert code == (128 + sig if sig == signal.SIGTERM else -sig), "".join(driver.lines[-20:])
    if sig == signal.SIGTERM:
        assert "error: stopped by SIGTERM: the running step and its processes have ended" in "".join(driver.lines)
    if not group:  # the step stopped its job in order, and gave the store's lease back
        assert not (run_dir / "checkpoint" / "_lease.json").exists()


def test_resume_latest_on_an_empty_store_exits_2_before_data_prep_and_runs_get_their_own_directories(tmp_path):
    """``checkpoint.resume=latest`` with nothing to resume is an error, not a silent fresh start. Two runs
    started together (Hydra's default run directory, named to the second) get a directory each."""
    procs = [subprocess.Popen([*CLI, "experiment=tiny", "checkpoint.resume=latest"], cwd=tmp_path, env=_env(),
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [proc.communicate(timeout=120) for proc in procs]
    run_dirs = sorted((tmp_path / "outputs").glob("*/*"))
    assert len(run_dirs) == 2, run_dirs
    assert all(re.fullmatch(r"\d\d-\d\d-\d\d-[0-9a-f]{6}", d.name) for d in run_dirs), run_dirs
    for proc, (_, stderr), run_dir in zip(procs, results, run_dirs):
        assert proc.returncode == 2, stderr
        (line,) = stderr.strip().splitlines()
        assert line.startswith("error: config key 'checkpoint.resume' has value 'latest'; allowed: none, latest, "
                               "auto or a committed checkpoint id.")
        assert "holds no committed checkpoint" in line and "checkpoint.resume=auto" in line
        assert "/checkpoint holds" in line  # names the store (the run's own, new every run)
    for run_dir in run_dirs:
        assert not (run_dir / "kfp").exists() and not (run_dir / "checkpoint").exists()  # no data prep, no store


def test_a_missing_s3_bucket_exits_2_before_data_prep(tmp_path, moto_endpoint):
    run_dir = tmp_path / "run"
    proc = subprocess.run([*CLI, "experiment=tiny", "checkpoint.uri=s3://no-such-bucket-here/ctr",
                           f"hydra.run.dir={run_dir}"], cwd=ROOT, env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith("error: config key 'checkpoint.uri' has value 's3://no-such-bucket-here/ctr'; allowed: "
                           "a store this machine can write, read and delete in.")
    assert "s3://no-such-bucket-here/ctr/_probe-" in line and "FileNotFoundError" in line
    assert not (run_dir / "kfp").exists()


def test_a_store_another_run_holds_is_refused_before_anything_starts(tmp_path, config):
    from components.checkpoint.lease import StoreLease
    from components.checkpoint.store import CheckpointStore
    from components.config import ConfigError
    from components.resolve.step import check_checkpoint_store

    cfg = config(f"checkpoint.uri={tmp_path / 'store'}")
    check_checkpoint_store(cfg)
    with StoreLease(CheckpointStore(str(tmp_path / "store")), "run-first"):
        with pytest.raises(ConfigError) as err:
            check_checkpoint_store(cfg)
    assert err.value.key == "checkpoint.uri" and "allowed: a store no other run is using" in str(err.value)
    assert f"is in use by run run-first (pid {os.getpid()}" in str(err.value)
    check_checkpoint_store(cfg)  # given back


@pytest.mark.slow
def test_a_run_resuming_a_corrupt_newest_checkpoint_warns_once_and_trains_on_from_the_intact_one_before(tmp_path):
    """The issue's case, end to end: one byte changed in a table file of LATEST. The fast twins check the resolve
    step and plan=true (tests/pipelines/test_pipeline.py, test_plan.py) and every kind of damage
    (tests/checkpoint/test_restore.py)."""
    store = tmp_path / "ckpt"
    first = subprocess.run([*CLI, "experiment=tiny", f"checkpoint.uri={store}", f"hydra.run.dir={tmp_path / 'run-1'}"],
                           cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr
    older, newest = sorted(p.parent.name for p in store.glob("*/MANIFEST.json"))
    table = sorted((store / newest / "tables").rglob("part-*"))[0]
    data = bytearray(table.read_bytes())
    data[len(data) // 2] ^= 1
    table.write_bytes(bytes(data))
    second = subprocess.run([*CLI, "experiment=tiny", "ps.epochs=3", f"checkpoint.uri={store}",
                             "checkpoint.resume=latest", f"hydra.run.dir={tmp_path / 'run-2'}"],
                            cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=300)
    assert second.returncode == 0, second.stderr
    warnings = [line for line in (second.stdout + second.stderr).splitlines() if "warning: checkpoint" in line]
    assert len(warnings) == 1, warnings
    damaged = table.relative_to(store / newest)
    assert f"checkpoint {newest} in {store} is corrupt ({damaged} does not match" in warnings[0]
    assert f"resuming from {older} instead" in warnings[0]
    assert "epoch 2:" in second.stdout and "epoch 3:" in second.stdout  # pass 1's checkpoint, then passes 2 and 3
    assert not job_processes(str(tmp_path))
