"""A tensorrtllm repository in the real 2.51 server: everything but the engine step loads.

The `tensorrtllm` backend itself is not installable here (it needs NVIDIA's container and a GPU), so the
engine model and the ensemble that depends on it are expected to fail to load; nothing else may.
"""

import urllib.error
import urllib.request

from tritonforge.builder.build import BuildOptions, build
from tritonforge.serve.server import TritonServer

from .conftest import running


def model_ready(server: TritonServer, model: str) -> bool:
    try:
        with urllib.request.urlopen(f"http://{server.http_url}/v2/models/{model}/ready", timeout=5) as response:
            return response.status == 200
    except urllib.error.HTTPError:
        return False


def test_everything_but_the_engine_loads_in_triton_2_51(tiny_models, tmp_path):
    repo = build(BuildOptions(model=tiny_models["sentencepiece"], output=tmp_path / "repo", engine="tensorrtllm",
                              gpu_memory_gib=80, max_input_len=64, max_seq_len=256, dry_run=True,
                              target_triton=(2, 51)))
    with running(repo, require_all_models=False) as server:
        assert model_ready(server, "preprocessing")
        assert model_ready(server, "postprocessing")
        assert model_ready(server, "tensorrt_llm_bls")
        assert not model_ready(server, "tensorrt_llm")  # no tensorrtllm backend in this server
        log = server.log_text()
    assert "failed to load 'tensorrt_llm'" in log
    assert "failed to load 'preprocessing'" not in log and "failed to load 'postprocessing'" not in log
