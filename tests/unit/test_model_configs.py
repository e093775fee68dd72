"""Every generated config parses back with the model-config proto and carries the right settings."""

from pathlib import Path

from tritonclient.grpc import model_config_pb2 as mc

from tritonforge import model_configs as configs
from tritonforge.build import BuildOptions, build


def test_repository_configs_parse_and_carry_serving_settings(tiny_models, tmp_path):
    serving = configs.ServingConfig(postprocessing_instances=3, max_queue_delay_microseconds=100)
    out = build(BuildOptions(model=tiny_models["bpe"], output=tmp_path / "repo", max_input_len=64,
                             max_seq_len=128, serving=serving))
    parsed = {d.name: configs.parse_text((d / "config.pbtxt").read_text())
              for d in Path(out).iterdir() if (d / "config.pbtxt").exists()}
    assert set(parsed) == {"preprocessing", "tensorrt_llm", "postprocessing", "ensemble", "tensorrt_llm_bls"}
    for config in parsed.values():
        assert "${" not in configs.to_text(config)
    assert parsed["tensorrt_llm"].model_transaction_policy.decoupled
    assert parsed["tensorrt_llm_bls"].model_transaction_policy.decoupled
    assert parsed["postprocessing"].instance_group[0].count == 3
    assert parsed["postprocessing"].dynamic_batching.preserve_ordering
    assert parsed["preprocessing"].dynamic_batching.max_queue_delay_microseconds == 100
    engine_inputs = {i.name: i for i in parsed["tensorrt_llm"].input}
    assert engine_inputs["temperature"].HasField("reshape") and engine_inputs["input_lengths"].optional is False
    assert parsed["tensorrt_llm"].instance_group[0].kind == mc.ModelInstanceGroup.KIND_CPU


def test_ensemble_wires_every_step_input():
    config = configs.ensemble_config(configs.ServingConfig())
    produced = {i.name for i in config.input}
    for step in config.ensemble_scheduling.step:
        produced |= set(step.output_map.values())
    for step in config.ensemble_scheduling.step:
        assert set(step.input_map.values()) <= produced, step.model_name
    assert {o.name for o in config.output} <= produced
