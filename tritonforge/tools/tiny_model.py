"""Build a small Llama-architecture checkpoint and tokenizer offline, deterministically.

Used by the tests, the demo and the benchmarks, where no weights can be downloaded. The result is an ordinary
Hugging Face checkpoint directory: everything else in tritonforge loads it exactly like a real one.

Two tokenizer families, because streaming detokenization breaks differently on each:
- ``bpe``: byte-level BPE (GPT-2 / Llama-3 style), every byte is a symbol of the alphabet;
- ``sentencepiece``: SentencePiece-style BPE with ``▁`` word markers, a prefix space and byte fallback
  (Llama-2 / Mistral style). Its alphabet is kept small so that CJK and emoji go through ``<0xNN>`` tokens.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass
from pathlib import Path

from ..builder.corpus import corpus_lines

logger = logging.getLogger(__name__)

TOKENIZER_FAMILIES = ("bpe", "sentencepiece")

# A chat template in the usual shape: role headers, an end-of-turn marker, an optional generation prompt; tools
# shown in a system turn and tool calls written as Hermes and Qwen models write them (<tool_call> JSON </tool_call>).
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% if tools %}<|start|>system\nYou may call these functions:\n"
    "{% for tool in tools %}{{ tool | tojson }}\n{% endfor %}"
    "To call one, write <tool_call>\n{\"name\": <name>, \"arguments\": <arguments>}\n</tool_call><|end|>\n{% endif %}"
    "{% for message in messages %}"
    "<|start|>{{ message['role'] }}\n{% if message['content'] is not none %}{{ message['content'] }}{% endif %}"
    "{% for call in message['tool_calls'] or [] %}<tool_call>\n"
    "{{ {'name': call['function']['name'], 'arguments': call['function']['arguments']} | tojson }}\n</tool_call>"
    "{% endfor %}<|end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|start|>assistant\n{% endif %}"
)


@dataclass(frozen=True, kw_only=True)
class TinyModelShape:
    """The model's dimensions; the defaults give a ~1M-parameter model that runs fast on two CPU cores."""

    hidden_size: int = 64
    intermediate_size: int = 176
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    max_position_embeddings: int = 2048
    vocab_size: int = 1024
    # With the usual 0.02 a random model's logits are nearly flat and greedy decoding repeats one token.
    initializer_range: float = 0.5
    seed: int = 0
    dtype: str = "float32"  # of the saved weights


# "1b": the body of a ~1B-parameter Llama (Llama-3.2-1B's layers, a small vocabulary) for GPU measurements.
# At that depth the tiny model's large init overflows, so it keeps the usual 0.02.
SHAPES = {
    "tiny": TinyModelShape(),
    "1b": TinyModelShape(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32,
                         num_key_value_heads=8, initializer_range=0.02, dtype="bfloat16"),
}


def _train_bpe(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start|>", "<|end|>"]
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer)
    bos = "<|begin_of_text|>"
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A {bos} $B", special_tokens=[(bos, tokenizer.token_to_id(bos))]
    )
    return tokenizer, {"bos_token": bos, "eos_token": "<|end_of_text|>", "pad_token": "<|end_of_text|>"}


ALPHABET_SIZE = 80  # characters of the SentencePiece-style alphabet; the rest fall back to bytes


def _train_sentencepiece(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    specials = ["<unk>", "<s>", "</s>", "<|start|>", "<|end|>"]
    # Train with word splitting so that no merge crosses a word marker, as SentencePiece does.
    trainer_tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    trainer_tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    # The 80 most frequent characters, ties broken by the character: left to the trainer, a tie at the cutoff
    # is broken in hash order, and the vocabulary (so every test's expected tokens) changed from run to run.
    counts: dict[str, int] = {}
    for line in corpus_lines():
        for character in "▁" + line.replace(" ", "▁"):  # the text as the trainer sees it, after Metaspace
            counts[character] = counts.get(character, 0) + 1
    alphabet = sorted(counts, key=lambda character: (-counts[character], character))[:ALPHABET_SIZE]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - 256, special_tokens=specials, limit_alphabet=ALPHABET_SIZE,
        initial_alphabet=alphabet, show_progress=False
    )
    trainer_tokenizer.train_from_iterator(corpus_lines(), trainer)
    trained = json.loads(trainer_tokenizer.to_str())["model"]

    # Llama-2 layout: specials, then the 256 byte-fallback pieces, then the learned pieces.
    vocab: dict[str, int] = {token: index for index, token in enumerate(specials)}
    for byte in range(256):
        vocab[f"<0x{byte:02X}>"] = len(vocab)
    for token, _ in sorted(trained["vocab"].items(), key=lambda item: item[1]):
        vocab.setdefault(token, len(vocab))
    merges = [tuple(merge) if isinstance(merge, list) else tuple(merge.split(" ")) for merge in trained["merges"]]

    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.add_special_tokens(specials)
    tokenizer.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tokenizer.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", vocab["<s>"])]
    )
    return tokenizer, {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>", "pad_token": "</s>"}


def _write_portable_tokenizer_config(output: Path, tokenizer) -> None:
    """A tokenizer_config.json in the form real checkpoints ship, which transformers 4.x (NVIDIA's
    TensorRT-LLM containers) and 5.x both read; transformers 5 writes a `TokenizersBackend` class that 4.x
    does not know."""
    path = output / "tokenizer_config.json"
    config = json.loads(path.read_text())
    config["tokenizer_class"] = "PreTrainedTokenizerFast"
    config.pop("backend", None)
    extra = config.pop("extra_special_tokens", None)
    if isinstance(extra, list):
        config["additional_special_tokens"] = extra
    path.write_text(json.dumps(config, indent=2) + "\n")


def make_tiny_model(output_dir: str | Path, *, tokenizer_family: str = "bpe",
                    shape: TinyModelShape | None = None) -> Path:
    """Write a tokenizer and a randomly initialised LlamaForCausalLM to ``output_dir``; return the path."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    if tokenizer_family not in TOKENIZER_FAMILIES:
        raise ValueError(f"tokenizer family must be one of {TOKENIZER_FAMILIES}, got {tokenizer_family!r}")
    shape = shape or TinyModelShape()
    output = Path(output_dir)
    output.mkdir(parents=True, exist_ok=True)

    train = _train_bpe if tokenizer_family == "bpe" else _train_sentencepiece
    backend, special_tokens = train(shape.vocab_size)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, chat_template=CHAT_TEMPLATE, clean_up_tokenization_spaces=False,
        additional_special_tokens=["<|start|>", "<|end|>"], **special_tokens,
    )
    tokenizer.save_pretrained(output)
    _write_portable_tokenizer_config(output, tokenizer)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=shape.hidden_size,
        intermediate_size=shape.intermediate_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        num_key_value_heads=shape.num_key_value_heads,
        max_position_embeddings=shape.max_position_embeddings,
        initializer_range=shape.initializer_range,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(shape.seed)
    model = LlamaForCausalLM(config)
    model.generation_config = GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id,
        do_sample=False,
    )
    model.to(getattr(torch, shape.dtype)).save_pretrained(output)
    logger.info("wrote a %s-tokenizer tiny Llama to %s", tokenizer_family, output)
    return output


def degraded_copy(checkpoint: str | Path, output_dir: str | Path, *, noise: float = 0.0, int8: bool = False,
                  seed: int = 0) -> Path:
    """A copy of `checkpoint` with its matrices degraded, to check that the accuracy gate catches it:
    `int8` rounds every 2-D weight to int8 per row (symmetric, absmax: what dynamic int8 quantization
    keeps) and back; `noise` adds Gaussian noise of `noise` × the matrix's own standard deviation."""
    import shutil

    import torch
    from safetensors.torch import load_file, save_file

    source, output = Path(checkpoint), Path(output_dir)
    output.mkdir(parents=True, exist_ok=False)
    generator = torch.Generator().manual_seed(seed)
    for file in source.iterdir():
        if file.suffix != ".safetensors":
            shutil.copy2(file, output / file.name)
            continue
        tensors = load_file(file)
        for name, tensor in tensors.items():
            if tensor.ndim != 2 or not tensor.is_floating_point():
                continue
            weight = tensor.float()
            if int8:
                scale = weight.abs().amax(dim=1, keepdim=True).clamp(min=1e-12) / 127
                weight = (weight / scale).round().clamp(-127, 127) * scale
            if noise:
                weight = weight + torch.randn(weight.shape, generator=generator) * weight.std() * noise
            tensors[name] = weight.to(tensor.dtype).contiguous()
        save_file(tensors, output / file.name, metadata={"format": "pt"})
    return output


def make_lora_adapter(checkpoint: str | Path, output_dir: str | Path, *, rank: int = 8, alpha: float = 16,
                      target_modules: tuple[str, ...] = ("q_proj", "v_proj"), seed: int = 0, use_rslora: bool = False,
                      alpha_pattern: dict[str, float] | None = None, scale: float = 1.0) -> Path:
    """A LoRA adapter of `checkpoint` made by PEFT (as a fine-tune would save it) with random non-zero factors
    (PEFT's own initialisation leaves B at zero, an update of nothing), B multiplied by `scale`."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    base = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(target_modules), use_rslora=use_rslora,
                        alpha_pattern=alpha_pattern or {}, init_lora_weights=False, task_type="CAUSAL_LM")
    model = get_peft_model(base, config)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "lora_B" in name:
                parameter.mul_(scale)
    output = Path(output_dir)
    model.save_pretrained(output, safe_serialization=True)
    return output
