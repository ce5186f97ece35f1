"""The ways a prepared PS job is started: each backend starts the same role processes (:mod:`components.ps.role`)
with the same environment (:func:`components.ps.contract.role_env`), behind one interface
(:class:`~components.train.backends.base.JobBackend`; the train step picks one by ``cluster.backend``).

Code that runs a job:

* :mod:`~components.train.backends.local`: processes of this machine (``cluster.backend=local``);
* :mod:`~components.train.backends.kubernetes`: a TrainJob (with its TrainingRuntime), JobSet or PaddleJob created
  from the train step's pod, and the cleanup of a pipeline run's exit handler.

Files that only write manifests (pure functions, no cluster needed):

* :mod:`~components.train.backends.manifests`: the Kubernetes objects of a job, and the launcher's RBAC;
* :mod:`~components.train.backends.image_policy`: the admission policy for the job's signed images;
* :mod:`~components.train.backends.docker_compose`: a compose file for one host (not run by the pipeline;
  ``containers/check.sh`` runs it in real containers).
"""
