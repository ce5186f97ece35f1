"""What a role process does before Paddle starts: the pod's copy of the dataset."""

from components.data_prep.prepare import prepare_synthetic
from components.ps.role import fetch_dataset


def test_a_pod_fetches_the_dataset_files_its_role_reads(tmp_path, monkeypatch):
    stats = prepare_synthetic(tmp_path / "remote", rows=2000, test_fraction=0.2, num_shards=4, vocab_size=1000, seed=1)
    uri = (tmp_path / "remote").as_uri()  # file://..., fetched through fsspec like s3://...
    monkeypatch.setenv("TRAINING_ROLE", "PSERVER")
    server = fetch_dataset(uri, tmp_path / "server")
    assert sorted(p.name for p in server.rglob("*") if p.is_file()) == ["stats.json"]
    monkeypatch.setenv("TRAINING_ROLE", "TRAINER")
    monkeypatch.setenv("PADDLE_TRAINER_ID", "1")
    monkeypatch.setenv("PADDLE_TRAINERS_NUM", "2")
    worker = fetch_dataset(uri, tmp_path / "worker-1")
    fetched = sorted(str(p.relative_to(worker)) for p in worker.rglob("*") if p.is_file() and p.name != "stats.json")
    assert fetched == sorted(stats["shards"]["train"][1::2])
    for rel in fetched:
        assert (worker / rel).read_bytes() == (tmp_path / "remote" / rel).read_bytes()
