"""The environment variables tritonforge reads, and the files that the server launcher and the Python stubs
exchange through one of them. `tritonforge serve` sets them in the server's environment, which the stubs
inherit; the runtime reads them there."""

import os
from pathlib import Path

# The stubs' heartbeat folder: each stub writes its clock there (triton_adapter.start_heartbeat), the
# supervisor reads it (tritonforge/serve/supervisor.py).
HEARTBEAT_DIR_ENV = "TRITONFORGE_HEARTBEAT_DIR"
HEARTBEAT_PERIOD_S = 1.0
# Written into that folder by a launcher that stops the server (tritonforge/serve/server.py), before it signals
# the server: the time.monotonic() by which open requests must end. A model that drains (the engine) says so
# at start with a `<pid>.drains` file and, once none of its requests is open, writes `<pid>.drained`; the
# launcher signals the server after that. The C++ replay engine, which runs in the server's own process, names
# its files `<server pid>-<instance>` (replay_backend.cc keeps these names and values in step with this
# module's). Triton 2.51 cannot end an ensemble request once it has been told to stop (the request stays in
# flight until its exit timeout, and the process then hangs in its exit), so the ensembles must be over before
# the signal.
STOPPING_FILE = "stopping"
DRAINS_SUFFIX, DRAINED_SUFFIX = ".drains", ".drained"
# How long a model that drains may take to end the requests still open at the deadline (its drain returns by
# then at the latest); the C++ models read it from runtime/native/contract.h.
MODEL_DRAIN_END_S = 5
STOPPING_DIGITS = 19  # the most digits of the STOPPING file's number (an int64 of nanoseconds)


def stopping_text(deadline_s: float) -> str:
    """The STOPPING file's one stated format, which the Python and the C++ models read alike: the deadline as
    whole nanoseconds of the machine's monotonic clock (time.monotonic(), CLOCK_MONOTONIC), decimal digits
    and a newline."""
    return f"{max(0, round(deadline_s * 1e9))}\n"


def stopping_deadline(text: str) -> float | None:
    """The deadline (time.monotonic seconds) in a STOPPING file's text; None for any text not in the format
    (the launcher writes the file whole, with a rename: no text means not stopping)."""
    number = text[:-1]
    if not text.endswith("\n") or not number.isascii() or not number.isdigit() or len(number) > STOPPING_DIGITS:
        return None
    return int(number) / 1e9
# Written there by the launcher as it starts the server: the server's pid. A stub whose parent is another
# process was orphaned while it loaded (its server killed before the stub could watch it) and ends at once.
SERVER_PID_FILE = "server.pid"

# Where the BLS finds the server's gRPC endpoint: the launcher that picks the port says so through this
# variable, which the stubs inherit; otherwise the BLS's `engine_grpc_url` parameter (Triton's default port).
ENGINE_GRPC_URL_ENV = "TRITONFORGE_ENGINE_GRPC_URL"

# Where the OpenAI gateway's key comes from when no --api-key is given: an environment variable, so that a
# Kubernetes Secret can hand it over without putting it on a command line (/proc/PID/cmdline is readable by
# local users).
API_KEY_ENV = "TRITONFORGE_API_KEY"

# The tritonserver binary to run, where --tritonserver names none.
TRITONSERVER_ENV = "TRITONSERVER"

# A lock file that makes the servers started on one machine load one at a time (serve/start_lock.py): loads side by
# side starve each other's Python stubs, which Triton 2.51 can wedge. Unset: servers start side by side.
SERVER_START_LOCK_ENV = "TRITONFORGE_SERVER_START_LOCK"

# What tritonforge keeps between runs (the repositories `serve CHECKPOINT` builds, where --cache-dir names no
# folder; the compiled C++ backends; the real model): $XDG_CACHE_HOME/tritonforge/, else ~/.cache/tritonforge/
# (the XDG base directory rules, as Hugging Face's cache).
XDG_CACHE_HOME_ENV = "XDG_CACHE_HOME"


def tritonforge_cache_dir() -> Path:
    """$XDG_CACHE_HOME/tritonforge, else ~/.cache/tritonforge (a relative $XDG_CACHE_HOME is ignored, as the XDG
    base directory rules say): what tritonforge keeps between runs, in a folder per kind."""
    base = os.environ.get(XDG_CACHE_HOME_ENV, "")
    return (Path(base) if os.path.isabs(base) else Path.home() / ".cache") / "tritonforge"
