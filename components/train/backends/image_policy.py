"""The admission policy for the job's images: a sigstore policy-controller ``ClusterImagePolicy``.

With ``cluster.image_signing_key`` set (the cosign public key the images are signed with), the Kubeflow run
directory gets ``k8s/image-policy.yaml`` (``pipelines/kubeflow.py``): pods whose image is in one of the job's image
repositories are admitted only when the image carries a signature of that key (``cosign sign --key``, or
``containers/sigstore.py sign``), in namespaces that opt in to policy-controller
(``policy.sigstore.dev/include=true``). The authority names no transparency log, so none is required: the
signature is checked against the key alone. policy-controller resolves a tag to its digest before checking, so
a moved tag cannot swap the image after admission.

    python -m components.train.backends.image_policy --public-key cosign.pub --image REGISTRY/REPO:TAG [...]
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path
from typing import Iterable, Optional

import yaml

from components.config import ConfigError, CtrConfig

API_VERSION = "policy.sigstore.dev/v1beta1"
POLICY_NAME = "ctr-ps-signed-images"
# Docker Hub, as go-containerregistry (and so policy-controller) names it.
DOCKER_HUB = "index.docker.io"


def repository(image: str) -> str:
    """The image's repository, fully qualified as policy-controller matches it: ``paddle:1`` is
    ``index.docker.io/library/paddle``, ``registry:5000/a/b@sha256:...`` is ``registry:5000/a/b``."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:  # a tag (a colon before the last slash is a registry's port)
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    first, _, rest = name.partition("/")
    names_registry = bool(rest) and ("." in first or ":" in first or first == "localhost")
    if names_registry and first not in ("docker.io", DOCKER_HUB):
        return name
    path = rest if names_registry else name
    return f"{DOCKER_HUB}/{path if '/' in path else 'library/' + path}"


def image_globs(images: Iterable[str]) -> list[dict]:
    """One glob per repository, matching its tags and digests (``repo:tag``, ``repo@sha256:...``).

    policy-controller's ``*`` matches any characters but ``/``, so ``repo*`` matches both; it also covers
    sibling repositories whose name starts with the same characters (``repo-gpu``): they then need the same
    signature, which is stricter, never looser.
    """
    return [{"glob": f"{repo}*"} for repo in sorted({repository(image) for image in images})]


def cluster_image_policy(images: Iterable[str], public_key_pem: str, name: str = POLICY_NAME) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "ClusterImagePolicy",
        "metadata": {"name": name},
        "spec": {
            "images": image_globs(images),
            "authorities": [{"name": "signing-key", "key": {"data": public_key_pem, "hashAlgorithm": "sha256"}}],
            "mode": "enforce",
        },
    }


def read_public_key(path: str) -> str:
    """The PEM public key in the file ``path``; ValueError, saying why, when the file holds none."""
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        text = Path(path).read_text()
    except OSError as err:
        raise ValueError(f"cannot read the public key file {path}: {err.strerror}") from None
    try:
        load_pem_public_key(text.encode())
    except ValueError:
        raise ValueError(f"{path} holds no PEM public key (-----BEGIN PUBLIC KEY-----, as cosign.pub)") from None
    return text


def job_image_policy(cfg: CtrConfig) -> Optional[dict]:
    """The policy for the images a Kubeflow run of ``cfg`` uses, or None without ``cluster.image_signing_key``.

    The key is read on the machine that compiles the pipeline (the steps never read it), so it is checked
    here rather than in :func:`components.config_rules.validate`, which the steps run too.
    """
    cluster = cfg.cluster
    if not cluster.image_signing_key:
        return None
    try:
        key = read_public_key(cluster.image_signing_key)
    except ValueError as err:
        raise ConfigError("cluster.image_signing_key", cluster.image_signing_key,
                          "null or the path of the cosign public key the images are signed with", str(err))
    images = [cluster.pipeline_image.reference, cluster.servers.image.reference, cluster.workers.image.reference]
    return cluster_image_policy(images, key)


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (the PEM key) as ``|`` blocks, as a person would write them."""


_BlockDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def to_yaml(policy: dict) -> str:
    return yaml.dump(policy, Dumper=_BlockDumper, sort_keys=False)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m components.train.backends.image_policy", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--public-key", required=True, help="the cosign public key (PEM) the images are signed with")
    parser.add_argument("--image", action="append", required=True, help="an image reference (repeat for more)")
    parser.add_argument("--name", default=POLICY_NAME, help="the policy's name")
    parser.add_argument("--out", type=Path, help="file to write (default: stdout)")
    args = parser.parse_args(argv)
    bad = [image for image in args.image if not re.fullmatch(r"[\w.\-/:@]+", image)]
    if bad:
        print(f"error: not an image reference: {bad[0]!r}", file=sys.stderr)
        return 2
    try:
        text = to_yaml(cluster_image_policy(args.image, read_public_key(args.public_key), args.name))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
