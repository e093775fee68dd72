"""Where the transformers engine runs and in which dtype, for one process (loading.py) or each rank of a tensor-
parallel one (tensor_parallel.py). torch is imported when asked, never by the service."""

from __future__ import annotations

from ..service import EngineSettings


def engine_device(settings: EngineSettings):
    """Where the engine runs: `cuda:N` where Triton placed the instance on GPU N (build --gpus), else --device
    (auto: the first GPU where there is one). A GPU becomes this process's current device before CUDA is first
    used, so that nothing of the engine's lands on GPU 0 by default."""
    import torch

    device = settings.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(device)
    if device.type == "cuda":
        device = torch.device("cuda", device.index or 0)
        torch.cuda.set_device(device)
    return device


def model_dtype(settings: EngineSettings):
    import torch

    return "auto" if settings.dtype == "auto" else getattr(torch, settings.dtype)
