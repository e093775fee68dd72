"""The transformers engine's in-flight batching against one-request-at-a-time `generate`, 32 requests.

Checks that greedy tokens are identical both ways, then prints the throughput ratio.
Run: .venv/bin/python bench/engine.py [--requests 32] [--max-tokens 64]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time

import torch
from transformers import AutoModelForCausalLM

from tritonforge.facts.limits import EngineLimits
from tritonforge.runtime.engine.generation import GenerationRequest
from tritonforge.runtime.engine.sampling import SamplingParams
from tritonforge.runtime.engine.transformers.inflight import InflightBatchingEngine
from tritonforge.runtime.text.tokenization import load_tokenizer
from tritonforge.tools.tiny_model import make_tiny_model


class Collect:
    def __init__(self):
        self.done, self.result = threading.Event(), None

    def scheduled(self):
        pass

    def tokens(self, ids, log_probs):
        pass

    def finish(self, result, error):
        self.result = result
        self.done.set()

    def cancelled(self):
        return False


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    torch.set_num_threads(2)
    with tempfile.TemporaryDirectory() as work:
        model_dir = make_tiny_model(f"{work}/tiny", tokenizer_family="bpe")
        tokenizer = load_tokenizer(model_dir)
        model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
        prompts = [tokenizer(f"Request {i}: the server reads").input_ids for i in range(args.requests)]

        start = time.perf_counter()
        sequential = []
        with torch.inference_mode():
            for ids in prompts:
                out = model.generate(torch.tensor([ids]), max_new_tokens=args.max_tokens,
                                     min_new_tokens=args.max_tokens, do_sample=False)
                sequential.append(out[0, len(ids):].tolist())
        sequential_s = time.perf_counter() - start

        engine = InflightBatchingEngine(model, EngineLimits(max_batch_size=args.requests, max_input_len=64,
                                                            max_seq_len=64 + args.max_tokens))
        sinks = [Collect() for _ in prompts]
        start = time.perf_counter()
        for index, (ids, sink) in enumerate(zip(prompts, sinks)):
            # Fixed length both ways: EOS masked until max_tokens, as generate's min_new_tokens does.
            engine.submit(GenerationRequest(request_id=str(index), prompt_ids=ids, max_new_tokens=args.max_tokens,
                                            end_id=tokenizer.eos_token_id, sink=sink,
                                            sampling=SamplingParams(min_tokens=args.max_tokens)))
        for sink in sinks:
            sink.done.wait()
        batched_s = time.perf_counter() - start
        engine.shutdown()

    identical = all(sink.result.token_ids == tokens for sink, tokens in zip(sinks, sequential))
    total = args.requests * args.max_tokens
    print(f"{args.requests} requests × {args.max_tokens} tokens, greedy, tiny Llama on CPU")
    print(f"{'mode':<36}{'tokens/s':>10}")
    print(f"{'one at a time (model.generate)':<36}{total / sequential_s:>10.0f}")
    print(f"{'in-flight batching (this engine)':<36}{total / batched_s:>10.0f}")
    print(f"speed-up: {sequential_s / batched_s:.1f}x; greedy tokens identical: {identical}")
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
