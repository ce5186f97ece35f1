"""The contract between a PS process and its launcher: the environment every backend builds, the job spec."""

from components.config import from_dict, to_dict
from components.ps.contract import JobSpec, Role, role_env
from components.train.backends.local import local_layout
from components.train.planner import job_plan


def test_the_job_spec_carries_the_plan_beside_the_config_in_every_mode():
    for mode in ("async", "geo"):  # geo: no memory plan
        cfg = from_dict({"ps": {"mode": mode, "servers": 3}, "run_dir": "."})
        plan = job_plan(cfg, {"negative_sample_rate": 0.5})
        spec = JobSpec(config=to_dict(cfg), plan=plan, data_dir="d", workdir="w", staging_dir="s")
        read = JobSpec.from_json(spec.to_json())
        assert read == spec and read.config["table"]["shard_num"] is None
        assert (read.plan.shard_num, read.plan.negative_sample_rate) == (24, 0.5)
        assert (read.plan.memory is None) == (mode == "geo")


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


def test_a_port_that_closes_what_it_accepts_is_not_listening_for_the_roles():
    """A TLS tunnel accepts at once and closes moments later while the peer behind it is not up: not ready."""
    import socket
    import threading

    from components.ps.contract import endpoint_accepts

    with socket.create_server(("127.0.0.1", 0)) as closing, socket.create_server(("127.0.0.1", 0)) as holding:
        def close_each():
            while True:
                try:
                    conn, _ = closing.accept()
                except OSError:
                    return
                conn.close()

        threading.Thread(target=close_each, daemon=True).start()
        closing_ep = f"127.0.0.1:{closing.getsockname()[1]}"
        assert not endpoint_accepts(closing_ep)
        assert endpoint_accepts(closing_ep, hold_s=0)  # accepting is enough when asked so (a TLS terminator's own ports)
        assert endpoint_accepts(f"127.0.0.1:{holding.getsockname()[1]}")  # a listener that waits for a request
