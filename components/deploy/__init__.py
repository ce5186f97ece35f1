"""The online server on Kubeflow: :mod:`~components.deploy.inference_service` (the KServe InferenceService, a pure
function of the config), :mod:`~components.deploy.step` (created or updated, then waited for until Ready) and
:mod:`~components.deploy.component` (the KFP component, ``deploy-model``)."""
