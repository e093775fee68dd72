"""The transformers engine alone, in-process (no Triton): output tokens/s and TTFT at each concurrency, on the
random-weight Llama shapes of tritonforge/tools/tiny_model.py (SHAPES: "tiny", "1b"), on CUDA when present.

Each of N streams sends its next request (a random prompt, exactly --output-tokens new tokens, streamed) as
soon as its previous one ends, as bench/pipeline.py's clients do; tokens are counted over --duration-s after
a warm-up. --profile then records the engine at the last concurrency with torch.profiler and prints where the
time goes (the top ops by host and by device time) and writes a Chrome trace. On CUDA the engine replays its
decode steps as CUDA graphs unless --no-cuda-graphs; --compare-cuda-graphs measures both, eager first, in one
run. The figures go to --results-dir (engine-gpu-<size>.json and .md). Every point also times the engine's
prefills and decode steps apart (each ends in its one sync to the host, so its wall time is its time).

--model CHECKPOINT measures a real model instead of a shape (e.g. the one `tritonforge make-model smollm2` writes);
--compare-log-probs K adds a mode whose requests ask for their tokens' log probabilities with the K likeliest
alternatives (what they cost); --compare-transformers adds transformers' own `generate` (one request at a time)
and its continuous batching (`generate_batch`, four requests a stream at once) on the same model;
--compare-lora N adds a mode whose requests go round-robin to N random LoRA adapters (rank --lora-rank, every
linear layer of every block) and the base model, in one batch (runtime/engine/transformers/lora_layers.py).

--tp-size 1,2,4 measures tensor parallelism instead (runtime/engine/transformers/tensor_parallel.py): the shape
is written as a checkpoint, and each size loads it split over that many GPUs (rank 0 here, the others worker
processes), eager decode steps as tensor parallelism runs them, with one GPU's CUDA graphs beside them as the
ceiling of one GPU.

Run:
  .venv/bin/python bench/engine_gpu.py --model-size tiny --concurrency 1,8 --duration-s 2       # CPU, a check
  python3 bench/engine_gpu.py --model-size 1b --concurrency 1,32,128 --duration-s 4 --compare-cuda-graphs
  python3 bench/engine_gpu.py --model-size 1b --concurrency 128 --duration-s 3 --profile --trace-dir /tmp
  python3 bench/engine_gpu.py --model CHECKPOINT --concurrency 1,32,128 --compare-log-probs 5 --compare-transformers
  python3 bench/engine_gpu.py --model-size 1b --concurrency 128 --compare-lora 4
  python3 bench/engine_gpu.py --model-size 1b --concurrency 128,256,512 --tp-size 1,2,4     # 4 GPUs
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

from tritonforge.facts.limits import EngineLimits
from tritonforge.runtime.engine.generation import GenerationRequest
from tritonforge.runtime.engine.sampling import SamplingParams
from tritonforge.tools.tiny_model import SHAPES

if TYPE_CHECKING:
    import torch


def build_model(size: str, device: str, dtype: torch.dtype):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    shape = SHAPES[size]
    config = LlamaConfig(vocab_size=shape.vocab_size, hidden_size=shape.hidden_size,
                         intermediate_size=shape.intermediate_size, num_hidden_layers=shape.num_hidden_layers,
                         num_attention_heads=shape.num_attention_heads,
                         num_key_value_heads=shape.num_key_value_heads,
                         max_position_embeddings=shape.max_position_embeddings,
                         initializer_range=shape.initializer_range, tie_word_embeddings=False)
    torch.manual_seed(shape.seed)
    # Made where it runs, in its dtype: no float32 copy on the host first (seconds for the 1b shape).
    default = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(config)
    finally:
        torch.set_default_dtype(default)
    return model.to(dtype).eval()


def make_model(args, dtype):
    if not args.model:
        return build_model(args.model_size, args.device, dtype)
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(args.model, dtype=dtype).to(args.device).eval()


class Load:
    """Closed-loop streams: each sends its next request from the engine's thread when the previous ends."""

    def __init__(self, engine, streams: int, prompt_tokens: int, output_tokens: int, vocab: int, sampled: bool,
                 top_log_probs: int = 0, adapters: int = 0):
        self.engine, self.prompt_tokens, self.output_tokens, self.vocab = engine, prompt_tokens, output_tokens, vocab
        self.top_log_probs, self.adapters = top_log_probs, adapters
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
                                             sampling=self.sampling, stream=True,
                                             return_log_probs=bool(self.top_log_probs),
                                             num_top_log_probs=self.top_log_probs,
                                             # the base model, then each adapter (task ids 1..N) in turn
                                             lora_task_id=self.count % (self.adapters + 1) or None))

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
        """No new requests; the open ones are cancelled (their sinks say so), so that the next run starts
        at once instead of after a drain."""
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

    def tokens(self, ids, log_probs, top=None):
        self._count(len(ids))

    def finish(self, result, error):
        # The tokens of the step that ends a request come only with finish.
        self._count(len(result.token_ids) - self.streamed if result else 0)
        self.load.ended(error)

    def cancelled(self):
        return not self.load.running


class StepClock:
    """The engine thread's time in prefills and in decode steps while `on`; wraps the engine's own two methods
    (instance attributes, which its loop calls in their place)."""

    def __init__(self, engine):
        self.on = False
        self.reset()
        prefill, decode = engine._prefill, engine._decode_step

        def timed_prefill(group):
            start = time.perf_counter()
            prefill(group)
            if self.on:
                self.prefill_s += time.perf_counter() - start
                self.prefills += 1
                self.prefilled += len(group)

        def timed_decode():
            start = time.perf_counter()
            decode()
            if self.on:
                self.decode_s += time.perf_counter() - start
                self.decodes += 1

        engine._prefill, engine._decode_step = timed_prefill, timed_decode

    def reset(self) -> None:
        self.prefill_s = self.decode_s = 0.0
        self.prefills = self.prefilled = self.decodes = 0

    def figures(self, seconds: float) -> dict:
        return {"decode_ms": round(1000 * self.decode_s / self.decodes, 3) if self.decodes else None,
                "prefill_ms": round(1000 * self.prefill_s / self.prefills, 3) if self.prefills else None,
                "prefilled_per_pass": round(self.prefilled / self.prefills, 1) if self.prefills else None,
                "decode_share": round(self.decode_s / seconds, 3), "prefill_share": round(self.prefill_s / seconds, 3)}


def measure(engine, streams: int, args, vocab: int, top_log_probs: int = 0, adapters: int = 0) -> dict:
    clock = engine.step_clock
    load = Load(engine, streams, args.prompt_tokens, args.output_tokens, vocab, args.sampled, top_log_probs,
                adapters)
    load.window(args.warmup_s)
    clock.reset()
    clock.on = True
    tokens, ttft = load.window(args.duration_s)
    clock.on = False
    load.stop()
    return {"streams": streams, "tokens_per_s": round(tokens / args.duration_s, 1), "errors": load.errors,
            "ttft_p50_ms": round(1000 * statistics.median(ttft), 2) if ttft else None,
            **clock.figures(args.duration_s)}


def profile(engine, streams: int, args, vocab: int) -> None:
    """torch.profiler records the thread that starts it: it is started and stopped between two of the
    engine's iterations, on the engine's thread."""
    import torch
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


def limits_of(args, concurrency: list[int]) -> EngineLimits:
    return EngineLimits(max_batch_size=max(concurrency), max_input_len=args.prompt_tokens,
                        max_seq_len=args.prompt_tokens + args.output_tokens)


def run_mode(model, args, concurrency: list[int], cuda_graphs: bool, admission_wait_steps: int = 0,
             top_log_probs: int = 0, adapters: int = 0) -> dict:
    """One engine, every concurrency in turn; the engine's decode mode as it ended (a failed capture falls
    back to eager steps). `adapters`: that many random LoRA adapters installed in `model` first (for good: the
    mode that asks for them runs last)."""
    from tritonforge.runtime.engine.transformers.inflight import InflightBatchingEngine

    bank = install_random_adapters(model, adapters, args.lora_rank, max(concurrency)) if adapters else None
    engine = InflightBatchingEngine(model, limits_of(args, concurrency), cuda_graphs=cuda_graphs,
                                    admission_wait_steps=admission_wait_steps, adapters=bank)
    label = ("CUDA graphs" if engine.cuda_graphs else "eager") + (
        f", admissions gathered up to {admission_wait_steps} steps" if admission_wait_steps else "") + (
        f", top {top_log_probs} log probs" if top_log_probs else "") + (
        f", {adapters} LoRA adapters and the base" if adapters else "")
    return run_engine(engine, label, args, concurrency, cuda_graphs, top_log_probs, adapters)


def install_random_adapters(model, count: int, rank: int, slots: int):
    """`count` adapters of random factors on every linear layer of the model's blocks, written as PEFT saves
    them and loaded as the engine loads a build's."""
    import torch
    from safetensors.torch import save_file

    from tritonforge.runtime.engine.lora import AdapterRecord
    from tritonforge.runtime.engine.transformers.lora_layers import load_adapters

    linears = {name: module for name, module in model.named_modules()
               if isinstance(module, torch.nn.Linear) and ".layers." in name}
    shapes = {f"{name}.weight": list(module.weight.shape) for name, module in linears.items()}
    folder = Path(tempfile.mkdtemp(prefix="lora-bench-"))
    records = []
    for task in range(1, count + 1):
        generator = torch.Generator().manual_seed(task)
        tensors = {}
        for name, module in linears.items():
            tensors[f"base_model.model.{name}.lora_A.weight"] = torch.randn(
                rank, module.in_features, generator=generator) / module.in_features ** 0.5
            tensors[f"base_model.model.{name}.lora_B.weight"] = torch.randn(
                module.out_features, rank, generator=generator) / rank ** 0.5
        adapter = folder / f"adapter{task}"
        adapter.mkdir()
        save_file(tensors, str(adapter / "adapter_model.safetensors"))
        (adapter / "adapter_config.json").write_text(json.dumps(
            {"peft_type": "LORA", "r": rank, "lora_alpha": rank,
             "target_modules": sorted({name.rsplit(".", 1)[-1] for name in linears})}))
        records.append(AdapterRecord(name=f"adapter{task}", task_id=task, path=str(adapter)))
    return load_adapters(model, records, slots, shapes)


def run_engine(engine, label: str, args, concurrency: list[int], cuda_graphs: bool, top_log_probs: int = 0,
               adapters: int = 0) -> dict:
    engine.step_clock = StepClock(engine)
    vocab = engine.model.config.vocab_size
    rows = []
    try:
        print(f"\ndecode steps: {label}\n{'streams':>8}{'tokens/s':>12}{'TTFT p50 ms':>14}{'errors':>8}"
              f"{'decode ms':>11}{'prefill ms':>12}{'prefill share':>15}", flush=True)
        for streams in concurrency:
            row = measure(engine, streams, args, vocab, top_log_probs, adapters)
            ttft = f"{row['ttft_p50_ms']:.1f}" if row["ttft_p50_ms"] is not None else "-"
            decode, prefill = (f"{row[key]:.2f}" if row[key] is not None else "-" for key in ("decode_ms",
                                                                                            "prefill_ms"))
            print(f"{row['streams']:>8}{row['tokens_per_s']:>12.0f}{ttft:>14}{row['errors']:>8}{decode:>11}"
                  f"{prefill:>12}{row['prefill_share']:>15.2f}", flush=True)
            rows.append(row)
        if args.profile:
            profile(engine, concurrency[-1], args, vocab)
        graphs = engine._graphs
        mode = {"cuda_graphs_asked": cuda_graphs, "cuda_graphs": engine.cuda_graphs,
                "graphs_captured": graphs.captured if graphs is not None else 0, "rows": rows}
    finally:
        engine.shutdown()
    if cuda_graphs and not mode["cuda_graphs"] and args.device != "cpu":
        print("note: CUDA graphs were asked for but are off (see the warning above): these are eager figures")
    return mode


def run_transformers(model, args, concurrency: list[int]) -> dict:
    """transformers' own: `generate` one request at a time, and its continuous batching (`generate_batch`) with
    four requests a stream at each concurrency above 1; greedy, exactly --output-tokens new tokens each, the
    tokens counted from what it returns. Each is run once untimed first (its warm-up and graph captures)."""
    import torch
    from transformers import GenerationConfig

    rng = random.Random(1)
    vocab = model.config.vocab_size

    def prompts(count: int) -> list[list[int]]:
        return [[rng.randrange(4, vocab) for _ in range(rng.randint(args.prompt_tokens // 2, args.prompt_tokens))]
                for _ in range(count)]

    config = GenerationConfig(max_new_tokens=args.output_tokens, min_new_tokens=args.output_tokens, do_sample=False,
                              eos_token_id=model.generation_config.eos_token_id,
                              pad_token_id=model.generation_config.pad_token_id or 0)
    device = next(model.parameters()).device

    def generate_once(prompt: list[int]) -> int:
        ids = torch.tensor([prompt], device=device)
        return int(model.generate(ids, generation_config=config).shape[1] - ids.shape[1])

    generate_once(prompts(1)[0])
    tokens, start = 0, time.perf_counter()
    while time.perf_counter() - start < args.duration_s:
        tokens += generate_once(prompts(1)[0])
    rate = tokens / (time.perf_counter() - start)
    rows = {"generate (one request at a time)": {"streams": 1, "tokens_per_s": round(rate, 1)}}
    print(f"\ntransformers generate, one request at a time: {rate:.0f} tokens/s", flush=True)
    for streams in (n for n in concurrency if n > 1):
        model.generate_batch(prompts(streams), generation_config=config)
        batch = prompts(4 * streams)
        start = time.perf_counter()
        outputs = model.generate_batch(batch, generation_config=config)
        seconds = time.perf_counter() - start
        tokens = sum(len(output.generated_tokens) for output in outputs.values())
        rows[f"generate_batch ({len(batch)} requests at once)"] = {"streams": streams,
                                                                  "tokens_per_s": round(tokens / seconds, 1)}
        print(f"transformers generate_batch, {len(batch)} requests: {tokens / seconds:.0f} tokens/s", flush=True)
    return rows


def run_tensor_parallel(args, concurrency: list[int], dtype, work: Path) -> tuple[dict, float]:
    """Each --tp-size in turn over a checkpoint of the shape (one tensor-parallel group at a time: a process
    holds one), eager as tensor parallelism decodes; one GPU's CUDA graphs beside tp=1. The modes, and the
    model's parameters in billions."""
    from tritonforge.builder.planner import ModelShape
    from tritonforge.runtime.engine.service import EngineSettings
    from tritonforge.runtime.engine.transformers.inflight import InflightBatchingEngine
    from tritonforge.runtime.engine.transformers.loading import load_model
    from tritonforge.runtime.engine.transformers.tensor_parallel import make_tensor_parallel_engine
    from tritonforge.tools.tiny_model import make_tiny_model

    checkpoint = make_tiny_model(work / "model", shape=SHAPES[args.model_size])
    shape = ModelShape.from_hf_config(json.loads((checkpoint / "config.json").read_text()))
    modes = {}
    for size in (int(value) for value in args.tp_size.split(",")):
        settings = EngineSettings(limits=limits_of(args, concurrency), model_path=str(checkpoint),
                                  dtype=str(dtype).removeprefix("torch."), device=args.device,
                                  tensor_parallel_size=size)
        if size == 1:
            for graphs in (False, True) if args.device != "cpu" else (False,):
                engine = InflightBatchingEngine(load_model(settings), settings.limits, cuda_graphs=graphs)
                name = "tp=1, " + ("CUDA graphs" if engine.cuda_graphs else "eager")
                modes[name] = run_engine(engine, name, args, concurrency, graphs)
        else:
            modes[f"tp={size}, eager"] = run_engine(make_tensor_parallel_engine(settings), f"tp={size}, eager", args,
                                                    concurrency, False)
    return modes, (shape.linear_params + shape.other_params) / 1e9


def write_results(args, header: dict, modes: dict, baselines: dict | None = None) -> Path:
    args.results_dir.mkdir(parents=True, exist_ok=True)
    stem = args.results_dir / f"engine-gpu-{header['model']}{'-tp' if args.tp_size != '1' else ''}"
    stem.with_suffix(".json").write_text(json.dumps({**header, "modes": modes}, indent=1) + "\n")
    streams = [row["streams"] for row in next(iter(modes.values()))["rows"]]
    lines = [f"# bench/engine_gpu.py: {header['model']} on {header['device_name']}", "",
             f"`{header['command']}`", "",
             f"{header['parameters_b']:.2f}B parameters, {header['dtype']}, {args.output_tokens} tokens a request, "
             f"prompts of {args.prompt_tokens // 2}-{args.prompt_tokens} tokens, {args.duration_s:g} s a point "
             f"after {args.warmup_s:g} s of warm-up; torch {header['torch']}, {header['date']}.", "",
             "| decode steps | " + " | ".join(f"{n} streams: tokens/s (TTFT p50 ms)" for n in streams) + " |",
             "|---|" + "---|" * len(streams)]
    for name, mode in modes.items():
        cells = [f"{row['tokens_per_s']:,.0f} ({row['ttft_p50_ms'] if row['ttft_p50_ms'] is not None else '-'})"
                 + (f", {row['errors']} errors" if row["errors"] else "") for row in mode["rows"]]
        lines.append(f"| {name} ({mode['graphs_captured']} captured graphs) | " + " | ".join(cells) + " |")
    lines += ["", "Prefill and decode apart: mean ms a decode step, mean ms a prefill pass (requests a pass), "
              "share of the time in prefills.", "",
              "| decode steps | " + " | ".join(f"{n} streams" for n in streams) + " |", "|---|" + "---|" * len(streams)]
    for name, mode in modes.items():
        lines.append(f"| {name} | " + " | ".join(
            f"decode {row['decode_ms']} ms, prefill {row['prefill_ms']} ms ({row['prefilled_per_pass']}), "
            f"{row['prefill_share']:.0%} in prefills" for row in mode["rows"]) + " |")
    if args.compare_cuda_graphs and args.tp_size == "1":
        eager, graphed = (mode["rows"] for mode in list(modes.values())[:2])
        lines += ["", "CUDA graphs / eager: " + ", ".join(
            f"{a['streams']} streams {b['tokens_per_s'] / a['tokens_per_s']:.1f}x" for a, b in zip(eager, graphed)
            if a["tokens_per_s"])]
    # The added modes come last (log probs, then LoRA), each beside the plain mode they were added to.
    rows = [mode["rows"] for mode in modes.values()]
    plain = rows[len(rows) - 1 - bool(args.compare_log_probs) - bool(args.compare_lora)]

    def ratios(label: str, added: list[dict]) -> list[str]:
        return ["", f"{label}: " + ", ".join(f"{a['streams']} streams {b['tokens_per_s'] / a['tokens_per_s']:.2f}"
                                             for a, b in zip(plain, added) if a["tokens_per_s"])]

    if args.compare_lora:
        lines += ratios(f"{args.compare_lora} LoRA adapters and the base / the base alone", rows[-1])
    if args.compare_log_probs:
        lines += ratios(f"With top {args.compare_log_probs} log probs / without", rows[-2 if args.compare_lora else -1])
    if baselines:
        lines += ["", "transformers' own on the same model (greedy, the same lengths):", "",
                  "| transformers | streams | tokens/s |", "|---|---|---|"]
        lines += [f"| {name} | {row['streams']} | {row['tokens_per_s']:,.0f} |" for name, row in baselines.items()]
    stem.with_suffix(".md").write_text("\n".join(lines) + "\n")
    return stem


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model-size", choices=sorted(SHAPES), default="1b")
    parser.add_argument("--model", type=Path, default=None, help="a checkpoint folder instead of a shape")
    parser.add_argument("--compare-log-probs", type=int, default=0, metavar="K",
                        help="also measure with each token's log prob and its K likeliest alternatives asked")
    parser.add_argument("--compare-lora", type=int, default=0, metavar="N",
                        help="also measure requests spread over N random LoRA adapters and the base model")
    parser.add_argument("--lora-rank", type=int, default=16)
    parser.add_argument("--compare-transformers", action="store_true",
                        help="also measure transformers' own generate and generate_batch")
    parser.add_argument("--concurrency", default="1,32,128")
    parser.add_argument("--output-tokens", type=int, default=64)
    parser.add_argument("--prompt-tokens", type=int, default=32, help="prompts of half to this many tokens")
    parser.add_argument("--duration-s", type=float, default=6.0)
    parser.add_argument("--warmup-s", type=float, default=2.0)
    parser.add_argument("--device", default=None, help="default: cuda where torch sees a GPU, else cpu")
    parser.add_argument("--dtype", default=None, help="default: the shape's (bfloat16 for 1b) on CUDA, else float32")
    parser.add_argument("--sampled", action="store_true", help="top-k sampling with a seed instead of greedy")
    graphs = parser.add_mutually_exclusive_group()
    graphs.add_argument("--no-cuda-graphs", action="store_true", help="eager decode steps on CUDA too")
    graphs.add_argument("--compare-cuda-graphs", action="store_true",
                        help="measure eager decode steps, then CUDA graphs, then CUDA graphs with admissions "
                             "gathered, in one run")
    parser.add_argument("--tp-size", default="1", help="tensor-parallel sizes to measure, e.g. 1,2,4 (GPUs each)")
    parser.add_argument("--profile", action="store_true", help="profile the last concurrency after measuring")
    parser.add_argument("--profile-rows", type=int, default=30)
    parser.add_argument("--trace-dir", default=None)
    parser.add_argument("--results-dir", type=Path, default=Path(__file__).resolve().parent / "results")
    args = parser.parse_args()
    # Imported once the arguments are read: --help answers without loading torch.
    import torch

    from tritonforge.runtime.engine.transformers.inflight import GATHERED_ADMISSION_STEPS

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    concurrency = [int(value) for value in args.concurrency.split(",")]
    dtype = getattr(torch, args.dtype or (SHAPES[args.model_size].dtype if args.device != "cpu" else "float32"))
    start = time.perf_counter()
    device_name = torch.cuda.get_device_name(args.device) if args.device != "cpu" else platform.processor() or "CPU"
    header = {"command": "python3 bench/engine_gpu.py " + " ".join(sys.argv[1:]), "device_name": device_name,
              "model": args.model.name if args.model else args.model_size,
              "dtype": str(dtype).removeprefix("torch."), "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}
    if args.tp_size != "1":
        with tempfile.TemporaryDirectory() as work:
            modes, parameters_b = run_tensor_parallel(args, concurrency, dtype, Path(work))
        header.update(parameters_b=parameters_b, gpus=torch.cuda.device_count(),
                      seconds=round(time.perf_counter() - start, 1))
        stem = write_results(args, header, modes)
        print(f"\nresults: {stem}.json, {stem}.md ({header['seconds']:.0f} s in all)")
        return 1 if any(row["errors"] for mode in modes.values() for row in mode["rows"]) else 0
    if args.model and args.dtype is None and args.device != "cpu":
        dtype = torch.bfloat16
    model = make_model(args, dtype)
    parameters = sum(p.numel() for p in model.parameters())
    print(f"{header['model']} ({parameters / 1e9:.2f}B parameters) on {args.device} ({device_name}) in {dtype}, "
          f"made in {time.perf_counter() - start:.1f} s, attention {model.config._attn_implementation}; "
          f"{args.output_tokens} tokens a request, prompts <= {args.prompt_tokens}", flush=True)
    gathered = f"CUDA graphs, admissions gathered (up to {GATHERED_ADMISSION_STEPS} steps)"
    if args.compare_cuda_graphs:
        plan = {"eager": (False, 0), "CUDA graphs": (True, 0), gathered: (True, GATHERED_ADMISSION_STEPS)}
    else:
        plan = {"eager" if args.no_cuda_graphs or args.device == "cpu" else "CUDA graphs": (not args.no_cuda_graphs, 0)}
    plan = {name: (cuda_graphs, wait, 0, 0) for name, (cuda_graphs, wait) in plan.items()}
    last, (cuda_graphs, wait, _, _) = list(plan.items())[-1]
    if args.compare_log_probs:
        plan[f"{last}, top {args.compare_log_probs} log probs"] = (cuda_graphs, wait, args.compare_log_probs, 0)
    if args.compare_lora:  # last: it installs the adapters in the model
        plan[f"{last}, {args.compare_lora} LoRA adapters and the base"] = (cuda_graphs, wait, 0, args.compare_lora)
    modes = {name: run_mode(model, args, concurrency, cuda_graphs, wait, top, adapters)
             for name, (cuda_graphs, wait, top, adapters) in plan.items()}
    # A model of its own: the engine switched this one's attention to its slot attention.
    baselines = run_transformers(make_model(args, dtype), args, concurrency) if args.compare_transformers else None
    header.update(parameters_b=parameters / 1e9, seconds=round(time.perf_counter() - start, 1))
    stem = write_results(args, {**header, "transformers": baselines}, modes, baselines)
    print(f"\nresults: {stem}.json, {stem}.md ({header['seconds']:.0f} s in all)")
    return 1 if any(row["errors"] for mode in modes.values() for row in mode["rows"]) else 0


if __name__ == "__main__":
    sys.exit(main())
