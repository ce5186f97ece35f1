"""A network brought by its user (``model=custom model.network=examples.custom_network:network``).

It follows the contract of :class:`components.networks.models.NetworkInputs`: it gets each sparse slot's pooled embedding
rows and the dense values, and returns the logit ``[batch, 1]``. This one is a wide & deep variant: the first-order
weight of every id (the row's first element) summed, plus a gated MLP over the rows' factors and the dense values.
"""

import paddle


def network(inputs):
    """The logit of a batch: built with Paddle's static layers, as every model of the pipeline is."""
    pooled = paddle.stack(inputs.slots, axis=1)  # [batch, slots, dim]
    first_order = paddle.sum(pooled[:, :, 0], axis=1, keepdim=True)
    deep = paddle.concat([paddle.flatten(pooled[:, :, 1:], 1)] + ([inputs.dense] if inputs.dense is not None else []),
                         axis=1)
    for width in inputs.hidden:
        deep = paddle.static.nn.fc(deep, width, activation="relu")
    gate = paddle.static.nn.fc(deep, 1, activation="sigmoid")
    out = paddle.static.nn.fc(deep, 1, bias_attr=paddle.ParamAttr(
        initializer=paddle.nn.initializer.Constant(inputs.initial_logit)))
    return first_order + gate * out
