"""The code that runs inside a PS process: a server or worker of one job.

:mod:`~components.ps.contract` is what passes between a process and whoever starts it (environment, job spec,
events, readiness); :mod:`~components.ps.role` is the process's entry point. The rest is what a process builds
and does: :mod:`~components.ps.strategy` (our config as Paddle's strategy), :mod:`~components.ps.shard_uploader`
(a server's sidecar that uploads its saved shards), ... The networks (:mod:`components.networks`) and the table's
row layout and sharding (:mod:`components.table`) live below, shared with evaluation, export and the planner.

Nothing here imports the orchestration layers (kfp, kubernetes, ``components.train``): a PS process imports
Paddle, whose ``proto`` package a kfp import would shadow (:func:`components.ps.role.import_paddle`).
"""
