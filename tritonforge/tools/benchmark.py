"""Measure how much of the engine's token rate reaches the client, on a running server: the engine model
called directly, through the ensemble and through the BLS, streaming, side by side at each concurrency.

Every request asks for exactly `output_tokens` tokens (min_tokens = max_tokens), so every path does equal
work. Load generators: `asyncio` (tritonclient's asyncio gRPC streaming; one stream per concurrent user,
each sending its next request when the previous one ends) or `perf_analyzer` (--streaming, inputs through
--input-data; timings read from its --profile-export-file). Used by `tritonforge bench` and
`bench/pipeline.py`; the terms are defined in DEFINITIONS and printed under every table.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import os
import platform
import re
import subprocess
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ..builder.corpus import corpus_lines
from ..clients.client import first_string, response_outputs, wait_call_ended
from ..facts.contract import (
    BLS_MODEL,
    ENGINE_MODEL,
    EXCLUDE_INPUT_IN_OUTPUT,
    FINAL_RESPONSE_PARAMETER,
    INPUT_IDS,
    INPUT_LENGTHS,
    MAX_TOKENS,
    MIN_TOKENS,
    NUM_TOP_LOG_PROBS,
    OUTPUT_IDS,
    POSTPROCESSING_MODEL,
    PREPROCESSING_MODEL,
    REQUEST_OUTPUT_LEN,
    RETURN_LOG_PROBS,
    SEQUENCE_LENGTH,
    STREAM,
    STREAMING,
    TEXT_INPUT,
    TEXT_OUTPUT,
)
from ..facts.paths import LOG_PROB_PATH_TOP, PATH_MODELS, PATHS
from ..runtime.text.tokenization import load_tokenizer
from .profiling import (
    busiest_threads,
    cpu_cores,
    cpu_snapshot,
    model_statistics,
    record_stubs,
    statistics_delta,
    thread_cpu_snapshot,
)

logger = logging.getLogger(__name__)

DEFINITIONS = [
    "output tokens/s: tokens of the completed requests / wall time of the run (first send to last response)",
    "TTFT: time to first token, from sending a request to its first streamed response",
    "ITL: inter-token latency of one request, (last response - first response) / (tokens - 1)",
    "p50 / p99: percentiles over the run's requests (numpy.percentile)",
    "efficiency: output tokens/s of the path / output tokens/s of the engine model called directly",
    "steady tokens/s (efficiency): tokens of the requests completed after as many requests as streams had "
    "completed (the ramp is over) and by the last send (after it the run only drains) / that window; "
    "'-' when the run is too short to hold one more round of completions in it",
    "streams checked / differing: completed streams whose content was checked, and those that did not carry "
    "what they should (errors: requests that failed): through the ensemble or the BLS, the streamed chunks "
    "joined must equal the non-streamed answer to the same prompt (the ensemble: but for the characters cut "
    "between two chunks, which its postprocessing shows as U+FFFD); from the engine directly, exactly the "
    "requested tokens",
]
REQUEST_TIMEOUT_S = 120
TOKEN_BYTES = 4  # an output_ids element: INT32
STREAM_OUTPUTS = (TEXT_OUTPUT, OUTPUT_IDS)  # what the ensemble and the BLS stream; what the engine streams
REPLACEMENT = "\ufffd"  # what a decoder makes of bytes that are not a whole character
ANSWER_CONCURRENCY = 32  # non-streamed answers asked at once before a path's points


@dataclass
class Timing:
    """One request: send time, arrival time of each streamed response (seconds), tokens, error; and what its
    stream carried, where the load generator recorded it (None: not recorded)."""

    sent: float
    arrivals: list[float]
    tokens: int
    error: str | None = None
    prompt: str | None = None  # its text_input (ensemble, BLS)
    text: bytes | None = None  # its text_output chunks joined (ensemble, BLS)
    received_tokens: int | None = None  # tokens in its output_ids (the engine called directly)
    difference: str | None = None  # how what it carried differs from what it should have (check_streams)


# ---- workload -----------------------------------------------------------------------------------------------

def make_prompts(tokenizer_dir: Path, count: int, max_prompt_tokens: int) -> list[tuple[str, list[int]]]:
    """Distinct prompts from the shipped corpus, with the token ids the preprocessing model would produce."""
    if not Path(tokenizer_dir).is_dir():
        raise FileNotFoundError(f"no tokenizer at {tokenizer_dir}: pass a repository written by tritonforge build")
    tokenizer = load_tokenizer(tokenizer_dir)
    lines = [line for line in corpus_lines() if line.strip()]
    prompts = []
    for index in range(count):
        text = f"{lines[index % len(lines)]} ({index})"
        ids = tokenizer(text).input_ids[:max_prompt_tokens]
        prompts.append((tokenizer.decode(ids, skip_special_tokens=True), ids))
    return prompts


def request_arrays(path: str, prompt: tuple[str, list[int]], output_tokens: int) -> dict[str, np.ndarray]:
    """The tensors of one request, [1, ...] with the batch dimension, by the model's input names."""
    text, ids = prompt
    if path == "direct":
        return {INPUT_IDS: np.array([ids], dtype=np.int32),
                INPUT_LENGTHS: np.array([[len(ids)]], dtype=np.int32),
                REQUEST_OUTPUT_LEN: np.array([[output_tokens]], dtype=np.int32),
                MIN_TOKENS: np.array([[output_tokens]], dtype=np.int32),
                STREAMING: np.array([[True]])}
    arrays = {TEXT_INPUT: np.array([[text.encode()]], dtype=object),
              MAX_TOKENS: np.array([[output_tokens]], dtype=np.int32),
              MIN_TOKENS: np.array([[output_tokens]], dtype=np.int32),
              STREAM: np.array([[True]])}
    if path == "bls-log-probs":
        arrays |= {RETURN_LOG_PROBS: np.array([[True]]), NUM_TOP_LOG_PROBS: np.array([[LOG_PROB_PATH_TOP]], np.int32)}
    return arrays


def triton_dtype(array: np.ndarray) -> str:
    return {np.int32: "INT32", np.bool_: "BOOL", np.object_: "BYTES"}[array.dtype.type]


# ---- load generator: asyncio gRPC ---------------------------------------------------------------------------

async def _one_request(client, model: str, arrays: dict[str, np.ndarray], output_tokens: int, client_module) -> Timing:
    import grpc

    inputs = []
    for name, array in arrays.items():
        tensor = client_module.InferInput(name, list(array.shape), triton_dtype(array))
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)

    async def requests():
        yield {"model_name": model, "inputs": inputs, "enable_empty_final_response": True}

    timing = Timing(sent=time.perf_counter(), arrivals=[], tokens=0)
    chunks: list[bytes] = []
    received_tokens = 0
    try:
        # A stream that stops answering is an error of the run, not a hang of the benchmark.
        stream = client.stream_infer(requests(), stream_timeout=REQUEST_TIMEOUT_S)
        async for result, error in stream:
            now = time.perf_counter()
            if error is not None:
                timing.error = str(error)
                return timing
            response = result.get_response()
            if response.outputs:
                timing.arrivals.append(now)
                raw = response_outputs(result, STREAM_OUTPUTS)
                if TEXT_OUTPUT in raw:
                    chunks.append(first_string(raw[TEXT_OUTPUT]))
                if OUTPUT_IDS in raw:
                    received_tokens += len(raw[OUTPUT_IDS]) // TOKEN_BYTES
            final = response.parameters.get(FINAL_RESPONSE_PARAMETER)
            if final is not None and final.bool_param:
                await wait_call_ended(stream)  # not dropped: a dropped call is cancelled (docs/design/faults.md)
                break
    except grpc.aio.AioRpcError as error:  # e.g. DEADLINE_EXCEEDED: counted, and the run goes on
        timing.error = f"{error.code().name}: {error.details()}"
        return timing
    # min_tokens = max_tokens: a completed request carries exactly output_tokens tokens on every path.
    timing.tokens = output_tokens if timing.arrivals else 0
    if TEXT_INPUT in arrays:
        timing.prompt, timing.text = arrays[TEXT_INPUT].reshape(-1)[0].decode(), b"".join(chunks)
    else:
        timing.received_tokens = received_tokens
    return timing


async def _asyncio_load(url: str, path: str, prompts, concurrency: int, output_tokens: int,
                        duration_s: float) -> tuple[list[Timing], float]:
    import tritonclient.grpc.aio as grpc_aio

    client = grpc_aio.InferenceServerClient(url)
    model = PATH_MODELS[path]
    start = time.perf_counter()
    deadline = start + duration_s
    timings: list[Timing] = []

    async def user(index: int) -> None:
        sent = 0
        while sent == 0 or time.perf_counter() < deadline:
            prompt = prompts[(index + sent * concurrency) % len(prompts)]
            timings.append(await _one_request(client, model, request_arrays(path, prompt, output_tokens),
                                              output_tokens, grpc_aio))
            sent += 1

    await asyncio.gather(*(user(index) for index in range(concurrency)))
    await client.close()
    end = max((t.arrivals[-1] for t in timings if t.arrivals), default=time.perf_counter())
    return timings, end - start


# One Python process is one core: at a real engine's rate (~30k responses/s at 128 streams) a single asyncio
# client would measure itself rather than the server. Streams beyond this many are spread over processes.
STREAMS_PER_LOAD_PROCESS = 32
LOAD_START_DELAY_S = 5.0  # time for every load process to import and wait before the first request


def asyncio_load(url, path, prompts, concurrency, output_tokens, duration_s, processes: int | None = None):
    """`concurrency` streams of asyncio gRPC clients, from `processes` processes (None: one per
    STREAMS_PER_LOAD_PROCESS streams; 1: this one)."""
    processes = processes or -(-concurrency // STREAMS_PER_LOAD_PROCESS)
    if processes == 1:
        return asyncio.run(_asyncio_load(url, path, prompts, concurrency, output_tokens, duration_s))
    timings, wall, _ = spread_load(_asyncio_share, (url, path), prompts, concurrency, output_tokens, duration_s,
                                   processes)
    return timings, wall


def _asyncio_share(target: tuple[str, str], prompts, concurrency: int, output_tokens: int, seconds: float,
                   start_at: float):
    url, path = target
    return timed_share(start_at, lambda: asyncio_load(url, path, prompts, concurrency, output_tokens, seconds, 1))


def timed_share(start_at: float, load):
    """A load process's share: `load()` run from `start_at` (time.monotonic); its timings, wall time and the
    CPU seconds it spent."""
    time.sleep(max(0.0, start_at - time.monotonic()))
    cpu = time.process_time()
    timings, wall = load()
    return timings, wall, time.process_time() - cpu


def spread_load(share, target, prompts, concurrency: int, output_tokens: int, seconds: float,
                processes: int) -> tuple[list[Timing], float, float]:
    """`concurrency` streams from `processes` load processes started together, each running
    `share(target, its prompts, its streams, output_tokens, seconds, start_at)` (a module-level function: it is
    pickled): the timings, the longest wall time and the CPU seconds the processes spent on the load itself."""
    shares = [count for count in (concurrency // processes + (index < concurrency % processes)
                                  for index in range(processes)) if count]
    start_at = time.monotonic() + LOAD_START_DELAY_S
    with ProcessPoolExecutor(len(shares), mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(share, target, prompts[index::len(shares)], count, output_tokens, seconds, start_at)
                   for index, count in enumerate(shares)]
        results = [future.result() for future in futures]
    return ([timing for timings, _, _ in results for timing in timings], max(wall for _, wall, _ in results),
            sum(cpu for _, _, cpu in results))


# ---- load generator: perf_analyzer --------------------------------------------------------------------------

# A point normally ends within a few times its duration (count windows at 256 streams: ~30 s for 4 s);
# a stream that never ends must fail its point, not hold the run for ten minutes.
PERF_ANALYZER_MIN_TIMEOUT_S = 120
PERF_ANALYZER_TIMEOUT_PER_POINT_S = 20  # seconds allowed per second of the point's duration
PERF_ANALYZER_WINDOWS = 3  # measurement windows per point
# The engine's time per token that sizes perf_analyzer's count windows when the caller knows no better: the
# replay engine's default step (a ~15k tokens/s engine at 128 streams). Pass the engine's real step.
DEFAULT_MS_PER_TOKEN = 8.5
OPENAI_COMPLETIONS_ENDPOINT = "v1/completions"


def perf_analyzer_command(url: str, model: str, input_file: Path, concurrency: int, duration_s: float,
                          output_tokens: int, export: Path, *, expected_ms_per_token: float = DEFAULT_MS_PER_TOKEN,
                          openai: bool = False) -> list[str]:
    """perf_analyzer, set up to measure decoupled streams reliably.

    - `count_windows`: a window lasts until N requests have completed, not a fixed time, so a window is never
      cut while most streams are mid-generation (time windows with long streams give "Failed to obtain stable
      measurement"); N is sized so that three windows take about `duration_s`.
    - `--stability-percentage 999`: accept the first three windows as they are (genai-perf does the same for
      LLMs): the load is steady by construction, and a tighter band only repeats windows.
    - `--max-threads` = concurrency (up to 256): one thread per stream, so sending is never queued behind
      other streams' responses, which would inflate the first-response latency perf_analyzer measures.
    - `openai`: Triton's gRPC API at `url` otherwise; with it, streamed `/v1/completions` at the base URL `url`
      (its OpenAI service kind: each server-sent event received is a response).
    """
    request_s = output_tokens * expected_ms_per_token / 1000
    per_window = max(int(concurrency / request_s * duration_s / PERF_ANALYZER_WINDOWS), 2 * concurrency, 8)
    # The OpenAI kind runs only in --async mode, and streams when the server answers with server-sent events
    # (the payload asks with "stream": true); it refuses --streaming, which is for Triton's gRPC API.
    service = (["--service-kind", "openai", "--endpoint", OPENAI_COMPLETIONS_ENDPOINT, "--async"] if openai
               else ["-i", "grpc", "--streaming"])
    return ["perf_analyzer", "-m", model, *service, "-u", url,
            "--input-data", str(input_file), "--concurrency-range", str(concurrency),
            "--measurement-mode", "count_windows", "--measurement-request-count", str(per_window),
            "--stability-percentage", "999", "--max-threads", str(min(concurrency, 256)),
            "--profile-export-file", str(export)]


def perf_analyzer_error(completed: subprocess.CompletedProcess) -> str:
    """What went wrong: its error lines, not the usage text it prints around an argument error."""
    lines = [line for line in (completed.stderr + "\n" + completed.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if "error" in line.lower() or "failed" in line.lower()]
    return "\n".join(errors[-10:] or lines[-25:])


def perf_analyzer_load(url: str, path: str, prompts, concurrency: int, output_tokens: int, duration_s: float,
                       work: Path, *, ms_per_token: float = DEFAULT_MS_PER_TOKEN) -> tuple[list[Timing], float]:
    """perf_analyzer against one of the server's paths (Triton's gRPC API)."""
    data = []
    for prompt in prompts:
        entry = {}
        for name, array in request_arrays(path, prompt, output_tokens).items():
            values = array[0].tolist()
            if array.dtype == object:
                values = [value.decode() for value in values]
            entry[name] = {"content": values, "shape": list(array.shape[1:])}
        data.append(entry)
    return _run_perf_analyzer(url, PATH_MODELS[path], data, f"{path}-{concurrency}", concurrency, duration_s,
                              output_tokens, work, openai=False, ms_per_token=ms_per_token)


def perf_analyzer_openai_load(base_url: str, model: str, prompts, concurrency: int, output_tokens: int,
                              duration_s: float, work: Path, *,
                              ms_per_token: float = DEFAULT_MS_PER_TOKEN) -> tuple[list[Timing], float]:
    """perf_analyzer against an OpenAI-compatible server: streamed completions of exactly `output_tokens`."""
    data = [{"payload": [{"model": model, "prompt": text, "max_tokens": output_tokens, "min_tokens": output_tokens,
                          "stream": True}]} for text, _ in prompts]
    return _run_perf_analyzer(base_url, model, data, f"openai-{concurrency}", concurrency, duration_s,
                              output_tokens, work, openai=True, ms_per_token=ms_per_token)


def _run_perf_analyzer(url: str, model: str, data: list[dict], label: str, concurrency: int, duration_s: float,
                       output_tokens: int, work: Path, *, openai: bool,
                       ms_per_token: float) -> tuple[list[Timing], float]:
    """One point; a failed perf_analyzer fails the point alone, its own error lines in the point's report."""
    try:
        return _perf_analyzer_timings(url, model, data, label, concurrency, duration_s, output_tokens, work,
                                      openai=openai, ms_per_token=ms_per_token)
    except subprocess.TimeoutExpired as error:
        message = f"perf_analyzer: no result in {error.timeout:.0f} s (a stream that never ended?); stopped"
        return [Timing(sent=0.0, arrivals=[], tokens=0, error=message)], duration_s
    except (RuntimeError, KeyError) as error:
        return [Timing(sent=0.0, arrivals=[], tokens=0, error=f"perf_analyzer: {error}")], duration_s


def _perf_analyzer_timings(url: str, model: str, data: list[dict], label: str, concurrency: int,
                           duration_s: float, output_tokens: int, work: Path, *,
                           openai: bool, ms_per_token: float) -> tuple[list[Timing], float]:
    input_file = work / f"input-{label}.json"
    input_file.write_text(json.dumps({"data": data}))
    # perf_analyzer refuses an existing export file: one new name per run.
    export = work / f"export-{label}-{time.monotonic_ns()}.json"
    command = perf_analyzer_command(url, model, input_file, concurrency, duration_s, output_tokens, export,
                                    expected_ms_per_token=ms_per_token, openai=openai)
    timeout_s = max(PERF_ANALYZER_MIN_TIMEOUT_S, PERF_ANALYZER_TIMEOUT_PER_POINT_S * duration_s)
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
    if completed.returncode != 0 or not export.exists():
        raise RuntimeError(f"perf_analyzer exited {completed.returncode}: {perf_analyzer_error(completed)}\n"
                           f"command: {' '.join(command)}")
    # The export holds each request's inputs and each response's outputs as the tensors' raw bytes, written
    # into JSON strings unchecked: surrogateescape keeps every byte, to be had back with `_export_bytes`.
    experiment = json.loads(export.read_bytes().decode("utf-8", errors="surrogateescape"))["experiments"][-1]
    timings = []
    for request in experiment["requests"]:
        arrivals = [ns / 1e9 for ns in request.get("response_timestamps", [])]
        timing = Timing(sent=request["timestamp"] / 1e9, arrivals=arrivals, tokens=output_tokens if arrivals else 0)
        _record_stream(timing, request)
        timings.append(timing)
    completed_requests = [t for t in timings if t.arrivals]
    if not completed_requests:
        return timings, duration_s
    wall = max(t.arrivals[-1] for t in completed_requests) - min(t.sent for t in timings)
    return timings, wall


def _export_bytes(value: str) -> bytes:
    return value.encode("utf-8", errors="surrogateescape")


def _string_payload(raw: bytes) -> bytes:
    """A one-element STRING tensor's bytes, with or without its 4-byte length prefix (perf_analyzer versions
    differ in which they record)."""
    if len(raw) >= 4 and int.from_bytes(raw[:4], "little") == len(raw) - 4:
        return raw[4:]
    return raw


def _response_tokens(output: dict) -> int | None:
    """Tokens in one engine response of the export: its sequence_length, which perf_analyzer writes as a
    number, or its output_ids as raw bytes or as numbers; None when it holds neither readably."""
    length = output.get(SEQUENCE_LENGTH)
    if isinstance(length, int):
        return length
    ids = output.get(OUTPUT_IDS)
    if isinstance(ids, str):  # raw INT32 bytes ("" for a response without tokens)
        return len(_export_bytes(ids)) // TOKEN_BYTES
    if isinstance(ids, list):
        return len(ids)
    return 1 if isinstance(ids, int) else None


def _record_stream(timing: Timing, request: dict) -> None:
    """What one request of a perf_analyzer export carried; nothing where the export holds no outputs."""
    outputs = request.get("response_outputs")
    if outputs is None:
        return
    prompt = request.get("request_inputs", {}).get(TEXT_INPUT)
    if isinstance(prompt, str):
        chunks = [output[TEXT_OUTPUT] for output in outputs if TEXT_OUTPUT in output]
        if all(isinstance(chunk, str) for chunk in chunks):
            timing.prompt = _string_payload(_export_bytes(prompt)).decode("utf-8", errors="replace")
            timing.text = b"".join(_string_payload(_export_bytes(chunk)) for chunk in chunks)
    elif prompt is None:
        tokens = [_response_tokens(output) for output in outputs]
        if None not in tokens:
            timing.received_tokens = sum(tokens)


# ---- what each stream carried -----------------------------------------------------------------------------


def expected_answers(url: str, path: str, prompts, output_tokens: int) -> dict[str, bytes]:
    """The non-streamed answer to each prompt through `path` (ensemble or BLS), asked ANSWER_CONCURRENCY at a
    time: what each of its streams must carry, chunk by chunk, under load. Empty for the engine called
    directly (its streams' tokens are counted)."""
    if path == "direct":
        return {}
    from concurrent.futures import ThreadPoolExecutor

    from ..clients.client import GenerateRequest, GrpcClient

    def answer(text: str) -> bytes:
        # The streams' own settings: the prompt left out whatever the repository's default.
        request = GenerateRequest(text, output_tokens, parameters={MIN_TOKENS: output_tokens,
                                                                   EXCLUDE_INPUT_IN_OUTPUT: True})
        with GrpcClient(url, PATH_MODELS[path]) as client:  # one stream each: a client's stream serves one request
            return b"".join(client.stream_bytes(request, stream=False))

    texts = [text for text, _ in prompts]
    with ThreadPoolExecutor(max_workers=ANSWER_CONCURRENCY) as pool:
        return dict(zip(texts, pool.map(answer, texts)))


def check_streams(timings: list[Timing], expected: dict[str, bytes], output_tokens: int, *,
                  split_characters_replaced: bool = False) -> int:
    """Mark the `difference` of each completed stream that did not carry what it should: its chunks joined against the
    non-streamed answer to its prompt, or the engine's tokens counted. With `split_characters_replaced` (the
    ensemble: its postprocessing decodes each chunk alone) a run of U+FFFD in the stream stands for the
    characters whose bytes straddled two chunks; every other character must match, in order. Returns how many
    streams were checked."""
    checked = 0
    for timing in timings:
        if timing.error is not None or not timing.arrivals:
            continue
        if timing.text is not None:
            checked += 1
            answer = expected.get(timing.prompt)
            if answer is None:
                timing.difference = f"a stream for a prompt that was not sent: {timing.prompt!r}"[:300]
            elif not _same_text(timing.text, answer, split_characters_replaced):
                timing.difference = (f"streamed text differs from its non-streamed answer: "
                                     f"{timing.text[:80]!r}... against {answer[:80]!r}...")
        elif timing.received_tokens is not None:
            checked += 1
            if timing.received_tokens != output_tokens:
                timing.difference = f"the stream carried {timing.received_tokens} tokens, not {output_tokens}"
    return checked


def _same_text(streamed: bytes, answer: bytes, split_characters_replaced: bool) -> bool:
    if streamed == answer or not split_characters_replaced:
        return streamed == answer
    # Each straddling character shows as U+FFFD on both sides of its cut: n of them stand for 1..n characters.
    pattern = "".join(f".{{1,{len(piece)}}}" if piece.startswith(REPLACEMENT) else re.escape(piece)
                      for piece in re.split(f"({REPLACEMENT}+)", streamed.decode("utf-8", errors="replace")) if piece)
    return re.fullmatch(pattern, answer.decode("utf-8", errors="replace"), flags=re.DOTALL) is not None


# ---- figures ------------------------------------------------------------------------------------------------

def steady_tokens_per_s(done: list[Timing], concurrency: int) -> float | None:
    """Tokens/s of a closed-loop run without its ramp and drain, which weigh on short runs with many streams
    (at 256 streams and a 128-slot engine each takes about two request times)."""
    completions = sorted((t.arrivals[-1], t.tokens) for t in done)
    if len(completions) < 2 * concurrency:
        return None
    start, end = completions[concurrency - 1][0], max(t.sent for t in done)
    counted = [tokens for finished, tokens in completions if start < finished <= end]
    if len(counted) < concurrency:
        return None
    return round(sum(counted) / (end - start), 1)


def summarize(timings: list[Timing], wall_s: float, concurrency: int | None = None) -> dict:
    done = [t for t in timings if t.error is None and t.arrivals]
    ttft = np.array([t.arrivals[0] - t.sent for t in done]) * 1000
    itl = np.array([(t.arrivals[-1] - t.arrivals[0]) / (t.tokens - 1) for t in done if t.tokens > 1]) * 1000

    def percentile(values, q):
        return round(float(np.percentile(values, q)), 2) if len(values) else None

    return {"requests": len(done), "errors": len(timings) - len(done),
            "output_tokens_per_s": round(sum(t.tokens for t in done) / wall_s, 1) if wall_s > 0 else 0.0,
            "steady_output_tokens_per_s": steady_tokens_per_s(done, concurrency) if concurrency else None,
            "ttft_ms_p50": percentile(ttft, 50), "ttft_ms_p99": percentile(ttft, 99),
            "itl_ms_p50": percentile(itl, 50), "itl_ms_p99": percentile(itl, 99),
            "first_error": next((t.error for t in timings if t.error), None),
            "streams_checked": sum(1 for t in done if t.text is not None or t.received_tokens is not None),
            "streams_differing": sum(1 for t in done if t.difference is not None),
            "first_difference": next((t.difference for t in done if t.difference), None)}


def add_efficiency(rows: list[dict]) -> None:
    for measure, ratio in (("output_tokens_per_s", "efficiency"), ("steady_output_tokens_per_s", "steady_efficiency")):
        direct = {(r["engine"], r["concurrency"]): r.get(measure) for r in rows if r["path"] == "direct"}
        for row in rows:
            base, value = direct.get((row["engine"], row["concurrency"])), row.get(measure)
            row[ratio] = round(value / base, 3) if base and value is not None else None


def markdown(result: dict) -> str:
    meta = result["meta"]
    lines = [f"Pipeline efficiency — {meta['machine']}, {meta['date']}, load: {meta['tool']}, "
             f"{meta['output_tokens']} output tokens per request, {meta['duration_s']} s per point",
             "", "| engine | streams | path | output tokens/s | efficiency | steady tokens/s (efficiency) | "
                 "TTFT p50 / p99 ms | ITL p50 / p99 ms | requests | streams checked / differing | errors |",
             "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in result["rows"]:
        efficiency = "" if row["path"] == "direct" else f"{row['efficiency']:.2f}" if row["efficiency"] else "-"
        lines.append(f"| {row['engine']} | {row['concurrency']} | {row['path']} | {row['output_tokens_per_s']:,.0f} | "
                     f"{efficiency} | {_steady(row)} | {row['ttft_ms_p50']} / {row['ttft_ms_p99']} | "
                     f"{row['itl_ms_p50']} / {row['itl_ms_p99']} | {row['requests']} | "
                     f"{row.get('streams_checked', '-')} / {row.get('streams_differing', '-')} | {row['errors']} |")
    lines += ["", *(f"- {definition}" for definition in DEFINITIONS)]
    lines += profile_table(result["rows"])
    if meta.get("notes"):
        lines += ["", *(f"- {note}" for note in meta["notes"])]
    return "\n".join(lines) + "\n"


def _steady(row: dict) -> str:
    steady = row.get("steady_output_tokens_per_s")
    if steady is None:
        return "-"
    ratio = row.get("steady_efficiency")
    return f"{steady:,.0f}" + (f" ({ratio:.2f})" if row["path"] != "direct" and ratio is not None else "")


PROFILE_GROUPS = {"tritonserver": "tritonserver", "engine stubs": f"stub:{ENGINE_MODEL}",
                  "pre": f"stub:{PREPROCESSING_MODEL}", "post": f"stub:{POSTPROCESSING_MODEL}",
                  "BLS": f"stub:{BLS_MODEL}",
                  "load gen.": "load generator"}


def profile_table(rows: list[dict]) -> list[str]:
    """Where the time went, per point: CPU cores by process, postprocessing's batching and queueing. Only
    where the server's processes were measured (a run that knows the server's pid) or its statistics read
    (open APIs): `tritonforge bench` against a server it did not start knows neither, and a table of zeros
    would read as idle processes."""
    rows = [row for row in rows
            if set(row.get("cpu_cores") or {}) - {PROFILE_GROUPS["load gen."]} or row.get("server_stats")]
    if not rows:
        return []
    lines = ["", "Where the time went (CPU cores busy during the point, by process; postprocessing requests per "
                 "execution and mean queue time per request, from Triton's statistics):", "",
             "| engine | streams | path | " + " | ".join(PROFILE_GROUPS)
             + " | post batch | post queue µs | busiest tritonserver threads (cores) |",
             "|---|---:|---|" + "---:|" * (len(PROFILE_GROUPS) + 2) + "---|"]
    for row in rows:
        cores = [row["cpu_cores"].get(group) for group in PROFILE_GROUPS.values()]
        post = row.get("server_stats", {}).get(POSTPROCESSING_MODEL, {})
        lines.append(f"| {row['engine']} | {row['concurrency']} | {row['path']} | "
                     + " | ".join("-" if value is None else f"{value:.2f}" for value in cores)
                     + f" | {post.get('batch', '')} | {post.get('queue_us', '')} | "
                     + ", ".join(f"{thread['cores']:.2f} {thread['name']}/{thread['tid']}"
                                 for thread in row.get("server_threads", [])) + " |")
    return lines


def plot(result: dict, png: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    engines = sorted({row["engine"] for row in result["rows"]})
    figure, axes = plt.subplots(1, len(engines), figsize=(6 * len(engines), 4.2), squeeze=False)
    for axis, engine in zip(axes[0], engines):
        for path in PATH_MODELS:
            rows = sorted((r for r in result["rows"] if r["engine"] == engine and r["path"] == path),
                          key=lambda r: r["concurrency"])
            if rows:
                axis.plot([r["concurrency"] for r in rows], [r["output_tokens_per_s"] for r in rows],
                          marker="o", label=path)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("concurrent streams")
        axis.set_ylabel("output tokens/s")
        axis.set_title(f"{engine} engine")
        axis.grid(True, alpha=0.3)
        axis.legend()
    figure.suptitle(f"{result['meta']['machine']} — {result['meta']['date']}", fontsize=9)
    figure.tight_layout()
    figure.savefig(png, dpi=110)
    plt.close(figure)


def with_extension(stem: Path, extension: str) -> Path:
    """`stem` + `extension`, keeping every dot of the stem (`Path.with_suffix` would cut "run-4.25ms" at
    its dot, so two runs named apart would write the same files)."""
    return stem.with_name(stem.name + extension)


def write_results(result: dict, stem: Path) -> None:
    stem.parent.mkdir(parents=True, exist_ok=True)
    with_extension(stem, ".json").write_text(json.dumps(result, indent=1) + "\n")
    with_extension(stem, ".md").write_text(markdown(result))
    try:
        plot(result, with_extension(stem, ".png"))
    except ImportError:
        logger.warning("matplotlib is not installed: no plot (pip install -e .[bench])")


def machine_description() -> str:
    description = f"{platform.machine()}, {os.cpu_count()} CPUs"
    try:
        import torch

        if torch.cuda.is_available():
            description = f"{torch.cuda.get_device_name(0)}, {description}"
    except ImportError:
        pass
    return description


# ---- the run ------------------------------------------------------------------------------------------------


def measure_server(url: str, prompts, *, paths=PATHS, concurrencies=(1, 8, 32, 128), output_tokens: int = 64,
                   duration_s: float = 10.0, tool: str = "asyncio", work: Path, label: str = "",
                   server_pid: int | None = None, stacks_dir: Path | None = None,
                   ms_per_token: float = DEFAULT_MS_PER_TOKEN, on_row=lambda row: None,
                   progress=lambda line: None) -> list[dict]:
    """Warm up, then measure every path at every concurrency (the paths of one concurrency back to back).

    Each row also says where the time went (tritonforge.tools.profiling): CPU cores by process, and Triton's
    per-model statistics over the point; with `stacks_dir` (and py-spy installed), the Python stubs' stacks at
    the largest concurrency."""
    def load(path: str, concurrency: int, seconds: float) -> tuple[list[Timing], float]:
        point = (url, path, prompts, concurrency, output_tokens, seconds)
        if tool == "asyncio":
            return asyncio_load(*point)
        return perf_analyzer_load(*point, work=work, ms_per_token=ms_per_token)

    from ..clients.client import check_serving

    # A server that is not there (or went away) fails every request as fast as they are sent: say so at once.
    served = {PATH_MODELS[path]: f"path {path}" for path in paths}
    check_serving(url, served)
    # Warm-up: first calls load kernels, fill pools, start the stubs' threads.
    for path in paths:
        load(path, min(8, max(concurrencies)), 0 if tool == "asyncio" else 1.5)
    expected = {path: expected_answers(url, path, prompts, output_tokens) for path in paths}
    rows = []
    for concurrency in concurrencies:
        for path in paths:
            recorders = []
            if stacks_dir is not None and server_pid is not None and concurrency == max(concurrencies):
                recorders = record_stubs(server_pid, duration_s, stacks_dir, f"{label}-{path}-{concurrency}")
            threads_before = thread_cpu_snapshot(server_pid)
            cpu_before, stats_before, started = cpu_snapshot(server_pid), model_statistics(url), time.perf_counter()
            timings, wall = load(path, concurrency, duration_s)
            elapsed = time.perf_counter() - started
            threads_after = thread_cpu_snapshot(server_pid)
            check_streams(timings, expected[path], output_tokens, split_characters_replaced=path == "ensemble")
            for recorder in recorders:
                recorder.wait(timeout=duration_s + 30)
            row = {"engine": label, "concurrency": concurrency, "path": path, "tool": tool,
                   **summarize(timings, wall, concurrency),
                   "cpu_cores": cpu_cores(cpu_before, cpu_snapshot(server_pid), elapsed),
                   "server_threads": busiest_threads(threads_before, threads_after, elapsed),
                   "server_stats": statistics_delta(stats_before, model_statistics(url))}
            rows.append(row)
            on_row(row)
            if row["requests"] and row["errors"] == row["requests"]:
                check_serving(url, served)  # every request failed: a server that went away ends the run
            progress(point_line(row))
    return rows


def point_line(row: dict) -> str:
    """One measured point in a line, for a run's progress."""
    return (f"{row['engine']:12} {row['concurrency']:4} {row['path']:9} {row['output_tokens_per_s']:10,.0f} tok/s  "
            f"TTFT p50 {row['ttft_ms_p50']} ms  ITL p50 {row['itl_ms_p50']} ms  "
            f"checked {row['streams_checked']}  differing {row['streams_differing']}  errors {row['errors']} "
            f"{row['first_error'] or row['first_difference'] or ''}")[:600]
