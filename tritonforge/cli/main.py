"""`tritonforge`: build | serve | openai | eval | generate | probe | bench | tune | demo | make-tiny-model.

Every mistake a user can make here ends in one line on stderr that names the problem and what to do, with exit
status 2 for a usage error (a bad flag, path or port) and 1 for a runtime one (no server answers, a tool is
missing, the server failed); `-v` adds the detail (`main`).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import logging
import os
import signal
import sys
import tempfile
import threading
from pathlib import Path

from ..build import model_configs as configs
from ..build.builder import AccuracyGateFailed, BuildOptions, build
from ..build.repository import tokenizer_dir
from ..build.trtllm import EngineMismatch, TensorRTLLMMissing
from ..clients.openai_gateway import DEFAULT_MODEL as OPENAI_DEFAULT_MODEL
from ..clients.openai_gateway import SERVED_MODEL_NAME
from ..serve.liveness import DEFAULT_WEDGED_AFTER_S
from ..spec.contract import BLS_MODEL, DEFAULT_MAX_TOKENS, ENSEMBLE_MODEL
from ..spec.ports import GRPC_PORT, HTTP_PORT, LOCAL_GRPC_URL, LOCAL_HTTP_URL, METRICS_PORT, OPENAI_PORT
from ..spec.settings import add_arguments, given


def _whole_numbers(text: str, minimum: int) -> list[int]:
    try:
        values = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < minimum:
        raise argparse.ArgumentTypeError(f"expected numbers >= {minimum}, got {text!r}")
    return values


def positive_ints(text: str) -> list[int]:
    """An argparse `type` for lists like "1,8,32,128" (concurrencies, instance counts)."""
    return _whole_numbers(text, 1)


def non_negative_ints(text: str) -> list[int]:
    """An argparse `type` for lists like "0,200" (delays)."""
    return _whole_numbers(text, 0)


def positive_seconds(text: str) -> float:
    """An argparse `type` for a time limit in seconds: a number above 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


SERVING = "serving."  # where the ServingConfig options land in `args`
INSTANCE_COUNTS = ("preprocessing_instances", "postprocessing_instances", "bls_instances")


def _add_build_arguments(parser: argparse.ArgumentParser) -> None:
    add_arguments(parser, BuildOptions)
    add_arguments(parser.add_argument_group("serving (Triton's batching, instances and queues)"),
                  configs.ServingConfig, prefix=SERVING)


def build_options(args: argparse.Namespace):
    """BuildOptions from the flags the user gave; every other value is the dataclasses' default."""
    options, serving = given(args, BuildOptions), given(args, configs.ServingConfig, prefix=SERVING)
    engine_batch = options.get("max_batch_size", _default(BuildOptions, "max_batch_size"))
    serving["max_batch_size"] = max(serving.get("max_batch_size", _default(configs.ServingConfig, "max_batch_size")),
                                    engine_batch)
    return BuildOptions(**options, serving=configs.ServingConfig(**serving),
                        planned_instances=not any(name in serving for name in INSTANCE_COUNTS))


def _default(cls, name: str):
    return next(field.default for field in dataclasses.fields(cls) if field.name == name)


def build_command(args: argparse.Namespace) -> int:
    output = build(build_options(args))
    print(f"repository ready: {output}")
    return 0


def check_repository_engine(repository: Path) -> int:
    """For a TensorRT-LLM repository: fail now if its engine was built for another GPU or release."""
    import json

    from ..build.repository import ENGINE_SUBDIR, MANIFEST
    from ..build.trtllm import check_engine, runtime_facts

    manifest = json.loads((repository / MANIFEST).read_text()) if (repository / MANIFEST).exists() else {}
    if manifest.get("ready") is False:
        raise EngineMismatch(f"{repository} failed its accuracy gate at build time (figures in {MANIFEST}): "
                             f"rebuild it, or rebuild without --accuracy-gate to serve it anyway")
    build = manifest.get("tritonforge_build", {})
    if build.get("engine") != "tensorrtllm":
        return 1
    world_size = int(build.get("tp_size", 1)) * int(build.get("pp_size", 1))
    check_engine(repository / configs.ENGINE_MODEL / "1" / ENGINE_SUBDIR, runtime_facts(), world_size)
    return world_size


def serve_command(args: argparse.Namespace) -> int:
    from ..serve.server import RESTRICTED_APIS, TritonServer, check_ports_free, check_repository
    from ..serve.supervisor import Supervisor

    models = check_repository(args.repository)
    world_size = check_repository_engine(args.repository)
    check_ports_free(args.address, {"--http-port": args.http_port, "--grpc-port": args.grpc_port,
                                    "--metrics-port": args.metrics_port, "--openai-port": args.openai_port})
    server = TritonServer(args.repository, executable=args.tritonserver, http_port=args.http_port,
                          grpc_port=args.grpc_port, metrics_port=args.metrics_port, address=args.address,
                          log_verbose=args.log_verbose, world_size=world_size,
                          restricted_apis="" if args.open_apis else RESTRICTED_APIS, log_file=args.log_file)
    supervisor = Supervisor(server, wedged_after_s=args.wedged_after_s)
    stop, serving = threading.Event(), threading.Event()

    def on_signal(*_) -> None:
        # While the server is still loading, a signal interrupts the wait (the start stops what it started).
        # Once it serves, the first SIGINT / SIGTERM stops cleanly (open streams get the server's exit timeout);
        # another one kills the server's process group at once. Neither interrupts the cleanup.
        if not serving.is_set():
            raise KeyboardInterrupt
        if stop.is_set() and server.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            return
        stop.set()
        _say(f"stopping tritonserver: open streams get up to {server.exit_timeout_s} s to finish "
             f"(Ctrl-C again: stop at once)")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    _say(f"starting tritonserver on {args.repository} ({', '.join(models)}); loading takes a few seconds to "
         f"minutes ...")
    supervisor.start()
    serving.set()
    gateway = None
    try:
        if args.openai_port:
            from ..clients.openai_gateway import GatewayThread, api_key_from_environment

            gateway = GatewayThread(server.grpc_url, host=args.address, port=args.openai_port,
                                    model=args.openai_model, served_model_name=args.served_model_name,
                                    api_key=api_key_from_environment(args.api_key)).start()
            # At a stop the gateway takes no new request while the server's open ones finish.
            threading.Thread(target=lambda: (stop.wait(), gateway.stop()), name="gateway-stop", daemon=True).start()
            print(f"OpenAI API: {gateway.base_url}/v1 (model {args.served_model_name!r} → {args.openai_model})")
        print(f"serving {args.repository}: HTTP {server.http_url}, gRPC {server.grpc_url}; log {server.log_path}",
              flush=True)
        _say("this terminal is the server's now: send requests from a second terminal "
             "(tritonforge generate \"Hello\"); Ctrl-C stops it")
        supervisor.run(stop)  # restarts the server when it or a Python stub dies; stops it on the way out
    finally:
        if gateway is not None:
            gateway.stop()
        server.stop()  # already stopped by run(), unless the gateway could not start
    _say("tritonserver stopped")
    return 0


def _say(message: str) -> None:
    """A progress line: on stderr, so that stdout keeps only what a command produces."""
    print(message, file=sys.stderr, flush=True)


def eval_command(args: argparse.Namespace) -> int:
    """Compare a served repository's engine with its Hugging Face checkpoint; non-zero exit when it fails."""
    import json

    from ..tools.accuracy import Thresholds, run_eval

    thresholds = Thresholds(min_greedy_agreement=args.min_greedy_agreement, max_logprob_mae=args.max_logprob_mae,
                            logprob_tolerance=args.logprob_tolerance, max_logprob_off_share=args.max_logprob_off_share,
                            max_task_accuracy_drop=args.max_task_accuracy_drop)
    report = run_eval(args.url, args.reference, args.tokenizer or args.reference, prompts_path=args.prompts,
                      tokens=args.tokens, thresholds=thresholds, choices_path=args.choices)
    print(report.table())
    if args.json:
        args.json.write_text(json.dumps(report.record(), indent=2) + "\n")
    return 0 if report.passed else 1


def openai_command(args: argparse.Namespace) -> int:
    from ..clients.openai_gateway import api_key_from_environment, run
    from ..serve.server import check_ports_free

    check_ports_free(args.host, {"--host/--port": args.port})
    print(f"OpenAI API on http://{args.host}:{args.port}/v1 → {args.model} at {args.url}", file=sys.stderr)
    run(args.url, host=args.host, port=args.port, model=args.model, served_model_name=args.served_model_name,
        workers=args.workers, api_key=api_key_from_environment(args.api_key))
    return 0


def _client(args: argparse.Namespace):
    from ..clients.client import GrpcClient, HttpClient

    if args.protocol == "http":
        return HttpClient(args.url or LOCAL_HTTP_URL, model=args.model)
    return GrpcClient(args.url or LOCAL_GRPC_URL, model=args.model)


def _parameters(args: argparse.Namespace) -> dict:
    parameters = {"max_tokens": args.max_tokens}
    for name in ("temperature", "top_k", "top_p", "seed"):
        if getattr(args, name) is not None:
            parameters[name] = getattr(args, name)
    if args.stop:
        parameters["stop_words"] = args.stop
    return parameters


def generate_command(args: argparse.Namespace) -> int:
    client = _client(args)
    if args.stream:
        for text in client.stream(args.prompt, **_parameters(args)):
            print(text, end="", flush=True)
        print()
    else:
        print(client.generate(args.prompt, **_parameters(args)))
    return 0


def probe_command(args: argparse.Namespace) -> int:
    """A liveness check through the engine, for servers that run without our supervisor: Triton's own
    /v2/health/live still says 200 when the engine is frozen (README, Faults). Exit 0 when a one-token
    generation answers within --timeout-s, 1 otherwise."""
    from ..clients.client import GenerateRequest, GenerationError, GrpcClient

    client = GrpcClient(args.url, model=args.model)
    try:
        for _ in client.stream_bytes(GenerateRequest(text_input="ping", max_tokens=1), timeout_s=args.timeout_s):
            pass
    except GenerationError as error:
        print(f"not live: {error}", file=sys.stderr)
        return 1
    finally:
        client.close()
    return 0


def bench_command(args: argparse.Namespace) -> int:
    """Measure a running server: output tokens/s, TTFT and ITL per path and concurrency, efficiency vs direct."""
    import datetime
    import json
    import tempfile

    from ..clients.client import check_serving
    from ..tools.benchmark import (
        DEFINITIONS,
        PATH_MODELS,
        add_efficiency,
        machine_description,
        make_prompts,
        markdown,
        measure_server,
    )

    paths = tuple(p.strip() for p in args.paths.split(",") if p.strip())
    unknown = set(paths) - set(PATH_MODELS)
    if unknown or not paths:
        raise ValueError(f"--paths: unknown {sorted(unknown)}; known: {sorted(PATH_MODELS)}")
    if args.tool == "perf_analyzer":
        require_tool("perf_analyzer")
    prompts = make_prompts(_repository_tokenizer(args.repository), 256, args.max_prompt_tokens)
    check_serving(args.url, {PATH_MODELS[path]: f"--paths {path}" for path in paths})
    with tempfile.TemporaryDirectory() as work:
        rows = measure_server(args.url, prompts, paths=paths,
                              concurrencies=args.concurrency,
                              output_tokens=args.output_tokens, duration_s=args.duration_s, tool=args.tool,
                              work=Path(work), label=args.repository.name)
    add_efficiency(rows)
    result = {"meta": {"machine": machine_description(), "date": datetime.date.today().isoformat(),
                       "tool": args.tool, "output_tokens": args.output_tokens, "duration_s": args.duration_s,
                       "url": args.url, "definitions": DEFINITIONS}, "rows": rows}
    print(markdown(result))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    return 0 if all(row["errors"] == 0 for row in rows) else 1


def tune_command(args: argparse.Namespace) -> int:
    """Measure a grid of serving settings of the Python steps and write the best into the repository."""
    import dataclasses
    import datetime
    import json

    from ..build.tuning import current, grid, plot, tune
    from ..serve.server import serving_processes
    from ..tools.benchmark import machine_description

    _repository_tokenizer(args.repository)
    if args.tool == "perf_analyzer":
        require_tool("perf_analyzer")
    serving = serving_processes(args.repository)
    if serving:
        raise RepositoryInUse(f"{args.repository} is served now (process {', '.join(map(str, serving))}): tune "
                              f"rewrites its configs, which a restart of that server would load; stop it first, "
                              f"or tune a copy (cp -r)")
    before = current(args.repository)
    candidates = grid(args.preprocessing, args.postprocessing, args.bls, args.postprocessing_delay_us)
    result = tune(args.repository, candidates, concurrency=args.concurrency, target=args.target,
                  output_tokens=args.output_tokens, duration_s=args.duration_s, tool=args.tool,
                  progress=lambda message: print(message, file=sys.stderr, flush=True))
    print("| candidate | path | output tokens/s | efficiency | TTFT p50 / p99 ms | errors |")
    print("|---|---|---:|---:|---:|---:|")
    for row in result.rows:
        print(f"| {row['engine']} | {row['path']} | {row['output_tokens_per_s']:,.0f} | {row['efficiency']} | "
              f"{row['ttft_ms_p50']} / {row['ttft_ms_p99']} | {row['errors']} |")
    verdict = "reaches" if result.reached_target else "does NOT reach (the best worst-path efficiency is kept)"
    print(f"\n{args.concurrency} streams: {result.chosen.label} {verdict} {args.target} of the engine's tokens/s; "
          f"was {before.label}; written into {args.repository}")
    if args.results:
        args.results.parent.mkdir(parents=True, exist_ok=True)
        title = (f"tune at {args.concurrency} streams — {machine_description()}, {datetime.date.today()}, "
                 f"load: {args.tool}")
        args.results.with_suffix(".json").write_text(json.dumps(
            {"meta": {"title": title, "target": args.target, "concurrency": args.concurrency},
             "chosen": dataclasses.asdict(result.chosen), "reached_target": result.reached_target,
             "rows": result.rows}, indent=1) + "\n")
        plot(result, args.results.with_suffix(".png"), title)
        print(f"results: {args.results.with_suffix('.json')} / .png")
    return 0 if result.reached_target else 1


class ToolMissing(RuntimeError):
    """A program a command runs is not installed."""


class RepositoryInUse(RuntimeError):
    """A repository a command would rewrite is being served."""


def require_tool(name: str) -> None:
    import shutil

    if shutil.which(name) is None:
        raise ToolMissing(f"{name} is not on PATH: it comes with NVIDIA's Triton SDK container "
                          f"(nvcr.io/nvidia/tritonserver:<version>-py3-sdk); or use --tool asyncio")


def _repository_tokenizer(repository: Path) -> Path:
    """A built repository's tokenizer folder; refuses a path that is none."""
    from ..serve.server import check_repository

    check_repository(repository)
    tokenizer = tokenizer_dir(repository)
    if not tokenizer.is_dir():
        raise FileNotFoundError(f"{repository} has no tokenizer at {tokenizer}: pass a repository `tritonforge "
                                f"build` wrote")
    return tokenizer


def make_tiny_model_command(args: argparse.Namespace) -> int:
    from ..tools.tiny_model import SHAPES, make_tiny_model

    if args.output.exists() and (not args.output.is_dir() or any(args.output.iterdir())):
        raise FileExistsError(f"{args.output} exists and is not an empty folder: the tiny model would overwrite "
                              f"what is there; choose a new folder")
    path = make_tiny_model(args.output, tokenizer_family=args.tokenizer, shape=SHAPES[args.size])
    print(f"tiny model ready: {path}")
    return 0


def demo_command(args: argparse.Namespace) -> int:
    """Build a tiny model and its repository, serve it, answer a prompt over gRPC and HTTP."""
    from ..tools.tiny_model import make_tiny_model

    # Its own work folder: a temporary one, removed at exit, unless --work-dir names one to keep.
    with tempfile.TemporaryDirectory(prefix="tritonforge-demo-") as temporary:
        work = Path(args.work_dir or temporary)
        model = make_tiny_model(work / "tiny-model", tokenizer_family=args.tokenizer)
        # --force replaces only the files an earlier demo or build recorded writing there.
        repository = build(BuildOptions(model=model, output=args.output or work / "model_repository",
                                        max_input_len=256, max_seq_len=512, frontends=("ensemble", "bls"),
                                        force=True))
        return _demo_serve(args, repository)


def _demo_serve(args: argparse.Namespace, repository: Path) -> int:
    from ..clients.client import GrpcClient, HttpClient
    from ..serve.server import TritonServer

    print(f"repository ready: {repository}")
    _say("starting tritonserver (loading the models takes 10-60 s) ...")
    with TritonServer(repository) as server:
        print(f"tritonserver ready: HTTP {server.http_url}, gRPC {server.grpc_url}")
        grpc_client = GrpcClient(server.grpc_url)
        print(f"prompt: {args.prompt!r}")
        print("gRPC stream:   ", end="", flush=True)
        for text in grpc_client.stream(args.prompt, max_tokens=args.max_tokens):
            print(text, end="", flush=True)
        print()
        http_client = HttpClient(server.http_url)
        print(f"HTTP generate: {http_client.generate(args.prompt, max_tokens=args.max_tokens)}")
        print("HTTP stream:   " + "".join(http_client.stream(args.prompt, max_tokens=args.max_tokens)))
        grpc_client.close()
        _say("stopping tritonserver (its models unload: a few seconds) ...")
    print("(random weights: the text is gibberish; the streams differ from the whole text only where a character "
          "straddles two chunks, shown as U+FFFD)")
    return 0


API_KEY_HELP = ("require 'Authorization: Bearer KEY' on every OpenAI request but GET /health (401 otherwise); "
                "default: $TRITONFORGE_API_KEY, no key when unset")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, except where there is none to show (None, a flag's False)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if any(action.default is nothing for nothing in (None, False, argparse.SUPPRESS)) \
                or "%(default)" in (action.help or ""):
            return action.help or ""
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    """A usage error in one line (argparse's own prints the whole usage first), pointing to --help."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def port(text: str) -> int:
    """An argparse `type` for a TCP port."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number, got {text!r}") from None
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"expected a port in 1..65535, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse `type` for a count of at least 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a number >= 1, got {value}")
    return value


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("tritonforge")
    except PackageNotFoundError:
        return "unknown (not installed: pip install -e .)"


def make_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="tritonforge", description=__doc__.split("\n\n")[0], formatter_class=_HelpFormatter)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="log what happens (INFO) and show the traceback of an error")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help_text: str) -> argparse.ArgumentParser:
        return commands.add_parser(name, help=help_text, description=help_text, formatter_class=_HelpFormatter)

    build_parser = command("build", "checkpoint → ready-to-mount model repository")
    _add_build_arguments(build_parser)
    build_parser.set_defaults(func=build_command)

    serve = command("serve", "run tritonserver on a repository, supervised (restarted when it or a model dies); "
                             "holds the terminal until Ctrl-C")
    serve.add_argument("repository", type=Path, help="a repository `tritonforge build` wrote")
    serve.add_argument("--tritonserver", default=None,
                       help="path of the tritonserver binary (default: $TRITONSERVER, then tritonserver on PATH, "
                            "then the nvidia-pytriton wheel's)")
    serve.add_argument("--address", default="127.0.0.1",
                       help="address the HTTP, gRPC and metrics endpoints listen on (0.0.0.0: every interface)")
    serve.add_argument("--http-port", type=port, default=HTTP_PORT, help="HTTP/REST port (generate, generate_stream)")
    serve.add_argument("--grpc-port", type=port, default=GRPC_PORT, help="gRPC port (streaming)")
    serve.add_argument("--metrics-port", type=port, default=METRICS_PORT, help="Prometheus metrics port")
    serve.add_argument("--log-verbose", type=int, default=0, help="tritonserver's --log-verbose level (0: off)")
    serve.add_argument("--wedged-after-s", type=float, default=DEFAULT_WEDGED_AFTER_S,
                       help="restart the server when a Python model has answered no liveness probe for this long "
                            "(0: no probes)")
    serve.add_argument("--openai-port", type=port, default=None,
                       help="also serve OpenAI's API (/v1/completions, /v1/chat/completions) on this port")
    serve.add_argument("--openai-model", default=OPENAI_DEFAULT_MODEL, choices=(BLS_MODEL, ENSEMBLE_MODEL),
                       help="what the OpenAI API calls")
    serve.add_argument("--served-model-name", default=SERVED_MODEL_NAME, help="the model name the OpenAI API shows")
    serve.add_argument("--api-key", default=None, help=API_KEY_HELP)
    serve.add_argument("--log-file", type=Path, default=None,
                       help="tritonserver's log, kept after exit (default: a temporary file removed at exit)")
    serve.add_argument("--open-apis", action="store_true",
                       help="leave model-config, statistics, ... unrestricted (perf_analyzer reads them)")
    serve.set_defaults(func=serve_command)

    generate = command("generate", "send a prompt to a running server and print the answer")
    generate.add_argument("prompt", help="the prompt text")
    generate.add_argument("--stream", action="store_true", help="print the text as it is generated")
    generate.add_argument("--protocol", choices=("grpc", "http"), default="grpc", help="how to reach the server")
    generate.add_argument("--url", default=None,
                          help=f"host:port (default {LOCAL_GRPC_URL} gRPC, {LOCAL_HTTP_URL} HTTP)")
    generate.add_argument("--model", default=ENSEMBLE_MODEL, choices=(ENSEMBLE_MODEL, BLS_MODEL),
                          help="which model answers")
    generate.add_argument("--max-tokens", type=positive_int, default=DEFAULT_MAX_TOKENS,
                          help="tokens to generate at most")
    generate.add_argument("--temperature", type=float, default=None, help="sampling temperature (default: greedy)")
    generate.add_argument("--top-k", type=int, default=None, help="sample from the k likeliest tokens")
    generate.add_argument("--top-p", type=float, default=None, help="sample from the smallest set of this mass")
    generate.add_argument("--seed", type=int, default=None, help="sampling seed")
    generate.add_argument("--stop", action="append", default=[], help="stop phrase (repeatable)")
    generate.set_defaults(func=generate_command)

    probe = command("probe", "liveness check: does a one-token generation answer in time? (exit 0: yes)")
    probe.add_argument("--url", default=LOCAL_GRPC_URL, help="gRPC host:port")
    probe.add_argument("--model", default=ENSEMBLE_MODEL, choices=(ENSEMBLE_MODEL, BLS_MODEL),
                       help="which model answers")
    probe.add_argument("--timeout-s", type=positive_seconds, default=60.0,
                       help="how long a generation may take to answer, queueing included (a busy engine queues "
                            "the probe too); a timed-out probe then spends up to 5 s stopping its request")
    probe.set_defaults(func=probe_command)

    bench = command("bench", "measure a running server: tokens/s, TTFT, ITL per path")
    bench.add_argument("repository", type=Path, help="the served repository (for its tokenizer)")
    bench.add_argument("--url", default=LOCAL_GRPC_URL, help="gRPC host:port")
    bench.add_argument("--paths", default="direct,ensemble,bls",
                       help="comma-separated: direct (tensorrt_llm), ensemble, bls")
    bench.add_argument("--concurrency", type=positive_ints, default="1,8,32,128",
                       help="concurrent streams per point, comma-separated")
    bench.add_argument("--output-tokens", type=positive_int, default=DEFAULT_MAX_TOKENS,
                       help="min_tokens = max_tokens per request")
    bench.add_argument("--max-prompt-tokens", type=positive_int, default=32, help="prompt length at most")
    bench.add_argument("--duration-s", type=positive_seconds, default=10.0, help="measurement time per point")
    bench.add_argument("--tool", choices=("asyncio", "perf_analyzer"), default="asyncio",
                       help="load generator; perf_analyzer needs a server started with --open-apis")
    bench.add_argument("--json", type=Path, default=None, help="also write the figures here")
    bench.set_defaults(func=bench_command)

    tune_parser = command("tune", "pick pre/post/BLS instance counts from measurements (starts its own servers)")
    tune_parser.add_argument("repository", type=Path,
                             help="a built repository, not being served; its counts are rewritten")
    tune_parser.add_argument("--preprocessing", type=positive_ints, default="2,4", help="instance counts to try")
    tune_parser.add_argument("--postprocessing", type=positive_ints, default="4,8", help="instance counts to try")
    tune_parser.add_argument("--bls", type=positive_ints, default="4,8", help="BLS instance counts to try")
    tune_parser.add_argument("--postprocessing-delay-us", type=non_negative_ints, default="0,1000,3000",
                             help="postprocessing max_queue_delay_microseconds values to try")
    tune_parser.add_argument("--results", type=Path, default=None,
                             help="write STEM.json and STEM.png (throughput against TTFT p99, chosen marked)")
    tune_parser.add_argument("--concurrency", type=positive_int, default=128, help="concurrent streams to tune for")
    tune_parser.add_argument("--target", type=float, default=0.95, help="efficiency to reach vs the engine alone")
    tune_parser.add_argument("--output-tokens", type=positive_int, default=DEFAULT_MAX_TOKENS,
                             help="tokens per request")
    tune_parser.add_argument("--duration-s", type=positive_seconds, default=10.0, help="measurement time per point")
    tune_parser.add_argument("--tool", choices=("asyncio", "perf_analyzer"), default="asyncio",
                             help="load generator")
    tune_parser.set_defaults(func=tune_command)

    tiny = command("make-tiny-model", "write a small random-weight Llama and tokenizer (its text is gibberish)")
    tiny.add_argument("output", type=Path, help="folder to write (a new or empty one)")
    tiny.add_argument("--tokenizer", choices=("bpe", "sentencepiece"), default="bpe", help="tokenizer family")
    tiny.add_argument("--size", choices=("tiny", "1b"), default="tiny",
                      help="tiny: ~1M parameters for CPUs; 1b: a ~1B Llama body for GPU measurements")
    tiny.set_defaults(func=make_tiny_model_command)

    from ..tools.accuracy import Thresholds

    evaluation = command("eval", "does the served engine answer like its checkpoint?")
    evaluation.add_argument("--url", required=True, help="Triton's gRPC address of the served repository")
    evaluation.add_argument("--reference", type=Path, required=True, help="the Hugging Face checkpoint")
    evaluation.add_argument("--tokenizer", type=Path, default=None,
                            help="tokenizer folder (default: the checkpoint's; the repository's is preprocessing/"
                                 "tokenizer)")
    evaluation.add_argument("--prompts", type=Path, default=None, help="JSONL of {\"prompt\": ...} (default: a "
                                                                        "small built-in set)")
    evaluation.add_argument("--choices", type=Path, default=None,
                            help="multiple-choice JSONL of {\"question\", \"choices\", \"answer\"}")
    evaluation.add_argument("--tokens", type=positive_int, default=32, help="greedy tokens compared per prompt")
    evaluation.add_argument("--min-greedy-agreement", type=float, default=Thresholds.min_greedy_agreement,
                            help="least share of prompts whose greedy tokens all agree")
    evaluation.add_argument("--max-logprob-mae", type=float, default=Thresholds.max_logprob_mae,
                            help="largest mean |served - reference| log-probability")
    evaluation.add_argument("--logprob-tolerance", type=float, default=Thresholds.logprob_tolerance,
                            help="a token's log-probability off by more than this (nats) counts as off")
    evaluation.add_argument("--max-logprob-off-share", type=float, default=Thresholds.max_logprob_off_share,
                            help="largest share of tokens off")
    evaluation.add_argument("--max-task-accuracy-drop", type=float, default=Thresholds.max_task_accuracy_drop,
                            help="largest drop of task accuracy against the reference (--choices)")
    evaluation.add_argument("--json", type=Path, default=None, help="write the figures here")
    evaluation.set_defaults(func=eval_command)

    gateway = command("openai", "OpenAI-compatible HTTP API in front of a served repository")
    gateway.add_argument("--url", required=True, help=f"Triton's gRPC address, e.g. localhost:{GRPC_PORT}")
    gateway.add_argument("--host", default="127.0.0.1", help="address to listen on")
    gateway.add_argument("--port", type=port, default=OPENAI_PORT, help="port to listen on")
    gateway.add_argument("--model", default=OPENAI_DEFAULT_MODEL, choices=(BLS_MODEL, ENSEMBLE_MODEL),
                         help="what it calls")
    gateway.add_argument("--served-model-name", default=SERVED_MODEL_NAME,
                         help="the model name /v1/models shows, and the only one requests may name")
    gateway.add_argument("--api-key", default=None, help=API_KEY_HELP)
    gateway.add_argument("--workers", type=positive_int, default=1,
                         help="gateway processes sharing the port: one handles a few thousand streamed chunks a "
                              "second")
    gateway.set_defaults(func=openai_command)

    demo = command("demo", "tiny model → repository → tritonserver → a prompt over gRPC and HTTP")
    demo.add_argument("--prompt", default="The server reads a request", help="the prompt")
    demo.add_argument("--max-tokens", type=positive_int, default=32, help="tokens to generate")
    demo.add_argument("--tokenizer", choices=("bpe", "sentencepiece"), default="sentencepiece",
                      help="the tiny model's tokenizer family")
    demo.add_argument("--output", type=Path, default=None,
                      help="repository folder (default: inside the demo's work folder)")
    demo.add_argument("--work-dir", default=None, help="keep the tiny model and repository here (default: a "
                                                       "temporary folder, removed at exit)")
    demo.set_defaults(func=demo_command)
    return parser


def _exit_status(error: BaseException) -> int | None:
    """2 for a usage error (the command line names something wrong), 1 for a runtime one; None: not ours."""
    from ..clients.client import GenerationError, ServerUnavailable
    from ..serve.server import PortInUse, ServerError
    from ..spec.errors import INVALID, answered_error_kind

    if isinstance(error, PortInUse):
        return 2
    if isinstance(error, ServerUnavailable):
        return 1
    if isinstance(error, GenerationError):  # the server's answer: a bad request is the command line's fault
        return 2 if answered_error_kind(str(error)) == INVALID else 1
    if isinstance(error, (ValueError, FileNotFoundError, FileExistsError, NotADirectoryError)):
        return 2
    if isinstance(error, (ServerError, ToolMissing, RepositoryInUse, TensorRTLLMMissing, EngineMismatch,
                          AccuracyGateFailed, OSError)):
        return 1
    return None


def _advice(error: BaseException) -> str:
    """What to do, where the message does not say it."""
    from ..clients.client import ServerUnavailable

    if isinstance(error, ServerUnavailable):
        return "; is `tritonforge serve` running there? (start it in another terminal, or pass --url HOST:PORT)"
    return ""


def main(argv: list[str] | None = None) -> int:
    args = make_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - the one place an error becomes a line and an exit status
        status = _exit_status(error)
        if args.verbose:
            logging.getLogger("tritonforge").exception("%s failed", args.command)
        if status is None:
            print(f"error: {type(error).__name__}: {error} (a bug: `tritonforge -v {args.command} ...` shows where)",
                  file=sys.stderr)
            return 1
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        print(f"error: {message}{_advice(error)}", file=sys.stderr)
        return status


if __name__ == "__main__":
    sys.exit(main())
