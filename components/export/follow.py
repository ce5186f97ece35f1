"""The live follower: a server's model kept at the newest version of its export store that passes every check.

A background thread polls the store (:meth:`ExportStore.latest`) every ``poll_seconds``. A newer version is
loaded beside the served one: a delta chained on the served version is applied copy-on-write
(:meth:`ShardedModel.with_delta`, the served model's memory-mapped rows shared), anything else (a new base, or a
chain the served version is not on) is loaded whole. Only then is it published, by rebinding one reference
(:attr:`ModelFollower.model`): a request reads the reference once and finishes on that model object, so none fails
or mixes versions. A version that fails a check (sha256, parent, layout, signature, transform: a
:class:`ServingModelError`) is refused in one log line, never tried again, and the served model stays; an outage
(OSError) is logged in one line and the next poll tries again.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from components.export.manifest import MANIFEST, ServingModelError
from components.export.model import InferenceModel, ShardedModel
from components.export.store import VERSION_NAME, ExportStore

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LoadOptions:
    """How every version a server serves is loaded and checked."""

    verify: bool = True  # every file's sha256
    public_key: Optional[str] = None  # the exporter's key that signed serving.json
    allow_unsigned: bool = False

    def load(self, path: str) -> InferenceModel:
        return servable(InferenceModel.load(path, verify=self.verify, public_key=self.public_key,
                                            allow_unsigned=self.allow_unsigned))

    def with_delta(self, model: ShardedModel, delta_dir: Path) -> ShardedModel:
        """The delta's signature is checked with the key ``model`` was loaded with."""
        return servable(model.with_delta(delta_dir, verify=self.verify))


def servable(model: InferenceModel) -> InferenceModel:
    """``model``, which a server can serve only with its transform: its requests are raw records."""
    if model.transform is None:
        raise ServingModelError(f"{model.root} was exported without its dataset's transform, so it cannot read raw "
                                "records: export the checkpoint again with its dataset (the pipeline's export step "
                                "does; the CLI: --dataset)")
    return model


def followed_store(model_uri: str, model: InferenceModel) -> Optional[str]:
    """The export store a server serving ``model`` (loaded from ``model_uri``) follows: ``model_uri`` itself when it
    is a store, else the store the sharded version names; None for a single-file model."""
    if "://" in model_uri or not (Path(model_uri) / MANIFEST).is_file():
        return model_uri
    return model.meta.get("store") if isinstance(model, ShardedModel) else None


class ModelFollower:
    """The served model (:attr:`model`) and the thread that moves it to each new version of ``store_uri``.

    ``prepare`` is called with each model before it is published (the server's metrics hook in there).
    """

    def __init__(self, model: InferenceModel, store_uri: str, options: LoadOptions, poll_seconds: float,
                 prepare: Callable[[InferenceModel], None] = lambda model: None):
        self.store = ExportStore(store_uri)
        self.options, self.poll_seconds, self._prepare = options, poll_seconds, prepare
        self._refused: set[int] = set()
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        # Deltas of a remote store are downloaded here, each version once (a served model maps its files, which
        # must never be rewritten); a whole load downloads into a directory the model holds for its lifetime.
        self._deltas = None if self.store.local else tempfile.TemporaryDirectory(prefix="serving-deltas-")
        prepare(model)
        self.model = model

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="model-follower", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Stop polling; a version being loaded is finished first (up to ``timeout`` seconds)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
        if self._deltas is not None:
            self._deltas.cleanup()

    def _run(self) -> None:
        while not self._stop.wait(self.poll_seconds):
            try:
                self.poll()
            except OSError as err:
                log.warning("reading the export store %s failed (%s: %s); still serving version %s, trying again "
                            "in %gs", self.store.display_uri, type(err).__name__, err, self.model.version,
                            self.poll_seconds)
            except Exception:  # a bug: the thread must keep polling, and the traceback must be seen
                log.exception("following the export store %s failed; still serving version %s",
                              self.store.display_uri, self.model.version)

    def poll(self) -> Optional[int]:
        """Move to the store's latest version when it is newer than the served one and not refused before;
        returns the version now served when it changed."""
        latest, current = self.store.latest(), self.model
        if latest is None or latest <= (current.version or 0) or latest in self._refused:
            return None
        try:
            model = self._load(latest, current)
        except ServingModelError as err:
            self._refused.add(latest)
            log.warning("refused version %d of %s, still serving version %s: %s", latest, self.store.display_uri,
                        current.version, err)
            return None
        self._prepare(model)
        self.model = model  # the swap: one reference rebound; requests in flight keep the one they read
        log.info("serving version %s of %s (was %s)", model.version, self.store.display_uri, current.version)
        return model.version

    def _load(self, version: int, current: InferenceModel) -> InferenceModel:
        chain = self.store.manifest(version)["chain"]
        if not isinstance(current, ShardedModel) or current.version not in chain[:-1]:
            model = self.options.load(self.store.uri)
            if model.version != version:  # the store moved on meanwhile: the newer version is loaded as well
                log.info("version %s was published while version %d loaded", model.version, version)
            return model
        model = current
        for step in chain[chain.index(current.version) + 1:]:
            model = self.options.with_delta(model, self._delta_dir(step))
        return model

    def _delta_dir(self, version: int) -> Path:
        if self._deltas is None:
            return Path(self.store.version_path(version))
        return self.store.download(version, Path(self._deltas.name) / VERSION_NAME.format(version))
