"""The build of the PyTorch-workflow engine step: no engine build, the checkpoint copied, the LLM's settings in
the engine model's parameters, and the settings the LLM API cannot take refused with what to do."""

import json

import pytest

from tritonforge.builder import model_configs as configs
from tritonforge.builder.build import BuildOptions, build
from tritonforge.builder.repository import SOURCE_ROOT
from tritonforge.builder.trtllm import TRITON_VERSION
from tritonforge.cli import main
from tritonforge.facts.model_parameters import PyTorchEngineParameters
from tritonforge.facts.release import TRITON_IMAGE, TRTLLM_VERSION


def options(model, output, **kwargs):
    return BuildOptions(model=model, output=output, engine="tensorrtllm-pytorch", max_input_len=64, max_seq_len=256,
                        **kwargs)


def test_the_build_writes_the_llm_api_model_with_the_checkpoint_and_no_engine(tiny_models, tmp_path):
    model = tiny_models["bpe"]
    out = build(options(model, tmp_path / "repo", tp_size=2, pp_size=2, dtype="bfloat16", kv_cache_dtype="fp8",
                        kv_cache_free_gpu_mem_fraction=0.8, max_num_tokens=4096, enable_kv_cache_reuse=False,
                        enable_chunked_context=True, stream_interval=4))
    engine_dir = out / configs.ENGINE_MODEL
    assert (engine_dir / "1" / "model.py").read_text() == (SOURCE_ROOT / "tensorrt_llm_pytorch/1/model.py").read_text()
    assert sorted(p.name for p in (engine_dir / "1" / "checkpoint").glob("*.safetensors"))
    assert not (engine_dir / "1" / "engine").exists()
    config = configs.parse_text((engine_dir / "config.pbtxt").read_text())
    assert config.backend == "python" and config.model_transaction_policy.decoupled
    parameters = PyTorchEngineParameters.from_config({k: v.string_value for k, v in config.parameters.items()})
    vocab_size = json.loads((model / "config.json").read_text())["vocab_size"]
    assert parameters == PyTorchEngineParameters(
        model_path="1/checkpoint", tokenizer_dir="../preprocessing/tokenizer", vocab_size=vocab_size,
        max_batch_size=8, max_input_len=64, max_seq_len=256, dtype="bfloat16", kv_cache_dtype="fp8",
        tensor_parallel_size=2, pipeline_parallel_size=2, kv_cache_free_gpu_memory_fraction=0.8, max_num_tokens=4096,
        enable_block_reuse=False, enable_chunked_prefill=True, stream_interval=4)
    assert (engine_dir / parameters.tokenizer_dir / "tokenizer.json").is_file()  # the LLM's, for guided decoding
    ensemble = configs.parse_text((out / "ensemble" / "config.pbtxt").read_text())
    assert ensemble.ensemble_scheduling.max_inflight_requests > 0  # configs for the pinned image's Triton
    manifest = json.loads((out / "tritonforge.json").read_text())
    assert (manifest["tensorrt_llm"], manifest["image"]) == (TRTLLM_VERSION, TRITON_IMAGE)
    assert TRITON_VERSION >= configs.MAX_INFLIGHT_SINCE


def test_stream_interval_is_one_unless_set(tiny_models, tmp_path):
    out = build(options(tiny_models["bpe"], tmp_path / "repo"))
    config = configs.parse_text((out / configs.ENGINE_MODEL / "config.pbtxt").read_text())
    assert config.parameters["stream_interval"].string_value == "1"


@pytest.mark.parametrize("setting, message", [
    ({"quantization": "fp8"}, "reads the quantization from the checkpoint"),
    ({"kv_cache_dtype": "int8"}, "--kv-cache-dtype"),
    ({"stream_interval": 0}, "--stream-interval"),
    ({"kv_cache_free_gpu_mem_fraction": 1.0}, "--kv-cache-free-gpu-mem-fraction"),
    ({"tp_size": 0}, "--tp-size"),
    ({"max_num_tokens": 32}, "--max-num-tokens"),
])
def test_settings_the_llm_api_cannot_take_are_refused_naming_the_flag(tiny_models, tmp_path, setting, message):
    with pytest.raises(ValueError, match=message):
        options(tiny_models["bpe"], tmp_path / "repo", **setting)


def test_the_cli_builds_it_with_the_stream_interval_flag(tiny_models, tmp_path):
    code = main(["build", "--model", str(tiny_models["bpe"]), "--output", str(tmp_path / "repo"),
                 "--engine", "tensorrtllm-pytorch", "--max-input-len", "64", "--max-seq-len", "256",
                 "--stream-interval", "3"])
    assert code == 0
    config = configs.parse_text((tmp_path / "repo" / configs.ENGINE_MODEL / "config.pbtxt").read_text())
    assert config.parameters["stream_interval"].string_value == "3"


def test_a_checkpoint_without_safetensors_is_refused_before_anything_is_written(tiny_models, tmp_path):
    import shutil

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_models["bpe"], checkpoint)
    for weights in checkpoint.glob("*.safetensors"):
        weights.unlink()
    with pytest.raises(FileNotFoundError, match="has no weights"):
        build(options(checkpoint, tmp_path / "repo"))
    assert not (tmp_path / "repo").exists()


def test_a_sharded_and_quantized_checkpoint_keeps_its_index_and_quantization_config(tiny_models, tmp_path):
    """The LLM API loads shards through their index and a ModelOpt checkpoint as quantized through
    hf_quant_config.json: both go into the repository with the weights; files the LLM does not read do not."""
    import shutil

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_models["bpe"], checkpoint)
    extras = {"model.safetensors.index.json": '{"weight_map": {}}', "hf_quant_config.json": '{"quantization": {}}'}
    for name, text in extras.items():
        (checkpoint / name).write_text(text)
    (checkpoint / "notes.txt").write_text("not the model's")
    copied = build(options(checkpoint, tmp_path / "repo")) / configs.ENGINE_MODEL / "1" / "checkpoint"
    assert {name: (copied / name).read_text() for name in extras} == extras
    assert not (copied / "notes.txt").exists()
