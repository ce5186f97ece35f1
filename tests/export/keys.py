"""Export signing key pairs other than the per-user one, for the tests that sign with a key file or a Secret."""

from __future__ import annotations

from pathlib import Path

from components.export.signing import PRIVATE_KEY, PUBLIC_KEY, Signer, public_pem


def new_key_pair(directory: Path) -> tuple[Path, Path]:
    """A fresh EC P-256 pair as an operator makes it (``key.pem``: PEM PKCS#8; ``key.pub``) in ``directory``."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    directory.mkdir(parents=True, exist_ok=True)
    private, public = directory / PRIVATE_KEY, directory / PUBLIC_KEY
    key = ec.generate_private_key(ec.SECP256R1())
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(public_pem(Signer(private).key))
    return private, public
