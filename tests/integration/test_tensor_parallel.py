"""The transformers engine split over two ranks (`build --tp-size 2`) inside a real tritonserver, on CPUs over
gloo: the engine model's stub starts its worker rank, answers as one process does, and the worker ends with the
stub."""

import time

import pytest

from tritonforge.builder.build import BuildOptions, build
from tritonforge.clients.client import GrpcClient

from .conftest import child_pids, lean_serving, running

PROMPTS = ["The engine", "Hello world, the server reads a request"]
GONE_WITHIN_S = 10  # a worker looks for its parent once a second


def repository(model, folder, **options):
    return build(BuildOptions(model=model, output=folder, max_input_len=64, max_seq_len=256, max_batch_size=4,
                              dtype="float32", device="cpu", frontends=("ensemble",), serving=lean_serving(),
                              **options), progress=lambda _: None)


def answers(server) -> list[str]:
    client = GrpcClient(server.grpc_url)
    return [client.generate(prompt, max_tokens=16) for prompt in PROMPTS]


def descendants(pid: int) -> set[int]:
    found, todo = set(), [pid]
    while todo:
        children = child_pids(todo.pop())
        found.update(children)
        todo.extend(children)
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
            return b"tensor_parallel" in cmdline.read()
    except OSError:
        return False


@pytest.mark.integration
def test_two_ranks_served_answer_as_one_process_and_the_worker_ends_with_its_server(tiny_models, tmp_path):
    with running(repository(tiny_models["bpe"], tmp_path / "one")) as server:
        expected = answers(server)
    with running(repository(tiny_models["bpe"], tmp_path / "two", tp_size=2)) as server:
        assert answers(server) == expected
        workers = {pid for pid in descendants(server.pid) if alive(pid)}
        assert len(workers) == 1  # rank 1, started by the engine model's stub
    deadline = time.monotonic() + GONE_WITHIN_S
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(alive(pid) for pid in workers)
