"""`build --lora` for the TensorRT-LLM kinds: the engine's LoRA plugin and the backend's prefetched LoRA tensors
(`--engine tensorrtllm`, dry runs: TensorRT-LLM cannot run here), and the adapters the LLM API loads
(`--engine tensorrtllm-pytorch`). The tensors are held to PEFT's own update of each layer."""

import json

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file, save_file
from safetensors.torch import load_file as load_torch_file
from safetensors.torch import save_file as save_torch_file

from tritonforge.builder import model_configs as configs
from tritonforge.builder import trtllm_lora
from tritonforge.builder.build import BuildOptions, build
from tritonforge.builder.lora import plan_adapters
from tritonforge.facts.contract import ENGINE_MODEL
from tritonforge.facts.model_parameters import PyTorchEngineParameters
from tritonforge.runtime.engine.lora import read_adapter, records_from_parameter
from tritonforge.tools.tiny_model import make_lora_adapter

# float16 keeps 11 significant bits: a factor converted to it is within this of the float32 value, relatively,
# down to its smallest normal number (below it, within half its subnormal step).
FLOAT16_RELATIVE = 2 ** -11
FLOAT16_TINY = 2 ** -25
# B @ A of factors rounded to float16 sums `rank` products, each off by up to twice the rounding: bounded by this
# many roundings of the largest entry of the product.
PRODUCT_ROUNDINGS = 8


@pytest.fixture(scope="module")
def adapters(tiny_models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("adapters")
    base = tiny_models["bpe"]
    return {
        "small": make_lora_adapter(base, folder / "small", rank=2, target_modules=("q_proj", "v_proj"),
                                   alpha_pattern={"v_proj": 32}),
        "wide": make_lora_adapter(base, folder / "wide", rank=8, seed=1,
                                  target_modules=("o_proj", "gate_proj", "up_proj", "down_proj")),
        "rslora": make_lora_adapter(base, folder / "rslora", rank=4, seed=2, use_rslora=True,
                                    target_modules=("k_proj",)),
        "head": lm_head_adapter(base, folder / "head"),
    }


def lm_head_adapter(base, folder):
    """An adapter of lm_head alone: PEFT saves the head's own weight beside it, which is dropped here."""
    make_lora_adapter(base, folder, rank=2, target_modules=("lm_head",))
    weights = load_file(folder / "adapter_model.safetensors")
    save_file({key: value for key, value in weights.items() if ".lora_" in key}, folder / "adapter_model.safetensors")
    return folder


def trt_options(model, output, *names, adapters, **kwargs):
    return BuildOptions(model=model, output=output, engine="tensorrtllm", gpu_memory_gib=80, max_input_len=64,
                        max_seq_len=256, dry_run=True, lora=tuple(f"{name}={adapters[name]}" for name in names),
                        **kwargs)


def test_a_build_with_two_adapters_gets_the_lora_plugin_and_the_prefetched_tensors(tiny_models, adapters, tmp_path):
    out = build(trt_options(tiny_models["bpe"], tmp_path / "repo", "small", "wide", adapters=adapters),
                progress=lambda line: None)
    manifest = json.loads((out / "tritonforge.json").read_text())
    trtllm_build = manifest["commands"][1]
    assert trtllm_build[0] == "trtllm-build"
    lora_flags = trtllm_build[trtllm_build.index("--lora_plugin"):]
    # NVIDIA's names: gate_proj is mlp_h_to_4h, up_proj mlp_gate; q_proj brings k and v along.
    assert lora_flags == ["--lora_plugin", "auto", "--max_lora_rank", "8", "--lora_target_modules", "attn_q",
                          "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_4h_to_h", "mlp_gate"]
    engine = configs.parse_text((out / ENGINE_MODEL / "config.pbtxt").read_text())
    lora = {key: value.string_value for key, value in engine.parameters.items() if key.startswith("lora_")}
    assert lora == {"lora_prefetch_dir": "/models/tensorrt_llm/1/lora", "lora_cache_optimal_adapter_size": "8",
                    "lora_cache_max_adapter_size": "8", "lora_cache_host_memory_bytes": str(1 << 30),
                    "lora_cache_gpu_memory_fraction": ""}
    prefetch = out / ENGINE_MODEL / "1" / "lora"
    assert sorted(str(p.relative_to(prefetch)) for p in prefetch.rglob("*.npy")) == [
        "1/model.lora_config.npy", "1/model.lora_weights.npy", "2/model.lora_config.npy", "2/model.lora_weights.npy"]
    assert manifest["lora_adapters"] == [{"name": "small", "task_id": 1}, {"name": "wide", "task_id": 2}]


def test_a_build_without_adapters_has_no_lora_plugin(tiny_models, tmp_path):
    out = build(BuildOptions(model=tiny_models["bpe"], output=tmp_path / "repo", engine="tensorrtllm",
                             gpu_memory_gib=80, max_input_len=64, max_seq_len=256, dry_run=True),
                progress=lambda line: None)
    manifest = json.loads((out / "tritonforge.json").read_text())
    assert "--lora_plugin" not in manifest["commands"][1] and "lora_adapters" not in manifest
    assert not (out / ENGINE_MODEL / "1" / "lora").exists()


# Per adapter: its rank and, per adapted layer, (where it lies, TensorRT-LLM's module id, the lora_alpha it scales by).
HAND_CASES = {
    "small": (2, [("self_attn.q_proj", 1, 16), ("self_attn.v_proj", 3, 32)]),  # v_proj's alpha from alpha_pattern
    # gate_proj is mlp_h_to_4h (5), up_proj mlp_gate (7): TensorRT-LLM's gated MLP is act(fc(x)) * gate(x).
    "wide": (8, [("self_attn.o_proj", 4, 16), ("mlp.gate_proj", 5, 16), ("mlp.down_proj", 6, 16),
                 ("mlp.up_proj", 7, 16)]),
}


@pytest.mark.parametrize("name", HAND_CASES)
def test_each_row_is_the_factors_flattened_with_b_scaled_as_computed_by_hand(adapters, name):
    """lora_A then lora_B × alpha / r, zero-padded; config rows (module id, layer, rank) in layer, module order."""
    rank, modules = HAND_CASES[name]
    weights, config = trtllm_lora.convert(read_adapter(name, adapters[name]))
    factors = load_file(adapters[name] / "adapter_model.safetensors")
    expected_rows = []
    for layer in (0, 1):
        for module, module_id, alpha in modules:
            prefix = f"base_model.model.model.layers.{layer}.{module}"
            a, b = factors[f"{prefix}.lora_A.weight"], factors[f"{prefix}.lora_B.weight"]
            expected_rows.append(((module_id, layer, rank), np.concatenate([a.ravel(), (b * alpha / rank).ravel()])))
    width = max(len(row) for _, row in expected_rows)
    assert weights.shape == (1, len(expected_rows), width) and weights.dtype == np.float16
    assert config.dtype == np.int32 and config[0].tolist() == [list(key) for key, _ in expected_rows]
    for index, (_, row) in enumerate(expected_rows):
        np.testing.assert_allclose(weights[0, index, :len(row)], row, rtol=FLOAT16_RELATIVE, atol=FLOAT16_TINY)
        assert not weights[0, index, len(row):].any()  # padding


@pytest.mark.parametrize("name", ["small", "wide", "rslora"])
def test_each_row_rebuilds_pefts_own_update_of_its_layer(tiny_models, adapters, name):
    """B @ A of each row, as TensorRT-LLM multiplies them, against PEFT's get_delta_weight (its scale included)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_models["bpe"]), adapters[name])
    adapter = read_adapter(name, adapters[name])
    weights, config = trtllm_lora.convert(adapter)
    ids = {value: key for key, value in trtllm_lora.MODULE_IDS.items()}
    names = {trtllm: hf for hf, trtllm in trtllm_lora.HF_TO_TRTLLM.items()}
    assert len(config[0]) == len(adapter.modules)
    for row, (module_id, layer, rank) in zip(weights[0].astype(np.float32), config[0]):
        path = next(p for p in adapter.modules if p.startswith(f"model.layers.{layer}.")
                    and p.endswith(f".{names[ids[module_id]]}"))
        peft_delta = model.get_submodule(f"base_model.model.{path}").get_delta_weight("default").detach().numpy()
        out_features, in_features = peft_delta.shape
        a = row[:rank * in_features].reshape(rank, in_features)
        b = row[rank * in_features:rank * (in_features + out_features)].reshape(out_features, rank)
        tolerance = PRODUCT_ROUNDINGS * FLOAT16_RELATIVE * np.abs(peft_delta).max()
        np.testing.assert_allclose(b @ a, peft_delta, rtol=0, atol=tolerance)


def test_bfloat16_factors_are_read_without_torch_as_torch_reads_them(adapters, tmp_path):
    folder = tmp_path / "bf16"
    folder.mkdir()
    (folder / "adapter_config.json").write_bytes((adapters["small"] / "adapter_config.json").read_bytes())
    tensors = {k: v.to(torch.bfloat16) for k, v in load_torch_file(adapters["small"] / "adapter_model.safetensors")
               .items()}
    save_torch_file(tensors, folder / "adapter_model.safetensors")
    factors = trtllm_lora.read_factors(read_adapter("bf16", folder))
    assert factors.keys() == tensors.keys()
    for key, tensor in tensors.items():
        np.testing.assert_array_equal(factors[key], tensor.float().numpy())


@pytest.mark.parametrize("flags", [{"dtype": "bfloat16"}, {}])
def test_a_bfloat16_engine_with_adapters_is_refused_naming_the_fix(tiny_models, adapters, tmp_path, flags):
    model = tmp_path / "bf16-model"
    model.mkdir()
    for file in tiny_models["bpe"].iterdir():
        (model / file.name).write_bytes(file.read_bytes())
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps({**config, "torch_dtype": "bfloat16"}))  # --dtype auto reads it
    with pytest.raises(ValueError, match=r"^--lora with --engine tensorrtllm needs a float16 engine, and this one is "
                                         r"bfloat16: .* pass --dtype float16$"):
        build(trt_options(model, tmp_path / "repo", "small", adapters=adapters, **flags))
    assert not (tmp_path / "repo").exists()


def test_a_layer_tensorrt_llm_has_no_lora_module_for_is_refused(tiny_models, adapters, tmp_path):
    with pytest.raises(ValueError, match=r"^LoRA adapter head: TensorRT-LLM has no LoRA module for lm_head here"):
        build(trt_options(tiny_models["bpe"], tmp_path / "repo", "head", adapters=adapters))


def test_the_host_cache_holds_one_page_per_adapter_and_a_spare_as_nvidia_pages_it():
    """A Llama-2-7B shape, rank 64 on all seven modules, three adapters. By hand (PeftCacheManager's arithmetic): a
    rank-1 row is in + out values: 8192 for q, k, v, o; 4096 + 11008 = 15104 for gate, up, down. The page width is
    the smallest, 8192; a layer of an optimal (rank-64) adapter takes 64 × (4 × 1 + 3 × 2) slots, 32 layers of it
    one page of 20480 slots, 20480 × 8192 float16 values. Tensor parallel 2 splits one side of each row: 4096 + 2048 =
    6144 for q, k, v, o and 4096 + 5504 = 9600 for the MLP's, the same 10 slots a layer at width 6144."""
    lora = trtllm_lora.EngineLora(target_modules=("attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h",
                                                  "mlp_4h_to_h", "mlp_gate"), max_rank=64)
    dims = {"attn_q": (4096, 4096), "attn_k": (4096, 4096), "attn_v": (4096, 4096), "attn_dense": (4096, 4096),
            "mlp_h_to_4h": (4096, 11008), "mlp_gate": (4096, 11008), "mlp_4h_to_h": (11008, 4096)}
    one = trtllm_lora.host_cache_bytes(lora, dims, adapters=3, num_layers=32, tp_size=1, pp_size=1, dtype="float16")
    assert one == (3 + 1) * 20480 * 8192 * 2
    two = trtllm_lora.host_cache_bytes(lora, dims, adapters=3, num_layers=32, tp_size=2, pp_size=1, dtype="float16")
    assert two == (3 + 1) * 20480 * 6144 * 2
    pipeline = trtllm_lora.host_cache_bytes(lora, dims, adapters=3, num_layers=32, tp_size=1, pp_size=2,
                                            dtype="float16")
    assert pipeline == one // 2  # each rank caches its 16 layers


def test_module_dims_come_from_the_checkpoints_first_layer(tiny_models):
    from tritonforge.runtime.engine.lora import checkpoint_shapes

    dims = trtllm_lora.module_dims(("attn_k", "mlp_4h_to_h"), checkpoint_shapes(tiny_models["bpe"]))
    assert dims == {"attn_k": (64, 32), "mlp_4h_to_h": (176, 64)}  # 2 of 4 heads of 16 for k; down_proj 176 -> 64


def pytorch_options(model, output, *names, adapters, **kwargs):
    return BuildOptions(model=model, output=output, engine="tensorrtllm-pytorch", max_input_len=64, max_seq_len=256,
                        lora=tuple(f"{name}={adapters[name]}" for name in names), **kwargs)


def test_the_llm_api_build_copies_the_adapters_and_names_them_in_its_parameters(tiny_models, adapters, tmp_path):
    out = build(pytorch_options(tiny_models["bpe"], tmp_path / "repo", "wide", "rslora", adapters=adapters))
    config = configs.parse_text((out / ENGINE_MODEL / "config.pbtxt").read_text())
    parameters = PyTorchEngineParameters.from_config({k: v.string_value for k, v in config.parameters.items()})
    records = records_from_parameter(parameters.lora_adapters)
    assert [(r.name, r.task_id, r.path) for r in records] == [("wide", 1, "1/lora/wide"),
                                                               ("rslora", 2, "1/lora/rslora")]
    for record in records:
        assert (out / ENGINE_MODEL / record.path / "adapter_model.safetensors").read_bytes() == (
            adapters[record.name] / "adapter_model.safetensors").read_bytes()
    assert json.loads((out / "tritonforge.json").read_text())["lora_adapters"] == [
        {"name": "wide", "task_id": 1}, {"name": "rslora", "task_id": 2}]


def test_without_adapters_the_llm_api_config_has_no_lora_key(tiny_models, tmp_path):
    out = build(BuildOptions(model=tiny_models["bpe"], output=tmp_path / "repo", engine="tensorrtllm-pytorch",
                             max_input_len=64, max_seq_len=256))
    assert "lora_adapters" not in configs.parse_text((out / ENGINE_MODEL / "config.pbtxt").read_text()).parameters


def test_the_llm_api_refuses_an_adapter_whose_alpha_pattern_it_would_ignore(tiny_models, adapters, tmp_path):
    with pytest.raises(ValueError, match=r"^LoRA adapter small: alpha_pattern scales model\.layers\.\d+\.self_attn"
                                         r"\.v_proj by 16, and TensorRT-LLM's LLM API scales every layer by lora_alpha "
                                         r"/ rank \(8\); serve it with --engine tensorrtllm or transformers$"):
        build(pytorch_options(tiny_models["bpe"], tmp_path / "repo", "small", adapters=adapters))
    assert not (tmp_path / "repo").exists()


def test_the_engine_lora_is_none_without_adapters_and_the_largest_rank_with_them(tiny_models, adapters):
    assert trtllm_lora.engine_lora([]) is None
    built = plan_adapters((f"rslora={adapters['rslora']}", f"wide={adapters['wide']}"), tiny_models["bpe"])
    # rslora adapts k_proj alone: q and v come with it.
    assert trtllm_lora.engine_lora(built) == trtllm_lora.EngineLora(
        ("attn_q", "attn_k", "attn_v", "attn_dense", "mlp_h_to_4h", "mlp_4h_to_h", "mlp_gate"), 8)
