"""`tritonforge build`'s flags are generated from BuildOptions and ServingConfig: defaults come from the
dataclasses alone, and each flag lands on its field."""

from pathlib import Path

import pytest

from tritonforge.builder import model_configs as configs
from tritonforge.builder.build import BuildOptions
from tritonforge.cli import make_parser
from tritonforge.cli.build import build_options


def options_of(*flags: str) -> BuildOptions:
    return build_options(make_parser().parse_args(["build", "--model", "ckpt", *flags]))


def test_no_flags_give_the_dataclasses_defaults():
    assert options_of() == BuildOptions(model=Path("ckpt"))


def test_each_flag_lands_on_its_field():
    options = options_of("--output", "out", "--engine", "tensorrtllm", "--frontends", "bls", "--max-batch-size", "4",
                         "--max-input-len", "64", "--max-seq-len", "128", "--no-kv-cache-reuse", "--chunked-context",
                         "--cuda-graphs", "--gpu-memory-gib", "79.6", "--target-triton", "2.51", "--dry-run",
                         "--tp-size", "2", "--calib-dataset", "calib", "--accuracy-gate", "prompts.jsonl")
    assert options == BuildOptions(
        model=Path("ckpt"), output=Path("out"), engine="tensorrtllm", frontends=("bls",), max_batch_size=4,
        max_input_len=64, max_seq_len=128, enable_kv_cache_reuse=False, enable_chunked_context=True, cuda_graphs=True,
        gpu_memory_gib=79.6, target_triton=(2, 51), dry_run=True, tp_size=2, calib_dataset="calib")
    assert options_of("--engine", "replay", "--replay-step-ms", "20").replay_step_ms == 20.0


@pytest.mark.parametrize("engine", ["transformers", "replay"])
@pytest.mark.parametrize("flags, flag, owners", [
    (["--pp-size", "2"], "--pp-size", "tensorrtllm or tensorrtllm-pytorch"),
    (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype", "tensorrtllm or tensorrtllm-pytorch"),
    (["--chunked-context"], "--chunked-context", "tensorrtllm or tensorrtllm-pytorch"),
    (["--quantization", "int8_wo"], "--quantization", "tensorrtllm"),
    (["--dry-run"], "--dry-run", "tensorrtllm"),
    (["--gpu-memory-gib", "80"], "--gpu-memory-gib", "tensorrtllm"),
])
def test_an_option_the_engine_would_ignore_is_refused_naming_the_engines_that_read_it(engine, flags, flag, owners):
    refusal = f"^{flag} is for --engine {owners} only: the {engine} engine would ignore it$"
    with pytest.raises(ValueError, match=refusal):
        options_of("--engine", engine, *flags)


def test_the_llm_api_takes_the_parallelism_the_engine_build_takes_but_not_its_dry_run():
    assert options_of("--engine", "tensorrtllm-pytorch", "--tp-size", "2", "--pp-size", "2").tp_size == 2
    with pytest.raises(ValueError, match="^--dry-run is for --engine tensorrtllm only"):
        options_of("--engine", "tensorrtllm-pytorch", "--dry-run")
    # A kind's own word comes first: the LLM API reads the quantization from the checkpoint.
    with pytest.raises(ValueError, match="reads the quantization from the checkpoint"):
        options_of("--engine", "tensorrtllm-pytorch", "--quantization", "fp8")


def test_the_gate_flags_land_on_the_gate_options():
    from tritonforge.facts.settings import given
    from tritonforge.tools.accuracy_gate import GateOptions

    args = make_parser().parse_args(["build", "--model", "ckpt", "--accuracy-gate", "prompts.jsonl"])
    assert GateOptions(**given(args, GateOptions)) == GateOptions(accuracy_gate=Path("prompts.jsonl"))


def test_serving_flags_land_on_the_serving_config_and_given_counts_are_not_planned():
    options = options_of("--no-streaming", "--preprocessing-instances", "3", "--postprocessing-unordered",
                         "--nvidia-wiring", "--include-input-in-output", "--max-queue-delay-us", "100",
                         "--postprocessing-delay-us", "50", "--max-queue-size", "9", "--bls-max-concurrency", "32")
    assert options.serving == configs.ServingConfig(
        decoupled=False, preprocessing_instances=3, postprocessing_preserve_ordering=False, messages_input=False,
        exclude_input_in_output=False, max_queue_delay_microseconds=100, postprocessing_delay_microseconds=50,
        max_queue_size=9, bls_max_concurrency=32)
    assert not options.planned_instances
    assert options_of().planned_instances


def test_triton_batch_limit_is_at_least_the_engine_batch():
    assert options_of("--max-batch-size", "256").serving.max_batch_size == 256
    assert options_of("--triton-max-batch-size", "512", "--max-batch-size", "8").serving.max_batch_size == 512


@pytest.mark.parametrize("flags, message", [
    (["--engine", "tensorrtllm", "--quantization", "fp8"], "--calib-dataset"),
    (["--engine", "tensorrtllm", "--dtype", "float32"], "--dtype"),
    (["--engine", "tensorrtllm", "--max-num-tokens", "512"], "--max-num-tokens"),
    (["--engine", "tensorrtllm", "--tp-size", "0"], "--tp-size"),
    (["--max-input-len", "2048"], "--max-seq-len"),
    (["--engine-instances", "2"], "--engine-instances > 1 is for the replay engine only"),
    (["--engine", "tensorrtllm", "--engine-instances", "2"], "--engine-instances > 1 is for the replay engine"),
    (["--engine", "replay", "--replay-step-ms", "0"], "--replay-step-ms must be > 0"),
    (["--response-lanes", "-1"], "--response-lanes must be >= 0"),
])
def test_settings_are_validated_where_they_are_declared(flags, message):
    with pytest.raises(ValueError, match=message):
        options_of(*flags)


def test_chunked_context_lets_prompts_exceed_one_step():
    options_of("--engine", "tensorrtllm", "--max-num-tokens", "512", "--chunked-context")


@pytest.mark.parametrize("options, flag", [
    ({"replay_sender_threads": 5, "max_batch_size": 4}, "--replay-sender-threads"),
    ({"serving": configs.ServingConfig(decoupled=False)}, "--no-streaming"),
    ({"serving": configs.ServingConfig(max_queue_size=8)}, "--max-queue-size"),
    ({"engine_instances_given": True}, "--engine-instances"),
])
def test_the_cpp_replay_engine_refuses_settings_it_cannot_honour_naming_the_flag(options, flag):
    if options.pop("engine_instances_given", False):
        options["serving"] = configs.ServingConfig(engine_instances=2)
    with pytest.raises(ValueError, match=flag):
        BuildOptions(model=Path("m"), engine="replay", replay_native=True, **options)


def test_the_cpp_replay_engine_takes_a_sender_thread_for_each_sequence_of_its_batch():
    options = BuildOptions(model=Path("m"), engine="replay", replay_native=True, replay_sender_threads=4,
                           max_batch_size=4)
    assert options.replay_sender_threads == 4


def test_a_stream_interval_is_refused_for_the_tensorrtllm_backend_which_has_none():
    with pytest.raises(ValueError, match="--stream-interval"):
        BuildOptions(model=Path("m"), engine="tensorrtllm", stream_interval=3)


def test_the_library_keeps_tritons_batch_limit_at_least_the_engines_as_the_cli_does():
    """`build(BuildOptions(...))` without the CLI: Triton's max_batch_size is raised to the engine's batch."""
    from pathlib import Path

    from tritonforge.builder import model_configs as configs
    from tritonforge.builder.build import BuildOptions

    options = BuildOptions(model=Path("ckpt"), output=Path("out"), max_batch_size=256,
                           serving=configs.ServingConfig(max_batch_size=64))
    assert options.serving.max_batch_size == 256
    kept = BuildOptions(model=Path("ckpt"), output=Path("out"), max_batch_size=8,
                        serving=configs.ServingConfig(max_batch_size=512))
    assert kept.serving.max_batch_size == 512


def test_a_max_seq_len_past_the_models_positions_is_refused_before_anything_is_written(tiny_models, tmp_path):
    import json
    import shutil

    from tritonforge.builder.build import build

    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_models["bpe"], checkpoint)
    positions = json.loads((checkpoint / "config.json").read_text())["max_position_embeddings"]
    with pytest.raises(ValueError, match=f"^--max-seq-len {positions + 1} exceeds the model's "
                                         f"max_position_embeddings {positions}$"):
        build(BuildOptions(model=checkpoint, output=tmp_path / "repo", max_input_len=64, max_seq_len=positions + 1))
    assert not (tmp_path / "repo").exists()
    build(BuildOptions(model=checkpoint, output=tmp_path / "repo", max_input_len=64, max_seq_len=positions))



def test_a_comma_list_may_have_spaces_after_its_commas():
    from tritonforge.facts.paths import path_list

    assert options_of("--frontends", "ensemble, bls").frontends == ("ensemble", "bls")
    assert path_list(" direct , bls,") == ("direct", "bls")
