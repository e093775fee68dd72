"""The config.pbtxt files committed beside the model sources are exactly what the typed configs generate."""

import pytest

from tritonforge.builder import model_configs as configs
from tritonforge.builder.repository import SOURCE_ROOT
from tritonforge.builder.source_configs import source_configs

GENERATED = source_configs()


@pytest.mark.parametrize("relative", sorted(GENERATED))
def test_committed_config_equals_the_generated_one(relative):
    committed = SOURCE_ROOT / relative
    assert committed.is_file(), f"{relative} is missing: run python -m tritonforge.builder.source_configs"
    assert committed.read_text() == GENERATED[relative], (
        f"{relative} differs from what tritonforge/builder/model_configs.py generates: never edit it by hand; "
        f"change the typed config and run python -m tritonforge.builder.source_configs")


def test_every_model_directory_of_the_source_tree_has_its_config():
    model_dirs = {path.parent.parent.name for path in SOURCE_ROOT.glob("*/1/model.py")}
    with_config = {relative.split("/")[0] for relative in GENERATED}
    assert model_dirs - {"tensorrt_llm_replay_benchmark"} <= with_config
    assert {"ensemble", "tensorrt_llm_tensorrtllm"} <= with_config  # the models without Python code too


def test_the_committed_ensemble_wires_the_three_steps():
    ensemble = configs.parse_text((SOURCE_ROOT / "ensemble" / "config.pbtxt").read_text())
    assert [step.model_name for step in ensemble.ensemble_scheduling.step] == [
        "preprocessing", configs.COALESCER_MODEL, "postprocessing"]
    coalescer = configs.parse_text((SOURCE_ROOT / configs.COALESCER_MODEL / "config.pbtxt").read_text())
    assert coalescer.parameters["tensorrt_llm_model_name"].string_value == configs.ENGINE_MODEL
