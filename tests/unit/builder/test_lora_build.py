"""`build --lora NAME=PATH`: each adapter checked against the checkpoint, refused in one line where it cannot serve,
and written into the repository with the task id requests select it by."""

import shutil

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from tritonforge.builder import model_configs as configs
from tritonforge.builder.build import BuildOptions, build
from tritonforge.builder.manifest import read_manifest
from tritonforge.cli import make_parser
from tritonforge.cli.build import build_options
from tritonforge.facts.contract import ENGINE_MODEL
from tritonforge.runtime.engine.lora import records_from_parameter
from tritonforge.tools.tiny_model import make_lora_adapter


@pytest.fixture(scope="module")
def adapters(tiny_models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("adapters")
    return {"small": make_lora_adapter(tiny_models["bpe"], folder / "small", rank=2, target_modules=("q_proj",)),
            "wide": make_lora_adapter(tiny_models["bpe"], folder / "wide", rank=8,
                                      target_modules=("o_proj", "down_proj"))}


def options_of(*flags: str) -> BuildOptions:
    return build_options(make_parser().parse_args(["build", "--model", "ckpt", *flags]))


def test_the_flag_repeats_and_keeps_its_order():
    assert options_of("--lora", "a=/x", "--lora", "b=/y").lora == ("a=/x", "b=/y")


@pytest.mark.parametrize(("flags", "message"), [
    (["--lora", "noequals"], r"^--lora 'noequals': expected NAME=PATH"),
    (["--lora", "a b=/x"], r"^LoRA adapter name 'a b': use letters"),
    (["--lora", "a=/x", "--lora", "a=/y"], r"^--lora names a more than once"),
    (["--engine", "replay", "--lora", "a=/x"], r"^--lora is for --engine .*transformers.* only: the replay engine "),
])
def test_a_bad_flag_is_refused_in_one_line(flags, message):
    with pytest.raises(ValueError, match=message):
        options_of(*flags)


def test_the_build_writes_each_adapter_with_its_task_id(tiny_models, adapters, tmp_path):
    repository = build(BuildOptions(model=tiny_models["bpe"], output=tmp_path / "repo", max_input_len=32,
                                    max_seq_len=64, lora=(f"small={adapters['small']}", f"wide={adapters['wide']}")))
    config = configs.parse_text((repository / ENGINE_MODEL / "config.pbtxt").read_text())
    records = records_from_parameter(config.parameters["lora_adapters"].string_value)
    assert [(r.name, r.task_id, r.path) for r in records] == [("small", 1, "1/lora/small"), ("wide", 2, "1/lora/wide")]
    for record in records:
        copied = repository / ENGINE_MODEL / record.path
        assert sorted(path.name for path in copied.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
        assert (copied / "adapter_model.safetensors").read_bytes() == (
            adapters[record.name] / "adapter_model.safetensors").read_bytes()
    assert read_manifest(repository).to_json()["lora_adapters"] == [{"name": "small", "task_id": 1},
                                                                     {"name": "wide", "task_id": 2}]


def test_an_adapter_for_another_model_is_refused_before_anything_is_written(tiny_models, adapters, tmp_path):
    other = tmp_path / "other"
    shutil.copytree(adapters["small"], other)
    weights = load_file(other / "adapter_model.safetensors")
    key = next(name for name in weights if name.endswith("lora_A.weight"))
    weights[key] = np.zeros((2, weights[key].shape[1] + 1), dtype=np.float32)  # a wider layer than the base's
    save_file(weights, other / "adapter_model.safetensors")
    with pytest.raises(ValueError, match=r"^LoRA adapter other: model\.layers\.\d+\.self_attn\.q_proj is \d+ -> \d+ "
                                         r"in the adapter but \[\d+, \d+\] in the base model"):
        build(BuildOptions(model=tiny_models["bpe"], output=tmp_path / "repo", max_input_len=32, max_seq_len=64,
                           lora=(f"other={other}",)))
    assert not (tmp_path / "repo").exists()


def test_a_folder_that_is_no_adapter_is_refused(tiny_models, tmp_path):
    with pytest.raises(ValueError, match=r"^LoRA adapter x: .* has no adapter_config.json"):
        build(BuildOptions(model=tiny_models["bpe"], output=tmp_path / "repo", max_input_len=32, max_seq_len=64,
                           lora=(f"x={tmp_path}",)))
