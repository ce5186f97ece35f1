"""Real local PS jobs whose roles fail: the launcher restarts the whole job from the newest intact checkpoint, up to
``cluster.max_restarts`` times, says what each restart cost, and leaves nothing running.

(The whole pipeline with a worker killed, against an undisturbed run: tests/pipelines/test_restarts.py.)
"""

import os
import signal

import pytest

from components.checkpoint.format import SCORES, TEST, load_scores
from components.checkpoint.store import CheckpointStore
from components.metrics import binary_metrics_counts
from components.train.backends.local import LocalJob, RoleFailed
from components.train.job import prepare_job
from tests.conftest import job_processes
from tests.ps.test_lifecycle import Running, _config, _in_pass, _wait_for, datasets  # noqa: F401 - a fixture


def _test_auc(uri, ckpt_id, local):
    """The test AUC of a checkpoint, from the test split's score counts every checkpoint carries."""
    store = CheckpointStore(uri)
    store.download(ckpt_id, local, select=lambda rel: rel.startswith(SCORES + "/"))
    return binary_metrics_counts(load_scores(local, TEST))["auc"]


def _kill(job, name, attempt, epoch):
    """SIGKILL to ``name`` once attempt ``attempt`` of the job reported it training pass ``epoch``."""
    _wait_for(lambda: job.attempt.number == attempt and _in_pass(job, name, epoch),
              what=f"{name} to train pass {epoch} in attempt {attempt}")
    os.kill(next(p for p in job.processes if p.name == name).popen.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def undisturbed(tmp_path_factory, datasets):  # noqa: F811 - the fixture imported above
    """The test AUC of the job below, run without a fault (the same data and seed)."""
    tmp_path = tmp_path_factory.mktemp("undisturbed")
    data_dir, _ = datasets[1]
    result = LocalJob(prepare_job(_config(tmp_path), None), data_dir, tmp_path / "logs", echo=lambda line: None).run()
    return _test_auc(str(tmp_path / "ckpt"), result.checkpoints[-1]["id"], tmp_path / "auc")


def test_a_worker_killed_mid_pass_restarts_the_job_from_its_checkpoint_and_ends_as_an_undisturbed_run(
        tmp_path, datasets, undisturbed):  # noqa: F811
    """Default settings (cluster.max_restarts=2): worker 0 killed with SIGKILL in pass 2 of 2. The launcher stops the
    server, restarts the job from pass 1's checkpoint in one console line, and the job ends as the undisturbed one
    does: both passes of every example, a test AUC within 0.01."""
    data_dir, stats = datasets[1]
    lines = []
    job = LocalJob(prepare_job(_config(tmp_path), None), data_dir, tmp_path / "logs", echo=lines.append)
    running = Running(job.run)
    _wait_for(lambda: job.checkpoints, what="pass 1's checkpoint")
    first = job.checkpoints[0]["id"]
    _kill(job, "worker-0", attempt=1, epoch=2)
    running.join(180)
    assert running.error is None, running.error
    result = running.result
    (restart,) = result.restarts
    assert restart["role"] == "worker-0" and restart["what"] == "exited with code -9 (killed by SIGKILL)"
    assert restart["checkpoint"] == first and restart["attempt"] == 1
    assert 0 <= restart["examples_again"] <= stats["rows"]["train"]
    (line,) = [line for line in lines if line.startswith("restart ")]
    assert line.startswith(f"restart 1 of 2: PS job {job.job_id}: worker-0 exited with code -9 (killed by SIGKILL); "
                           f"attempt 2 of 3 resuming from checkpoint {first} (after pass 1, "
                           f"{stats['rows']['train']:,} examples); "), line
    assert [(e["epoch"], e["examples"]) for e in result.epochs] == [(1, stats["rows"]["train"]),
                                                                   (2, stats["rows"]["train"])]
    assert [c["epoch"] for c in result.checkpoints] == [1, 2]
    auc = _test_auc(str(tmp_path / "ckpt"), result.checkpoints[-1]["id"], tmp_path / "auc")
    assert abs(auc - undisturbed) < 0.01, (auc, undisturbed)
    assert "---- attempt 2 of 3" in (tmp_path / "logs" / "server-0.log").read_text()  # the first attempt's kept
    assert not job_processes(str(tmp_path))


def test_a_restart_resumes_a_checkpoint_taken_inside_a_pass_at_its_chunk(tmp_path, datasets):  # noqa: F811
    """Checkpoints inside a pass (checkpoint.every_batches; checkpoint.every_minutes takes them at the same chunk
    boundaries): a worker killed after one resumes from that chunk, not from the pass's start."""
    data_dir, _ = datasets[1]
    lines = []
    cfg = _config(tmp_path, epochs=1, checkpoint={"every_batches": 100})
    job = LocalJob(prepare_job(cfg, None), data_dir, tmp_path / "logs", echo=lines.append)
    running = Running(job.run)
    _wait_for(lambda: len(job.checkpoints) >= 2, what="two checkpoints inside pass 1")
    os.kill(next(p for p in job.processes if p.name == "worker-0").popen.pid, signal.SIGKILL)
    running.join(180)
    assert running.error is None, running.error
    (restart,) = running.result.restarts
    resumed = next(c for c in running.result.checkpoints if c["id"] == restart["checkpoint"])
    assert resumed["epoch"] == 1 and resumed["chunk"] >= 2
    (line,) = [line for line in lines if line.startswith("restart ")]
    assert f"resuming from checkpoint {resumed['id']} (pass 1, chunk {resumed['chunk']} of " in line, line
    chunk = 100 * cfg.ps.batch_size * cfg.ps.threads
    assert restart["examples_again"] <= 2 * chunk  # at most the chunk it was in and the one before
    assert not job_processes(str(tmp_path))


def test_a_worker_stopped_past_the_stall_timeout_is_stopped_and_the_job_restarted_and_finished(
        tmp_path, datasets):  # noqa: F811
    """SIGSTOP to a worker (hung) in pass 1: the stall watchdog fires after ps.stall_timeout_s, the launcher kills
    every process of the attempt, the stopped one too, and the restarted job trains both passes to the end."""
    data_dir, stats = datasets[2]
    lines = []
    cfg = _config(tmp_path, workers=2, stall_timeout_s=6)
    job = LocalJob(prepare_job(cfg, None), data_dir, tmp_path / "logs", echo=lines.append)
    running = Running(job.run)
    _wait_for(lambda: _in_pass(job, "worker-1", 1), what="worker 1 to train pass 1")
    stopped = next(p for p in job.processes if p.name == "worker-1").popen
    os.kill(stopped.pid, signal.SIGSTOP)
    running.join(180)
    assert running.error is None, running.error
    assert stopped.poll() is not None  # killed, not left stopped
    (restart,) = running.result.restarts
    assert restart["role"] == "worker-1" and restart["what"].startswith("reported nothing for")
    assert "(its process is stopped: state T)" in restart["what"] and restart["checkpoint"] is None
    assert [e["examples"] for e in running.result.epochs] == [stats["rows"]["train"]] * 2
    assert not job_processes(str(tmp_path))


def test_a_role_that_keeps_failing_stops_the_job_after_max_restarts_naming_it_and_the_attempts(
        tmp_path, datasets):  # noqa: F811
    data_dir, _ = datasets[1]
    lines = []
    cfg = _config(tmp_path, epochs=50)
    cfg.cluster.max_restarts = 1
    job = LocalJob(prepare_job(cfg, None), data_dir, tmp_path / "logs", echo=lines.append)
    running = Running(job.run)
    for attempt in (1, 2):
        _kill(job, "worker-0", attempt=attempt, epoch=1)
    running.join(60)
    error = running.error
    assert isinstance(error, RoleFailed) and error.role == "worker-0", error
    assert str(error).splitlines()[0].startswith(
        f"PS job {job.job_id}: worker-0 exited with code -9 (killed by SIGKILL) on attempt 2 of 2 "
        f"(cluster.max_restarts=1); its log: {tmp_path / 'logs' / 'worker-0.log'}")
    assert [line.split(";")[0] for line in lines if line.startswith("restart ")] == [
        f"restart 1 of 1: PS job {job.job_id}: worker-0 exited with code -9 (killed by SIGKILL)"]
    assert any("attempt 2 of 2 starting from scratch again" in line for line in lines)  # no checkpoint yet
    assert not job_processes(str(tmp_path))


def test_a_configuration_error_is_not_restarted(tmp_path, datasets):  # noqa: F811
    """A role that exits with the contract's configuration error (a GPU asked of a CPU build of Paddle) fails the job
    at once: no restart can mend it."""
    data_dir, _ = datasets[1]
    lines = []
    cfg = _config(tmp_path)
    cfg.cluster.workers.gpus = 1
    job = LocalJob(prepare_job(cfg, None), data_dir, tmp_path / "logs", echo=lines.append)
    with pytest.raises(RoleFailed) as failed:
        job.run()
    assert failed.value.role == "worker-0" and not failed.value.restartable
    assert "exited with code 78 (a configuration error: restarting cannot mend it)" in str(failed.value)
    assert "cluster.workers.gpus" in str(failed.value)
    assert not [line for line in lines if line.startswith("restart ")]
    assert not job_processes(str(tmp_path))
