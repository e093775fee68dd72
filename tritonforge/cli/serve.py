"""`tritonforge serve`: tritonserver on a built repository, supervised (restarted when it or a model
dies), with the OpenAI API beside it on request; holds the terminal until Ctrl-C."""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import threading
import time
from pathlib import Path

from ..builder.trtllm import EngineMismatch
from ..facts.settings import add_arguments, given
from ..serve.options import ServeOptions
from .arguments import say

GATEWAY_END_S = 2.0  # once the server is gone, how long the gateway gets at least to send its streams' last events


def check_repository_engine(repository: Path) -> int:
    """Refuse a repository that failed its accuracy gate, or whose engine cannot serve here (a TensorRT-LLM
    engine built for another GPU or release); return the server processes (MPI ranks) it takes."""
    from ..builder.engines import ENGINE_KINDS
    from ..builder.manifest import MANIFEST, read_manifest

    manifest = read_manifest(repository)
    if manifest is None:
        return 1
    if manifest.ready is False:
        raise EngineMismatch(f"{repository} failed its accuracy gate at build time (figures in {MANIFEST}): "
                             f"rebuild it, or rebuild without --accuracy-gate to serve it anyway")
    kind = ENGINE_KINDS.get(manifest.engine or "")
    return kind.serving_ranks(repository, manifest.build) if kind else 1


def serve_command(args: argparse.Namespace) -> int:
    from ..serve.server import RESTRICTED_APIS, TritonServer, check_ports_free, check_repository
    from ..serve.supervisor import Supervisor

    repository, options = args.repository, ServeOptions(**given(args, ServeOptions))
    models = check_repository(repository)
    world_size = check_repository_engine(repository)
    check_ports_free(options.address, options.ports())
    server = TritonServer(repository, executable=options.tritonserver, http_port=options.http_port,
                          grpc_port=options.grpc_port, metrics_port=options.metrics_port, address=options.address,
                          log_verbose=options.log_verbose, world_size=world_size,
                          restricted_apis="" if options.open_apis else RESTRICTED_APIS, log_file=options.log_file,
                          exit_timeout_s=options.exit_timeout_s)
    supervisor = Supervisor(server, wedged_after_s=options.wedged_after_s)
    stop, serving = threading.Event(), threading.Event()
    stopping_since: list[float] = []

    def on_signal(*_) -> None:
        # While the server is still loading, a signal interrupts the wait (the start stops what it started).
        # Once it serves, the first SIGINT / SIGTERM stops cleanly, within the exit timeout; another one kills
        # the server's process group at once. Neither interrupts the cleanup.
        if not serving.is_set():
            raise KeyboardInterrupt
        if stop.is_set() and server.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(server.pid, signal.SIGKILL)
            return
        stopping_since.append(time.monotonic())
        stop.set()
        say(f"stopping tritonserver: open streams get up to {server.drain_s:g} s to finish; it exits within "
            f"{server.exit_timeout_s:g} s (--exit-timeout-s) (Ctrl-C again: stop at once)")

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    say(f"starting tritonserver on {repository} ({', '.join(models)}); loading takes a few seconds to "
         f"minutes ...")
    supervisor.start()
    serving.set()
    gateway = None
    try:
        if options.openai_port:
            from ..gateway.options import GatewayThread, api_key_from_environment

            gateway = GatewayThread(server.grpc_url, host=options.address, port=options.openai_port,
                                    model=options.openai_model, served_model_name=options.served_model_name,
                                    api_key=api_key_from_environment(options.api_key)).start()
            # At a stop the gateway takes no new request while the server's open ones finish.
            threading.Thread(target=lambda: (stop.wait(), gateway.stop_accepting()), name="gateway-stop",
                             daemon=True).start()
            print(f"OpenAI API: {gateway.base_url}/v1 (model {options.served_model_name!r} → {options.openai_model})")
        print(f"serving {repository}: HTTP {server.http_url}, gRPC {server.grpc_url}; log {server.log_path}",
              flush=True)
        say("this terminal is the server's now: send requests from a second terminal "
             "(tritonforge generate \"Hello\"); Ctrl-C stops it")
        supervisor.run(stop)  # restarts the server when it or a Python stub dies; stops it on the way out
    finally:
        server.stop()  # already stopped by run(), unless the gateway could not start
        if gateway is not None:  # its streams ended with the server: it gets what is left of the exit timeout
            left = options.exit_timeout_s - (time.monotonic() - stopping_since[0]) if stopping_since else 0
            gateway.stop(max(left, GATEWAY_END_S))
    say("tritonserver stopped")
    return 0


def add_parser(command) -> None:
    serve = command("serve", "run tritonserver on a repository, supervised (restarted when it or a model dies); "
                             "holds the terminal until Ctrl-C")
    serve.add_argument("repository", type=Path, help="a repository `tritonforge build` wrote")
    add_arguments(serve, ServeOptions)
    serve.set_defaults(func=serve_command)
