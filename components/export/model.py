"""An exported model loaded for scoring, in either format (``serving.json["format"]`` says which).

* :class:`SingleModel` (``single``): one Paddle inference model holding every row.
* :class:`ShardedModel` (``sharded``): the dense program fed with rows looked up per batch in memory-mapped,
  id-sorted shards; :meth:`ShardedModel.apply_delta` moves a loaded model to the next version, and
  :meth:`ShardedModel.with_delta` makes the next version's model beside it (what a server swaps in while serving).

:meth:`InferenceModel.load` reads either, checking each version's signature (:mod:`components.export.signing`)
before anything else, then every file against ``serving.json``'s sha256. A model exported with its dataset holds
the training data's transform (:attr:`InferenceModel.transform`), so it scores raw records and serving instances as
well as MultiSlot shards.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Optional, Sequence

import numpy as np

from components.config import ExportFormat
from components.data_prep.multislot import RaggedIds, Schema, read_shards
from components.data_prep.parsed import WeightError
from components.data_prep.transform import Transform
from components.export.delta import DELTA, LAYOUT_KEYS
from components.export.manifest import MANIFEST, ServingModelError, load_transform, verify_files
from components.export.program import LoadedProgram, declared_ops, load_program
from components.export.shards import ShardedTable
from components.export.signing import Verifier
from components.export.single import IDS_FILE
from components.export.store import ExportStore
from components.networks.models import EMBEDDING_TABLE
from components.networks.scoring import (BUCKETS_SUFFIX, SCORE_BATCH, BaselineFeeds, baseline_buckets,
                                         predict_batches)


class InferenceModel:
    """An exported model loaded for scoring: ``predict(dense, sparse) -> probabilities``; :meth:`load` reads
    either format."""

    def __init__(self, root: Path, meta: dict[str, Any], program: LoadedProgram, verifier: Verifier):
        if program.feed_names != list(meta["feed_names"]):
            raise ServingModelError(f"{root}: the program feeds {program.feed_names}, {MANIFEST} says "
                                    f"{meta['feed_names']}")
        self.root, self.meta, self.program, self.verifier = root, meta, program, verifier
        self.version: Optional[int] = meta.get("version")  # a sharded export's; None for a single-file model
        self.schema = Schema.from_dict(meta["schema"])
        # None: exported without its dataset; such a model scores shards only.
        self.transform: Optional[Transform] = load_transform(root, meta)
        buckets = [name for name in program.feed_names if name.endswith(BUCKETS_SUFFIX)]
        feeds = [name for name in program.feed_names if name not in buckets]
        self.dense_name = feeds[0] if self.schema.dense_dim else None
        self.sparse_names = feeds[1:] if self.schema.dense_dim else list(feeds)
        # A network that starts from the baseline: each slot's ids' buckets are fed too.
        self.baseline = BaselineFeeds(buckets, int(meta["baseline_features"])) if buckets else None

    @classmethod
    def load(cls, path: str | os.PathLike, verify: bool = True, public_key: Optional[str | os.PathLike] = None,
             allow_unsigned: bool = False, cache_dir: Optional[str | os.PathLike] = None) -> InferenceModel:
        """The model at ``path``: a single-file model, a sharded version directory (a delta: its chain is loaded
        from the export store its ``serving.json`` names) or an export store (any fsspec URL: its latest
        version). Versions of a store that is not local are downloaded into ``cache_dir`` (default: a
        temporary directory that lives as long as the model).

        Each version's signature is checked first (:class:`~components.export.signing.Verifier`: the key
        ``public_key``, else ``$CTR_SERVING_PUBLIC_KEY``, else the per-user ``key.pub``; ``allow_unsigned``
        skips it), then (``verify``) every file's sha256. Raises :class:`ServingModelError` for an unsigned,
        incomplete, inconsistent or altered model."""
        verifier = Verifier(public_key, allow_unsigned)
        local = None if "://" in str(path) else Path(path)
        if local is None or not (local / MANIFEST).is_file():
            return ShardedModel.load_store(str(path), verifier, verify, cache_dir)
        manifest = verifier.manifest(local)
        if manifest["format"] == ExportFormat.single.value:
            return SingleModel.open(local, manifest, verifier, verify)
        return ShardedModel.load_version(local, manifest, verifier, verify, cache_dir)

    def predict(self, dense: Optional[np.ndarray], sparse: Sequence[RaggedIds]) -> np.ndarray:
        """Click probabilities (float32 ``[n]``) of ``n`` examples.

        ``dense``: float32 ``[n, dense_dim]`` (ignored when the schema has no dense slot); ``sparse``: one
        :class:`RaggedIds` of raw feature ids per sparse slot, in schema order. Ids the model never saw
        score with the zero row, as in evaluation.
        """
        if dense is None:
            n = len(sparse[0].offsets) - 1 if sparse else 0
            dense = np.zeros((n, self.schema.dense_dim), np.float32)
        return self._predict(dense, list(sparse))

    def predict_files(self, paths: Sequence[str | os.PathLike]) -> np.ndarray:
        """Probabilities of every example of the MultiSlot files ``paths``, in order."""
        _, dense, sparse = read_shards(paths, self.schema)
        return self.predict(dense, sparse)

    def predict_records(self, data: bytes, name: str = "records", first_line: int = 1) -> np.ndarray:
        """Probabilities of lines in the training data's format (label column included, as in the input files;
        blank lines skipped), mapped by the model's transform; a line that does not parse is refused, naming it
        (``name``: what the message calls the input, ``first_line``: the number of the data's first line)."""
        try:
            records = self._transform("raw records").rows_of_records(data, name)
        except WeightError as err:  # a weighted input's row without its weight: the whole input is refused
            raise ValueError(f"{name}:{first_line + err.line}: {err}") from None
        if records.malformed:
            line, reason = records.malformed[0]
            raise ValueError(f"{name}:{first_line + line}: {reason} ({len(records.malformed)} line(s) of "
                             f"{self.transform.fmt} input do not parse)")
        return self.predict(records.dense, records.sparse)

    def predict_instances(self, instances: list) -> np.ndarray:
        """Probabilities of serving instances (:meth:`Transform.rows_of_instances`: lists of the raw fields in
        column order, or objects keyed by column); raises :class:`~components.data_prep.transform.InstanceError`
        naming the first bad instance and field."""
        records = self._transform("instances").rows_of_instances(instances)
        return self.predict(records.dense, records.sparse)

    def _transform(self, what: str) -> Transform:
        if self.transform is None:
            raise ServingModelError(f"{self.root} was exported without its dataset's transform: it scores MultiSlot "
                                    f"shards, not {what}; export it again with the dataset (--dataset)")
        return self.transform

    def _predict(self, dense: np.ndarray, sparse: list[RaggedIds]) -> np.ndarray:
        raise NotImplementedError


class SingleModel(InferenceModel):
    """A single-file model (:mod:`components.export.single`): the program looks rows up in its own table."""

    def __init__(self, root: Path, meta: dict[str, Any], program: LoadedProgram, verifier: Verifier,
                 ids: np.ndarray):
        super().__init__(root, meta, program, verifier)
        self.ids = ids

    @classmethod
    def open(cls, root: Path, meta: dict[str, Any], verifier: Verifier, verify: bool = True) -> SingleModel:
        """The model at ``root`` whose ``meta`` ``verifier`` read."""
        if verify:
            verify_files(root, meta)
        ids = np.load(root / IDS_FILE)
        program = load_program(root, declared_ops(meta))
        table = program.scope.find_var(EMBEDDING_TABLE)
        rows = np.array(table.get_tensor()).shape[0] if table is not None else None
        if rows != len(ids) + 1:
            raise ServingModelError(f"{root}: the embedding table has {rows} rows, {IDS_FILE} holds {len(ids)} ids "
                                    "(expected one more row: the zero row of unseen ids)")
        return cls(root, meta, program, verifier, ids)

    def _predict(self, dense: np.ndarray, sparse: list[RaggedIds]) -> np.ndarray:
        return predict_batches(self.program.run, self.ids, self.dense_name, self.sparse_names, dense, sparse,
                               baseline=self.baseline)[:, 0]


class ShardedModel(InferenceModel):
    """A version of a sharded export: the dense program fed with rows looked up per batch in memory-mapped
    shards (:class:`~components.export.shards.ShardedTable`). The version's directories must stay in place
    while it is loaded."""

    def __init__(self, root: Path, meta: dict[str, Any], program: LoadedProgram, verifier: Verifier,
                 table: ShardedTable):
        super().__init__(root, meta, program, verifier)
        self.table = table
        self.on_lookup: Optional[Callable[[int], None]] = None  # told how many rows each batch looks up
        self._downloads: Optional[tempfile.TemporaryDirectory] = None  # versions fetched from a remote store

    @classmethod
    def load_store(cls, uri: str, verifier: Verifier, verify: bool = True,
                   cache_dir: Optional[str | os.PathLike] = None) -> ShardedModel:
        """The latest version of the export store ``uri``: its chain is the one its signed ``serving.json``
        names, not the store's unchecked copy."""
        store = ExportStore(uri)
        latest = store.latest()
        if latest is None:
            raise ServingModelError(f"{store.display_uri} is not a serving model: it holds no {MANIFEST}, and as an "
                                    "export store no published version")
        cache, downloads = _cache(store, cache_dir)
        root = store.local_dir(latest, cache)
        return cls._load_chain(store, root, verifier.manifest(root), verifier, verify, cache, downloads)

    @classmethod
    def load_version(cls, root: Path, manifest: dict[str, Any], verifier: Verifier, verify: bool = True,
                     cache_dir: Optional[str | os.PathLike] = None) -> ShardedModel:
        """The version at ``root`` (``manifest``: its ``serving.json`` as ``verifier`` read it): a base, or a
        delta whose chain's other versions come from its store (:func:`_delta_store`)."""
        if manifest["kind"] != DELTA:
            return cls._open_base(root, manifest, verifier, verify)
        store = _delta_store(root, manifest, verifier)
        return cls._load_chain(store, root, manifest, verifier, verify, *_cache(store, cache_dir))

    @classmethod
    def _load_chain(cls, store: ExportStore, root: Path, manifest: dict[str, Any], verifier: Verifier, verify: bool,
                    cache: Optional[Path], downloads: Optional[tempfile.TemporaryDirectory]) -> ShardedModel:
        """The version at ``root``: a base, or the chain's base from ``store`` with each delta of the chain
        applied, then ``root``'s; each version's signature checked as it is read. The model keeps ``downloads``
        (the directory ``cache`` that versions fetched from a remote store went to) alive."""
        if manifest["kind"] != DELTA:
            model = cls._open_base(root, manifest, verifier, verify)
        else:
            chain = manifest["chain"]
            base = store.local_dir(chain[0], cache)
            model = cls._open_base(base, verifier.manifest(base), verifier, verify)
            for delta in [store.local_dir(version, cache) for version in chain[1:-1]] + [root]:
                model.apply_delta(delta, verify)
        model._downloads = downloads
        return model

    @classmethod
    def _open_base(cls, root: Path, manifest: dict[str, Any], verifier: Verifier, verify: bool) -> ShardedModel:
        if manifest["kind"] == DELTA:
            raise ServingModelError(f"{root}: version {manifest['version']} is a delta where its chain names a base: "
                                    "the store is altered")
        if verify:
            verify_files(root, manifest)
        table = ShardedTable(manifest["shard_num"], manifest["embedding_dim"])
        table.push(root, manifest)
        return cls(root, manifest, load_program(root, declared_ops(manifest)), verifier, table)

    def apply_delta(self, delta_dir: str | os.PathLike, verify: bool = True) -> None:
        """Move the loaded model to the delta at ``delta_dir``: its dense program, and its rows and tombstones on
        top of the loaded ones. A delta whose parent is not the loaded version, or whose signature does not
        check out with the key the model was loaded with, is refused, naming both. In place: for a model no other
        thread is using (a server uses :meth:`with_delta`)."""
        root, manifest, program = self._checked_delta(Path(delta_dir), verify)
        transform = load_transform(root, manifest)  # each version its own (a new day's counts)
        self.table.push(root, manifest)
        self.root, self.meta, self.program, self.version = root, manifest, program, manifest["version"]
        self.transform = transform

    def with_delta(self, delta_dir: str | os.PathLike, verify: bool = True) -> ShardedModel:
        """A new model: this one moved to the delta at ``delta_dir`` (refused as :meth:`apply_delta` refuses it),
        sharing this one's memory-mapped rows. This model is left as it is, so predictions running on it finish
        on the version they started with."""
        root, manifest, program = self._checked_delta(Path(delta_dir), verify)
        table = self.table.copy()
        table.push(root, manifest)
        model = type(self)(root, manifest, program, self.verifier, table)
        model.on_lookup, model._downloads = self.on_lookup, self._downloads
        return model

    def _checked_delta(self, root: Path, verify: bool) -> tuple[Path, dict[str, Any], LoadedProgram]:
        """The delta at ``root`` (its manifest, read through the signature check, and program) once it is known
        to apply to this model."""
        manifest = self.verifier.manifest(root)
        if manifest["format"] != ExportFormat.sharded.value or manifest["kind"] != DELTA:
            raise ServingModelError(f"{root} is not a delta of a sharded export ({manifest['format']} "
                                    f"{manifest.get('kind', '')}): load it instead")
        if manifest["parent"] != self.version:
            raise ServingModelError(f"{root}: delta version {manifest['version']} applies to version "
                                    f"{manifest['parent']}, the loaded model is version {self.version}: refusing it")
        changed = [key for key in LAYOUT_KEYS if manifest[key] != self.meta[key]]
        if changed:
            raise ServingModelError(f"{root}: delta version {manifest['version']} changes {changed} of version "
                                    f"{self.version}: a delta never does (a written export is altered)")
        if verify:
            verify_files(root, manifest)
        program = load_program(root, declared_ops(manifest))
        if program.feed_names != self.program.feed_names:
            raise ServingModelError(f"{root}: the program feeds {program.feed_names}, version {self.version}'s "
                                    f"{self.program.feed_names}")
        return root, manifest, program

    def _predict(self, dense: np.ndarray, sparse: list[RaggedIds], batch: int = SCORE_BATCH) -> np.ndarray:
        import paddle

        if len(sparse) != len(self.sparse_names):
            raise ValueError(f"the model reads {len(self.sparse_names)} sparse slots, got {len(sparse)}")
        n = len(sparse[0].offsets) - 1
        for name, slot in zip(self.sparse_names, sparse):
            if len(slot.offsets) != n + 1:
                raise ValueError(f"sparse slot {name} holds {len(slot.offsets) - 1} rows, expected {n}")
        if self.dense_name is not None:
            dense = np.asarray(dense, dtype=np.float32)
            if dense.ndim != 2 or len(dense) != n:
                raise ValueError(f"dense features must be a [{n}, dense_dim] array, got shape {dense.shape}")
        out = np.empty(n, np.float32)
        for start in range(0, n, batch):
            stop = min(start + batch, n)
            spans = [(int(slot.offsets[start]), int(slot.offsets[stop])) for slot in sparse]
            values = np.concatenate([slot.values[lo:hi] for slot, (lo, hi) in zip(sparse, spans)]).astype(np.uint64)
            unique, inverse = np.unique(values, return_inverse=True)  # each id looked up once per batch
            rows = self.table.lookup(unique)[inverse]
            if self.on_lookup is not None:
                self.on_lookup(len(unique))
            feed: dict[str, Any] = {self.dense_name: dense[start:stop]} if self.dense_name is not None else {}
            at = 0
            for name, slot, (lo, hi) in zip(self.sparse_names, sparse, spans):
                tensor = paddle.base.core.LoDTensor()
                tensor.set(rows[at:at + hi - lo], paddle.CPUPlace())
                tensor.set_lod([(slot.offsets[start:stop + 1] - lo).tolist()])
                feed[name] = tensor
                at += hi - lo
            for name, slot, (lo, hi) in zip(self.baseline.names if self.baseline else [], sparse, spans):
                feed[name] = baseline_buckets(slot.values[lo:hi], self.baseline.features,
                                              (slot.offsets[start:stop + 1] - lo).tolist())
            out[start:stop] = np.asarray(self.program.run(feed), np.float32).reshape(-1)
        return out


def _cache(store: ExportStore, cache_dir: Optional[str | os.PathLike]) -> tuple[Optional[Path],
                                                                                Optional[tempfile.TemporaryDirectory]]:
    """``(directory, owner)``: where versions of ``store`` are downloaded (None: a local store, read in place):
    ``cache_dir``, else a temporary directory, whose ``owner`` the model keeps alive."""
    if cache_dir is not None:
        return Path(cache_dir), None
    if store.local:
        return None, None
    downloads = tempfile.TemporaryDirectory(prefix="serving-")
    return Path(downloads.name), downloads


def _delta_store(root: Path, manifest: dict[str, Any], verifier: Verifier) -> ExportStore:
    """The store a delta's chain is read from: the one its ``serving.json`` names, followed only when it is the
    directory the delta sits in, or when the signature vouched for the name (a copy of a signed delta, such as
    the run's ``serving_model``, whose chain is then checked version by version with the same key). An unsigned
    delta accepted with ``allow_unsigned`` never leads the loader elsewhere."""
    named = ExportStore(manifest["store"])
    if named.local and Path(named.root).resolve() == root.resolve().parent:
        return named
    if verifier.checks:
        return named
    raise ServingModelError(f"{root}: an unsigned delta names the export store {named.display_uri}, not the "
                            f"directory it sits in ({root.resolve().parent}): refusing to follow it; load the "
                            "store itself, or sign the export with export.signing_key")
