#!/usr/bin/env python3
"""Sigstore (cosign-format) image signatures without cosign: a key pair, and a signature attached in the registry.

    containers/sigstore.py keygen OUT_DIR                  # OUT_DIR/cosign.key, cosign.pub, cosign.password
    containers/sigstore.py sign KEY PASSWORD_FILE REGISTRY/REPO:TAG
    containers/sigstore.py verify PUBLIC_KEY REGISTRY/REPO:TAG   # exit 1 when no valid signature is attached

This is what ``cosign generate-key-pair`` and ``cosign sign --key`` (without a transparency log) write, and what
``podman push --sign-by-sigstore-private-key`` writes too, except on Debian 12, whose podman is built with
sigstore signing compiled out ("Debian-local change: sigstore disabled"; verifying works). The signatures are
read by containers-policy.json's ``sigstoreSigned`` (podman, CRI-O) and by sigstore policy-controller's
``ClusterImagePolicy`` with a ``key`` authority (``components/train/backends/image_policy.py``). ``verify`` does
what policy-controller does with such an authority (no transparency log): find the attachment of the image's
digest, check a layer's signature with the key and that its payload names that digest. It is this script's own
check, not an independent verifier: Debian's podman cannot verify sigstore signatures either.

* The key: ECDSA P-256. The private key is PKCS#8, encrypted as sigstore's ``cryptoutils`` does it (scrypt
  N=32768 r=8 p=1 derives a NaCl secretbox key; PEM type ``ENCRYPTED SIGSTORE PRIVATE KEY``) with a random
  password written beside it (mode 600); the public key is a PEM ``PUBLIC KEY``.
* The signature: the simple-signing payload (``critical``: the image's manifest digest and the reference it was
  signed as; ``optional``: null), signed with ECDSA over SHA-256, is the one layer (media type
  ``application/vnd.dev.cosign.simplesigning.v1+json``, signature in the ``dev.cosignproject.cosign/signature``
  annotation) of an OCI manifest tagged ``sha256-<manifest digest>.sig`` in the image's repository.

Registries without authentication only (HTTP on loopback, or HTTPS the system trusts). Needs ``cryptography``
and PyNaCl (Debian: python3-cryptography, python3-nacl).
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import secrets
import sys
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import nacl.secret
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

PEM_TYPE = "ENCRYPTED SIGSTORE PRIVATE KEY"
SCRYPT = {"N": 32768, "r": 8, "p": 1}  # sigstore's default work factors, which its decrypter accepts
SIMPLE_SIGNING = "application/vnd.dev.cosign.simplesigning.v1+json"
SIGNATURE_ANNOTATION = "dev.cosignproject.cosign/signature"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MANIFEST_TYPES = ", ".join([OCI_MANIFEST, "application/vnd.docker.distribution.manifest.v2+json",
                            "application/vnd.oci.image.index.v1+json",
                            "application/vnd.docker.distribution.manifest.list.v2+json"])


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _secretbox_key(password: bytes, salt: bytes, params: dict) -> bytes:
    return hashlib.scrypt(password, salt=salt, n=params["N"], r=params["r"], p=params["p"], maxmem=256 << 20,
                          dklen=nacl.secret.SecretBox.KEY_SIZE)


def encrypt(plaintext: bytes, password: bytes) -> bytes:
    """The JSON document of go-securesystemslib's ``encrypted.Encrypt`` (scrypt + nacl/secretbox)."""
    salt = secrets.token_bytes(32)
    nonce = secrets.token_bytes(nacl.secret.SecretBox.NONCE_SIZE)
    sealed = nacl.secret.SecretBox(_secretbox_key(password, salt, SCRYPT)).encrypt(plaintext, nonce).ciphertext
    return json.dumps({"kdf": {"name": "scrypt", "params": SCRYPT, "salt": _b64(salt)},
                       "cipher": {"name": "nacl/secretbox", "nonce": _b64(nonce)},
                       "ciphertext": _b64(sealed)}).encode()


def decrypt(document: bytes, password: bytes) -> bytes:
    doc = json.loads(document)
    if doc["kdf"]["name"] != "scrypt" or doc["cipher"]["name"] != "nacl/secretbox":
        raise ValueError(f"unsupported key encryption: {doc['kdf']['name']} + {doc['cipher']['name']}")
    key = _secretbox_key(password, base64.b64decode(doc["kdf"]["salt"]), doc["kdf"]["params"])
    return nacl.secret.SecretBox(key).decrypt(base64.b64decode(doc["ciphertext"]),
                                              base64.b64decode(doc["cipher"]["nonce"]))


def pem(kind: str, data: bytes) -> str:
    body = _b64(data)
    return "".join([f"-----BEGIN {kind}-----\n", *(body[i:i + 64] + "\n" for i in range(0, len(body), 64)),
                    f"-----END {kind}-----\n"])


def unpem(text: str, kind: str) -> bytes:
    begin, end = f"-----BEGIN {kind}-----", f"-----END {kind}-----"
    if begin not in text or end not in text:
        raise ValueError(f"not a PEM {kind}")
    return base64.b64decode("".join(text.split(begin, 1)[1].split(end, 1)[0].split()))


def keygen(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    key = ec.generate_private_key(ec.SECP256R1())
    password = secrets.token_urlsafe(24)
    der = key.private_bytes(serialization.Encoding.DER, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    public = key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    files = {out_dir / "cosign.key": pem(PEM_TYPE, encrypt(der, password.encode())),
             out_dir / "cosign.pub": public.decode(), out_dir / "cosign.password": password + "\n"}
    for path, text in files.items():
        path.write_text(text)
        if path.suffix != ".pub":
            os.chmod(path, 0o600)
    return list(files)


def load_private_key(key_file: Path, password_file: Path) -> ec.EllipticCurvePrivateKey:
    der = decrypt(unpem(key_file.read_text(), PEM_TYPE), password_file.read_text().rstrip("\n").encode())
    return serialization.load_der_private_key(der, password=None)


def payload(reference: str, manifest_digest: str) -> bytes:
    """The simple-signing payload, byte for byte as cosign writes it."""
    return json.dumps({"critical": {"identity": {"docker-reference": reference},
                                    "image": {"docker-manifest-digest": manifest_digest},
                                    "type": "cosign container image signature"},
                       "optional": None}, separators=(",", ":")).encode()


class Registry:
    """The few calls of the registry API (distribution spec v2) that attaching a signature needs."""

    def __init__(self, host: str):
        scheme = "http" if host.split(":")[0] in ("localhost", "127.0.0.1", "::1") else "https"
        self.base = f"{scheme}://{host}"

    def request(self, method: str, url: str, data: bytes | None = None, headers: dict | None = None):
        full = url if url.startswith("http") else self.base + url
        return urllib.request.urlopen(urllib.request.Request(full, data=data, method=method, headers=headers or {}))

    def get(self, path: str, accept: str = MANIFEST_TYPES) -> bytes:
        with self.request("GET", path, headers={"Accept": accept}) as response:
            return response.read()

    def manifest_digest(self, repo: str, tag: str) -> str:
        return "sha256:" + hashlib.sha256(self.get(f"/v2/{repo}/manifests/{tag}")).hexdigest()

    def put_blob(self, repo: str, data: bytes) -> dict:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        with self.request("POST", f"/v2/{repo}/blobs/uploads/") as started:
            location = started.headers["Location"]
        separator = "&" if "?" in location else "?"
        self.request("PUT", f"{location}{separator}digest={urllib.parse.quote(digest)}", data,
                     {"Content-Type": "application/octet-stream"}).close()
        return {"digest": digest, "size": len(data)}

    def put_manifest(self, repo: str, tag: str, manifest: dict) -> None:
        self.request("PUT", f"/v2/{repo}/manifests/{tag}", json.dumps(manifest).encode(),
                     {"Content-Type": OCI_MANIFEST}).close()


def parse_reference(reference: str) -> tuple[str, str, str]:
    host, _, path = reference.partition("/")
    repo, _, tag = path.rpartition(":")
    if not repo or "/" in tag:
        raise ValueError(f"expected REGISTRY/REPO:TAG, got {reference!r}")
    return host, repo, tag


def signature_tag(digest: str) -> str:
    return digest.replace(":", "-") + ".sig"


def sign(key_file: Path, password_file: Path, reference: str) -> str:
    """Attach a signature of ``reference`` (``host[:port]/repo:tag``) to its repository, replacing any earlier
    one; returns the signature's reference."""
    host, repo, tag = parse_reference(reference)
    key = load_private_key(key_file, password_file)
    registry = Registry(host)
    digest = registry.manifest_digest(repo, tag)
    body = payload(reference, digest)
    signature = _b64(key.sign(body, ec.ECDSA(hashes.SHA256())))
    layer = {"mediaType": SIMPLE_SIGNING, **registry.put_blob(repo, body),
             "annotations": {SIGNATURE_ANNOTATION: signature}}
    config = json.dumps({"architecture": "", "os": "", "config": {},
                         "rootfs": {"type": "layers", "diff_ids": [layer["digest"]]}}).encode()
    registry.put_manifest(repo, signature_tag(digest), {
        "schemaVersion": 2, "mediaType": OCI_MANIFEST,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **registry.put_blob(repo, config)},
        "layers": [layer]})
    return f"{host}/{repo}:{signature_tag(digest)}"


class NotVerified(Exception):
    pass


def verify(public_key_file: Path, reference: str) -> str:
    """The digest of ``reference`` when a signature attached to it verifies with the key; else NotVerified."""
    host, repo, tag = parse_reference(reference)
    public = serialization.load_pem_public_key(public_key_file.read_bytes())
    registry = Registry(host)
    digest = registry.manifest_digest(repo, tag)
    try:
        manifest = json.loads(registry.get(f"/v2/{repo}/manifests/{signature_tag(digest)}", OCI_MANIFEST))
    except urllib.error.HTTPError as err:
        if err.code == 404:
            raise NotVerified(f"no signature attached to {reference} ({digest})") from None
        raise
    for layer in manifest.get("layers", []):
        signature = layer.get("annotations", {}).get(SIGNATURE_ANNOTATION)
        if layer.get("mediaType") != SIMPLE_SIGNING or not signature:
            continue
        body = registry.get(f"/v2/{repo}/blobs/{layer['digest']}", "*/*")
        try:
            public.verify(base64.b64decode(signature), body, ec.ECDSA(hashes.SHA256()))
        except InvalidSignature:
            continue
        if json.loads(body)["critical"]["image"]["docker-manifest-digest"] == digest:
            return digest
    raise NotVerified(f"no signature of {reference} ({digest}) verifies with {public_key_file}")


def main(argv: list[str]) -> int:
    if argv[:1] == ["keygen"] and len(argv) == 2:
        for path in keygen(Path(argv[1])):
            print(path)
        return 0
    if argv[:1] == ["sign"] and len(argv) == 4:
        print(f"signature of {argv[3]} attached as {sign(Path(argv[1]), Path(argv[2]), argv[3])}")
        return 0
    if argv[:1] == ["verify"] and len(argv) == 3:
        try:
            digest = verify(Path(argv[1]), argv[2])
        except NotVerified as refused:
            print(f"refused: {refused}")
            return 1
        print(f"verified: {argv[2]} ({digest}) is signed with {argv[1]}")
        return 0
    print(__doc__.split("\n\n")[1], file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
