"""The transformers engine on several GPUs (`build --gpus N`, `--tp-size T`): the engine model's instances as
Triton places them, the Python instances planned for every engine's batch, the counts refused at build time, and
what the engine model reads back from the config and from Triton's `initialize` args."""

import json
from pathlib import Path

import pytest
from google.protobuf import json_format
from tritonclient.grpc import model_config_pb2 as mc

from tritonforge.builder import model_configs as configs
from tritonforge.builder import trtllm
from tritonforge.builder.build import BuildOptions, build
from tritonforge.builder.engines import transformers as transformers_engine
from tritonforge.builder.manifest import read_manifest
from tritonforge.facts.model_parameters import TransformersEngineParameters
from tritonforge.runtime.engine.service import EngineSettings


@pytest.fixture()
def gpus(monkeypatch):
    """The GPUs this build machine shows (None: no nvidia-smi), set by the test."""
    def shows(count: int | None) -> None:
        monkeypatch.setattr(trtllm, "visible_gpus", lambda: count)

    shows(None)
    return shows


def built(model: Path, output: Path, said: list[str] | None = None, **options) -> dict[str, mc.ModelConfig]:
    out = build(BuildOptions(model=model, output=output, max_input_len=64, max_seq_len=128, **options),
                progress=(said if said is not None else []).append)
    return {folder.name: configs.parse_text((folder / "config.pbtxt").read_text())
            for folder in out.iterdir() if (folder / "config.pbtxt").is_file()}


def parameters(config: mc.ModelConfig) -> dict[str, str]:
    return {key: value.string_value for key, value in config.parameters.items()}


def test_each_gpu_runs_one_engine_instance_and_the_python_instances_are_planned_for_all_of_them(
        tiny_models, tmp_path, gpus):
    gpus(4)
    parsed = built(tiny_models["bpe"], tmp_path / "repo", gpus=4, max_batch_size=32)
    (group,) = parsed["tensorrt_llm"].instance_group
    assert (group.kind, list(group.gpus), group.count) == (mc.ModelInstanceGroup.KIND_GPU, [0, 1, 2, 3], 1)
    assert "tensor_parallel_size" not in parameters(parsed["tensorrt_llm"])
    assert parameters(parsed["tensorrt_llm"])["max_batch_size"] == "32"  # each engine's own batch
    # 4 engines of 32 sequences: the instance counts of 128 streams, and a BLS taking twice that many
    assert [parsed[name].instance_group[0].count for name in ("preprocessing", "postprocessing",
                                                              "tensorrt_llm_bls")] == [8, 8, 8]
    assert parameters(parsed["tensorrt_llm_bls"])["max_concurrency"] == "256"


def test_tensor_parallel_instances_start_on_every_tp_th_gpu_and_the_manifest_keeps_the_layout(
        tiny_models, tmp_path, gpus):
    gpus(4)
    parsed = built(tiny_models["bpe"], tmp_path / "repo", gpus=4, tp_size=2)
    assert list(parsed["tensorrt_llm"].instance_group[0].gpus) == [0, 2]  # ranks 1 on GPUs 1 and 3
    assert parameters(parsed["tensorrt_llm"])["tensor_parallel_size"] == "2"
    assert read_manifest(tmp_path / "repo").plan.serving.engine_gpus == (0, 2)  # tune renders the same configs


def test_the_default_build_keeps_one_cpu_kind_instance_that_places_itself(tiny_models, tmp_path, gpus):
    parsed = built(tiny_models["bpe"], tmp_path / "repo")
    (group,) = parsed["tensorrt_llm"].instance_group
    assert (group.kind, list(group.gpus), group.count) == (mc.ModelInstanceGroup.KIND_CPU, [], 1)
    assert "tensor_parallel_size" not in parameters(parsed["tensorrt_llm"])
    assert parsed["preprocessing"].instance_group[0].count == configs.ServingConfig.preprocessing_instances


def test_instance_counts_given_are_kept_over_the_plan(tiny_models, tmp_path, gpus):
    serving = configs.ServingConfig(preprocessing_instances=3)
    parsed = built(tiny_models["bpe"], tmp_path / "repo", gpus=4, max_batch_size=32, serving=serving,
                   planned_instances=False)
    assert [parsed[name].instance_group[0].count for name in ("preprocessing", "postprocessing",
                                                              "tensorrt_llm_bls")] == [3, 2, 1]


def test_gpus_are_planned_without_a_gpu_in_sight_and_the_build_says_so(tiny_models, tmp_path, gpus):
    said = []
    built(tiny_models["bpe"], tmp_path / "repo", said, gpus=8)
    assert "no GPU visible here: planned for 8 GPUs without checking that the server's machine has them" in said


@pytest.mark.parametrize("options, refusal", [
    ({"gpus": 3, "tp_size": 2}, "^--gpus 3 must be a multiple of --tp-size 2: each engine instance takes 2 GPUs$"),
    ({"gpus": 2, "device": "cpu"}, "^--gpus 2 places the engine on GPUs: it cannot run with --device cpu$"),
    ({"gpus": -1}, "^--gpus must be >= 0, got -1$"),
    ({"tp_size": 0}, "^--tp-size must be >= 1, got 0$"),
    ({"engine": "replay", "gpus": 2}, "^--gpus is for --engine transformers only: the replay engine would ignore it$"),
    ({"engine": "tensorrtllm", "gpus": 2}, "^--gpus is for --engine transformers only"),
    ({"engine": "replay", "tp_size": 2},
     "^--tp-size is for --engine transformers or tensorrtllm or tensorrtllm-pytorch only"),
])
def test_wrong_counts_are_refused_in_one_line_before_anything_is_read(options, refusal):
    with pytest.raises(ValueError, match=refusal):
        BuildOptions(model=Path("ckpt"), **options)


@pytest.mark.parametrize("shown, options, refusal", [
    (None, {"tp_size": 3, "device": "cpu"}, "^--tp-size 3 must divide the model's 4 attention heads: each rank holds "
                                            "an equal share of them$"),
    (None, {"tp_size": 4, "device": "cpu"}, "^--tp-size 4 must divide the model's 2 key-value heads"),
    (2, {"gpus": 4}, "^--gpus 4 needs 4 GPUs; this machine shows 2$"),
    (1, {"tp_size": 2}, "^--tp-size 2 needs 2 GPUs; this machine shows 1$"),
])
def test_counts_the_model_or_the_machine_cannot_take_are_refused_before_the_repository_is_written(
        tiny_models, tmp_path, gpus, shown, options, refusal):
    gpus(shown)
    with pytest.raises(ValueError, match=refusal):
        built(tiny_models["bpe"], tmp_path / "repo", **options)
    assert not (tmp_path / "repo").exists()


def test_tensor_parallelism_is_refused_for_a_model_transformers_has_no_plan_for(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "gpt2", "n_head": 4}))
    options = BuildOptions(model=tmp_path, tp_size=2, device="cpu")
    with pytest.raises(ValueError, match=r"^--tp-size 2: transformers has no tensor-parallel plan for gpt2 "):
        transformers_engine.plan(options, {"model_type": "gpt2", "n_head": 4}, lambda line: None)


def initialize_args(config: mc.ModelConfig, kind: str, device_id: int) -> dict:
    """What Triton hands a Python model's `initialize` for one instance of `config`."""
    return {"model_config": json_format.MessageToJson(config, preserving_proto_field_name=True),
            "model_instance_kind": kind, "model_instance_device_id": str(device_id), "model_repository": "/m"}


def test_each_engine_instance_runs_on_the_gpu_triton_gave_it_with_the_parallelism_the_build_wrote():
    written = TransformersEngineParameters(model_path="1/checkpoint", max_batch_size=4, max_input_len=16,
                                           max_seq_len=32, tensor_parallel_size=2)
    config = configs.engine_config(configs.ServingConfig(engine_gpus=(0, 2)), backend="python",
                                   parameters=written.to_config())
    args = initialize_args(config, "GPU", 2)
    settings = EngineSettings.from_model_args(args, TransformersEngineParameters.from_model_args(args))
    assert (settings.device, settings.tensor_parallel_size, settings.instances) == ("cuda:2", 2, 2)


def test_an_engine_triton_placed_on_the_cpu_kind_keeps_its_device_parameter_and_runs_alone():
    written = TransformersEngineParameters(model_path="1/checkpoint", max_batch_size=4, max_input_len=16,
                                           max_seq_len=32, device="cpu")
    config = configs.engine_config(configs.ServingConfig(), backend="python", parameters=written.to_config())
    args = initialize_args(config, "CPU", 0)
    settings = EngineSettings.from_model_args(args, TransformersEngineParameters.from_model_args(args))
    assert (settings.device, settings.tensor_parallel_size, settings.instances) == ("cpu", 1, 1)


@pytest.mark.parametrize("serving, refusal", [
    ({"engine_gpus": (0, 0)}, r"^engine_gpus must be distinct GPU ids >= 0, got \[0, 0\]$"),
    ({"engine_gpus": (-1,)}, "^engine_gpus must be distinct GPU ids >= 0"),
    ({"engine_gpus": (0, 1), "engine_instances": 2}, "^engine_gpus places one engine instance on each GPU"),
])
def test_a_gpu_layout_that_triton_would_refuse_is_refused_naming_it(serving, refusal):
    with pytest.raises(ValueError, match=refusal):
        configs.ServingConfig(**serving)
