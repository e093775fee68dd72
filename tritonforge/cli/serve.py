"""`tritonforge serve`: tritonserver on a built repository, supervised (restarted when it or a model
dies), with the OpenAI API beside it on request; holds the terminal until Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import threading
from pathlib import Path

from ..build import model_configs as configs
from ..build.trtllm import EngineMismatch
from ..clients.openai_gateway import DEFAULT_MODEL as OPENAI_DEFAULT_MODEL
from ..clients.openai_gateway import SERVED_MODEL_NAME
from ..serve.liveness import DEFAULT_WEDGED_AFTER_S
from ..spec.contract import BLS_MODEL, ENSEMBLE_MODEL
from ..spec.ports import GRPC_PORT, HTTP_PORT, METRICS_PORT
from .arguments import API_KEY_HELP, port, say


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
        say(f"stopping tritonserver: open streams get up to {server.exit_timeout_s} s to finish "
             f"(Ctrl-C again: stop at once)")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    say(f"starting tritonserver on {args.repository} ({', '.join(models)}); loading takes a few seconds to "
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
        say("this terminal is the server's now: send requests from a second terminal "
             "(tritonforge generate \"Hello\"); Ctrl-C stops it")
        supervisor.run(stop)  # restarts the server when it or a Python stub dies; stops it on the way out
    finally:
        if gateway is not None:
            gateway.stop()
        server.stop()  # already stopped by run(), unless the gateway could not start
    say("tritonserver stopped")
    return 0


def add_parser(command) -> None:
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
