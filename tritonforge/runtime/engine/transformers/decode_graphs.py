"""The transformers engine's decode step replayed as a CUDA graph.

An eager decode step of a 16-layer model is some 600 kernel launches from Python; at small batches the GPU
waits on them. The slot cache's buffers keep their addresses, so one step over every slot (the model's
forward pass and the batched sampling) can be captured once and replayed: its inputs (each slot's last token,
position and step, the banned tokens) are copied into static tensors first, its outputs (the chosen tokens and
their log probs) read from the static tensors it wrote.

A graph is captured lazily, the first time a step needs it, for one cache length (`graph_bucket`: the step's
length rounded up to a multiple of 128, coarser past 2048 so that a bucket pads at most an eighth) and
one set of sampling features (the optional ops a step runs: see `_Features` in inflight.py). A capture
that fails, or a replay, logs one warning and the engine runs eagerly from then on: this is an optimisation,
never a reason for a request to fail. Nothing here runs on a CPU (the engine is eager there); `capture=False`
runs the same step body without a graph, which is how the tests check its logic.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Hashable

import torch

logger = logging.getLogger(__name__)

GRAPH_MIN_BUCKET = 128  # cache lengths of the captured steps: multiples of this, at most 1/8 more than needed
GRAPH_WARMUP_RUNS = 2  # eager runs on a side stream before a capture, as torch.cuda.graph's documentation does


def graph_bucket(length: int, max_len: int) -> int:
    """The cache length of the captured step that serves a step reading `length` columns: `length` rounded up
    to a multiple of 128, or for longer steps of the largest power of two times 128 that is at most an eighth
    of it (so a bucket pads at most 127 columns or an eighth), at most `max_len`."""
    if not 1 <= length <= max_len:
        raise ValueError(f"a decode step reads 1 to {max_len} columns, not {length}")
    step = GRAPH_MIN_BUCKET
    while step * 16 <= length:
        step *= 2
    return min(-(-length // step) * step, max_len)


class StaticInputs:
    """The tensors a captured step reads, at fixed addresses: `state` [3, slots] (each slot's last token,
    its position = its cache length, its step = tokens generated so far) and `ban` [slots, vocab] (tokens a
    row must not draw: min_tokens' end id, bad words)."""

    def __init__(self, slots: int, vocab_size: int, device: torch.device):
        self.state = torch.zeros((3, slots), dtype=torch.long, device=device)
        self.ban = torch.zeros((slots, vocab_size), dtype=torch.bool, device=device)
        self._banned = False  # whether `ban` holds any True

    @property
    def input_ids(self) -> torch.Tensor:
        return self.state[0, :, None]

    @property
    def positions(self) -> torch.Tensor:
        return self.state[1]

    @property
    def steps(self) -> torch.Tensor:
        return self.state[2]

    def fill(self, host_state: torch.Tensor, banned: list[tuple[int, int]]) -> None:
        """Copy the step's inputs in: `host_state` [3, slots] (pinned on CUDA: the copy does not block) and the
        banned (row, token) pairs, which replace the previous step's."""
        self.state.copy_(host_state, non_blocking=True)
        if self._banned:
            self.ban.zero_()
        if banned:
            index = torch.tensor(banned, dtype=torch.long).to(self.ban.device, non_blocking=True)
            self.ban.index_put_((index[:, 0], index[:, 1]), torch.ones((), dtype=torch.bool, device=self.ban.device))
        self._banned = bool(banned)


class DecodeGraphs:
    """Captured decode steps, one per key (a bucket and the step's features), replayed with `run`.

    `run(key, body)`: `body(record)` is the step over the static inputs, returning its output tensor; with
    `record` False it must leave no state behind but what a replay rewrites (the warm-up runs it so). It
    returns the output tensor, or None when graphs are off or have failed (the caller then runs eagerly)."""

    def __init__(self, device: torch.device, *, capture: bool = True):
        self.device = device
        self.capture = capture
        self.failed = False
        self.captured = 0
        self._graphs: dict[Hashable, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self._generation: Hashable = None
        self._pool = None

    def run(self, key: Hashable, generation: Hashable, body: Callable[[bool], torch.Tensor]) -> torch.Tensor | None:
        """Replay (capturing first if needed) the step `key`. `generation` names the buffers the step reads
        (the cache's): when it changes, every captured step is dropped."""
        if self.failed:
            return None
        if not self.capture:
            return body(True)
        if generation != self._generation:
            self._graphs.clear()
            self._generation = generation
        try:
            entry = self._graphs.get(key)
            if entry is None:
                entry = self._graphs[key] = self._capture(body)
            graph, output = entry
            graph.replay()
            return output
        except Exception as error:  # noqa: BLE001 - any failure: run eagerly, never fail a request for this
            self.disable(error)
            return None

    def disable(self, error: BaseException) -> None:
        logger.warning("CUDA graphs are off for this engine, decode steps run eagerly: %s: %s",
                       type(error).__name__, error)
        self.failed = True
        self._graphs.clear()

    def _capture(self, body: Callable[[bool], torch.Tensor]) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        side = torch.cuda.Stream(self.device)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            for _ in range(GRAPH_WARMUP_RUNS):
                body(False)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: a CUDA call of another thread during the capture is not this capture's error
        with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
            output = body(True)
        self.captured += 1
        return graph, output
