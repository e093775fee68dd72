"""What runs of ours that were killed from outside left (work folders, Python stubs still running, shared-memory
regions, Python backend folders): the records that tell a dead run's, and the sweep that removes it."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import tempfile
from pathlib import Path

from . import python_env
from .processes import STUB_PROGRAM

logger = logging.getLogger(__name__)

# Where the Python backend keeps each stub's shared-memory region. A stub that is killed (a crash, the
# supervisor's restart, a stop that had to SIGKILL) leaves its region there, a file of RAM: each server names
# its regions with a prefix of its own, and removes what is left under that prefix once it has exited.
SHARED_MEMORY_DIR = Path("/dev/shm")
WORK_DIR_PREFIX = "tritonforge-server-"  # in the temporary folder, one per start
OWNER_RECORD = "owner.json"  # in a work folder: the pids it belongs to
# A shared-memory prefix names the process that started the server, so that a sweep can tell a dead run's.
_SHM_PREFIX = re.compile(r"tritonforge_pid(\d+)_[0-9a-f]+_")


def _pid_alive(pid: int) -> bool:
    """Whether process `pid` runs: one that exited and that its adopter has not reaped yet (a zombie, as a killed
    run's tritonserver is for a moment) does not."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # another user's process
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except (OSError, IndexError):
        return True  # no /proc to tell: it answers signals


def sweep_leftovers(temporary_dir: Path | None = None, shared_memory_dir: Path | None = None) -> list[Path]:
    """Remove what servers of runs that were killed from outside left, and say so in one line: work folders whose
    recorded processes are all gone (with the Python stubs still running from them, and the Python backend's
    folder the record names), and shared-memory regions whose starting process is gone. Folders and regions
    without our record are never touched. Returns what was removed."""
    removed: list[Path] = []
    ended: list[int] = []
    runs: set[int] = set()
    for folder in Path(temporary_dir or tempfile.gettempdir()).glob(f"{WORK_DIR_PREFIX}*"):
        try:
            record = json.loads((folder / OWNER_RECORD).read_text())
            pids = [int(pid) for pid in record["pids"]]
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours to judge
        if pids and not any(_pid_alive(pid) for pid in pids):
            folder_removed, stubs_ended = _remove_run(folder, record)
            removed += folder_removed
            ended += stubs_ended
            runs.add(pids[0])
    regions = 0
    for region in Path(shared_memory_dir or SHARED_MEMORY_DIR).glob("tritonforge_pid*"):
        match = _SHM_PREFIX.match(region.name)
        if match and not _pid_alive(int(match.group(1))):
            region.unlink(missing_ok=True)
            removed.append(region)
            regions += 1
            runs.add(int(match.group(1)))
    if removed:
        envs = sum(1 for path in removed if python_env.is_python_env(path))
        left = ", ".join(part for part in (_count(len(removed) - regions - envs, "work folder"),
                                           _count(regions, "shared-memory region"),
                                           _count(envs, "Python backend folder")) if part)
        stubs = f"; ended {_count(len(ended), 'stub')} still running" if ended else ""
        logger.warning("removed what killed tritonforge servers (started by pid %s) left: %s%s",
                       ", ".join(map(str, sorted(runs))), left, stubs)
    return removed


def _remove_run(folder: Path, record: dict) -> tuple[list[Path], list[int]]:
    """Remove what a run whose processes are all gone left: the stubs still running from its work folder, the
    folder, and the Python backend's folder its record names. Returns what was removed and the stubs ended."""
    ended = []
    for pid in _stubs_of_run(folder, record.get("shm_prefix")):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
            ended.append(pid)
    shutil.rmtree(folder, ignore_errors=True)
    removed = [folder]
    env = Path(record["python_env"]) if record.get("python_env") else None
    if python_env.remove(env):
        removed.append(env)
    return removed, ended


def remove_killed_run(folder: Path, shared_memory_dir: Path | None = None) -> None:
    """Remove all that a run left whose launcher was killed and whose server's process group is gone (the
    reaper's part, serve/reaper.py): `_remove_run`'s, and the shared memory of its stubs (the record's prefix)."""
    try:
        record = json.loads((folder / OWNER_RECORD).read_text())
    except (OSError, ValueError):
        return  # removed meanwhile, or not ours to judge
    _remove_run(folder, record)
    if record.get("shm_prefix"):
        for region in Path(shared_memory_dir or SHARED_MEMORY_DIR).glob(f"{record['shm_prefix']}*"):
            region.unlink(missing_ok=True)


def _count(number: int, thing: str) -> str:
    return f"{number} {thing}{'' if number == 1 else 's'}" if number else ""


def _stubs_of_run(folder: Path, shm_prefix: str | None) -> list[int]:
    """The Python stubs of a run's server: the processes whose program lies inside its work folder (the
    backends it copied there), or a stub program whose shared-memory region carries the run's prefix (a
    server's own backends, as in NVIDIA's container)."""
    prefix = str(folder) + os.sep
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            command = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if command[0].startswith(prefix) or (
                shm_prefix and Path(command[0]).name == STUB_PROGRAM and any(shm_prefix in arg for arg in command)):
            found.append(int(entry.name))
    return found


def serving_processes(repository: Path, temporary_dir: Path | None = None) -> list[int]:
    """The live processes of other runs whose servers serve `repository` (from their work folders' records)."""
    target = str(Path(repository).resolve())
    found = []
    for folder in Path(temporary_dir or tempfile.gettempdir()).glob(f"{WORK_DIR_PREFIX}*"):
        try:
            record = json.loads((folder / OWNER_RECORD).read_text())
            launcher = int(record["pids"][0])
        except (OSError, ValueError, KeyError, TypeError, IndexError):
            continue
        if record.get("repository") == target and launcher != os.getpid() and _pid_alive(launcher):
            found.append(launcher)
    return sorted(set(found))
