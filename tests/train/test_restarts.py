"""What a whole-job restart costs, counted from the events of the attempt that failed, and how it is told."""

import json
import time

from components.checkpoint.restore import STATE_FILE, RestoreTarget
from components.checkpoint.store import CheckpointStore, make_id
from components.train.restarts import Attempt, Restart, position


def _line(tag, **payload):
    return f"{tag} {json.dumps(payload)}\n"


def _progress(index, epoch, examples):
    return _line("@progress", role="worker", index=index, epoch=epoch, examples=examples, examples_per_s=1.0,
                 loss=0.5, auc=0.7)


def test_an_attempt_counts_what_was_trained_after_the_checkpoint_a_restart_resumes():
    attempt = Attempt(1)
    attempt.feed("worker-0", _progress(0, 1, 400))
    attempt.feed("worker-1", _progress(1, 1, 300))
    assert attempt.trained() == 700
    attempt.feed("worker-0", _line("@epoch", epoch=1, examples=1000, seconds=1.0, auc=0.7))
    assert attempt.trained() == 1000  # the pass's own count replaces the workers' last reports in it
    attempt.feed("worker-0", _line("@checkpoint", id="c1", epoch=1, uri="/s"))
    attempt.feed("worker-0", _progress(0, 2, 250))
    attempt.feed("worker-1", _progress(1, 2, 200))
    attempt.feed("server-0", "I1204 a line that is no event\n")
    assert attempt.trained() == 1450
    examples, seconds = attempt.lost_since("c1", until=attempt.at_checkpoint["c1"][1] + 2.5)
    assert examples == 450 and seconds == 2.5
    assert attempt.lost_since(None, until=time.monotonic())[0] == 1450  # resumed from where the attempt started: all of it again


def test_a_restart_is_one_line_naming_the_role_the_attempt_the_checkpoint_and_the_cost(tmp_path):
    store = CheckpointStore(str(tmp_path / "ckpt"))
    staged = tmp_path / "staged"
    staged.mkdir()
    (staged / STATE_FILE).write_text(json.dumps({"epoch": 1, "chunk": 3, "chunks_in_pass": 10, "examples": 16000}))
    ckpt_id = make_id(2, 16000)
    store.commit(ckpt_id, store.upload_dir(staged, ckpt_id), {})
    target = RestoreTarget(store.uri, ckpt_id, resume=True)
    restart = Restart(1, 3, "worker-1", "exited with code -9 (killed by SIGKILL)", target, position(store, target),
                      examples_again=3200, seconds_lost=9.4)
    assert restart.line("job1") == (
        f"restart 1 of 2: PS job job1: worker-1 exited with code -9 (killed by SIGKILL); attempt 2 of 3 resuming from "
        f"checkpoint {ckpt_id} (pass 2, chunk 3 of 10, 16,000 examples); at least 3,200 examples to train again "
        "(9s of training lost)")
    assert restart.record() == {"attempt": 1, "role": "worker-1", "what": "exited with code -9 (killed by SIGKILL)",
                                "checkpoint": ckpt_id, "examples_again": 3200, "seconds_lost": 9.4}
    fresh = Restart(2, 3, "server-0", "reported nothing for 61s", None, "", 0, 1.0)
    assert "attempt 3 of 3 starting from scratch again; at least 0 examples" in fresh.line("job1")
