"""The transformers engine for a Triton model: the checkpoint loaded on its device, in-flight batching over it.
torch and transformers are imported here, when an engine model of this kind starts, never by the service."""

from __future__ import annotations

import logging
from pathlib import Path

from ..lora import checkpoint_shapes
from ..service import EngineSettings
from .grammar import xgrammar_available
from .inflight import InflightBatchingEngine
from .lora_layers import load_adapters
from .placement import engine_device, model_dtype

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")  # any one: a tokenizer is there


def load_model(settings: EngineSettings):
    from transformers import AutoModelForCausalLM

    device = engine_device(settings)
    model = AutoModelForCausalLM.from_pretrained(settings.model_path, dtype=model_dtype(settings),
                                                 trust_remote_code=False)
    return model.to(device).eval()


def load_guided_tokenizer(settings: EngineSettings):
    """The tokenizer guided decoding compiles grammars for: the build's (preprocessing's), else one beside the
    checkpoint. None, and guided requests are refused, where there is none or xgrammar is not installed."""
    from ...text.tokenization import load_tokenizer

    folder = settings.tokenizer_dir or settings.model_path
    if not any((Path(folder) / name).is_file() for name in TOKENIZER_FILES):
        logger.warning("guided decoding is off: no tokenizer at %s (a repository built before guided decoding: "
                       "rebuild it)", folder)
        return None
    if not xgrammar_available():
        logger.warning("guided decoding is off: xgrammar is not installed (pip install xgrammar)")
        return None
    return load_tokenizer(folder)


def make_engine(settings: EngineSettings) -> InflightBatchingEngine:
    if settings.tensor_parallel_size > 1:  # the model split over ranks this engine starts (tensor_parallel.py)
        if settings.lora_adapters:
            raise ValueError("LoRA adapters need tensor_parallel_size 1 in the transformers engine")
        from .tensor_parallel import make_tensor_parallel_engine

        return make_tensor_parallel_engine(settings, tokenizer=load_guided_tokenizer(settings))
    model = load_model(settings)
    adapters = load_adapters(model, list(settings.lora_adapters), settings.limits.max_batch_size or 1,
                             checkpoint_shapes(Path(settings.model_path)))
    return InflightBatchingEngine(model, settings.limits, tokenizer=load_guided_tokenizer(settings),
                                  adapters=adapters)
