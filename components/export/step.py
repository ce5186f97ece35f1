"""What the export step runs: a plain function over :func:`components.serving.export_inference_model`.

The ``serving_model`` artifact is the serving model directory itself (``model.pdmodel``,
``model.pdiparams``, ``ids.npy``, ``serving.json``): unlike the checkpoint it is small and immutable, so it
lives in the artifact store; its metadata names the model, its feeds and the checkpoint it came from.
"""

import json
from pathlib import Path
from typing import Any, Optional

from components.config import from_dict
from components.serving import SERVING_META, export_inference_model
from components.checkpoint.pointer import fetched_checkpoint


def serving_metadata(serving: dict) -> dict:
    """The facts worth showing on the Model artifact (the full set is ``serving.json`` inside it)."""
    source = serving["source_checkpoint"]
    return {"model_name": serving["model_name"], "feed_names": serving["feed_names"],
            "fetch_names": serving["fetch_names"], "table_rows": serving["table_rows"],
            "checkpoint_uri": source.get("uri"), "checkpoint_id": source.get("id"),
            "checkpoint_manifest_sha256": source["manifest_sha256"],
            "paddle_version": serving["paddle_version"], "format": "paddle-inference"}


def export_serving_model(config: Any, checkpoint_path: str, checkpoint_metadata: Optional[dict],
                         out_dir: str) -> dict:
    """Export the checkpoint the Model artifact points at into ``out_dir``; returns the artifact metadata."""
    from_dict(config)  # the same config check as every step
    with fetched_checkpoint(checkpoint_path, checkpoint_metadata) as (uri, ckpt_id, local):
        out = export_inference_model(local, out_dir, source={"uri": uri, "id": ckpt_id})
    serving = json.loads((Path(out) / SERVING_META).read_text())
    print(f"serving model: {serving['model_name']} from checkpoint {ckpt_id} in {uri} -> {out}", flush=True)
    return serving_metadata(serving)
