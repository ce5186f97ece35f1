"""The contract between a PS process and its launcher: the environment every backend builds."""

from components.ps.contract import Role, role_env
from components.train.backends.local import local_layout


def test_role_env_matches_paddle_contract():
    layout = local_layout(servers=2, workers=3, host="127.0.0.1", job_id="j1")
    servers = layout.server_endpoints
    for i in range(2):
        env = role_env(layout, Role.SERVER, i)
        assert env["TRAINING_ROLE"] == "PSERVER"
        # Paddle finds a server's own shard by matching POD_IP:PADDLE_PORT against the list exactly.
        assert f"{env['POD_IP']}:{env['PADDLE_PORT']}" == servers[i]
        assert env["PADDLE_PSERVERS_IP_PORT_LIST"].split(",") == list(servers)
        assert "PADDLE_TRAINER_ID" not in env
    for i in range(3):
        env = role_env(layout, Role.WORKER, i)
        assert env["TRAINING_ROLE"] == "TRAINER"
        assert env["PADDLE_TRAINER_ID"] == str(i)
        assert env["PADDLE_TRAINERS_NUM"] == "3"
        assert env["PADDLE_GLOO_HTTP_ENDPOINT"] == layout.gloo_endpoint
    ports = [e.rsplit(":", 1)[1] for e in servers + layout.worker_endpoints + (layout.gloo_endpoint,)]
    assert len(set(ports)) == len(ports)
