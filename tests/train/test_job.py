"""What every backend shares: the events of a job's processes and stop signals (which roles stalled:
tests/train/test_liveness.py)."""

import json
import os
import signal
import time

import pytest

from components.ps.contract import parse_event
from components.train.job import CURVE_POINTS, EventLog, StopSignals, format_epoch


def test_a_pass_reported_again_after_a_restart_replaces_the_first_report():
    events = EventLog(echo=lambda line: None)
    for epoch, auc in ((1, 0.6), (2, 0.7), (2, 0.71), (3, 0.75)):  # the job restarted during pass 2
        payload = json.dumps({"epoch": epoch, "examples": 10, "seconds": 1.0, "auc": auc})
        assert events.feed("worker-0", f"@epoch {payload}\n")
    assert [(e["epoch"], e["auc"]) for e in events.epochs] == [(1, 0.6), (2, 0.71), (3, 0.75)]
    assert not events.feed("worker-0", "@epoch {broken\n") and not events.feed("worker-0", "I1129 plain line")


def test_the_training_curve_counts_each_workers_examples_over_its_passes():
    events = EventLog(echo=lambda line: None)
    reports = [(0, 1, 500, 0.6, 0.55), (1, 1, 400, 0.7, 0.52), (0, 1, 1000, 0.5, float("nan")),  # no AUC yet: left out
               (0, 1, 1200, 0.5, 0.6), (0, 2, 300, 0.45, 0.7), (1, 2, 100, 0.6, 0.6)]
    for index, epoch, examples, loss, auc in reports:
        _report(events, f"worker-{index}", "@progress", role="worker", index=index, epoch=epoch, examples=examples,
                examples_per_s=100.0, loss=loss, auc=auc)
    _report(events, "server-0", "@progress", role="server", index=0, state="serving")
    assert events.curve == {"worker-0": [[500, 0.6, 0.55], [1200, 0.5, 0.6], [1500, 0.45, 0.7]],
                            "worker-1": [[400, 0.7, 0.52], [500, 0.6, 0.6]]}
    for step in range(3 * CURVE_POINTS):  # a long job: the curve keeps its span in a bounded number of points
        _report(events, "worker-0", "@progress", role="worker", index=0, epoch=3, examples=step + 1,
                examples_per_s=1.0, loss=0.4, auc=0.7)
    points = events.curve["worker-0"]
    assert CURVE_POINTS <= len(points) <= 2 * CURVE_POINTS and points[0] == [500, 0.6, 0.55]


def test_a_structured_log_echoes_the_events_themselves_without_the_curves_samples():
    shown = []
    events = EventLog(echo=shown.append, structured=True)
    progress = {"role": "worker", "index": 1, "epoch": 2, "examples": 10_560, "examples_per_s": 25_682.0,
                "loss": 0.6132, "auc": 0.4969}
    _report(events, "worker-1", "@progress", **progress, curve=[[10_560, 0.6132, 0.4969]])
    epoch = {"epoch": 3, "examples": 14_000, "seconds": 0.6, "auc": 0.5014}
    _report(events, "worker-0", "@epoch", **epoch)
    assert [parse_event(line) for line in shown] == [("@progress", progress), ("@epoch", epoch)]
    assert events.curve == {"worker-1": [[10_560, 0.6132, 0.4969]]}  # the samples still make the curve
    readable = []
    EventLog(echo=readable.append).feed("worker-0", f"@epoch {json.dumps(epoch)}")
    assert readable == [format_epoch(epoch)]


def _report(events, source, tag="@heartbeat", **payload):
    assert events.feed(source, f"{tag} {json.dumps(payload)}\n")


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


def test_a_progress_events_curve_samples_each_become_a_point():
    events = EventLog(echo=lambda line: None)
    _report(events, "worker-0", "@progress", role="worker", index=0, epoch=1, examples=900, examples_per_s=100.0,
            loss=0.5, auc=0.6, curve=[[300, 0.7, float("nan")], [600, 0.6, 0.55], [900, 0.5, 0.6]])
    _report(events, "worker-0", "@progress", role="worker", index=0, epoch=2, examples=200, examples_per_s=100.0,
            loss=0.45, auc=0.65, curve=[[200, 0.45, 0.65]])
    assert events.curve == {"worker-0": [[600, 0.6, 0.55], [900, 0.5, 0.6], [1100, 0.45, 0.65]]}


def test_a_workers_heartbeat_samples_its_progress_between_its_events(capsys):
    from components.ps.liveness import CURVE_SAMPLE_S, Heartbeat

    examples = iter(range(100, 100_000, 100))
    beat = Heartbeat("worker", 0, 4 * CURVE_SAMPLE_S, progress=lambda: dict(
        role="worker", index=0, epoch=1, examples=next(examples), examples_per_s=1.0, loss=0.5, auc=0.6)).start()
    time.sleep(9 * CURVE_SAMPLE_S)
    beat.stop()
    events = [json.loads(line.split(" ", 1)[1]) for line in capsys.readouterr().out.splitlines()
              if line.startswith("@progress")]
    assert len(events) == 2 and [len(event["curve"]) for event in events] == [4, 4]
    assert events[0]["curve"][-1][0] == events[0]["examples"]  # the event's own sample closes its curve
