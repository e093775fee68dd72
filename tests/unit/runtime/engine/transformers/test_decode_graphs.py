"""The pure logic of the captured decode step, which runs without a GPU: buckets, static inputs, fallback."""

import pytest
import torch

from tritonforge.runtime.engine.transformers.decode_graphs import DecodeGraphs, StaticInputs, graph_bucket


@pytest.mark.parametrize("length, max_len, bucket", [
    (1, 4096, 128), (128, 4096, 128), (129, 4096, 256), (1024, 4096, 1024), (1025, 4096, 1152), (2047, 4096, 2048),
    (2049, 4096, 2304), (4000, 4096, 4096), (97, 96, None), (50, 96, 96), (96, 96, 96),
])
def test_a_bucket_covers_the_length_with_at_most_an_eighth_more(length, max_len, bucket):
    if bucket is None:
        with pytest.raises(ValueError):
            graph_bucket(length, max_len)
        return
    assert graph_bucket(length, max_len) == bucket


def test_buckets_pad_little_and_are_few():
    buckets = {graph_bucket(length, 32768) for length in range(1, 32769)}
    assert all(graph_bucket(length, 32768) - length <= max(127, length // 8) for length in range(1, 32769))
    assert len(buckets) <= 64 and max(buckets) == 32768


def test_static_inputs_take_the_state_and_this_steps_bans_only():
    static = StaticInputs(3, 10, torch.device("cpu"))
    host = torch.tensor([[7, 8, 9], [4, 0, 2], [1, 0, 3]])
    address = static.state.data_ptr()
    static.fill(host, [(0, 2), (2, 9)])
    assert torch.equal(static.input_ids[:, 0], host[0]) and torch.equal(static.positions, host[1])
    assert torch.equal(static.steps, host[2]) and static.state.data_ptr() == address
    assert static.ban.nonzero().tolist() == [[0, 2], [2, 9]]
    static.fill(host, [(1, 1)])
    assert static.ban.nonzero().tolist() == [[1, 1]]  # the previous step's bans are gone
    static.fill(host, [])
    assert not static.ban.any()


def test_without_capture_the_step_body_runs_and_a_failure_turns_graphs_off(caplog):
    graphs = DecodeGraphs(torch.device("cpu"), capture=False)
    assert graphs.run("key", 0, lambda record: torch.tensor([record])).item() is True
    failing = DecodeGraphs(torch.device("cpu"))  # a CPU build of torch: capturing fails
    with caplog.at_level("WARNING"):
        assert failing.run("key", 0, lambda record: torch.zeros(1)) is None
        assert failing.run("key", 0, lambda record: torch.zeros(1)) is None
    assert failing.failed and sum("CUDA graphs are off" in r.getMessage() for r in caplog.records) == 1
