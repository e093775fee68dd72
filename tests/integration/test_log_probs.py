"""Log probabilities end to end: the real `openai` client asks the gateway, which asks the BLS (C++ and Python)
or the ensemble (its C++ or Python postprocessing), which ask the transformers engine of a real tritonserver;
what comes back is compared with the model's own forward pass in transformers."""

import openai
import pytest
import torch
from transformers import AutoModelForCausalLM

from tritonforge.builder.build import BuildOptions, build
from tritonforge.facts.contract import BLS_MODEL, ENSEMBLE_MODEL
from tritonforge.gateway.options import GatewayThread
from tritonforge.runtime.text.detokenization import TokenBytes
from tritonforge.runtime.text.tokenization import load_tokenizer
from tritonforge.serve.ports import free_port

from .conftest import MAX_INPUT_LEN, MAX_SEQ_LEN, lean_serving, running

pytestmark = pytest.mark.integration

MODEL = "tiny"
PROMPT = "The server reads a request"
TOKENS = 10
TOP = 3
TOLERANCE = 1e-3


@pytest.fixture(scope="module", params=["cpp", "python"])
def gateway(request, tiny_models, tmp_path_factory):
    """A gateway in front of the BLS of the given text backend, on the tiny BPE model's repository."""
    repository = build(BuildOptions(model=tiny_models["bpe"], output=tmp_path_factory.mktemp("log-probs") / "models",
                                    max_input_len=MAX_INPUT_LEN, max_seq_len=MAX_SEQ_LEN, max_batch_size=4,
                                    text_backend=request.param, serving=lean_serving()),
                       progress=lambda _: None)
    with running(repository) as server:
        gateway = GatewayThread(server.grpc_url, port=free_port(), model=BLS_MODEL, served_model_name=MODEL).start()
        gateway.server = server
        yield gateway
        gateway.stop()


@pytest.fixture
def client(gateway):
    return openai.OpenAI(base_url=f"{gateway.base_url}/v1", api_key="unused", max_retries=0)


def greedy_reference(model_dir, prompt: list[int]) -> list[tuple[bytes, float, list[tuple[bytes, float]]]]:
    """The model's own greedy answer to `prompt`, as (token bytes, log prob, [(bytes, log prob)] of the TOP
    likeliest) per generated token, from one forward pass over the prompt and the answer."""
    tokenizer = load_tokenizer(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    table = TokenBytes(tokenizer)
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=TOKENS, do_sample=False,
                             eos_token_id=tokenizer.eos_token_id)[0, len(prompt):].tolist()
        generated = out[:-1] if out and out[-1] == tokenizer.eos_token_id else out
        logits = model(torch.tensor([prompt + generated])).logits[0, len(prompt) - 1:-1].float()
    log_probs = torch.log_softmax(logits, dim=-1)
    answer = []
    for step, token in enumerate(generated):
        values, ids = torch.topk(log_probs[step], TOP)
        answer.append((table.token_bytes(token), log_probs[step, token].item(),
                       [(table.token_bytes(i), v) for i, v in zip(ids.tolist(), values.tolist())]))
    return answer


@pytest.fixture(scope="module")
def reference(tiny_models):
    """The completion's prompt tokens, and the model's greedy answer to them."""
    prompt = load_tokenizer(tiny_models["bpe"])(PROMPT).input_ids
    return len(prompt), greedy_reference(tiny_models["bpe"], prompt)


def assert_matches(entries, reference_answer):
    """Chat `logprobs.content` entries against the reference, token by token."""
    assert len(entries) == len(reference_answer)
    for entry, (token, log_prob, top) in zip(entries, reference_answer):
        assert bytes(entry.bytes) == token and entry.token == token.decode(errors="replace")
        assert entry.logprob == pytest.approx(log_prob, abs=TOLERANCE)
        assert [bytes(alternative.bytes) for alternative in entry.top_logprobs] == [b for b, _ in top]
        assert [alternative.logprob for alternative in entry.top_logprobs] == pytest.approx(
            [v for _, v in top], abs=TOLERANCE)


def test_a_completions_log_probs_whole_and_streamed_equal_the_models_forward_pass(client, reference):
    prompt_tokens, answer = reference
    request = {"model": MODEL, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "logprobs": TOP}
    completion = client.completions.create(**request)
    assert completion.usage.prompt_tokens == prompt_tokens
    logprobs = completion.choices[0].logprobs
    assert len(logprobs.tokens) == len(answer) == completion.usage.completion_tokens
    assert logprobs.tokens == [token.decode(errors="replace") for token, _, _ in answer]
    assert logprobs.token_logprobs == pytest.approx([log_prob for _, log_prob, _ in answer], abs=TOLERANCE)
    for top, (_, _, expected) in zip(logprobs.top_logprobs, answer):  # keyed by text: alike texts share a key
        assert top == {text: pytest.approx(value, abs=TOLERANCE) for text, value in
                       reversed([(token.decode(errors="replace"), value) for token, value in expected])}
    assert logprobs.text_offset[0] == 0 and logprobs.text_offset == sorted(logprobs.text_offset)

    chunks = list(client.completions.create(**request, stream=True))
    streamed = [chunk.choices[0].logprobs for chunk in chunks if chunk.choices and chunk.choices[0].logprobs]
    assert [value for part in streamed for value in part.token_logprobs] == logprobs.token_logprobs
    assert [offset for part in streamed for offset in part.text_offset] == logprobs.text_offset
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == completion.choices[0].text


def test_chat_log_probs_equal_the_models_forward_pass(client, tiny_models):
    """A chat's prompt is its template's: the reference is taken on the tokens the chat template makes."""
    tokenizer = load_tokenizer(tiny_models["bpe"])
    messages = [{"role": "user", "content": PROMPT}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt)
    answer = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=TOKENS, temperature=0,
                                            logprobs=True, top_logprobs=TOP)
    assert answer.usage.prompt_tokens == len(prompt)
    assert_matches(answer.choices[0].logprobs.content, greedy_reference(tiny_models["bpe"], prompt))


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_chat_log_probs_name_each_token_by_its_bytes_which_make_the_text(client, stream):
    """A chat answer's tokens, whole or streamed: their bytes joined make the answer's text, each entry has the
    TOP alternatives asked for, likeliest first, and the chosen one is the likeliest (greedy)."""
    request = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": TOKENS,
               "temperature": 0, "logprobs": True, "top_logprobs": TOP}
    if stream:
        chunks = [chunk for chunk in client.chat.completions.create(**request, stream=True) if chunk.choices]
        text = "".join(chunk.choices[0].delta.content or "" for chunk in chunks)
        entries = [entry for chunk in chunks if chunk.choices[0].logprobs
                   for entry in chunk.choices[0].logprobs.content]
        whole = client.chat.completions.create(**request)
        assert [(e.bytes, e.logprob) for e in entries] == [(e.bytes, e.logprob)
                                                           for e in whole.choices[0].logprobs.content]
    else:
        answer = client.chat.completions.create(**request)
        text, entries = answer.choices[0].message.content, answer.choices[0].logprobs.content
        assert len(entries) == answer.usage.completion_tokens
    # Random weights write invalid UTF-8 at times: the text has U+FFFD where the bytes do not make a character.
    assert entries and b"".join(bytes(entry.bytes) for entry in entries).decode(errors="replace") == text
    for entry in entries:
        values = [alternative.logprob for alternative in entry.top_logprobs]
        assert len(values) == TOP and values == sorted(values, reverse=True)
        assert entry.top_logprobs[0].bytes == entry.bytes and entry.logprob == pytest.approx(values[0])


@pytest.mark.parametrize("max_tokens", [0, 3])
def test_an_echoed_prompts_log_probs_equal_the_models_forward_pass(client, tiny_models, max_tokens):
    """`echo` with `logprobs`, as evaluation harnesses score a text: the answer is the prompt (and what follows),
    its first token has no log probability, each other one its own, from the model's forward pass."""
    tokenizer = load_tokenizer(tiny_models["bpe"])
    model = AutoModelForCausalLM.from_pretrained(tiny_models["bpe"]).eval()
    table = TokenBytes(tokenizer)
    prompt = tokenizer(PROMPT).input_ids
    with torch.no_grad():
        expected = torch.log_softmax(model(torch.tensor([prompt])).logits[0].float(), dim=-1)
    request = {"model": MODEL, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "logprobs": 2,
               "echo": True}
    completion = client.completions.create(**request)
    choice, logprobs = completion.choices[0], completion.choices[0].logprobs
    assert choice.text.startswith(PROMPT) and (max_tokens or choice.text == PROMPT)
    assert completion.usage.completion_tokens == max_tokens and (max_tokens or choice.finish_reason == "length")
    assert len(logprobs.tokens) == len(prompt) + max_tokens
    assert logprobs.tokens[:len(prompt)] == [table.token_bytes(token).decode(errors="replace") for token in prompt]
    assert logprobs.token_logprobs[0] is None and logprobs.top_logprobs[0] is None
    assert logprobs.token_logprobs[1:len(prompt)] == pytest.approx(
        [expected[place - 1, prompt[place]].item() for place in range(1, len(prompt))], abs=TOLERANCE)
    for place in range(1, len(prompt)):
        values = torch.topk(expected[place - 1], 2).values.tolist()
        assert sorted(logprobs.top_logprobs[place].values(), reverse=True) == pytest.approx(values, abs=TOLERANCE)
    chunks = list(client.completions.create(**request, stream=True))
    assert "".join(chunk.choices[0].text for chunk in chunks if chunk.choices) == choice.text
    streamed = [value for chunk in chunks if chunk.choices and chunk.choices[0].logprobs
                for value in chunk.choices[0].logprobs.token_logprobs]
    assert streamed[0] is None and streamed[1:] == pytest.approx(logprobs.token_logprobs[1:])


def test_log_probs_without_alternatives_and_a_request_without_them_beside(client):
    plain = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=4, temperature=0)
    asked = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": PROMPT}],
                                           max_tokens=4, temperature=0, logprobs=True)
    assert plain.choices[0].logprobs is None
    assert asked.choices[0].message.content == plain.choices[0].message.content
    assert all(entry.top_logprobs == [] for entry in asked.choices[0].logprobs.content)


@pytest.fixture(scope="module")
def ensemble_client(gateway):
    """The real client of a gateway in front of the same server's ensemble (the C++ or the Python postprocessing,
    as the server's text backend)."""
    ensemble = GatewayThread(gateway.server.grpc_url, port=free_port(), model=ENSEMBLE_MODEL,
                             served_model_name=MODEL).start()
    yield openai.OpenAI(base_url=f"{ensemble.base_url}/v1", api_key="unused", max_retries=0)
    ensemble.stop()


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
def test_the_ensembles_log_probs_equal_the_models_forward_pass(ensemble_client, reference, stream):
    """Through the ensemble the engine's log probs pass as they are and postprocessing names each token and
    alternative by its bytes: the same answer as the BLS's, whole and streamed."""
    _, answer = reference
    request = {"model": MODEL, "prompt": PROMPT, "max_tokens": TOKENS, "temperature": 0, "logprobs": TOP}
    if stream:
        parts = [chunk.choices[0].logprobs for chunk in ensemble_client.completions.create(**request, stream=True)
                 if chunk.choices and chunk.choices[0].logprobs]
        tokens = [token for part in parts for token in part.tokens]
        values = [value for part in parts for value in part.token_logprobs]
        tops = [top for part in parts for top in part.top_logprobs]
    else:
        logprobs = ensemble_client.completions.create(**request).choices[0].logprobs
        tokens, values, tops = logprobs.tokens, logprobs.token_logprobs, logprobs.top_logprobs
    assert tokens == [token.decode(errors="replace") for token, _, _ in answer]
    assert values == pytest.approx([log_prob for _, log_prob, _ in answer], abs=TOLERANCE)
    for top, (_, _, expected) in zip(tops, answer, strict=True):
        assert top == {text: pytest.approx(value, abs=TOLERANCE) for text, value in
                       reversed([(token.decode(errors="replace"), value) for token, value in expected])}


def test_the_ensembles_chat_log_probs_carry_each_tokens_bytes(ensemble_client, tiny_models):
    tokenizer = load_tokenizer(tiny_models["bpe"])
    messages = [{"role": "user", "content": PROMPT}]
    prompt = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if isinstance(prompt, dict) or hasattr(prompt, "keys") else prompt)
    answer = ensemble_client.chat.completions.create(model=MODEL, messages=messages, max_tokens=TOKENS,
                                                     temperature=0, logprobs=True, top_logprobs=TOP)
    assert_matches(answer.choices[0].logprobs.content, greedy_reference(tiny_models["bpe"], prompt))


def test_the_ensembles_log_probs_without_alternatives_name_every_token(ensemble_client, client):
    """No alternatives asked (chat's `logprobs` alone): each token still comes, as through the BLS."""
    request = {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 4,
               "temperature": 0, "logprobs": True}
    through_ensemble = ensemble_client.chat.completions.create(**request).choices[0].logprobs.content
    through_bls = client.chat.completions.create(**request).choices[0].logprobs.content
    assert [(entry.bytes, entry.top_logprobs) for entry in through_ensemble] == [
        (entry.bytes, []) for entry in through_bls] and len(through_bls) == 4
    assert [entry.logprob for entry in through_ensemble] == pytest.approx(
        [entry.logprob for entry in through_bls], abs=TOLERANCE)


def test_the_gateway_in_front_of_the_ensemble_refuses_an_echoed_prompts_log_probs_naming_the_field(
        ensemble_client):
    """The ensemble returns no log probabilities of the prompt (its postprocessing sees only the engine's tokens)."""
    with pytest.raises(openai.BadRequestError) as refusal:
        ensemble_client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, logprobs=1, echo=True)
    assert refusal.value.body["param"] == "echo" and BLS_MODEL in refusal.value.body["message"]
