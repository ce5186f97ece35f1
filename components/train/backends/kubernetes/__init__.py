"""Runs a PS job on Kubernetes (``cluster.backend`` trainjob | jobset | paddlejob) from inside the train step's pod.

The step creates the job's objects (:mod:`components.train.backends.manifests`: a NetworkPolicy, then a
TrainingRuntime and its TrainJob, a JobSet or a PaddleJob), streams worker 0's and the servers' logs into its own
output and ``logs/<role>-<i>.log`` (worker 0's progress, epochs and checkpoints are the events the local backend
echoes), waits for the
job's outcome and always deletes what it created: after success, after failure, and when the run is cancelled
(Kubeflow sends the step's pod SIGTERM) or interrupted. The objects also carry an ownerReference to the step's
pod, so they are garbage-collected even if the step is killed outright, and the label of the Kubeflow run that
created them, so that the run's exit handler deletes whatever a cancelled or failed run left (:mod:`.cleanup`).

Restarts: a JobSet (under a TrainJob too) restarts the whole job itself (``failurePolicy``): up to
``cluster.max_restarts`` times, without counting a restart after the cluster disrupted a pod (preemption,
eviction), and not at all after a role's configuration error; its roles resume from the run's latest committed
checkpoint (``PS_RESTART_ATTEMPT``). A PaddleJob has no such policy, so the launcher applies the same rules: a
failed one is deleted and created again under a new name. A hung role fails no pod, so no kind's policy sees it: the
roles' heartbeat records in the checkpoint store do (:mod:`components.train.liveness`), and the launcher deletes and
recreates the job of any kind, counting against ``cluster.max_restarts``. A job the launcher recreates resumes from
the newest intact checkpoint of the run (chosen and verified by the launcher, named in the roles' spec), and one
line says what the restart loses (:mod:`components.train.restarts`); with no restart left, the step fails with
exit status 4, as a local job does.

A TrainJob or JobSet waiting in a Kueue queue (suspended) is not failing to start: ``cluster.start_timeout_s``
counts from its admission.

The step's pod runs as a plain account; the launcher acts as ``cluster.service_account`` through tokens of that
account that the step requests, each bound to its pod and expiring within the hour
(:func:`~.api.launcher_configuration`; only the train step, the exit handler and the deploy step ask,
:mod:`components.train.backends.rbac`).

The package, by concern: :mod:`.api` (the API clients and the objects the launcher creates), :mod:`.status` (what
each kind's status means), :mod:`.pod_log` (a role's log, followed), :mod:`.diagnosis` (why a job failed or
does not start, from its pods), :mod:`.lifecycle` (:class:`~.lifecycle.KubernetesJob`, the backend),
:mod:`.cleanup` (what a pipeline run's exit handler deletes) and :mod:`.logs` (a job's logs by role, for a user:
``python -m components.train.backends.kubernetes.logs``). The manifests themselves are pure functions apart
from all of this (:mod:`components.train.backends.manifests`).
"""
