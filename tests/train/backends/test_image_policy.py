"""The admission policy for signed images (sigstore policy-controller ClusterImagePolicy), checked offline: the
image globs against policy-controller's glob rules, the Kubeflow run directory that carries it, its CRD schema
(../shared/schemas, when the CRD is there)."""

import json
import re

import jsonschema
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from components.config import ConfigError, from_dict
from components.config_rules import validate
from components.train.backends import image_policy
from pipelines.kubeflow import IMAGE_POLICY_FILE, RBAC_FILE, write_run_files
from tests.conftest import PROD, SCHEMAS, compose_config

DIGEST = "sha256:" + "ab" * 32
# sigstore/policy-controller config/300-clusterimagepolicy.yaml: the CRD, with its v1alpha1 and v1beta1 schemas.
CRD = SCHEMAS / "policy.sigstore.dev_clusterimagepolicies.yaml"
needs_crd = pytest.mark.skipif(not CRD.is_file(), reason=f"{CRD} is absent (sigstore/policy-controller's CRD, "
                                                         "config/300-clusterimagepolicy.yaml, is not in ../shared)")


def policy_controller_glob(glob: str) -> re.Pattern:
    """How policy-controller (pkg/apis/glob) matches a glob against an image name: ``*`` is any run of characters
    but ``/``, ``**`` any run of characters, and the whole name must match. Written out here, from its
    documentation, rather than taken from image_policy.py."""
    pattern = re.escape(glob).replace(r"\*\*", "\0").replace(r"\*", "[^/]*").replace("\0", ".*")
    return re.compile(f"^{pattern}$")


def admitted_by(policy: dict, image: str) -> bool:
    return any(policy_controller_glob(entry["glob"]).match(image) for entry in policy["spec"]["images"])


@pytest.fixture
def public_key(tmp_path):
    key = ec.generate_private_key(ec.SECP256R1()).public_key()
    path = tmp_path / "cosign.pub"
    path.write_bytes(key.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    return path


@pytest.mark.parametrize("image,repository", [
    ("paddle-ps-pipelines:0.1.0", "index.docker.io/library/paddle-ps-pipelines"),
    ("paddlepaddle/paddle:2.6.2", "index.docker.io/paddlepaddle/paddle"),
    ("docker.io/paddlepaddle/paddle:2.6.2", "index.docker.io/paddlepaddle/paddle"),
    ("registry.example.com/paddle-ps-pipelines:0.1.0-gpu", "registry.example.com/paddle-ps-pipelines"),
    (f"127.0.0.1:5000/team/ctr@{DIGEST}", "127.0.0.1:5000/team/ctr"),
    ("registry:5000/ctr", "registry:5000/ctr"),
    ("localhost/ctr:1", "localhost/ctr"),
])
def test_repository_is_the_fully_qualified_name_policy_controller_matches(image, repository):
    assert image_policy.repository(image) == repository


def test_globs_cover_the_job_images_by_tag_and_by_digest_and_nothing_beside_them(public_key):
    images = ["registry.example.com/ctr/paddle-ps-pipelines:0.1.0", "registry.example.com/ctr/paddle-ps-pipelines:0.1.0-gpu"]
    policy = image_policy.cluster_image_policy(images, public_key.read_text())
    assert len(policy["spec"]["images"]) == 1  # one repository
    # policy-controller resolves tags to digests before it matches: both forms must be covered.
    for name in (*images, f"registry.example.com/ctr/paddle-ps-pipelines@{DIGEST}"):
        assert admitted_by(policy, name), name
    for name in ("registry.example.com/ctr/other:1", "registry.example.com/ctr/paddle-ps-pipelines/sub:1",
                 "evil.example.com/ctr/paddle-ps-pipelines:0.1.0"):
        assert not admitted_by(policy, name), name


def test_the_policy_requires_the_signing_key_and_nothing_else(public_key):
    policy = image_policy.cluster_image_policy(["r.example.com/a:1"], public_key.read_text())
    assert (policy["apiVersion"], policy["kind"]) == ("policy.sigstore.dev/v1beta1", "ClusterImagePolicy")
    (authority,) = policy["spec"]["authorities"]
    assert authority["key"]["data"] == public_key.read_text()
    # No transparency log or keyless identity: the key alone decides (policy-controller skips the tlog then).
    assert set(authority) == {"name", "key"} and policy["spec"]["mode"] == "enforce"
    assert yaml.safe_load(image_policy.to_yaml(policy)) == policy
    assert "data: |\n        -----BEGIN PUBLIC KEY-----" in image_policy.to_yaml(policy)  # readable PEM block


def prod_config(tmp_path, *overrides):
    cfg = from_dict(compose_config(tmp_path / "run", *PROD, *overrides))
    validate(cfg)
    return cfg


def test_the_kubeflow_run_directory_gets_the_policy_beside_the_rbac(tmp_path, public_key):
    cfg = prod_config(tmp_path, f"cluster.image_signing_key={public_key}",
                      f"cluster.servers.image.digest={DIGEST}")
    run_dir = tmp_path / "run"
    write_run_files(cfg, run_dir)
    policy = yaml.safe_load((run_dir / IMAGE_POLICY_FILE).read_text())
    assert policy == image_policy.job_image_policy(cfg)
    assert (run_dir / IMAGE_POLICY_FILE).parent == (run_dir / RBAC_FILE).parent
    for image in (cfg.cluster.pipeline_image.reference, cfg.cluster.servers.image.reference,
                  cfg.cluster.workers.image.reference):
        assert admitted_by(policy, image), image
    # The key is read here, on the compiling machine; the steps do not carry its path.
    assert str(public_key) not in (run_dir / "pipeline.yaml").read_text()
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["cluster"]["image_signing_key"] is None


def test_no_policy_without_a_signing_key(tmp_path):
    cfg = prod_config(tmp_path)
    write_run_files(cfg, tmp_path / "run")
    assert image_policy.job_image_policy(cfg) is None and not (tmp_path / "run" / IMAGE_POLICY_FILE).exists()


@pytest.mark.parametrize("content", [None, "not a key\n", "-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"])
def test_a_bad_signing_key_is_refused_before_anything_is_compiled(tmp_path, content):
    key = tmp_path / "cosign.pub"
    if content is not None:
        key.write_text(content)
    cfg = prod_config(tmp_path, f"cluster.image_signing_key={key}")
    with pytest.raises(ConfigError, match=r"config key 'cluster.image_signing_key'.*(cannot read|holds no PEM)"):
        write_run_files(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_cli_writes_the_policy_and_refuses_a_bad_key_in_one_line(tmp_path, public_key, capsys):
    out = tmp_path / "k8s" / "image-policy.yaml"
    assert image_policy.main(["--public-key", str(public_key), "--image", "r.example.com/a:1", "--out", str(out)]) == 0
    assert yaml.safe_load(out.read_text())["spec"]["images"] == [{"glob": "r.example.com/a*"}]
    assert image_policy.main(["--public-key", str(tmp_path / "missing.pub"), "--image", "r.example.com/a:1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot read the public key file") and err.count("\n") == 1


def strict(schema: dict) -> dict:
    """The schema with unknown fields refused, as the API server's strict field validation (kubectl apply
    --validate=strict) refuses them: this CRD declares no required fields and no additionalProperties."""
    if isinstance(schema, dict):
        schema = {key: strict(value) for key, value in schema.items()}
        if "properties" in schema and not schema.get("x-kubernetes-preserve-unknown-fields"):
            schema.setdefault("additionalProperties", False)
        return schema
    return [strict(item) for item in schema] if isinstance(schema, list) else schema


def crd_schema(api_version: str) -> dict:
    crd = yaml.safe_load(CRD.read_text())
    group, version = api_version.split("/")
    assert crd["spec"]["group"] == group
    (served,) = [v for v in crd["spec"]["versions"] if v["name"] == version and v["served"]]
    schema = strict(served["schema"]["openAPIV3Schema"])
    # What every object has and the API server checks itself (CRD schemas may leave them out).
    schema["properties"].update(apiVersion={"const": api_version}, kind={"const": crd["spec"]["names"]["kind"]},
                                metadata={"type": "object"})
    return schema


@needs_crd
def test_the_policy_fits_the_crd_schema(tmp_path, public_key):
    cfg = prod_config(tmp_path, f"cluster.image_signing_key={public_key}")
    policy = image_policy.job_image_policy(cfg)
    schema = crd_schema(policy["apiVersion"])
    jsonschema.validate(policy, schema)
    broken = json.loads(json.dumps(policy))
    broken["spec"]["authorities"][0]["key"]["pem"] = broken["spec"]["authorities"][0]["key"].pop("data")
    with pytest.raises(jsonschema.ValidationError):  # strict enough to catch a misspelt field
        jsonschema.validate(broken, schema)
