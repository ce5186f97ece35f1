"""KFP v2 component of the Kubeflow run's exit handler; the code it runs is
:func:`components.train.backends.kubernetes.cleanup.delete_pipeline_run_objects`."""

# No `from __future__ import annotations`: KFP reads the component signatures' annotations as types.
from kfp import dsl

from components.config import DEFAULT_IMAGE


@dsl.component(base_image=DEFAULT_IMAGE, install_kfp_package=False)
def clean_up_run(cluster: dict) -> list:
    """Delete the PS job objects this run created that are still there (a cancelled or failed run's), as the train
    step's launcher account; ``cluster``: the config's ``cluster`` section. Returns what it deleted."""
    from components.config import from_dict
    from components.train.backends.kubernetes.cleanup import delete_pipeline_run_objects

    return delete_pipeline_run_objects(from_dict({"cluster": cluster}).cluster)
