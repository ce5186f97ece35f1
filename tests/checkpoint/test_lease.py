"""One job at a time on a checkpoint store: the lease a job takes, renews and gives back."""

import socket
import subprocess
import sys
import time

import pytest

from components.checkpoint.lease import LEASE, LeaseLost, StoreInUse, StoreLease, live_holder
from components.checkpoint.store import CheckpointStore


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    uri = str(tmp_path / "store") if request.param == "local" else request.getfixturevalue("s3_endpoint")
    return CheckpointStore(uri)


def test_a_second_job_is_refused_naming_the_holder_until_the_first_releases(store):
    with StoreLease(store, "run-a") as first:
        assert live_holder(store)["run_id"] == "run-a"
        with pytest.raises(StoreInUse) as err:
            StoreLease(store, "run-b").acquire()
        message = str(err.value)
        assert f"checkpoint store {store.display_uri} is in use by run run-a" in message
        assert f"on {socket.gethostname()}" in message and "set checkpoint.uri to another store" in message
        first.check()  # still held
    assert store.read_json(None, LEASE) is None and live_holder(store) is None
    with StoreLease(store, "run-b"):
        assert live_holder(store)["run_id"] == "run-b"


def test_a_lease_that_is_not_renewed_expires(store):
    """A holder on another host that stopped renewing: its lease lapses after its ttl, and the next job takes it."""
    stale = {"run_id": "run-gone", "token": "t", "host": "another-host", "pid": 1, "renewed_at": time.time() - 61,
             "ttl_s": 60.0}
    store.write_json(None, LEASE, stale)
    assert live_holder(store) is None
    with StoreLease(store, "run-b"):
        assert store.read_json(None, LEASE)["run_id"] == "run-b"
    fresh = dict(stale, renewed_at=time.time())  # renewed a moment ago on another host: in use
    store.write_json(None, LEASE, fresh)
    with pytest.raises(StoreInUse, match="in use by run run-gone"):
        StoreLease(store, "run-c").acquire()


def test_the_lease_of_a_killed_job_on_this_host_is_taken_over_at_once(tmp_path):
    """kill -9 leaves the lease behind; its holder's pid is gone on this host, so it need not expire first."""
    store = CheckpointStore(str(tmp_path / "store"))
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    store.write_json(None, LEASE, {"run_id": "run-killed", "token": "t", "host": socket.gethostname(),
                                   "pid": holder.pid, "renewed_at": time.time(), "ttl_s": 60.0})
    with pytest.raises(StoreInUse):
        StoreLease(store, "run-b").acquire()
    holder.kill()
    holder.wait()
    with StoreLease(store, "run-b"):
        assert store.read_json(None, LEASE)["run_id"] == "run-b"


def test_a_holder_that_cannot_renew_loses_the_lease_naming_the_store_error(moto_endpoint, s3_endpoint):
    store = CheckpointStore(s3_endpoint, retries=1)
    lease = StoreLease(store, "run-a", ttl_s=1.0, renew_s=0.2).acquire()
    try:
        moto_endpoint.stop()
        deadline = time.time() + 20
        while lease.lost is None and time.time() < deadline:
            time.sleep(0.1)
        with pytest.raises(LeaseLost) as err:
            lease.check()
        assert f"checkpoint store {store.display_uri} unreachable" in str(err.value)
        assert "Could not connect to the endpoint URL" in str(err.value)
    finally:
        moto_endpoint.start()
        lease.release()


def test_a_holder_whose_lease_was_taken_over_loses_it(tmp_path):
    store = CheckpointStore(str(tmp_path / "store"))
    lease = StoreLease(store, "run-a", renew_s=0.1).acquire()
    store.write_json(None, LEASE, {"run_id": "run-b", "token": "other", "host": "h", "pid": 1,
                                   "renewed_at": time.time(), "ttl_s": 60.0})
    deadline = time.time() + 10
    while lease.lost is None and time.time() < deadline:
        time.sleep(0.05)
    with pytest.raises(LeaseLost, match="taken over by run run-b"):
        lease.check()
    lease.release()
    assert store.read_json(None, LEASE)["run_id"] == "run-b"  # not this run's to delete
