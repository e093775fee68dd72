"""LoRA adapters in the in-flight batching engine against PEFT's own: each adapter's greedy tokens equal those of
PEFT applied to the base model in transformers, and a batch mixing adapters and the base gives every row its own
adapter's tokens; adapters PEFT saves with what the engine does not apply are refused in one line."""

import json

import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from tritonforge.facts.errors import RequestError
from tritonforge.facts.limits import EngineLimits
from tritonforge.runtime.engine.generation import GenerationRequest
from tritonforge.runtime.engine.lora import AdapterError, AdapterRecord, checkpoint_shapes, read_adapter
from tritonforge.runtime.engine.transformers.inflight import InflightBatchingEngine
from tritonforge.runtime.engine.transformers.lora_layers import load_adapters
from tritonforge.runtime.text.tokenization import load_tokenizer
from tritonforge.tools.tiny_model import make_lora_adapter

from .sinks import Sink

WAIT_S = 120
PROMPTS = ["The engine", "Hello world, the server reads a request", "A"]
# Ranks, target modules and scalings unlike one another: rank padding, modules some adapters leave alone,
# alpha_pattern and rsLoRA's scaling all meet in one batch.
ADAPTERS = {
    "attention": dict(rank=4, alpha=8, target_modules=("q_proj", "v_proj"), seed=1, scale=40.0),
    "everything": dict(rank=8, alpha=16, target_modules=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj",
                                                         "up_proj", "down_proj"), seed=2, use_rslora=True, scale=20.0),
    "mlp": dict(rank=2, alpha=4, target_modules=("down_proj", "up_proj"), seed=3, alpha_pattern={"up_proj": 16},
                scale=40.0),
}


@pytest.fixture(scope="module")
def adapters(tiny_models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("adapters")
    return {name: make_lora_adapter(tiny_models["bpe"], folder / name, **options)
            for name, options in ADAPTERS.items()}


@pytest.fixture(scope="module")
def tokenizer(tiny_models):
    return load_tokenizer(tiny_models["bpe"])


@pytest.fixture(scope="module")
def references(tiny_models, adapters, tokenizer):
    """PEFT's greedy tokens for each (adapter or None, prompt)."""
    def greedy(model, prompt):
        ids = tokenizer(prompt).input_ids
        out = model.generate(torch.tensor([ids]), max_new_tokens=16, min_new_tokens=16, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id)
        return out[0, len(ids):].tolist()

    answers = {}
    base = AutoModelForCausalLM.from_pretrained(tiny_models["bpe"]).eval()
    for prompt in PROMPTS:
        answers[None, prompt] = greedy(base, prompt)
    for name, folder in adapters.items():
        peft = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_models["bpe"]), folder).eval()
        for prompt in PROMPTS:
            answers[name, prompt] = greedy(peft, prompt)
    return answers


@pytest.fixture(scope="module", params=["eager", "static"])
def engine(tiny_models, adapters, request):
    """An engine with the three adapters, task ids 1-3 (the decode step run eagerly, and as a CUDA graph would
    capture it: every slot, static inputs)."""
    model = AutoModelForCausalLM.from_pretrained(tiny_models["bpe"]).eval()
    records = [AdapterRecord(name=name, task_id=task, path=str(folder))
               for task, (name, folder) in enumerate(adapters.items(), start=1)]
    bank = load_adapters(model, records, 4, checkpoint_shapes(tiny_models["bpe"]))
    engine = InflightBatchingEngine(model, EngineLimits(max_batch_size=4, max_input_len=64, max_seq_len=128),
                                    adapters=bank)
    if request.param == "static":
        engine.use_decode_graphs(capture=False)
    yield engine
    engine.shutdown()


TASK_IDS = {None: None, "attention": 1, "everything": 2, "mlp": 3}


def submit(engine, tokenizer, adapter, prompt):
    sink = Sink()
    request = GenerationRequest(request_id=f"{adapter}-{prompt}", prompt_ids=tokenizer(prompt).input_ids, sink=sink,
                                max_new_tokens=16, stream=True, lora_task_id=TASK_IDS[adapter])
    request.sampling = type(request.sampling)(min_tokens=16)
    engine.validate(request)
    engine.submit(request)
    return sink


def tokens(sink) -> list[int]:
    assert sink.done.wait(WAIT_S) and sink.error is None, sink.error
    return sink.result.token_ids


def test_the_adapters_change_the_answers(references):
    """Else the comparisons below would hold for an engine that ignores adapters."""
    for prompt in PROMPTS:
        answers = [tuple(references[name, prompt]) for name in TASK_IDS]
        assert len(set(answers)) == len(answers), prompt


def test_each_adapter_alone_answers_as_peft(engine, tokenizer, references):
    for adapter in TASK_IDS:
        for prompt in PROMPTS:
            assert tokens(submit(engine, tokenizer, adapter, prompt)) == references[adapter, prompt], (adapter, prompt)


def test_a_batch_mixing_the_adapters_and_the_base_gives_each_row_its_own(engine, tokenizer, references):
    """Four rows, one per adapter and the base, decoded together; then the same with the rows admitted while
    others decode (a prefill of one adapter beside decode steps of the others)."""
    sinks = {adapter: submit(engine, tokenizer, adapter, PROMPTS[1]) for adapter in TASK_IDS}
    for adapter, sink in sinks.items():
        assert tokens(sink) == references[adapter, PROMPTS[1]], adapter
    staggered = []
    for index, adapter in enumerate(TASK_IDS):
        if staggered:
            assert staggered[-1][1].started.wait(WAIT_S)
        prompt = PROMPTS[index % len(PROMPTS)]
        staggered.append(((adapter, prompt), submit(engine, tokenizer, adapter, prompt)))
    for key, sink in staggered:
        assert tokens(sink) == references[key], key


def test_an_unknown_task_id_is_refused_naming_the_field(engine, tokenizer):
    request = GenerationRequest(request_id="x", prompt_ids=[1, 2], sink=Sink(), max_new_tokens=2, lora_task_id=9)
    with pytest.raises(RequestError, match=r"^lora_task_id: no LoRA adapter has task id 9 .*1 \(attention\)"):
        engine.validate(request)


def test_an_engine_without_adapters_refuses_a_task_id(tiny_models):
    model = AutoModelForCausalLM.from_pretrained(tiny_models["bpe"]).eval()
    engine = InflightBatchingEngine(model, EngineLimits(max_batch_size=1, max_input_len=8, max_seq_len=16))
    try:
        request = GenerationRequest(request_id="x", prompt_ids=[1], sink=Sink(), max_new_tokens=1, lora_task_id=1)
        with pytest.raises(RequestError, match="^lora_task_id: .*built without adapters"):
            engine.validate(request)
    finally:
        engine.shutdown()


@pytest.mark.parametrize(("key", "value", "named"), [
    ("use_dora", True, "DoRA"), ("modules_to_save", ["lm_head"], "modules_to_save"), ("bias", "all", "bias"),
    ("peft_type", "IA3", "peft_type")])
def test_what_the_engine_does_not_apply_is_refused_in_one_line(adapters, tmp_path, key, value, named):
    copy = tmp_path / "adapter"
    copy.mkdir()
    config = json.loads((adapters["mlp"] / "adapter_config.json").read_text())
    (copy / "adapter_config.json").write_text(json.dumps({**config, key: value}))
    (copy / "adapter_model.safetensors").write_bytes((adapters["mlp"] / "adapter_model.safetensors").read_bytes())
    with pytest.raises(AdapterError, match=f"^LoRA adapter odd: .*{named}") as raised:
        read_adapter("odd", copy)
    assert "\n" not in str(raised.value)
