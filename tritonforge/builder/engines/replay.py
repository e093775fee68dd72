"""`--engine replay` (benchmarking only): streams the corpus in the model's tokens at a real engine's rate, as a
Python model (`tensorrt_llm_replay_benchmark/`, `runtime/engine/replay/`) or, with --replay-native, as the C++
backend beside it (`runtime/engine/replay/replay_backend.cc`), which sends one response a token as NVIDIA's
C++ engine backend does."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from ...facts.model_parameters import NativeReplayEngineParameters, ReplayEngineParameters
from .. import native
from ..repository import REPLAY_TOKENS, replay_tokens
from . import EngineKind, EnginePlan, Progress

if TYPE_CHECKING:
    from ..options import BuildOptions


def check(options: BuildOptions) -> None:
    if options.replay_step_ms <= 0:
        raise ValueError(f"--replay-step-ms must be > 0, got {options.replay_step_ms}")
    if options.replay_sender_threads < 1:
        raise ValueError(f"--replay-sender-threads must be >= 1, got {options.replay_sender_threads}")
    if not options.replay_native:
        return
    if options.serving.engine_instances > 1:
        raise ValueError("--replay-native runs as one instance: set --replay-sender-threads instead of "
                         "--engine-instances")
    if options.replay_sender_threads > options.max_batch_size:
        raise ValueError(f"--replay-sender-threads ({options.replay_sender_threads}) must be at most "
                         f"--max-batch-size ({options.max_batch_size}): each thread runs a share of the batch")
    if not options.serving.decoupled:
        raise ValueError("--replay-native streams: it needs the streaming (decoupled) build, not --no-streaming")
    if options.serving.max_queue_size:
        raise ValueError("--replay-native queues without bound: --max-queue-size is for the Python engines")


def plan(options: BuildOptions, checkpoint_config: dict, progress: Progress) -> EnginePlan:
    if options.replay_native:
        parameters = NativeReplayEngineParameters(
            replay_tokens=f"1/{REPLAY_TOKENS}", replay_step_ms=options.replay_step_ms,
            max_batch_size=options.max_batch_size, exclude_input_in_output=options.serving.exclude_input_in_output,
            replay_sender_threads=options.replay_sender_threads,
            stream_interval=options.stream_interval).to_config()
        return EnginePlan(parameters=parameters, serving=options.serving, backend=native.REPLAY.name)
    # --max-batch-size is the whole engine's: several instances share it (replay engine's SharedBatch), so
    # the engine streams max_batch_size tokens a step however many stubs send them.
    parameters = ReplayEngineParameters(
        replay_tokens=f"1/{REPLAY_TOKENS}", replay_step_ms=options.replay_step_ms,
        vocab_size=checkpoint_config["vocab_size"], shared_batch=options.serving.engine_instances > 1,
        max_batch_size=options.max_batch_size, max_input_len=options.max_input_len,
        max_seq_len=options.max_seq_len, exclude_input_in_output=options.serving.exclude_input_in_output,
        stream_interval=options.stream_interval, response_lanes=options.response_lanes).to_config()
    return EnginePlan(parameters=parameters, serving=options.serving)


def write_engine(options: BuildOptions, checkpoint_config: dict, version_dir: Path, progress: Progress) -> None:
    (version_dir / REPLAY_TOKENS).write_text(json.dumps(replay_tokens(options.model)))
    if options.replay_native:
        native.compile_backend(native.REPLAY, version_dir)


KIND = EngineKind(
    name="replay", summary="benchmarking only: streams pre-set tokens at a real engine's rate",
    model_source="tensorrt_llm_replay_benchmark", runtime_room="replay", plan=plan, check=check,
    write_engine=write_engine, needs_vocab_size=True, several_instances=True, own_options=("replay_native",))
