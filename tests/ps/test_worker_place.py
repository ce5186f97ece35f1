"""Which device a worker trains on, and the builds of Paddle and visible GPUs that cannot train (exit 78)."""

from types import SimpleNamespace

import pytest

from components.config import ConfigError, from_dict
from components.ps.role import worker_place


def _paddle(gpu_build: bool, gpus: int):
    """Paddle as a worker sees it: its build and the GPUs visible to the process (what the guard reads)."""
    device = SimpleNamespace(is_compiled_with_cuda=lambda: gpu_build,
                             cuda=SimpleNamespace(device_count=lambda: gpus))
    return SimpleNamespace(__version__="2.6.2", device=device, CPUPlace=lambda: "cpu", CUDAPlace=lambda i: f"gpu:{i}")


def _config(gpus: int):
    return from_dict({"cluster": {"workers": {"gpus": gpus}}})


def test_cpu_and_gpu_workers_get_their_place():
    assert worker_place(_config(0), _paddle(gpu_build=False, gpus=0)) == "cpu"
    assert worker_place(_config(1), _paddle(gpu_build=True, gpus=1)) == "gpu:0"
    assert worker_place(_config(0), _paddle(gpu_build=True, gpus=1)) == "cpu"


@pytest.mark.parametrize("gpus, gpu_build, message", [
    (0, True, "is a GPU build and sees no GPU"),  # the GPU image on a node without one: Paddle#76762's segfault
    (1, True, "is a GPU build and sees no GPU"),  # a pod scheduled without its GPU
    (1, False, "is a CPU build"),
])
def test_a_worker_that_cannot_train_says_why_in_one_line(gpus, gpu_build, message):
    with pytest.raises(ConfigError, match=message) as err:
        worker_place(_config(gpus), _paddle(gpu_build=gpu_build, gpus=0))
    assert "\n" not in str(err.value) and "cluster.workers.gpus" in str(err.value)
