"""The ways a prepared PS job is started: each backend starts the same role processes (:mod:`components.ps.role`)
with the same environment (:func:`components.ps.contract.role_env`).

* :mod:`~components.train.backends.local`: processes of this machine (``cluster.backend=local``);
* :mod:`~components.train.backends.kubernetes`: a TrainJob (with its TrainingRuntime), JobSet or PaddleJob created
  from the train step's pod, built by :mod:`~components.train.backends.manifests` (pure functions);
  :mod:`~components.train.backends.image_policy` writes the admission policy for the job's signed images;
* :mod:`~components.train.backends.docker_compose`: a compose file for one host (not run by the pipeline;
  ``containers/check.sh`` runs it in real containers).
"""
