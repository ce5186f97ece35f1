"""The one liveness signal: the heartbeat records roles write into the checkpoint store, read under the one stall
rule, as the local launcher, the Kubernetes launcher and a compose job's watch service read them."""

import threading
import uuid

import pytest

from components.checkpoint.lease import LEASE, StoreLease
from components.checkpoint.store import CheckpointStore
from components.ps.liveness import LIVENESS, Heartbeat, HeartbeatRecord, clear_heartbeats, record_rel
from components.train.job import PsJobStoreError, RoleFailed
from components.train.liveness import Liveness, watch

JOB = "job-a"


class Clock:
    def __init__(self, now: float = 100.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path):
    return CheckpointStore(str(tmp_path / "ckpt"))


def _roles(store, *names, job=JOB):
    return {name: HeartbeatRecord(store, name.split("-")[0], int(name.split("-")[1]), job) for name in names}


def _reader(store, clock, **kwargs):
    return Liveness(store, JOB, stall_s=20.0, first_report_s=60.0, clock=clock, **kwargs)


def test_a_silent_role_is_stalled_unless_it_waits_for_a_worker_that_works(store):
    """Silent (its record unchanged) for longer than the stall timeout, except a worker that said it waits in a
    collective while another worker still reports (Paddle holds the GIL in a barrier)."""
    clock = Clock()
    roles = _roles(store, "server-0", "worker-0", "worker-1")
    reader = _reader(store, clock)
    running = {"server-0": 0.0, "worker-0": 0.0, "worker-1": 0.0}
    roles["server-0"].write()
    roles["worker-0"].write()
    roles["worker-1"].write(waiting=True)
    reader.poll()
    clock.now = 125.0
    roles["worker-0"].write()  # worker 0 works (an export), worker 1 waits at the barrier
    roles["server-0"].write()
    reader.poll()
    assert reader.stalled(running) == []
    clock.now = 141.0  # worker 1 waits on; worker 0 silent 16 s, within the timeout: nobody stalled
    reader.poll()
    assert reader.stalled(running) == []
    clock.now = 150.0  # worker 0 silent 25 s and not waiting: stalled; worker 1 has no one left to wait for
    reader.poll()
    assert reader.stalled(running) == [("worker-1", 50.0), ("server-0", 25.0), ("worker-0", 25.0)]
    roles["worker-0"].write(progress={"epoch": 1, "examples": 10})  # a progress record counts too
    roles["server-0"].write()
    clock.now = 151.0
    reader.poll()
    assert reader.stalled(running) == []
    # A role that never recorded a beat is judged from its start, with the longer first-report limit.
    assert reader.stalled({**running, "worker-2": 95.0}) == []
    assert reader.stalled({**running, "worker-2": 80.0}) == [("worker-2", 71.0)]


def test_a_long_save_is_work_while_the_servers_record_rows_written(store):
    """A checkpoint of a large table: every worker waits in the save, and the servers' sidecars record that their
    save advanced. Nobody is stalled while it does; once it stops (a save that hangs), the waiting workers are."""
    clock = Clock()
    roles = _roles(store, "server-0", "worker-0", "worker-1")
    reader = _reader(store, clock)
    running = {"server-0": 0.0, "worker-0": 0.0, "worker-1": 0.0}
    roles["worker-0"].write(waiting=True)
    roles["worker-1"].write(waiting=True)
    for second in range(0, 300, 5):  # five minutes of saving, well past the timeout
        clock.now = 100.0 + second
        roles["server-0"].write(work="saving")
        reader.poll()
        assert reader.stalled(running) == [], second
    clock.now += 21.0  # the server still beats, but its save advanced no further for longer than the timeout
    roles["server-0"].write()
    reader.poll()
    assert [name for name, _ in reader.stalled(running)] == ["worker-0", "worker-1"]


def test_an_unchanged_record_is_no_report_and_another_jobs_records_are_not_read(store):
    clock = Clock()
    roles = _roles(store, "worker-0")
    stale = _roles(store, "worker-1", job="an-earlier-attempt")
    roles["worker-0"].write()
    stale["worker-1"].write()
    reader = _reader(store, clock)
    reader.poll()
    clock.now = 125.0  # worker 0 wrote nothing since: the same record read again is not a report
    reader.poll()
    assert reader.stalled({"worker-0": 0.0}) == [("worker-0", 25.0)]
    assert "worker-1" not in reader.reports


def test_a_store_the_reader_cannot_read_is_nobodys_silence(store, monkeypatch):
    clock = Clock()
    roles = _roles(store, "worker-0")
    roles["worker-0"].write()
    reader = _reader(store, clock)
    reader.poll()

    def unreachable(folder):
        from components.checkpoint.store import CheckpointStoreError
        raise CheckpointStoreError("listing the store failed after 4 tries: connection refused")

    monkeypatch.setattr(store, "list_control", unreachable)
    clock.now = 160.0  # a minute without the store: judged on what was read last
    reader.poll()
    monkeypatch.undo()
    clock.now = 161.0  # it answers again before the role's next beat landed: the outage does not count
    reader.poll()
    assert reader.stalled({"worker-0": 0.0}) == []
    clock.now = 182.0
    reader.poll()
    assert reader.stalled({"worker-0": 0.0}) == [("worker-0", 21.0)]


def test_a_heartbeat_thread_records_its_beats_and_progress_in_the_store(store):
    """What a role's thread writes: a beat or its pass's progress every period, then that it is done."""
    record = HeartbeatRecord(store, "worker", 1, JOB)
    beat = Heartbeat("worker", 1, 0.05, progress=lambda: {"role": "worker", "index": 1, "epoch": 2, "examples": 64},
                     record=record).start()
    try:
        with beat.waiting():
            waiting = store.read_json(None, record_rel("worker", 1))
        threading.Event().wait(0.2)
    finally:
        beat.stop()
    beat.done()
    last = store.read_json(None, record_rel("worker", 1))
    assert waiting["waiting"] is True and waiting["job"] == JOB
    assert last["done"] is True and last["seq"] > 3 and last["role"] == "worker" and last["index"] == 1
    progress = []
    reader = Liveness(store, JOB, 20.0, 60.0, on_progress=lambda *args: progress.append(args))
    record.write(progress={"epoch": 2, "examples": 64})
    reader.poll()
    assert progress == [("worker-1", 2, 64)]
    assert store.list_control(LIVENESS) == ["worker-1.json"]
    clear_heartbeats(store)
    assert store.list_control(LIVENESS) == []


def test_the_compose_watch_ends_when_every_worker_is_done_and_fails_on_a_stall(store):
    clock = Clock()
    roles = _roles(store, "server-0", "worker-0", "worker-1")
    for role in roles.values():
        role.write()
    roles["worker-0"].write(done=True)
    roles["worker-1"].write(done=True)
    watch(_reader(store, clock), servers=1, workers=2, lease=None, poll_s=0.0)  # returns: the job is done

    clear_heartbeats(store)

    def tick() -> float:  # server 0 and worker 0 beat on; worker 1 never does
        clock.now += 0.5
        roles["server-0"].write()
        roles["worker-0"].write()
        return clock.now

    with pytest.raises(RoleFailed) as failed:
        watch(_reader(store, tick), servers=1, workers=2, lease=None, poll_s=0.0)
    message = str(failed.value)
    assert failed.value.role == "worker-1" and "\n" not in message and "reported nothing for 61s" in message
    assert failed.value.restartable  # the compose driver restarts the job (up to cluster.max_restarts)


def test_the_compose_watch_stops_the_job_when_its_lease_is_taken_over(store):
    clock = Clock()
    with StoreLease(store, uuid.uuid4().hex[:12], renew_s=0.05) as lease:
        store.write_json(None, LEASE, {"run_id": "other-run", "token": "theirs", "host": "elsewhere", "pid": 1,
                                       "renewed_at": 1e12, "ttl_s": 60})
        threading.Event().wait(0.3)  # a renewal finds the other holder
        with pytest.raises(PsJobStoreError, match="taken over by run other-run"):
            watch(_reader(store, clock), servers=1, workers=1, lease=lease, poll_s=0.0)
