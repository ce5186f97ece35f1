"""The networks every place that runs a model shares (training on the PS, evaluation, export, serving):
:mod:`~components.networks.models` (the model contract: feeds, the network with an injected embedding lookup, the
built-in families and a user's own), :mod:`~components.networks.scoring` (the network program fed with rows, and the
one-process scorer of a checkpoint)."""
