"""What the report shows of training: the curve drawn from the workers' points, the servers' measured rows and memory."""

from components.evaluate.report import write_training_curve_png
from components.evaluate.step import server_facts


def test_training_curve_png(tmp_path):
    curve = {"worker-0": [[100, 0.6, 0.55], [200, 0.5, 0.6]], "worker-1": [[120, 0.62, 0.5]]}
    write_training_curve_png(tmp_path / "curve.png", curve)
    assert (tmp_path / "curve.png").read_bytes().startswith(b"\x89PNG")


def test_server_facts_from_the_model_metadata():
    # As a protobuf Struct hands the metadata back: every number a float.
    meta = {"server_rows": [30246.0, 29000.0], "server_peak_rss_gib": [0.309, 0.3],
            "memory_plan": {"rows": 60000.0, "bytes_per_row": 149.0, "shard_num": 16.0, "server_gib": 0.318,
                            "budget_gib": None}}
    assert server_facts(meta) == {
        "server 0": "30,246 rows, peak RSS 316.4 MiB", "server 1": "29,000 rows, peak RSS 307.2 MiB",
        "memory plan (fullest server)": "325.6 MiB for up to 60,000 rows in 16 shards, 149 B/row"}
    assert server_facts({"server_rows": [5.0]}) == {"server 0": "5 rows"}  # rows alone: the pods' RSS is not measured
    assert server_facts({}) == {}
