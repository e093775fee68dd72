"""LoRA adapters end to end on a real tritonserver: a build with two PEFT adapters answers each adapter's requests
as PEFT does in transformers, through the ensemble and the BLS by `lora_task_id` and through the gateway by the
`model` the real `openai` client names; an unknown task id is the request's own error."""

import urllib.request

import openai
import pytest
import torch
from peft import PeftModel
from transformers import AutoModelForCausalLM

from tritonforge.builder.build import BuildOptions, build
from tritonforge.cli.serve import lora_adapters_of
from tritonforge.clients.client import GenerationError, GrpcClient
from tritonforge.facts.contract import BLS_MODEL, ENSEMBLE_MODEL, LORA_TASK_ID
from tritonforge.gateway.options import GatewayThread
from tritonforge.runtime.text.tokenization import load_tokenizer
from tritonforge.serve.ports import free_port
from tritonforge.tools.tiny_model import make_lora_adapter

from .conftest import MAX_INPUT_LEN, MAX_SEQ_LEN, lean_serving, running

pytestmark = pytest.mark.integration

MODEL = "tiny"
PROMPT = "The server reads a request"
TOKENS = 8
# Unlike each other and unlike the engine's own tests' adapters: other ranks, other layers.
ADAPTERS = {"summaries": dict(rank=6, alpha=12, target_modules=("k_proj", "o_proj", "up_proj"), seed=7, scale=40.0),
            "support": dict(rank=3, alpha=3, target_modules=("q_proj", "gate_proj"), seed=8, scale=40.0)}


@pytest.fixture(scope="module")
def adapters(tiny_models, tmp_path_factory):
    folder = tmp_path_factory.mktemp("lora-adapters")
    return {name: make_lora_adapter(tiny_models["bpe"], folder / name, **options)
            for name, options in ADAPTERS.items()}


@pytest.fixture(scope="module")
def served(tiny_models, adapters, tmp_path_factory):
    """The tiny model built with both adapters (task ids 1 and 2), served, with the gateway serve starts."""
    repository = build(BuildOptions(model=tiny_models["bpe"], output=tmp_path_factory.mktemp("lora") / "models",
                                    max_input_len=MAX_INPUT_LEN, max_seq_len=MAX_SEQ_LEN, max_batch_size=4,
                                    serving=lean_serving(), lora=tuple(f"{n}={p}" for n, p in adapters.items())),
                       progress=lambda _: None)
    with running(repository) as server:
        gateway = GatewayThread(server.grpc_url, port=free_port(), model=BLS_MODEL, served_model_name=MODEL,
                                adapters=lora_adapters_of(repository)).start()
        yield server, gateway
        gateway.stop()


@pytest.fixture(scope="module")
def references(tiny_models, adapters):
    """PEFT's greedy text for the base model (None) and each adapter."""
    tokenizer = load_tokenizer(tiny_models["bpe"])
    prompt = torch.tensor([tokenizer(PROMPT).input_ids])

    def greedy(model) -> str:
        out = model.generate(prompt, max_new_tokens=TOKENS, min_new_tokens=TOKENS, do_sample=False)
        return tokenizer.decode(out[0, prompt.shape[1]:], skip_special_tokens=True)

    answers = {None: greedy(AutoModelForCausalLM.from_pretrained(tiny_models["bpe"]).eval())}
    for name, folder in adapters.items():
        answers[name] = greedy(PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_models["bpe"]),
                                                         folder).eval())
    assert len(set(answers.values())) == len(answers)  # else the adapters would prove nothing
    return answers


TASK_IDS = {"summaries": 1, "support": 2}


@pytest.mark.parametrize("model", [ENSEMBLE_MODEL, BLS_MODEL])
def test_each_adapter_answers_as_peft_through_the_ensemble_and_the_bls(served, references, model):
    server, _ = served
    client = GrpcClient(server.grpc_url, model)
    try:
        for name, task in TASK_IDS.items():
            assert client.generate(PROMPT, max_tokens=TOKENS, min_tokens=TOKENS, top_k=1,
                                   **{LORA_TASK_ID: task}) == references[name], name
        assert client.generate(PROMPT, max_tokens=TOKENS, min_tokens=TOKENS, top_k=1) == references[None]
    finally:
        client.close()


def test_an_unknown_task_id_is_the_requests_error_naming_it(served):
    server, _ = served
    client = GrpcClient(server.grpc_url, ENSEMBLE_MODEL)
    try:
        with pytest.raises(GenerationError, match="lora_task_id: no LoRA adapter has task id 9"):
            client.generate(PROMPT, max_tokens=TOKENS, **{LORA_TASK_ID: 9})
        assert client.generate(PROMPT, max_tokens=2)  # the server goes on
    finally:
        client.close()


def test_the_openai_client_chooses_an_adapter_by_model(served, references):
    _, gateway = served
    client = openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0)
    listed = {model.id: getattr(model, "parent", None) for model in client.models.list()}
    assert listed == {MODEL: None, "summaries": MODEL, "support": MODEL}
    for name in (MODEL, *TASK_IDS):
        answer = client.completions.create(model=name, prompt=PROMPT, max_tokens=TOKENS, temperature=0,
                                           extra_body={"min_tokens": TOKENS})
        assert answer.model == name
        assert answer.choices[0].text == references[None if name == MODEL else name], name
    with pytest.raises(openai.NotFoundError, match="'summaries', 'support'"):
        client.completions.create(model="legal", prompt=PROMPT, max_tokens=2)
    with urllib.request.urlopen(f"{gateway.base_url}/metrics", timeout=30) as answer:
        metrics = answer.read().decode()
    for name in (MODEL, *TASK_IDS):  # each answered under its own name
        assert f'tritonforge_completion_tokens_total{{model="{name}"}} {float(TOKENS)}' in metrics, name
