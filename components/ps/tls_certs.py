"""A certificate authority made for one PS job, and one certificate per role, for the job's mutual TLS
(:mod:`components.ps.tls`).

The CA is made when the job is launched (the compose file is generated, the Kubernetes launcher starts the job) and
its private key is never written anywhere: once the roles' certificates are signed, nothing can sign another, so a
certificate of this job is accepted by this job's roles only and by no other job's (each trusts its own CA alone).
The job id is the CA's and every certificate's organization, the role's host names its subject alternative names
(a client checks the name it dialled), and everything expires after :data:`VALIDITY` (a job that runs longer is
relaunched from its checkpoint with a new CA).
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = datetime.timedelta(days=30)
_CURVE = ec.SECP256R1()  # P-256: what every TLS 1.2/1.3 stack (HAProxy's OpenSSL here) negotiates fastest


@dataclass(frozen=True)
class RoleCredentials:
    """What one role's TLS terminator holds, PEM-encoded: its certificate and key, and the job's CA certificate."""

    cert: bytes
    key: bytes
    ca: bytes


# X.509 caps a common name at 64 characters, and a pod's DNS name can be longer: the name a peer checks is the
# subject alternative name; the common name is only what a person reads.
MAX_COMMON_NAME = 64


def _name(job_id: str, common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, job_id[:MAX_COMMON_NAME]),
                      x509.NameAttribute(NameOID.COMMON_NAME, common_name[:MAX_COMMON_NAME])])


def issue_job_credentials(job_id: str, hosts: dict[str, list[str]]) -> dict[str, RoleCredentials]:
    """A new CA for ``job_id`` and, for each role of ``hosts`` (role name -> the DNS names its peers dial it by), a
    certificate for both TLS server and client use, signed by it; the CA's key is dropped on return."""
    now = datetime.datetime.now(datetime.timezone.utc)
    ca_key = ec.generate_private_key(_CURVE)
    ca_name = _name(job_id, f"{job_id} PS CA")
    ca_cert = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
               .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
               # pathlen 0: the CA signs the roles' certificates only, never another CA.
               .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
               .add_extension(x509.KeyUsage(digital_signature=False, content_commitment=False, key_encipherment=False,
                                            data_encipherment=False, key_agreement=False, key_cert_sign=True,
                                            crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
               .sign(ca_key, hashes.SHA256()))
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    issued = {}
    for role, names in hosts.items():
        key = ec.generate_private_key(_CURVE)
        cert = (x509.CertificateBuilder().subject_name(_name(job_id, role)).issuer_name(ca_name)
                .public_key(key.public_key()).serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5)).not_valid_after(now + VALIDITY)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in dict.fromkeys([role, *names])]),
                               critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
                .sign(ca_key, hashes.SHA256()))
        issued[role] = RoleCredentials(
            cert=cert.public_bytes(serialization.Encoding.PEM),
            key=key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()),
            ca=ca_pem)
    return issued
