"""The NetworkPolicy of a PS job: only the job reaches the job, and the job reaches only itself, the cluster DNS
and its store (issue 35; docs/security.md).

* Ingress: TCP on any port from the job's own pods. Any port, not only the PS and gloo ports: gloo's
  worker-to-worker transport listens on ephemeral ports (34077 in one local run), and so do the workers' client
  services. With ``cluster.mesh_encryption`` Istio ambient's tunnel port too, from anywhere, as Istio documents:
  ztunnel authenticates that traffic by mTLS identity.
* Egress: TCP to the job's pods; DNS (UDP and TCP 53) to the cluster DNS pods in kube-system; the store
  (:func:`store_egress`). The cloud metadata address is never admitted.

The pods are selected by the labels their controller sets
(:func:`~components.train.backends.manifests.job_pod_selector`); a pod of the namespace that copies them is admitted
too, since a NetworkPolicy tells pods apart by labels only. What keeps such a pod out is who may create pods in the namespace, or mTLS (``ps.tls``, a
mesh).
"""

from __future__ import annotations

import ipaddress
from typing import Optional
from urllib.parse import urlsplit

from components.config import CtrConfig

# Istio ambient's mTLS tunnel (HBONE): ztunnel carries the pods' traffic to this port of the receiving pod.
HBONE_PORT = 15008
# The cluster DNS: CoreDNS/kube-dns pods in kube-system (the namespace label every cluster since 1.22 sets).
CLUSTER_DNS = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "kube-system"}},
               "podSelector": {"matchLabels": {"k8s-app": "kube-dns"}}}
# The cloud metadata service (AWS, GCP, Azure): node credentials a pod must not reach, blocked whatever
# cluster.store_egress admits.
METADATA_ADDRESS = ipaddress.ip_network("169.254.169.254/32")
URL_PORTS = {"http": 80, "https": 443}


def _ip_block(network: ipaddress.IPv4Network | ipaddress.IPv6Network) -> dict:
    """An ipBlock of ``network`` without the metadata address (Kubernetes takes an ``except`` inside the CIDR only)."""
    block: dict = {"cidr": str(network)}
    if network.version == METADATA_ADDRESS.version and METADATA_ADDRESS.subnet_of(network):  # type: ignore[arg-type]
        block["except"] = [str(METADATA_ADDRESS)]
    return block


def store_egress(cfg: CtrConfig, uris: list[Optional[str]]) -> list[dict]:
    """Egress rules to the store at ``uris``: the address itself (and its port) for a URL naming an IP address,
    ``cluster.store_egress`` for any other (``s3://bucket``: the endpoint comes from the storage secret); an empty
    ``cluster.store_egress`` admits no such store."""
    rules, elsewhere = [], False
    for uri in filter(None, uris):
        parts = urlsplit(uri)
        try:
            address = ipaddress.ip_address(parts.hostname or "")
        except ValueError:  # a bucket, a DNS name, a local path: not an address
            elsewhere = elsewhere or bool(parts.scheme) and parts.scheme != "file"
            continue
        port = parts.port or URL_PORTS.get(parts.scheme)
        rule = {"to": [{"ipBlock": _ip_block(ipaddress.ip_network(address))}],
                "ports": [{"protocol": "TCP", **({"port": port} if port else {})}]}
        if rule not in rules and address not in METADATA_ADDRESS:
            rules.append(rule)
    if elsewhere and cfg.cluster.store_egress:  # (a rule with no "to" would admit every address)
        rules.append({"to": [{"ipBlock": _ip_block(ipaddress.ip_network(cidr))} for cidr in cfg.cluster.store_egress]})
    return rules


def policy_spec(cfg: CtrConfig, job_pods: dict[str, str], store_uris: list[Optional[str]]) -> dict:
    """The spec of the policy over the pods labelled ``job_pods``, whose store is at ``store_uris``."""
    peers = [{"podSelector": {"matchLabels": job_pods}}]
    ingress = [{"from": peers, "ports": [{"protocol": "TCP"}]}]
    if cfg.cluster.mesh_encryption:
        ingress.append({"ports": [{"protocol": "TCP", "port": HBONE_PORT}]})
    egress = [{"to": peers, "ports": [{"protocol": "TCP"}]},
              {"to": [CLUSTER_DNS], "ports": [{"protocol": "UDP", "port": 53}, {"protocol": "TCP", "port": 53}]},
              *store_egress(cfg, store_uris)]
    return {"podSelector": {"matchLabels": job_pods}, "policyTypes": ["Ingress", "Egress"], "ingress": ingress,
            "egress": egress}
