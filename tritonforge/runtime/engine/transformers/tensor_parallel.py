"""Tensor parallelism for the transformers engine: one engine's weights split over T devices by transformers'
tensor-parallel plan for the model (`tp_plan="auto"`: its config's `base_model_tp_plan`), on torch.distributed
ranks that the engine model owns.

Rank 0 is the engine model's stub: the whole `InflightBatchingEngine` (scheduling, sampling, responses) runs there.
Ranks 1..T-1 are worker processes it starts (`python -m tritonforge.runtime.engine.transformers.tensor_parallel`)
on the devices after its own, and stops with the engine, as the tensorrtllm backend owns its MPI ranks. Each
forward pass of rank 0 is mirrored (`inflight.StepMirror`): just before it, rank 0 broadcasts what the pass is (a
prefill of which prompts into which slots, or a decode step of which rows at which positions and length) and every
worker runs the same pass on its shard of the weights and its own slot cache (its share of the key-value heads),
so that the collectives inside the pass meet: the all-reduce after each row-wise layer, the gather of the logits.
Only rank 0 samples (the gathered logits are whole there) and answers.

What the next pass is goes over a gloo group, as a header of four integers on the host (a worker waits there for
as long as the engine idles); the pass's token ids and positions go over the default group (NCCL on GPUs, with no
copy to the host on rank 0; gloo on CPUs, as the tests run). Decode steps run eagerly: a replayed CUDA graph runs
no Python that could tell the other ranks.

A worker that dies, or a step that fails on rank 0 while the ranks may be mid-pass, leaves the ranks out of step
for good: the engine model's process ends, with one error line, and the server's supervisor restarts the server,
as for any dead stub (docs/design/faults.md#supervisor).
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
from transformers import DynamicCache

from ....facts.limits import EngineLimits
from ..service import EngineSettings
from .inflight import (
    InflightBatchingEngine,
    SlotCache,
    _attention_backends,
    _on_device,
    check_cache_layers,
    decode_mask,
)
from .placement import engine_device, model_dtype
from .slot_attention import use_slot_attention

logger = logging.getLogger(__name__)

_STOP, _PREFILL, _DECODE = 0, 1, 2  # a header's op: [op, rows, length, kept logits]
_KEEP_ALL, _KEEP_ROWS = -1, -2  # a prefill's kept logits: all, one position a row (sent), or the last n (n >= 0)
# A worker waits for the next pass for as long as the engine idles, so the control group's waits never time out in
# practice; a pass's own collectives (and the load) end well within the other, or a rank is gone.
CONTROL_TIMEOUT = timedelta(days=3650)
PASS_TIMEOUT = timedelta(minutes=30)
STOP_WAIT_S = 30.0  # how long `close` waits for the workers to exit before it kills them
_RANK_ENVIRONMENT = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")


@dataclass(frozen=True)
class RankSpec:
    """What a worker rank needs, handed over as JSON on its command line."""

    rank: int
    world_size: int
    port: int  # rank 0's rendezvous on 127.0.0.1
    device: str  # "cpu" or "cuda:N"
    model_path: str
    dtype: str
    slots: int  # the engine's max_batch_size
    max_seq_len: int
    parent_pid: int  # rank 0's process: a worker ends with it


def rank_devices(device: torch.device, world_size: int) -> list[str]:
    """Each rank's device: rank r on the r-th GPU from the engine's own, or every rank on the CPU."""
    if device.type == "cpu":
        return ["cpu"] * world_size
    first, visible = device.index or 0, torch.cuda.device_count()
    if first + world_size > visible:
        raise ValueError(f"tensor_parallel_size {world_size} from {device} needs GPUs {first}.."
                         f"{first + world_size - 1}; {visible} are visible")
    return [f"cuda:{first + rank}" for rank in range(world_size)]


def join_ranks(rank: int, world_size: int, port: int, device: str):
    """Join the ranks: the default group (NCCL on GPUs, gloo on CPUs) and the gloo group of the headers, which
    this returns. transformers binds each rank to the GPU LOCAL_RANK names: here, the rank's own device."""
    on_gpu = torch.device(device).type == "cuda"
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world_size),
                      LOCAL_RANK=str(torch.device(device).index or 0))
    if on_gpu:
        torch.cuda.set_device(torch.device(device))
    else:  # ranks on one machine's cores: each its share, or their spinning threads take each other's (30x slower)
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))
    dist.init_process_group("nccl" if on_gpu else "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size, timeout=PASS_TIMEOUT,
                            device_id=torch.device(device) if on_gpu else None)
    return dist.new_group(backend="gloo", timeout=CONTROL_TIMEOUT)


def _parallel_arguments(world_size: int) -> dict:
    """from_pretrained's arguments for the model's own plan over `world_size` ranks."""
    try:
        from transformers.distributed import DistributedConfig as config_class
    except ImportError:
        config_class = None
    if config_class is not None and "tp_plan" in getattr(config_class, "__dataclass_fields__", {}):
        return {"distributed_config": config_class(tp_plan="auto", tp_size=world_size)}
    return {"tp_plan": "auto", "tp_size": world_size}  # transformers 4.x (NVIDIA's containers)


def load_sharded_model(model_path: str, dtype, world_size: int):
    """This rank's shard of the checkpoint (each rank reads only its share of every split weight), on the device
    `join_ranks` bound. Needs `accelerate`, which transformers requires for any device placement."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, trust_remote_code=False,
                                                 **_parallel_arguments(world_size))
    return model.eval()


def python_executable() -> str:
    """This interpreter, to start a worker with. Inside Triton's Python backend `sys.executable` can name the stub's
    binary, which cannot run a module: then the python of the interpreter's own prefix."""
    if sys.executable and Path(sys.executable).name.startswith("python"):
        return sys.executable
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    for folder in (sys.exec_prefix, sys.prefix):
        for name in (version, "python3"):
            if (Path(folder) / "bin" / name).is_file():
                return str(Path(folder) / "bin" / name)
    return shutil.which(version) or shutil.which("python3") or sys.executable


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _end_process() -> None:
    os._exit(1)  # a dead stub: its server's supervisor restarts the server


class TensorParallelRanks:
    """Rank 0's side: starts the workers, joins them, tells them every pass (`inflight.StepMirror`), stops them.
    `on_lost` is called, once, when the ranks are out of step for good (default: this process ends)."""

    def __init__(self, settings: EngineSettings, device: torch.device, *, on_lost: Callable[[], None] | None = None):
        self.world_size = settings.tensor_parallel_size
        devices = rank_devices(device, self.world_size)
        port = _free_port()
        self._on_lost = on_lost or _end_process
        self._closed = threading.Event()
        self._lost = threading.Event()
        self._header = torch.zeros(4, dtype=torch.long)
        self._environment = {name: os.environ.get(name) for name in _RANK_ENVIRONMENT}
        self._threads = torch.get_num_threads()
        self.workers = [self._start(RankSpec(
            rank=rank, world_size=self.world_size, port=port, device=devices[rank], model_path=settings.model_path,
            dtype=settings.dtype, slots=settings.limits.max_batch_size or 1, max_seq_len=settings.limits.max_seq_len,
            parent_pid=os.getpid())) for rank in range(1, self.world_size)]
        threading.Thread(target=self._watch, name="tensor-parallel-ranks", daemon=True).start()
        try:
            self.control = join_ranks(0, self.world_size, port, devices[0])
        except BaseException:
            self._closed.set()
            for worker in self.workers:
                worker.kill()
            raise

    @staticmethod
    def _start(spec: RankSpec) -> subprocess.Popen:
        # The stub's own import path: the worker imports tritonforge as the stub does.
        environment = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
        command = [python_executable(), "-m", __name__, json.dumps(dataclasses.asdict(spec))]
        logger.info("starting tensor-parallel rank %d of %d on %s", spec.rank, spec.world_size, spec.device)
        return subprocess.Popen(command, env=environment)

    def _watch(self) -> None:
        while not self._closed.wait(0.5):
            for rank, worker in enumerate(self.workers, start=1):
                code = worker.poll()
                if code is not None and not self._closed.is_set():
                    self.lost(f"tensor-parallel rank {rank} (pid {worker.pid}) exited with code {code}")
                    return

    def lost(self, why: str) -> None:
        if self._lost.is_set():
            return
        self._lost.set()
        logger.error("%s: the engine's ranks are out of step for good; this engine model's process ends (the "
                     "server's supervisor restarts the server)", why)
        self._on_lost()

    # ---- the mirror: rank 0's engine thread ---------------------------------------------------------------------

    def prefill(self, input_ids: torch.Tensor, keep: dict, slots: list[int]) -> None:
        kept = keep.get("logits_to_keep")
        code = _KEEP_ALL if kept is None else kept if isinstance(kept, int) else _KEEP_ROWS
        self._announce(_PREFILL, *input_ids.shape, code)
        self._share(input_ids)
        self._share(torch.tensor(slots, dtype=torch.long, device=input_ids.device))
        if code == _KEEP_ROWS:
            self._share(kept)

    def decode(self, input_ids: torch.Tensor, positions: torch.Tensor, rows: int, length: int) -> None:
        self._announce(_DECODE, rows, length, 0)
        self._share(input_ids)
        self._share(positions)

    def _announce(self, op: int, rows: int, length: int, kept: int) -> None:
        self._header[:] = torch.tensor((op, rows, length, kept))
        dist.broadcast(self._header, 0, group=self.control)

    @staticmethod
    def _share(tensor: torch.Tensor) -> None:
        dist.broadcast(tensor.to(torch.long).contiguous(), 0)

    # ---- the end ----------------------------------------------------------------------------------------------

    def _tell_stop(self) -> None:
        try:
            self._announce(_STOP, 0, 0, 0)
        except RuntimeError as error:  # a worker gone meanwhile: the wait below sees its exit
            logger.warning("tensor-parallel workers not told to stop: %s", error)

    def close(self) -> None:
        """Tell the workers to stop (after the engine's last pass), wait for them, kill the ones still there."""
        if self._closed.is_set():
            return
        self._closed.set()
        # In a thread of its own: a worker stuck mid-pass never takes it. Ranks lost are told nothing.
        told = threading.Thread(target=self._tell_stop, name="tensor-parallel-stop", daemon=True)
        if not self._lost.is_set():
            told.start()
        deadline = time.monotonic() + STOP_WAIT_S
        for worker in self.workers:
            try:
                worker.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                logger.warning("tensor-parallel worker %d did not stop: killed", worker.pid)
                worker.kill()
                worker.wait()
        if told.is_alive():
            told.join(timeout=1)
        if not told.is_alive():  # else a collective still waits in it: the process is ending anyway
            dist.destroy_process_group()
        for name, value in self._environment.items():  # as before: the process may load other models
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        torch.set_num_threads(self._threads)


class TensorParallelEngine(InflightBatchingEngine):
    """The in-flight engine on rank 0, each pass mirrored to the other ranks; shut down with them."""

    def __init__(self, model, limits: EngineLimits, ranks: TensorParallelRanks, **options):
        self.ranks = ranks
        super().__init__(model, limits, mirror=ranks, **options)

    def _iteration(self) -> None:
        try:
            super()._iteration()
        except Exception as error:
            # The ranks may be mid-pass (rank 0 failed inside one): none can tell what the next pass is.
            self.ranks.lost(f"a step failed on rank 0 ({type(error).__name__}: {error})")
            raise

    def shutdown(self) -> None:
        super().shutdown()  # the engine's thread has ended: no pass is under way
        self.ranks.close()


def make_tensor_parallel_engine(settings: EngineSettings, *, tokenizer=None,
                                on_lost: Callable[[], None] | None = None) -> TensorParallelEngine:
    """Rank 0: start the other ranks, load this rank's shard, and run the engine over it."""
    ranks = TensorParallelRanks(settings, engine_device(settings), on_lost=on_lost)
    try:
        model = load_sharded_model(settings.model_path, model_dtype(settings), settings.tensor_parallel_size)
        return TensorParallelEngine(model, settings.limits, ranks, tokenizer=tokenizer)
    except BaseException:
        ranks.close()
        raise


# ---- the worker ranks ---------------------------------------------------------------------------------------------

class _Follower:
    """A worker rank: its shard of the model and its slot cache, running each pass rank 0 announces, as rank 0's
    engine runs it (inflight.py's `_prefill` and `_decode_forward`)."""

    def __init__(self, model, device: torch.device, slots: int, max_seq_len: int):
        check_cache_layers(model)
        use_slot_attention(model)
        self.model, self.device = model, device
        self.cache = SlotCache(model.config.num_hidden_layers, slots, max_seq_len)
        self.cache_argument = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def run(self, control) -> None:
        header = torch.zeros(4, dtype=torch.long)
        with torch.inference_mode(), _on_device(self.device), _attention_backends(self.device):
            while True:
                dist.broadcast(header, 0, group=control)
                op, rows, length, kept = header.tolist()
                if op == _STOP:
                    return
                if op == _PREFILL:
                    self._prefill(rows, length, kept)
                else:
                    self._decode(rows, length)

    def _received(self, *shape: int) -> torch.Tensor:
        tensor = torch.empty(shape, dtype=torch.long, device=self.device)
        dist.broadcast(tensor, 0)
        return tensor

    def _prefill(self, rows: int, length: int, kept: int) -> None:
        input_ids = self._received(rows, length)
        slots = self._received(rows).tolist()
        keep = {} if kept == _KEEP_ALL else {"logits_to_keep": self._received(rows, 1) if kept == _KEEP_ROWS else kept}
        cache = DynamicCache(config=self.model.config)
        self.model(input_ids=input_ids, use_cache=True, **{self.cache_argument: cache}, **keep)
        self.cache.store(slots, cache)

    def _decode(self, rows: int, length: int) -> None:
        input_ids, positions = self._received(rows, 1), self._received(rows)
        mask = decode_mask(positions, length, self.model.dtype)
        self.cache.prepare(rows, positions, length)
        self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions[:, None], use_cache=True,
                   **{self.cache_argument: self.cache})


def _end_with(parent_pid: int) -> None:
    """End this worker when rank 0's process is gone, even while it waits in a collective."""
    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def run_worker(spec: RankSpec) -> None:
    _end_with(spec.parent_pid)
    control = join_ranks(spec.rank, spec.world_size, spec.port, spec.device)
    dtype = "auto" if spec.dtype == "auto" else getattr(torch, spec.dtype)
    model = load_sharded_model(spec.model_path, dtype, spec.world_size)
    _Follower(model, torch.device(spec.device), spec.slots, spec.max_seq_len).run(control)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="a tensor-parallel worker rank of the transformers engine (started "
                                                 "by the engine model, never by hand)")
    parser.add_argument("spec", help="the rank's RankSpec as JSON")
    spec = RankSpec(**json.loads(parser.parse_args(argv).spec))
    logging.basicConfig(level=logging.INFO, format=f"tensor-parallel rank {spec.rank}: %(levelname)s %(message)s")
    try:
        run_worker(spec)
    except Exception:  # noqa: BLE001 - one line in the server's log; rank 0 sees the exit
        logger.exception("failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
