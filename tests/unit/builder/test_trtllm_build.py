"""The TensorRT-LLM build path where TensorRT-LLM cannot run: dry-run plans, commands, refusal, pinning guard."""

import argparse
import json
from pathlib import Path

import pytest

from tritonforge.builder import build as builder
from tritonforge.builder import model_configs as configs
from tritonforge.builder.engines.tensorrtllm import build_spec as trt_build_spec
from tritonforge.builder.options import BuildOptions
from tritonforge.builder.trtllm import (
    CONTAINERS,
    ENGINE_INFO,
    EngineMismatch,
    TensorRTLLMMissing,
    build_command,
    check_engine,
    check_inputs,
    convert_command,
    parse_target_triton,
    runtime_facts,
)
from tritonforge.cli import main
from tritonforge.facts.release import TRITON_IMAGE, TRTLLM_VERSION

# The keys the tensorrtllm backend reads with no default: a config without them aborts the model instance.
# Read in NVIDIA/TensorRT-LLM triton_backend/inflight_batcher_llm/src/model_instance_state.cc (release 1.1.0, and
# the same in both 1.x versions stored for the 1.2.1 pin):
# `ModelInstanceState::getGuidedDecodingConfigFromParams` (tokenizer_dir, xgrammar_tokenizer_info_path,
# guided_decoding_backend, outside any try), the constructor (gpt_model_type: "Invalid gpt_model_type"), and
# the executor config (gpt_model_path: the engine).
KEYS_READ_WITHOUT_DEFAULT = {"tokenizer_dir", "xgrammar_tokenizer_info_path", "guided_decoding_backend",
                             "gpt_model_type", "gpt_model_path"}
# Every key of NVIDIA's tensorrt_llm/config.pbtxt template for the 1.2.1 pin
# (triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt @2a9abd95): 1.1.0's keys but
# `enable_trt_overlap`, which that template comments out as deprecated.
NVIDIA_TEMPLATE_KEYS = {
    "max_beam_width", "FORCE_CPU_ONLY_INPUT_TENSORS", "gpt_model_type", "gpt_model_path", "encoder_model_path",
    "max_tokens_in_paged_kv_cache", "max_attention_window_size", "sink_token_length", "batch_scheduler_policy",
    "kv_cache_free_gpu_mem_fraction", "cross_kv_cache_fraction", "kv_cache_host_memory_bytes",
    "kv_cache_onboard_blocks", "exclude_input_in_output", "cancellation_check_period_ms", "stats_check_period_ms",
    "iter_stats_max_iterations", "request_stats_max_iterations", "enable_kv_cache_reuse",
    "normalize_log_probs", "enable_chunked_context", "gpu_device_ids", "participant_ids", "num_nodes",
    "lora_cache_optimal_adapter_size", "lora_cache_max_adapter_size", "lora_cache_gpu_memory_fraction",
    "lora_cache_host_memory_bytes", "lora_prefetch_dir", "decoding_mode", "executor_worker_path",
    "lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size", "medusa_choices",
    "eagle_choices", "gpu_weights_percent", "enable_context_fmha_fp32_acc", "multi_block_mode", "cuda_graph_mode",
    "cuda_graph_cache_size", "speculative_decoding_fast_logits", "tokenizer_dir", "guided_decoding_backend",
    "xgrammar_tokenizer_info_path",
}


def build(options):
    """The build with its progress printed, as the commands below read it."""
    return builder.build(options, progress=print)


def options(model, output, **kwargs):
    return BuildOptions(model=model, output=output, engine="tensorrtllm", gpu_memory_gib=80, max_input_len=64,
                        max_seq_len=256, **kwargs)


def test_dry_run_writes_configs_with_every_backend_parameter(tiny_models, tmp_path, capsys):
    out = build(options(tiny_models["bpe"], tmp_path / "repo", dry_run=True, tp_size=2))
    printed = capsys.readouterr().out
    assert "KV tokens available" in printed and "trtllm-build" in printed
    engine = configs.parse_text((out / "tensorrt_llm" / "config.pbtxt").read_text())
    assert engine.backend == "tensorrtllm"
    assert set(engine.parameters) == NVIDIA_TEMPLATE_KEYS
    assert KEYS_READ_WITHOUT_DEFAULT <= set(engine.parameters)
    assert engine.parameters["gpt_model_type"].string_value == "inflight_fused_batching"
    assert engine.parameters["gpt_model_path"].string_value.endswith("/tensorrt_llm/1/engine")
    # Unset: the cache takes all that kv_cache_free_gpu_mem_fraction gives, not the plan's smaller estimate.
    assert engine.parameters["max_tokens_in_paged_kv_cache"].string_value == ""
    # Attention over the whole sequence (prompt and generation), and prefix reuse as the build was told.
    assert engine.parameters["max_attention_window_size"].string_value == "256"
    assert engine.parameters["enable_kv_cache_reuse"].string_value == "true"
    ensemble = configs.parse_text((out / "ensemble" / "config.pbtxt").read_text())
    assert ensemble.ensemble_scheduling.max_inflight_requests > 0  # the pinned image's Triton has it
    manifest = json.loads((out / "tritonforge.json").read_text())
    assert manifest["dry_run"] and manifest["commands"][1][0] == "trtllm-build"


def test_a_dry_run_plans_from_config_json_without_the_weights_a_build_needs(tiny_models, tmp_path, capsys):
    """A large model's small files (config.json, the tokenizer) are enough to plan it; the build itself refuses
    them."""
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    for file in tiny_models["bpe"].iterdir():
        if file.suffix != ".safetensors":
            (checkpoint / file.name).write_bytes(file.read_bytes())
    out = build(options(checkpoint, tmp_path / "planned", dry_run=True))
    assert "trtllm-build" in capsys.readouterr().out
    assert json.loads((out / "tritonforge.json").read_text())["dry_run"]
    with pytest.raises(FileNotFoundError, match="has no weights"):
        build(options(checkpoint, tmp_path / "built"))
    assert not (tmp_path / "built").exists()


def test_no_kv_cache_reuse_reaches_the_backend_parameter(tiny_models, tmp_path):
    out = build(options(tiny_models["bpe"], tmp_path / "repo", dry_run=True, enable_kv_cache_reuse=False))
    engine = configs.parse_text((out / "tensorrt_llm" / "config.pbtxt").read_text())
    assert engine.parameters["enable_kv_cache_reuse"].string_value == "false"


@pytest.mark.parametrize(("key", "value", "dtype"), [("torch_dtype", "bfloat16", "bfloat16"),
                                                     ("dtype", "bfloat16", "bfloat16"),  # transformers 5's key
                                                     ("torch_dtype", "float32", "float16"), (None, None, "float16")])
def test_the_engine_dtype_follows_the_checkpoints_16_bit_type(tmp_path, key, value, dtype):

    checkpoint_config = {key: value} if key else {}
    assert trt_build_spec(options(tmp_path / "model", tmp_path / "repo"), checkpoint_config).dtype == dtype


def test_without_tensorrt_llm_the_build_exits_non_zero_naming_the_container(tiny_models, tmp_path, capsys):
    code = main(["build", "--model", str(tiny_models["bpe"]), "--output", str(tmp_path / "repo"),
                 "--engine", "tensorrtllm", "--gpu-memory-gib", "80", "--max-input-len", "64", "--max-seq-len", "256"])
    assert code != 0
    assert TRITON_IMAGE in capsys.readouterr().err
    assert not (tmp_path / "repo" / "tensorrt_llm").exists()


def test_without_tensorrt_llm_nor_a_gpu_the_build_says_tensorrt_llm_is_missing_first(tiny_models, tmp_path, capsys):
    """Without TensorRT-LLM no --gpu-memory-gib would help: the build says what it misses first, not what to add."""
    code = main(["build", "--model", str(tiny_models["bpe"]), "--output", str(tmp_path / "repo"),
                 "--engine", "tensorrtllm"])
    said = capsys.readouterr().err
    assert code == 1 and "TensorRT-LLM is not installed here" in said and "--gpu-memory-gib" not in said, said


def test_a_dry_run_says_its_repository_has_no_engine_rather_than_ready(tiny_models, tmp_path, capsys):
    code = main(["build", "--model", str(tiny_models["bpe"]), "--output", str(tmp_path / "repo"), "--engine",
                 "tensorrtllm", "--gpu-memory-gib", "80", "--max-input-len", "64", "--max-seq-len", "256",
                 "--dry-run"])
    said = capsys.readouterr().out
    assert code == 0 and said.startswith(f"dry run written: {tmp_path / 'repo'} holds the configs and the plan but "
                                         f"no engine") and TRITON_IMAGE in said and "ready" not in said


def test_missing_tensorrt_llm_raises_from_the_library(tiny_models, tmp_path):
    with pytest.raises(TensorRTLLMMissing, match="--dry-run"):
        build(options(tiny_models["bpe"], tmp_path / "repo"))


def spec_of(tmp_path, **settings):
    """The engine build of these settings, for a Llama checkpoint."""
    options = BuildOptions(model=tmp_path / "hf", output=tmp_path / "repo", engine="tensorrtllm", **settings)
    return trt_build_spec(options, {"architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16"})


def test_commands_use_the_pinned_release_flags(tmp_path):
    spec = spec_of(tmp_path, tp_size=2, quantization="int4_wo", kv_cache_dtype="fp8")
    convert = convert_command(spec)
    assert convert[1].endswith("models/core/llama/convert_checkpoint.py")
    assert convert[convert.index("--tp_size") + 1] == "2" and "--use_weight_only" in convert
    assert convert[convert.index("--weight_only_precision") + 1] == "int4" and "--fp8_kv_cache" in convert
    trt = build_command(spec)
    assert trt[trt.index("--kv_cache_type") + 1] == "paged"  # --paged_kv_cache is deprecated in 1.x
    assert "--max_output_len" not in trt and "--paged_kv_cache" not in trt
    assert convert[0] == "python3"  # the image's Python, not the one that planned the build
    assert convert[convert.index("--dtype") + 1] == "bfloat16"  # "auto": the checkpoint's own dtype


def test_impossible_plan_is_refused_before_anything_is_written(tiny_models, tmp_path):
    with pytest.raises(ValueError, match="not one sequence"):
        build(BuildOptions(model=tiny_models["bpe"], output=tmp_path / "repo", engine="tensorrtllm",
                           gpu_memory_gib=2.2, max_input_len=64, max_seq_len=256, dry_run=True,
                           kv_cache_free_gpu_mem_fraction=0.0001))
    assert not (tmp_path / "repo").exists()


ENGINE_FACTS = {"tensorrt_llm_version": "1.1.0", "tensorrt_version": "10.13.2", "gpu_name": "NVIDIA H200",
                "compute_capability": "9.0"}


def fabricate_engine(tmp_path, **overrides):
    (tmp_path / ENGINE_INFO).write_text(json.dumps({**ENGINE_FACTS, "tp_size": 1, "pp_size": 1, **overrides}))
    return tmp_path


def test_pinning_guard_accepts_the_machine_the_engine_was_built_on(tmp_path):
    check_engine(fabricate_engine(tmp_path), ENGINE_FACTS, world_size=1)


def test_pinning_guard_names_every_difference_and_says_rebuild(tmp_path):
    running = {**ENGINE_FACTS, "gpu_name": "NVIDIA A100-SXM4-80GB", "compute_capability": "8.0"}
    with pytest.raises(EngineMismatch) as error:
        check_engine(fabricate_engine(tmp_path), running, world_size=2)
    message = str(error.value)
    assert "rebuild" in message and "compute_capability" in message and "'9.0'" in message
    assert "NVIDIA A100" in message and "world size" in message


def test_pinning_guard_refuses_an_engine_without_info(tmp_path):
    with pytest.raises(EngineMismatch, match="missing"):
        check_engine(tmp_path, ENGINE_FACTS)


@pytest.mark.parametrize("quantization", ["fp8", "int8_sq", "int4_awq"])
def test_calibrated_formats_calibrate_on_a_local_folder(tmp_path, quantization):
    spec = spec_of(tmp_path, quantization=quantization, calib_dataset="/data/calib")
    command = convert_command(spec)
    assert command[1].endswith("quantization/quantize.py") and command[command.index("--qformat") + 1] == quantization
    assert command[command.index("--calib_dataset") + 1] == "/data/calib"


def test_calibrated_format_without_a_calibration_folder_is_refused(tmp_path):
    with pytest.raises(ValueError, match="--calib-dataset"):
        spec_of(tmp_path, quantization="fp8")


def test_missing_examples_or_calibration_folder_is_named_before_building(tmp_path):
    examples = tmp_path / "examples"
    spec = spec_of(tmp_path, quantization="fp8", calib_dataset=str(tmp_path / "calib"), examples_dir=str(examples))
    with pytest.raises(FileNotFoundError, match="--examples-dir"):
        check_inputs(spec)
    (examples / "quantization").mkdir(parents=True)
    (examples / "quantization" / "quantize.py").write_text("")
    with pytest.raises(FileNotFoundError, match="--calib-dataset"):
        check_inputs(spec)
    (tmp_path / "calib").mkdir()
    check_inputs(spec)


def test_machine_facts_import_neither_torch_nor_tensorrt_llm():
    # `serve` reads them in the parent process; an import of torch there could hold a CUDA context on GPU 0.
    import subprocess
    import sys

    probe = ("import sys; from tritonforge.builder.trtllm import runtime_facts; runtime_facts(); "
             "print(sorted(m for m in ('torch', 'tensorrt_llm', 'tensorrt') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
    assert isinstance(runtime_facts(), dict)


def test_dry_run_prints_the_accuracy_gate_it_would_run(tiny_models, tmp_path, capsys):
    assert main(["build", "--model", str(tiny_models["bpe"]), "--output", str(tmp_path / "repo"), "--engine",
                 "tensorrtllm", "--gpu-memory-gib", "80", "--max-input-len", "64", "--max-seq-len", "256",
                 "--dry-run", "--accuracy-gate", str(tmp_path / "gate.jsonl")]) == 0
    printed = capsys.readouterr().err
    assert "tritonforge eval --url localhost:8001" in printed and "gate.jsonl" in printed


@pytest.mark.parametrize("container", sorted(CONTAINERS))
def test_target_triton_writes_loadable_configs_for_every_container_from_25_12_to_the_pin(tiny_models, tmp_path,
                                                                                        capsys, container):
    tag = f"{container[0]}.{container[1]:02d}"
    triton, release = CONTAINERS[container]
    out = build(options(tiny_models["bpe"], tmp_path / "repo", dry_run=True, target_triton=parse_target_triton(tag)))
    printed = capsys.readouterr().out
    assert f"configs for Triton {triton[0]}.{triton[1]} (container {tag}, TensorRT-LLM {release})" in printed
    assert ("build the engine inside that container" in printed) == (release != TRTLLM_VERSION)
    for model in ("ensemble", "preprocessing", "postprocessing", "tensorrt_llm", "tensorrt_llm_bls"):
        configs.parse_text((out / model / "config.pbtxt").read_text())  # Triton's own parser takes them
    ensemble = configs.parse_text((out / "ensemble" / "config.pbtxt").read_text())
    assert ensemble.ensemble_scheduling.max_inflight_requests > 0  # every one of them is 2.63 or newer


def test_the_pin_is_the_newest_container_of_the_pinned_release():
    assert TRITON_IMAGE == "nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3"
    newest = max(CONTAINERS)
    assert CONTAINERS[newest] == (parse_target_triton("26.07"), TRTLLM_VERSION) and TRTLLM_VERSION == "1.2.1"
    assert f"FROM {TRITON_IMAGE}\n" in (Path(__file__).resolve().parents[3] / "Dockerfile").read_text()


@pytest.mark.parametrize("text, expected", [("2.51", (2, 51)), ("2.71", (2, 71)), ("25.12", (2, 64)),
                                            ("26.03", (2, 67))])
def test_target_triton_takes_a_version_or_a_container(text, expected):
    assert parse_target_triton(text) == expected


@pytest.mark.parametrize("text", ["26.08", "latest"])
def test_target_triton_refuses_an_unknown_container_or_a_word(text):
    with pytest.raises(argparse.ArgumentTypeError, match=text):
        parse_target_triton(text)


@pytest.mark.parametrize(("tp", "pp", "ranks"), [(1, 1, 1), (2, 1, 2), (2, 2, 4), (1, 4, 4)])
def test_serve_runs_one_rank_per_gpu_of_the_engines_tensor_and_pipeline_split(tmp_path, monkeypatch, tp, pp, ranks):
    from tritonforge.builder import trtllm
    from tritonforge.builder.manifest import MANIFEST
    from tritonforge.cli.serve import check_repository_engine

    (tmp_path / MANIFEST).write_text(json.dumps({"tritonforge_build": {"engine": "tensorrtllm", "tp_size": tp,
                                                                       "pp_size": pp}}))
    checked = []
    monkeypatch.setattr(trtllm, "runtime_facts", lambda: {})
    monkeypatch.setattr(trtllm, "check_engine", lambda engine, facts, world_size: checked.append(world_size))
    assert check_repository_engine(tmp_path) == ranks and checked == [ranks]


@pytest.mark.parametrize("family", ["bpe", "sentencepiece"])
def test_a_dry_run_turns_on_guided_decoding_with_the_tokenizer_file_the_backend_reads(tiny_models, tmp_path, family):
    """The file, read as TensorRT-LLM reads its three keys (xgrammar's vocabulary type detected from
    `tokenizer_str`), gives xgrammar the tokenizer's own vocabulary: the same grammar masks the same tokens."""
    import xgrammar

    from tritonforge.runtime.text.tokenization import load_tokenizer

    out = build(options(tiny_models[family], tmp_path / "repo", dry_run=True))
    engine = configs.parse_text((out / "tensorrt_llm" / "config.pbtxt").read_text())
    parameters = {key: value.string_value for key, value in engine.parameters.items()}
    assert parameters["guided_decoding_backend"] == "xgrammar"
    assert parameters["xgrammar_tokenizer_info_path"] == "/models/tensorrt_llm/1/xgrammar_tokenizer_info.json"
    assert parameters["tokenizer_dir"] == "/models/preprocessing/tokenizer"
    info = json.loads((out / "tensorrt_llm" / "1" / "xgrammar_tokenizer_info.json").read_text())
    assert set(info) == {"encoded_vocab", "tokenizer_str", "stop_token_ids"}
    tokenizer = load_tokenizer(out / "preprocessing" / "tokenizer")
    assert info["stop_token_ids"] == [tokenizer.eos_token_id]
    metadata = xgrammar.TokenizerInfo._detect_metadata_from_hf(info["tokenizer_str"])
    from_file = xgrammar.TokenizerInfo(info["encoded_vocab"], vocab_type=metadata["vocab_type"],
                                       vocab_size=len(tokenizer), stop_token_ids=info["stop_token_ids"],
                                       add_prefix_space=metadata["add_prefix_space"])
    direct = xgrammar.TokenizerInfo.from_huggingface(tokenizer, vocab_size=len(tokenizer))
    assert from_file.decoded_vocab == direct.decoded_vocab
    masks = []
    for tokenizer_info in (from_file, direct):
        matcher = xgrammar.GrammarMatcher(xgrammar.GrammarCompiler(tokenizer_info).compile_json_schema(
            '{"type": "object", "properties": {"a b": {"type": "string"}}}'))
        assert matcher.accept_string('{"a b": "é')
        bitmask = xgrammar.allocate_token_bitmask(1, len(tokenizer))
        matcher.fill_next_token_bitmask(bitmask)
        masks.append(bitmask)
    assert bool((masks[0] == masks[1]).all())


def test_a_tokenizer_without_a_fast_form_leaves_guided_decoding_off(tiny_models, tmp_path, monkeypatch, capsys):
    from tritonforge.builder import trtllm

    monkeypatch.setattr(trtllm, "xgrammar_tokenizer_info", lambda tokenizer: None)
    out = build(options(tiny_models["bpe"], tmp_path / "repo", dry_run=True))
    assert "guided decoding off" in capsys.readouterr().out
    engine = configs.parse_text((out / "tensorrt_llm" / "config.pbtxt").read_text())
    assert {engine.parameters[key].string_value for key in ("guided_decoding_backend", "xgrammar_tokenizer_info_path",
                                                            "tokenizer_dir")} == {""}
    assert not (out / "tensorrt_llm" / "1" / "xgrammar_tokenizer_info.json").exists()
