"""Finding the tritonserver to run and the options it supports. Finds the server in this order: an explicit path
(argument or `TRITONSERVER`), `tritonserver` on PATH (NVIDIA's containers; backends at `<bin>/../backends`), the
nvidia-pytriton wheel's bundle (whose Python backend stub for the running interpreter is copied into a private
backends folder)."""

from __future__ import annotations

import functools
import logging
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from ..facts.environment import TRITONSERVER_ENV
from .errors import ServerError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerBinary:
    executable: Path
    backend_directory: Path
    library_path: Path | None = None  # extra LD_LIBRARY_PATH entry (the wheel's bundled libraries)


def _pytriton_bundle(work_dir: Path) -> ServerBinary | None:
    try:
        import pytriton
    except ImportError:
        return None
    root = Path(pytriton.__file__).resolve().parent
    bundle = root / "tritonserver"
    version = f"{sys.version_info[0]}.{sys.version_info[1]}"
    stub = bundle / "python_backend_stubs" / version / "triton_python_backend_stub"
    if not stub.is_file():
        raise ServerError(f"nvidia-pytriton has no Python backend stub for Python {version}")
    backends = work_dir / "backends"
    shutil.copytree(bundle / "backends", backends, dirs_exist_ok=True)
    shutil.copy2(stub, backends / "python" / "triton_python_backend_stub")
    return ServerBinary(bundle / "bin" / "tritonserver", backends, root.parent / "nvidia_pytriton.libs")


def locate_server(work_dir: Path, explicit: str | os.PathLike | None = None) -> ServerBinary:
    explicit = explicit or os.environ.get(TRITONSERVER_ENV)
    if explicit:
        path = Path(explicit)
        if not path.is_file():
            raise ServerError(f"tritonserver not found at {path}")
        return ServerBinary(path, path.resolve().parent.parent / "backends")
    on_path = shutil.which("tritonserver")
    if on_path:
        path = Path(on_path).resolve()
        return ServerBinary(path, path.parent.parent / "backends")
    bundled = _pytriton_bundle(work_dir)
    if bundled:
        return bundled
    raise ServerError("no tritonserver found: set TRITONSERVER, put it on PATH (NVIDIA's container), or "
                      "pip install 'tritonforge[server]' for the nvidia-pytriton bundle")


@functools.lru_cache(maxsize=8)
def _help_text(executable: Path, library_path: Path | None) -> str:
    env = dict(os.environ)
    if library_path:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(filter(None, [str(library_path), env.get("LD_LIBRARY_PATH")]))
    try:
        result = subprocess.run([str(executable), "--help"], capture_output=True, text=True, timeout=30, env=env,
                                check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return result.stdout + result.stderr


@functools.lru_cache(maxsize=8)
def note_no_http_limit(executable: Path) -> None:
    """Said once per binary, as information: Triton 2.51 has no cap on HTTP bodies
    (docs/design/faults.md#limits-before-work)."""
    logger.info("%s has no --http-max-input-size (Triton 2.53 and later have it): HTTP request bodies are not "
                "capped; prompts are still checked by size before tokenizing", executable)


def supports_option(binary: ServerBinary, option: str) -> bool:
    return f"{option} " in _help_text(binary.executable, binary.library_path)
