"""The pipeline benchmark's machinery against a real tritonserver: every path answers every request in full."""

import pytest

from tritonforge.builder.build import BuildOptions, build
from tritonforge.tools.benchmark import PATHS, add_efficiency, make_prompts, markdown, measure_server
from tritonforge.tools.tuning import Candidate, choose, current, tune

from .conftest import lean_serving, running

OUTPUT_TOKENS = 6
STEP_MS = 2


def build_replay(checkpoint, repository, **serving):
    """A repository on the replay engine, as the benchmarks measure the pipeline: its streams are the same however
    requests are batched, and it spends no CPU generating them."""
    return build(BuildOptions(model=checkpoint, output=repository, engine="replay", replay_step_ms=STEP_MS,
                              max_input_len=64, max_seq_len=256, max_batch_size=4,
                              serving=lean_serving(**serving)), progress=lambda _: None)


@pytest.fixture(scope="module")
def served(tiny_models, tmp_path_factory):
    repository = build_replay(tiny_models["bpe"], tmp_path_factory.mktemp("repo") / "model_repository")
    with running(repository) as server:
        yield server, repository


def test_every_path_completes_fixed_length_streams(served, tmp_path):
    server, repository = served
    prompts = make_prompts(repository / "preprocessing" / "tokenizer", 8, 16)
    rows = measure_server(server.grpc_url, prompts, concurrencies=(1, 3), output_tokens=OUTPUT_TOKENS,
                          duration_s=0.2, work=tmp_path, label="tiny", server_pid=server.pid)
    add_efficiency(rows)
    assert [(row["concurrency"], row["path"]) for row in rows] == [(c, p) for c in (1, 3) for p in PATHS]
    for row in rows:
        assert row["errors"] == 0 and row["requests"] >= row["concurrency"], row
        assert row["streams_checked"] == row["requests"]  # each stream's content against its answer
        assert row["streams_differing"] == 0, row["first_difference"]
        assert row["output_tokens_per_s"] > 0 and row["ttft_ms_p50"] is not None and row["itl_ms_p50"] is not None
        assert row["efficiency"] is not None and row["efficiency"] > 0
    table = markdown({"meta": {"machine": "m", "date": "d", "tool": "asyncio", "output_tokens": OUTPUT_TOKENS,
                               "duration_s": 0.2}, "rows": rows})
    # One row per point in the figures table and in the where-the-time-went table.
    assert table.count("\n| tiny |") == 2 * len(rows) and "TTFT: time to first token" in table
    assert "Where the time went" in table
    assert "| 0.00 | 0.00 | 0.00 | 0.00 | 0.00 |" not in table  # the server's processes were measured


def test_bench_without_the_servers_processes_or_statistics_prints_no_table_of_zeros(served, tmp_path):
    """`tritonforge bench` against a server it did not start (restricted statistics): nothing to show."""
    server, repository = served
    prompts = make_prompts(repository / "preprocessing" / "tokenizer", 8, 16)
    rows = measure_server(server.grpc_url, prompts, paths=("direct",), concurrencies=(1,),
                          output_tokens=OUTPUT_TOKENS, duration_s=0.2, work=tmp_path, label="tiny")
    table = markdown({"meta": {"machine": "m", "date": "d", "tool": "asyncio", "output_tokens": OUTPUT_TOKENS,
                               "duration_s": 0.2}, "rows": rows})
    assert "Where the time went" not in table


def test_tune_measures_each_candidate_and_writes_the_chosen_one(tiny_models, tmp_path):
    repository = build_replay(tiny_models["bpe"], tmp_path / "model_repository", postprocessing_instances=3)
    candidates = [Candidate(1, 1, 1, 0), Candidate(1, 2, 1, 300)]
    # Eight prompts are plenty for two streams for 0.2 s (each is answered alone first, on each path).
    result = tune(repository, candidates, concurrency=2, target=0.5, output_tokens=OUTPUT_TOKENS, duration_s=0.2,
                  prompts=8)
    assert [(row["candidate"]["postprocessing"], row["path"]) for row in result.rows] == [
        (count, path) for count in (1, 2) for path in PATHS]
    assert all(row["errors"] == 0 and row["cpu_cores"] and row["server_stats"] for row in result.rows)
    assert (result.chosen, result.reached_target) == choose(result.rows, candidates, 0.5)
    assert current(repository) == result.chosen
