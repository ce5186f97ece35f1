"""What every backend shares: the events of a job's processes, which of them stalled, and stop signals."""

import json
import os
import signal
import time

import pytest

from components.train.job import EventLog, StopSignals


def test_a_pass_reported_again_after_a_restart_replaces_the_first_report():
    events = EventLog(echo=lambda line: None)
    for epoch, auc in ((1, 0.6), (2, 0.7), (2, 0.71), (3, 0.75)):  # the job restarted during pass 2
        payload = json.dumps({"epoch": epoch, "examples": 10, "seconds": 1.0, "auc": auc})
        assert events.feed("worker-0", f"@epoch {payload}\n")
    assert [(e["epoch"], e["auc"]) for e in events.epochs] == [(1, 0.6), (2, 0.71), (3, 0.75)]
    assert not events.feed("worker-0", "@epoch {broken\n") and not events.feed("worker-0", "I1129 plain line")


def _report(events, source, tag="@heartbeat", **payload):
    assert events.feed(source, f"{tag} {json.dumps(payload)}\n")


def test_a_silent_process_is_stalled_unless_it_waits_for_a_worker_that_works(monkeypatch):
    """The watchdog's rule: silent for longer than the stall timeout, except a worker that said it waits in a
    collective while another worker is still reporting (Paddle holds the GIL in a barrier)."""
    clock = [100.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    events = EventLog(echo=lambda line: None)
    running = {"server-0": 0.0, "worker-0": 0.0, "worker-1": 0.0}
    _report(events, "server-0")
    _report(events, "worker-0", waiting=False)
    _report(events, "worker-1", waiting=True)
    clock[0] = 125.0
    _report(events, "worker-0", waiting=False)  # worker 0 works (an export), worker 1 waits at the barrier
    _report(events, "server-0")
    assert events.stalled(running, stall_s=20.0, first_report_s=60.0) == []
    clock[0] = 141.0  # worker 1 waits on, but worker 0 has been silent 16 s, within the timeout: nobody stalled
    assert events.stalled(running, stall_s=20.0, first_report_s=60.0) == []
    clock[0] = 150.0  # worker 0 silent 25 s and not waiting: stalled; worker 1 has no one left to wait for
    assert events.stalled(running, stall_s=20.0, first_report_s=60.0) == [("worker-1", 50.0), ("server-0", 25.0),
                                                                          ("worker-0", 25.0)]
    _report(events, "worker-0", "@progress", role="worker", index=0, epoch=1, examples=10)  # progress counts too
    _report(events, "server-0")
    assert events.stalled(running, stall_s=20.0, first_report_s=60.0) == []
    # A process that never reported is judged from its start, with the longer first-report limit.
    assert events.stalled({**running, "worker-2": 95.0}, stall_s=20.0, first_report_s=60.0) == []
    assert events.stalled({**running, "worker-2": 80.0}, stall_s=20.0, first_report_s=60.0) == [("worker-2", 70.0)]


def test_stop_signals_raise_once_then_wait_for_the_teardown():
    made = []

    def make_error(signum):
        made.append(signum)
        return KeyboardInterrupt(signal.Signals(signum).name)

    previous = signal.getsignal(signal.SIGTERM)
    with pytest.raises(KeyboardInterrupt, match="SIGTERM"):
        with StopSignals(make_error) as signals:
            try:
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(5)  # interrupted at once
            finally:
                signals.hold()
                os.kill(os.getpid(), signal.SIGHUP)  # a second signal during the teardown is not raised
                time.sleep(0.05)
    assert made == [signal.SIGTERM] and signal.getsignal(signal.SIGTERM) == previous
    # A signal that arrives once the teardown began is raised when the block ends, not in the middle of it.
    with pytest.raises(KeyboardInterrupt, match="SIGINT"):
        with StopSignals(make_error) as signals:
            signals.hold()
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)
            made.append("teardown done")
    assert made == [signal.SIGTERM, "teardown done", signal.SIGINT]
