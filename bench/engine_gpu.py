"""The transformers engine alone, in-process (no Triton): output tokens/s and TTFT at each concurrency, on the
random-weight Llama shapes of tritonforge/tools/tiny_model.py (SHAPES: "tiny", "1b"), on CUDA when present.

Each of N streams sends its next request (a random prompt, exactly --output-tokens new tokens, streamed) as
soon as its previous one ends, as bench/pipeline.py's clients do; tokens are counted over --duration-s after
a warm-up. --profile then records the engine at the last concurrency with torch.profiler and prints where the
time goes (the top ops by host and by device time) and writes a Chrome trace.

Run:
  .venv/bin/python bench/engine_gpu.py --model-size tiny --concurrency 1,8 --duration-s 2       # CPU, a check
  python3 bench/engine_gpu.py --model-size 1b --concurrency 1,32,128 --duration-s 6             # the GPU
  python3 bench/engine_gpu.py --model-size 1b --concurrency 128 --duration-s 3 --profile --trace-dir /tmp
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import threading
import time
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from tritonforge.runtime.generation import GenerationRequest
from tritonforge.runtime.inflight_engine import InflightBatchingEngine
from tritonforge.runtime.sampling import SamplingParams
from tritonforge.spec.limits import EngineLimits
from tritonforge.tools.tiny_model import SHAPES


def build_model(size: str, device: str, dtype: torch.dtype):
    shape = SHAPES[size]
    config = LlamaConfig(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
                         intermediate_size=shape.intermediate_size, num_hidden_layers=shape.num_hidden_layers,
                         num_attention_heads=shape.num_attention_heads,
                         num_key_value_heads=shape.num_key_value_heads,
                         max_position_embeddings=shape.max_position_embeddings,
                         initializer_range=shape.initializer_range, tie_word_embeddings=False)
    torch.manual_seed(shape.seed)
    with torch.device(device):
        model = LlamaForCausalLM(config)
    return model.to(dtype).eval()


class Load:
    """Closed-loop streams: each sends its next request from the engine's thread when the previous ends."""

    def __init__(self, engine, streams: int, prompt_tokens: int, output_tokens: int, vocab: int, sampled: bool):
        self.engine, self.prompt_tokens, self.output_tokens, self.vocab = engine, prompt_tokens, output_tokens, vocab
        self.sampling = SamplingParams(top_k=50, temperature=0.8, seed=1) if sampled else SamplingParams(
            min_tokens=output_tokens)
        self.lock = threading.Lock()
        self.tokens = 0
        self.ttft: list[float] = []
        self.errors = 0
        self.running = True
        self.open = 0
        self.idle = threading.Event()
        self.random = random.Random(0)
        self.count = 0
        for _ in range(streams):
            self.send()

    def send(self) -> None:
        with self.lock:
            self.count += 1
            self.open += 1
            request_id = f"r{self.count}"
            length = self.random.randint(self.prompt_tokens // 2, self.prompt_tokens)
            prompt = [self.random.randrange(4, self.vocab) for _ in range(length)]
        self.engine.submit(GenerationRequest(request_id=request_id, prompt_ids=prompt,
                                             max_new_tokens=self.output_tokens, sink=_Sink(self),
                                             sampling=self.sampling, stream=True))

    def counted(self, tokens: int, first_token_s: float | None) -> None:
        with self.lock:
            self.tokens += tokens
            if first_token_s is not None:
                self.ttft.append(first_token_s)

    def ended(self, error) -> None:
        with self.lock:
            self.open -= 1
            self.errors += error is not None
            again = self.running
            if not self.open:
                self.idle.set()
        if again:
            self.send()

    def window(self, seconds: float) -> tuple[int, list[float]]:
        with self.lock:
            start_tokens, self.ttft = self.tokens, []
        time.sleep(seconds)
        with self.lock:
            return self.tokens - start_tokens, list(self.ttft)

    def stop(self) -> None:
        with self.lock:
            self.running = False
        self.idle.wait(timeout=300)


class _Sink:
    def __init__(self, load: Load):
        self.load, self.start, self.streamed = load, time.perf_counter(), 0

    def scheduled(self):
        pass

    def _count(self, tokens: int) -> None:
        first = not self.streamed and tokens
        self.load.counted(tokens, time.perf_counter() - self.start if first else None)
        self.streamed += tokens

    def tokens(self, ids, log_probs):
        self._count(len(ids))

    def finish(self, result, error):
        # The tokens of the step that ends a request come only with finish.
        self._count(len(result.token_ids) - self.streamed if result else 0)
        self.load.ended(error)

    def cancelled(self):
        return False


def measure(engine, streams: int, args, vocab: int) -> dict:
    load = Load(engine, streams, args.prompt_tokens, args.output_tokens, vocab, args.sampled)
    load.window(args.warmup_s)
    tokens, ttft = load.window(args.duration_s)
    load.stop()
    return {"streams": streams, "tokens_per_s": tokens / args.duration_s, "errors": load.errors,
            "ttft_p50_ms": 1000 * statistics.median(ttft) if ttft else float("nan")}


def profile(engine, streams: int, args, vocab: int) -> None:
    """torch.profiler records the thread that starts it: it is started and stopped between two of the
    engine's iterations, on the engine's thread."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    prof = torch_profile(activities=activities)
    wanted = {"on": False, "started": False}
    stopped = threading.Event()
    iteration = engine._iteration

    def profiled_iteration():
        if wanted["on"] and not wanted["started"]:
            prof.start()
            wanted["started"] = True
        elif not wanted["on"] and wanted["started"]:
            prof.stop()
            wanted["started"] = False
            stopped.set()
        iteration()

    engine._iteration = profiled_iteration
    load = Load(engine, streams, args.prompt_tokens, args.output_tokens, vocab, args.sampled)
    load.window(args.warmup_s)
    wanted["on"] = True
    tokens, _ = load.window(args.duration_s)
    wanted["on"] = False
    stopped.wait(timeout=60)
    load.stop()
    engine._iteration = iteration
    print(f"\nprofile at {streams} streams: {tokens / args.duration_s:.0f} tokens/s while profiled")
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=args.profile_rows))
    if torch.cuda.is_available():
        print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=args.profile_rows))
    if args.trace_dir:
        path = Path(args.trace_dir) / f"engine-{args.model_size}-{streams}.json"
        prof.export_chrome_trace(str(path))
        print(f"trace: {path}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-size", choices=sorted(SHAPES), default="1b")
    parser.add_argument("--concurrency", default="1,32,128")
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32, help="prompts of half to this many tokens")
    parser.add_argument("--duration-s", type=float, default=6.0)
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dtype", default=None, help="default: the shape's (bfloat16 for 1b) on CUDA, else float32")
    parser.add_argument("--sampled", action="store_true", help="top-k sampling with a seed instead of greedy")
    parser.add_argument("--profile", action="store_true", help="profile the last concurrency after measuring")
    parser.add_argument("--profile-rows", type=int, default=30)
    parser.add_argument("--trace-dir", default=None)
    args = parser.parse_args()
    concurrency = [int(value) for value in args.concurrency.split(",")]
    dtype = getattr(torch, args.dtype or (SHAPES[args.model_size].dtype if args.device != "cpu" else "float32"))
    model = build_model(args.model_size, args.device, dtype)
    print(f"{args.model_size} Llama ({sum(p.numel() for p in model.parameters()) / 1e9:.2f}B parameters) on "
          f"{args.device} in {dtype}, attention {model.config._attn_implementation}; "
          f"{args.output_tokens} tokens a request, prompts <= {args.prompt_tokens}", flush=True)
    engine = InflightBatchingEngine(model, EngineLimits(
        max_batch_size=max(concurrency), max_input_len=args.prompt_tokens,
        max_seq_len=args.prompt_tokens + args.output_tokens))
    try:
        print(f"{'streams':>8}{'tokens/s':>12}{'TTFT p50 ms':>14}{'errors':>8}")
        for streams in concurrency:
            row = measure(engine, streams, args, model.config.vocab_size)
            print(f"{row['streams']:>8}{row['tokens_per_s']:>12.0f}{row['ttft_p50_ms']:>14.1f}{row['errors']:>8}",
                  flush=True)
        if args.profile:
            profile(engine, concurrency[-1], args, model.config.vocab_size)
    finally:
        engine.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
