"""Checkpoints of a PS job: what one is, where it lives, how a running job takes and restores one.

* :mod:`~components.checkpoint.format`: a checkpoint's files, its manifest, the portable export, ``load``;
* :mod:`~components.checkpoint.store`: checkpoints on any fsspec URL (upload, commit, ``LATEST``, prune, download);
* :mod:`~components.checkpoint.protocol`: how a running PS job takes one (servers' shards, workers' rows, commit);
* :mod:`~components.checkpoint.restore`: what a job starts from (:class:`~components.checkpoint.restore.RestoreTarget`)
  and how its processes restore it;
* :mod:`~components.checkpoint.pointer`: the pointer a ``Model`` artifact carries to a checkpoint;
* :mod:`~components.checkpoint.evaluation`: ``EVALUATION.json``, the test metrics beside the checkpoints.
"""
