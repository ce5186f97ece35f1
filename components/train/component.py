"""KFP v2 component for PS training; the code it runs is :mod:`components.train.step`."""

# No `from __future__ import annotations`: KFP reads the component signatures' annotations as types.
from kfp import dsl
from kfp.dsl import Artifact, Dataset, Input, Model, Output

from components.config import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def train(config: dict, dataset: Input[Dataset], checkpoint: Output[Model], logs: Output[Artifact],
          baseline: Input[Model] = None, baseline_root: str = "", fits_baseline: bool = False):
    """The PS job (servers + workers) on the prepared dataset; checkpoint at ``checkpoint.uri``. ``baseline``: the
    fitted baseline a model with ``model.blend_baseline`` blends in; ``baseline_root``: none given, it is fitted
    beside the job and published under this root, where the workers wait for it; ``fits_baseline``: by this step
    (kfp.local), else by the fit-baseline step beside it (Kubeflow)."""
    from components.train.step import Baseline, train_model

    # Local processes read dataset.path; pods on Kubernetes fetch their shards from dataset.uri.
    fitted = Baseline(baseline.path, baseline.uri) if baseline is not None else None
    checkpoint.metadata.update(train_model(config, dataset.path, checkpoint.path, logs.path, data_uri=dataset.uri,
                                           baseline=fitted, baseline_root=baseline_root,
                                           fits_baseline=fits_baseline))
