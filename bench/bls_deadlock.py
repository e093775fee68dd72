"""The load that deadlocked Triton 2.51's Python-backend stub when the BLS called the engine through the
backend's own BLS API (`InferenceRequest.exec(decoupled=True)`), run against the BLS that now calls the
engine over the server's gRPC stream (tritonforge/runtime/bls/engine_stream.py); with --supervised, under
`tritonforge serve`'s supervisor.

The cycle it met (python_backend r24.10 source, unchanged on its main branch;
docs/design/faults.md#a-deadlock-in-tritons-python-backend-and-why-the-bls-calls-the-engine-over-grpc): a row
thread returning from `exec` held the GIL and waited for the stub's response-iterator map lock; the stub's thread
that delivers BLS responses held that lock and waited for one iterator's lock; that iterator's row thread, woken
inside `__next__`, held it and waited for the GIL. With one BLS instance running 64 rows it stalled within 0 to 13
rounds in each of seven runs (`bench/results/bls-deadlock-cpu.md`, `-supervised.md`, `-one-row-per-instance.md`:
the BLS of commit e588cb4); the BLS over gRPC ran 20 rounds clean (`bls-deadlock-cpu-engine-stream.md`).

Rounds of closed-loop BLS streams (short requests, a fast replay engine, one BLS instance: many engine calls
and responses a second) until one makes no progress for --stall-s, or --rounds pass.

  .venv/bin/python bench/bls_deadlock.py --rounds 20
  .venv/bin/python bench/bls_deadlock.py --supervised
"""

from __future__ import annotations

import argparse
import datetime
import sys
import tempfile
import threading
import time
from pathlib import Path

from tritonforge.builder import model_configs as configs
from tritonforge.builder.build import BuildOptions, build
from tritonforge.builder.repository import tokenizer_dir
from tritonforge.serve.server import TritonServer
from tritonforge.serve.supervisor import Supervisor
from tritonforge.tools.benchmark import asyncio_load, machine_description, make_prompts, summarize
from tritonforge.tools.tiny_model import make_tiny_model

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", type=int, default=64)
    parser.add_argument("--output-tokens", type=int, default=8, help="short requests: many engine calls")
    parser.add_argument("--step-ms", type=float, default=2.0, help="replay engine step")
    parser.add_argument("--round-s", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=30)
    parser.add_argument("--stall-s", type=float, default=60.0, help="a round this late past its end is a stall")
    parser.add_argument("--bls-instances", type=int, default=1)
    parser.add_argument("--bls-max-concurrency", type=int, default=configs.ServingConfig.bls_max_concurrency,
                        help="rows one BLS instance runs at once")
    parser.add_argument("--supervised", action="store_true", help="run the server under the supervisor")
    parser.add_argument("--wedged-after-s", type=float, default=10.0, help="the supervisor's limit")
    parser.add_argument("--name", default=None, help="results file stem under bench/results/ (default: none)")
    args = parser.parse_args()
    lines = []

    def report(line: str) -> None:
        lines.append(line)
        print(line, flush=True)

    with tempfile.TemporaryDirectory() as temporary:
        work = Path(temporary)
        serving = configs.ServingConfig(max_batch_size=args.streams, engine_instances=2,
                                        bls_instances=args.bls_instances, bls_max_concurrency=args.bls_max_concurrency,
                                        postprocessing_instances=1)
        repository = build(BuildOptions(model=make_tiny_model(work / "model"), output=work / "repo",
                                        engine="replay", replay_step_ms=args.step_ms, max_batch_size=args.streams,
                                        max_input_len=40, max_seq_len=40 + args.output_tokens, serving=serving),
                           progress=lambda _: None)
        prompts = make_prompts(tokenizer_dir(repository), 256, 24)
        server = TritonServer(repository, restricted_apis="")
        supervisor = watcher = None
        stop = threading.Event()
        if args.supervised:
            supervisor = Supervisor(server, period_s=0.2, wedged_after_s=args.wedged_after_s)
            supervisor.start()
            watcher = threading.Thread(target=supervisor.run, args=(stop,), daemon=True)
            watcher.start()
        else:
            server.start()
        report(f"BLS deadlock reproduction — {machine_description()}, {datetime.date.today().isoformat()}: "
               f"{args.streams} streams of {args.output_tokens} tokens, replay step {args.step_ms} ms, "
               f"{args.bls_instances} BLS instance(s) running up to {args.bls_max_concurrency} rows each, "
               f"{args.round_s:.0f} s rounds{', under the supervisor' if args.supervised else ''}")
        try:
            for number in range(args.rounds):
                outcome: dict = {}

                def run_round(into: dict) -> None:
                    into["result"] = asyncio_load(server.grpc_url, "bls", prompts, args.streams, args.output_tokens,
                                                  args.round_s)

                load = threading.Thread(target=run_round, args=(outcome,), daemon=True)
                started = time.monotonic()
                load.start()
                load.join(args.round_s + args.stall_s)
                if load.is_alive() and not args.supervised:
                    report(f"round {number}: stalled (no end {args.stall_s:.0f} s past the round)")
                    return 1
                load.join()  # supervised: the supervisor ends a stalled round by restarting the server
                summary = summarize(*outcome["result"], args.streams)
                report(f"round {number}: {summary['requests']} requests, {summary['output_tokens_per_s']:,.0f} "
                       f"tokens/s, {summary['errors']} errors in {time.monotonic() - started:.0f} s"
                       + (f" ({summary['first_error']})" if summary["errors"] else "")
                       + (f"; supervisor restarts so far: {supervisor.restarts}" if supervisor else ""))
            report(f"{args.rounds} rounds: the supervisor restarted the server {supervisor.restarts} times"
                   if supervisor else f"no stall in {args.rounds} rounds")
            return 0
        finally:
            if watcher is not None:
                stop.set()
                watcher.join(timeout=60)  # it stops the server on its way out
            else:
                server.stop()
            if args.name:
                RESULTS_DIR.mkdir(parents=True, exist_ok=True)
                (RESULTS_DIR / f"{args.name}.md").write_text("\n\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
