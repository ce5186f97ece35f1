"""What a job object's ``status`` means, per backend: whether the job ended and how (:class:`Outcome`), a
short state line to echo, whether it waits in a queue, and whether the launcher must recreate a failed job."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

from components.config import ClusterBackend


@dataclass(frozen=True)
class Outcome:
    succeeded: bool
    detail: str


def _true_condition(status: dict, kind: str) -> Optional[dict]:
    return next((c for c in status.get("conditions") or [] if c.get("type") == kind and c.get("status") == "True"),
                None)


def _condition_detail(condition: dict) -> str:
    return ": ".join(filter(None, (condition.get("reason"), condition.get("message")))) or condition["type"]


def _conditions_outcome(succeeded: str) -> Callable[[dict], Optional[Outcome]]:
    """The outcome of a kind whose ``succeeded`` or ``Failed`` condition ends it."""
    def outcome(status: dict) -> Optional[Outcome]:
        for kind in (succeeded, "Failed"):
            condition = _true_condition(status, kind)
            if condition:
                return Outcome(kind == succeeded, _condition_detail(condition))
        return None

    return outcome


def _suspended(status: dict) -> bool:
    """Suspended, as Kueue keeps a TrainJob or JobSet until its queue admits it."""
    return _true_condition(status, "Suspended") is not None


def _suspension(status: dict) -> str:
    """A TrainJob's or JobSet's state while suspended, else ''. A TrainJob's status tells no restarts: worker 0's
    log shows them (a new pod that resumes from a checkpoint)."""
    suspended = _true_condition(status, "Suspended")
    return f"suspended, waiting to be admitted ({_condition_detail(suspended)})" if suspended else ""


def _jobset_state(status: dict) -> str:
    restarts, counted = int(status.get("restarts") or 0), int(status.get("restartsCountTowardsMax") or 0)
    if _suspended(status) or not restarts:
        return _suspension(status)
    uncounted = f", {restarts - counted} after a disruption (not counted)" if restarts > counted else ""
    return f"restarted {restarts} time(s){uncounted}; the roles resume from the latest checkpoint"


# paddle-operator's PaddleJobPhase values that end a job.
_PADDLEJOB_SUCCEEDED = ("Completed", "Succeed")
_PADDLEJOB_FAILED = ("Failed", "Aborted", "Terminated")


def _paddlejob_outcome(status: dict) -> Optional[Outcome]:
    phase = status.get("phase")
    if phase in _PADDLEJOB_SUCCEEDED + _PADDLEJOB_FAILED:
        return Outcome(phase in _PADDLEJOB_SUCCEEDED, f"phase {phase}")
    return None


def _paddlejob_state(status: dict) -> str:
    return status.get("phase") or ""


@dataclass(frozen=True)
class StatusRules:
    outcome: Callable[[dict], Optional[Outcome]]  # None while the job runs
    state: Callable[[dict], str]  # a short status line, echoed when it changes
    queued: Callable[[dict], bool]  # waiting for admission: not failing to start
    relaunch: bool  # the launcher recreates a failed job: the kind restarts nothing itself


STATUS_RULES = {
    ClusterBackend.trainjob: StatusRules(_conditions_outcome("Complete"), _suspension, _suspended, relaunch=False),
    ClusterBackend.jobset: StatusRules(_conditions_outcome("Completed"), _jobset_state, _suspended, relaunch=False),
    ClusterBackend.paddlejob: StatusRules(_paddlejob_outcome, _paddlejob_state, lambda status: False, relaunch=True),
}
