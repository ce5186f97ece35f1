"""Whole-job restarts of a PS job after a role failed or hung: which failures restart it, what it resumes from, and
what the failure cost.

A launcher that restarts a job itself (the ``local`` backend; the Kubernetes launcher after a hung role, and after
a failed PaddleJob) stops every process of the failed attempt and starts the whole job again, up to
``cluster.max_restarts`` times, from the newest intact checkpoint the run committed
(:func:`components.checkpoint.restore.restart_target`, chosen once by the launcher and verified), else from what the
first attempt started from. A role that exits with a status no restart can mend (:data:`NOT_RESTARTED`) fails the
job at once.

:class:`Attempt` counts, from the events of one attempt's roles, the examples the workers trained and where each
checkpoint of the attempt stood, so that a restart says what it loses: the examples trained since the checkpoint it
resumes from (they are trained again) and the seconds that took. The examples are those the workers reported: what a
worker trained after its last report (``ps.progress_period_s``) is not counted, hence "at least". Each restart is one
console line (:meth:`Restart.line`) and one record in the run's summary (:meth:`Restart.record`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Optional

from components.checkpoint.restore import STATE_FILE, RestoreTarget
from components.checkpoint.store import CheckpointStore
from components.ps.contract import CHECKPOINT, CONFIG_ERROR_EXIT, EPOCH, PROGRESS, STORE_REFUSED_EXIT, parse_event

# Exit statuses a whole-job restart cannot mend, so the job fails at once: the contract's configuration error (the
# job spec, the config, the GPU guard), its store refusal (a full disk), and 2, Python's own for a command line it
# cannot run.
NOT_RESTARTED = (CONFIG_ERROR_EXIT, STORE_REFUSED_EXIT, 2)


@dataclass
class Attempt:
    """What the workers of one attempt trained, from their events (thread-safe enough: each source feeds its own
    entry, and readers take copies of ints)."""

    number: int  # 1 for the first attempt
    started: float = field(default_factory=time.monotonic)
    passes_done: int = 0  # examples of the passes this attempt finished (every worker's)
    last_pass: int = 0  # the last pass this attempt finished
    in_pass: dict[str, tuple[int, int]] = field(default_factory=dict)  # worker -> (pass, examples in it so far)
    at_checkpoint: dict[str, tuple[int, float]] = field(default_factory=dict)  # id -> (trained, when) at its commit

    def feed(self, source: str, line: str) -> None:
        parsed = parse_event(line)
        if parsed is None:
            return
        tag, event = parsed
        if tag == PROGRESS and event.get("role") == "worker" and "examples" in event:
            self.progress(source, int(event["epoch"]), int(event["examples"]))
        elif tag == EPOCH:
            self.passes_done += int(event["examples"])
            self.last_pass = int(event["epoch"])
        elif tag == CHECKPOINT:
            self.at_checkpoint[event["id"]] = (self.trained(), time.monotonic())

    def progress(self, source: str, epoch: int, examples: int) -> None:
        """Worker ``source`` trained ``examples`` of pass ``epoch`` so far (its event, or its heartbeat record)."""
        self.in_pass[source] = (epoch, examples)

    def trained(self) -> int:
        """Examples this attempt trained so far: its finished passes, and the workers' last reports in the next."""
        return self.passes_done + sum(n for epoch, n in list(self.in_pass.values()) if epoch > self.last_pass)

    def lost_since(self, ckpt_id: Optional[str], until: float) -> tuple[int, float]:
        """``(examples, seconds up to until)`` this attempt trained after ``ckpt_id`` (all it trained, when this
        attempt did not commit that checkpoint: it started from it, or from before it)."""
        trained, since = self.at_checkpoint.get(ckpt_id, (0, self.started))
        return max(0, self.trained() - trained), max(0.0, until - since)


@dataclass(frozen=True)
class Restart:
    """One whole-job restart: the attempt that failed, what failed, what the next attempt resumes from."""

    attempt: int  # the attempt that failed
    attempts: int  # 1 + cluster.max_restarts
    role: str
    what: str  # what happened to the role, one phrase
    target: Optional[RestoreTarget]
    position: str  # where the target stands ("after pass 1, 16,000 examples"), empty for none
    examples_again: int
    seconds_lost: float

    def line(self, job: str) -> str:
        """``restart 1 of 2: ...``: the console shows a step's lines of this shape as they are."""
        start = (f"resuming from checkpoint {self.target.id} ({self.position})" if self.target and self.target.resume
                 else f"warm start from {self.target.id} again" if self.target else "starting from scratch again")
        return (f"restart {self.attempt} of {self.attempts - 1}: PS job {job}: {self.role} {self.what}; attempt "
                f"{self.attempt + 1} of {self.attempts} {start}; at least {self.examples_again:,} examples to train "
                f"again ({self.seconds_lost:.0f}s of training lost)")

    def record(self) -> dict:
        """JSON-safe, for the run's summary."""
        return {"attempt": self.attempt, "role": self.role, "what": self.what,
                "checkpoint": self.target.id if self.target else None, "examples_again": self.examples_again,
                "seconds_lost": round(self.seconds_lost, 1)}


def position(store: CheckpointStore, target: Optional[RestoreTarget]) -> str:
    """Where a checkpoint a job resumes from stands: ``after pass 2, 28,000 examples`` or ``pass 3, chunk 4 of 10``."""
    if target is None or not target.resume:
        return ""
    state = store.read_json(target.id, STATE_FILE) or {}
    examples = f", {int(state['examples']):,} examples" if state.get("examples") is not None else ""
    if state.get("chunk"):
        return f"pass {int(state['epoch']) + 1}, chunk {state['chunk']} of {state.get('chunks_in_pass')}{examples}"
    return f"after pass {state.get('epoch', '?')}{examples}"
