"""The serving export: what the export step writes from a delivered checkpoint, and what serves it.

* :mod:`~components.export.table`: a checkpoint's sparse table, read one shard at a time;
* :mod:`~components.export.sharded`: the sharded format, versions of an export store (:mod:`~components.export.store`),
  its rows in per-shard files (:mod:`~components.export.shards`), a base or a delta (:mod:`~components.export.delta`);
* :mod:`~components.export.single`: the single-file Paddle inference model (small tables);
* :mod:`~components.export.program`: the inference programs both save; :mod:`~components.export.manifest`:
  ``serving.json``, file checks, putting a directory in place;
* :mod:`~components.export.model`: loading either format and predicting; :mod:`~components.export.serving`: the command line;
  :mod:`~components.export.step`: the pipeline step;
* :mod:`~components.export.server`: the online server (KServe v1 and v2), whose model
  :mod:`~components.export.follow` keeps at the newest checked version of its export store.
"""
