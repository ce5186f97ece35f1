"""Who wrote an export: an ECDSA P-256 signature over ``serving.json``, checked before a loader reads anything else.

``serving.json`` holds every file's sha256, so its digests prove a file is the one listed, but whoever can write
the store can rewrite the list too: integrity, not origin. The exporter signs ``serving.json``'s exact bytes
(ECDSA over SHA-256, the algorithm of the image signatures, ``containers/sigstore.py``) into
``serving.json.sig`` (base64 of the DER signature), written before ``serving.json`` so that a store reader never
sees a version without its signature. A loader checks it with the operator's public key and refuses an
unsigned, tampered or otherwise signed export in one line, unless told by name to accept unsigned ones.

The keys: a plain PEM PKCS#8 private key (``export.signing_key``) and a PEM public key. ``auto`` (the default)
is a per-user pair under :func:`user_key_dir`, made on first use; on Kubeflow the export step reads the
private key from the Secret ``export.signing_secret`` mounted at :data:`SECRET_MOUNT`.
"""

from __future__ import annotations

import base64
import os
import uuid
from pathlib import Path
from typing import Any, Optional

from components.export.manifest import MANIFEST, SIGNATURE, ServingModelError, parse_manifest

AUTO, NONE = "auto", "none"  # export.signing_key's two words; anything else is a path
PRIVATE_KEY, PUBLIC_KEY = "key.pem", "key.pub"
PUBLIC_KEY_ENV = "CTR_SERVING_PUBLIC_KEY"
SECRET_MOUNT = "/var/run/secrets/ctr-export-signing"  # where the export step's pod sees export.signing_secret
FIX = "sign it with export.signing_key, or pass --allow-unsigned to accept it unsigned"


def user_key_dir() -> Path:
    """The per-user key pair's directory: ``$XDG_CONFIG_HOME`` (else ``~/.config``)
    ``/paddle-ps-pipelines/export-signing``. The one place it is named, so tests can point it at a tmp dir."""
    config_home = os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config"
    return Path(config_home) / "paddle-ps-pipelines" / "export-signing"


def ensure_user_key() -> Path:
    """The per-user private key, made (mode 600, with its ``key.pub``) when absent; returns its path.

    The key file appears whole or not at all (``link(2)`` of a finished file), so two exports starting at once
    end with one key, whichever linked first."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    directory = user_key_dir()
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    private = directory / PRIVATE_KEY
    if not private.exists():
        key = ec.generate_private_key(ec.SECP256R1())
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption())
        tmp = directory / f".{PRIVATE_KEY}.tmp-{uuid.uuid4().hex[:8]}"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(pem)
        try:
            os.link(tmp, private)
        except FileExistsError:
            pass
        finally:
            tmp.unlink()
    public = directory / PUBLIC_KEY
    if not public.exists():
        tmp = directory / f".{PUBLIC_KEY}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.write_bytes(public_pem(load_private_key(private)))
        os.replace(tmp, public)
    return private


def step_signing_key(setting: str, on_kubeflow: bool) -> str:
    """What the export step signs with: on Kubeflow, ``auto`` is the mounted Secret's ``key.pem`` (a pod has no
    per-user key worth trusting); elsewhere ``export.signing_key`` as it is."""
    return str(Path(SECRET_MOUNT) / PRIVATE_KEY) if on_kubeflow and setting == AUTO else setting


def load_private_key(path: str | os.PathLike) -> Any:
    """The EC P-256 private key in the PEM PKCS#8 file ``path``; ValueError in one line otherwise."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    try:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as err:
        raise ValueError(f"export signing key {path}: {_reason(err)}; give an unencrypted PEM PKCS#8 EC P-256 "
                         "private key (export.signing_key), or auto for the per-user one") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or not isinstance(key.curve, ec.SECP256R1):
        raise ValueError(f"export signing key {path} is not an EC P-256 private key: make one with "
                         "`openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256`")
    return key


def public_pem(private_key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return private_key.public_key().public_bytes(serialization.Encoding.PEM,
                                                 serialization.PublicFormat.SubjectPublicKeyInfo)


class Signer:
    """Signs ``serving.json`` bytes with the private key at ``path`` (loaded once, checked at construction)."""

    def __init__(self, path: str | os.PathLike):
        self.path = Path(path)
        self.key = load_private_key(self.path)

    def __call__(self, data: bytes) -> bytes:
        """The ``serving.json.sig`` content of ``data``: base64 of the DER ECDSA-SHA256 signature."""
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        return base64.b64encode(self.key.sign(data, ec.ECDSA(hashes.SHA256()))) + b"\n"


def signer(setting: str) -> Optional[Signer]:
    """The signer ``export.signing_key`` asks for: ``auto`` the per-user key (made on first use), ``none`` None
    (exports unsigned, an explicit opt-out), anything else the private key file it names."""
    if setting == NONE:
        return None
    return Signer(ensure_user_key() if setting == AUTO else Path(setting).expanduser())


class Verifier:
    """Reads a version's ``serving.json`` only once its signature checks out with the operator's public key.

    The key: ``public_key`` (a PEM file), else ``$CTR_SERVING_PUBLIC_KEY``, else the per-user ``key.pub``.
    ``allow_unsigned`` (an explicit opt-out) skips the check altogether."""

    def __init__(self, public_key: Optional[str | os.PathLike] = None, allow_unsigned: bool = False):
        self.allow_unsigned = allow_unsigned
        env = os.environ.get(PUBLIC_KEY_ENV)
        self.key_path = (Path(public_key) if public_key else Path(env) if env
                         else user_key_dir() / PUBLIC_KEY)
        self._key: Any = None

    @property
    def checks(self) -> bool:
        return not self.allow_unsigned

    def manifest(self, root: str | os.PathLike) -> dict[str, Any]:
        """``root/serving.json``, parsed only after its signature is checked (the bytes checked are the bytes
        parsed); raises :class:`ServingModelError` in one line naming ``root`` and how to fix it."""
        root = Path(root)
        path = root / MANIFEST
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ServingModelError(f"{root} is not a serving model: {MANIFEST} is missing") from None
        if self.checks:
            self.check(root, data)
        return parse_manifest(path, data)

    def check(self, root: Path, data: bytes) -> None:
        from cryptography.exceptions import InvalidSignature
        from cryptography.hazmat.primitives import hashes
        from cryptography.hazmat.primitives.asymmetric import ec

        sig_path = root / SIGNATURE
        if not sig_path.is_file():
            raise ServingModelError(f"{root} is unsigned (no {SIGNATURE}): {FIX}")
        try:
            signature = base64.b64decode(sig_path.read_bytes().strip(), validate=True)
            self.public_key(root).verify(signature, data, ec.ECDSA(hashes.SHA256()))
        except (InvalidSignature, ValueError):
            raise ServingModelError(f"{root}: {SIGNATURE} does not match {MANIFEST} with the public key "
                                    f"{self.key_path} (altered, or signed with another key): {FIX}") from None

    def public_key(self, root: Path) -> Any:
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import ec

        if self._key is None:
            try:
                key = serialization.load_pem_public_key(self.key_path.read_bytes())
            except (OSError, ValueError) as err:
                raise ServingModelError(f"cannot check {root}'s signature: public key {self.key_path}: "
                                        f"{_reason(err)}; pass --public-key or set {PUBLIC_KEY_ENV}, or pass "
                                        "--allow-unsigned to accept it unsigned") from None
            if not isinstance(key, ec.EllipticCurvePublicKey):
                raise ServingModelError(f"public key {self.key_path} is not an EC key: give the key.pub of the "
                                        "export signing key")
            self._key = key
        return self._key


def _reason(err: BaseException) -> str:
    return (str(err).strip().splitlines() or [type(err).__name__])[0]
