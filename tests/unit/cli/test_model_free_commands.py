"""Commands that run no model in their own process never load torch: transformers imports it whenever it is
installed, seconds before a command that only reads a tokenizer can start (`build` without its accuracy gate,
`bench`, `tune`). The gate runs the checkpoint, so torch stays importable for it."""

import subprocess
import sys

import pytest

from tritonforge.builder.build import BuildOptions, build

# Runs a command with the step after its tokenizer work replaced by a report: can torch still be imported?
TORCH_IMPORTABLE = """
import importlib.util, sys
import tritonforge.tools.tuning as tuning
import tritonforge.cli.build as build_command
import tritonforge.clients.client as client
import tritonforge.tools.benchmark as benchmark

def report(*args, **kwargs):
    print(importlib.util.find_spec("torch") is not None)
    raise SystemExit(0)

client.check_serving = lambda *args, **kwargs: None  # no server here
build_command.build = benchmark.measure_server = tuning.tune = report
from tritonforge.cli.main import main
main(sys.argv[1:])
"""


@pytest.fixture(scope="module")
def repository(tiny_models, tmp_path_factory):
    return build(BuildOptions(model=tiny_models["bpe"], output=tmp_path_factory.mktemp("model-free") / "repo",
                              engine="replay", max_input_len=64, max_seq_len=256), progress=lambda _: None)


@pytest.mark.parametrize("command, gate, torch_importable", [
    ("build", False, False), ("build", True, True), ("bench", False, False), ("tune", False, False)])
def test_a_command_loads_torch_only_where_it_runs_a_model(repository, tmp_path, command, gate, torch_importable):
    argv = {"build": ["build", "--model", str(tmp_path), "--output", str(tmp_path / "out")],
            "bench": ["bench", str(repository), "--duration-s", "1"],
            "tune": ["tune", str(repository), "--duration-s", "1"]}[command]
    if gate:
        argv += ["--accuracy-gate", str(tmp_path / "prompts.jsonl")]
    result = subprocess.run([sys.executable, "-c", TORCH_IMPORTABLE, *argv], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == str(torch_importable), result.stdout
