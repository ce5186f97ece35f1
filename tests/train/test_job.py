"""What every backend shares: the events of a job's processes."""

import json

from components.train.job import EventLog


def test_a_pass_reported_again_after_a_restart_replaces_the_first_report():
    events = EventLog(echo=lambda line: None)
    for epoch, auc in ((1, 0.6), (2, 0.7), (2, 0.71), (3, 0.75)):  # the job restarted during pass 2
        payload = json.dumps({"epoch": epoch, "examples": 10, "seconds": 1.0, "auc": auc})
        assert events.feed("worker-0", f"@epoch {payload}\n")
    assert [(e["epoch"], e["auc"]) for e in events.epochs] == [(1, 0.6), (2, 0.71), (3, 0.75)]
    assert not events.feed("worker-0", "@epoch {broken\n") and not events.feed("worker-0", "I1129 plain line")
