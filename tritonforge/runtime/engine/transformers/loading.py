"""The transformers engine for a Triton model: the checkpoint loaded on its device, in-flight batching over it.
torch and transformers are imported here, when an engine model of this kind starts, never by the service."""

from __future__ import annotations

from ..service import EngineSettings
from .inflight import InflightBatchingEngine


def load_model(settings: EngineSettings):
    import torch
    from transformers import AutoModelForCausalLM

    device = settings.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = "auto" if settings.dtype == "auto" else getattr(torch, settings.dtype)
    model = AutoModelForCausalLM.from_pretrained(settings.model_path, dtype=dtype, trust_remote_code=False)
    return model.to(device).eval()


def make_engine(settings: EngineSettings) -> InflightBatchingEngine:
    return InflightBatchingEngine(load_model(settings), settings.limits)
