"""The processes of a running tritonserver, read from /proc (Linux): its children and which of them are
the Python stubs of which model (a stub's command line names its model's `<model>/<version>/model.py`)."""

from __future__ import annotations

import re
from pathlib import Path

STUB_MODEL = re.compile(r"/([^/\s]+)/\d+/model\.py")
STUB_PROGRAM = "triton_python_backend_stub"  # the Python backend's stub binary


def children(pid: int) -> list[int]:
    try:
        return [int(child) for child in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def process_group(pid: int) -> str:
    command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    match = STUB_MODEL.search(command)
    return f"stub:{match.group(1)}" if match else Path(command.split(" ", 1)[0]).name or str(pid)


def all_stub_pids(server_pid: int) -> dict[int, str]:
    """Every Python stub under the server: pid → model name."""
    found: dict[int, str] = {}
    pending = list(children(server_pid))
    while pending:
        pid = pending.pop(0)
        try:
            group = process_group(pid)
        except OSError:
            continue
        if group.startswith("stub:"):
            found[pid] = group[len("stub:"):]
        pending.extend(children(pid))
    return found


def stub_pids(server_pid: int) -> dict[str, int]:
    """One Python stub per model (the first found) under the server."""
    found: dict[str, int] = {}
    for pid, model in all_stub_pids(server_pid).items():
        found.setdefault(model, pid)
    return found
