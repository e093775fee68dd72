"""The folder Triton's Python backend makes in /tmp for each server (`/tmp/python_env_XXXXXX`), and which one a
server of ours made.

The backend (python_backend's `EnvironmentManager`, pb_env.cc) makes it with mkdtemp when it initializes, in a
path it hard-codes (no TMPDIR), for the execution environments it would unpack there, and removes it only when
the server unloads the backend on a clean exit: every killed or force-stopped tritonserver leaves one, empty.
Nothing in the folder or its name says whose it is, so `PythonEnvClaim` works it out while the server starts:
the folders there before it started are not its own, the backend makes its folder before it starts any stub,
so once a stub of the server runs its folder exists, and it is ours only when it is then the one new folder.
Where two servers start together the answer is ambiguous and the folder is left alone; starts of our own take
turns (a lock) from their launch until that moment, so that only another program's server can be the other.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import shutil
import time
from pathlib import Path

from .processes import all_stub_pids

logger = logging.getLogger(__name__)

PYTHON_ENV_DIR = Path("/tmp")  # hard-coded by the backend, whatever TMPDIR says
_NAME = re.compile(r"python_env_[A-Za-z0-9]{6}")  # mkdtemp's six characters
# Shared by every start of ours on the machine, whatever temporary folder each uses: where the folders go.
LOCK_FILE = PYTHON_ENV_DIR / "tritonforge-python-env.lock"
LOCK_WAIT_S = 10.0  # a start waits this long for its turn, then goes on without it (the claim stays safe)
LOCK_HOLD_S = 10.0  # a server that starts no stub this soon (no Python model) gives the turn up


def python_envs(folder: Path = PYTHON_ENV_DIR) -> set[Path]:
    try:
        return {path for path in folder.iterdir() if _NAME.fullmatch(path.name) and path.is_dir()}
    except OSError:
        return set()


def is_python_env(path: Path) -> bool:
    """Whether `path` is such a folder: the only kind a claim or a record may name for removal."""
    return path.parent == PYTHON_ENV_DIR and bool(_NAME.fullmatch(path.name))


def claim(before: set[Path], now: set[Path]) -> Path | None:
    """The server's folder, from the folders before its launch and once a stub of it runs: the one new folder;
    None when there is none or several (another server's may be among them)."""
    new = now - before
    return next(iter(new)) if len(new) == 1 else None


class PythonEnvClaim:
    """Works out, while one server starts, which python_env folder is its own: `begin()` just before its launch,
    `poll(pid)` while it loads (cheap until its first stub runs), `finish(pid)` once it is ready or failed."""

    def __init__(self, folder: Path = PYTHON_ENV_DIR, lock_file: Path = LOCK_FILE):
        self.folder, self.lock_file = folder, lock_file
        self.path: Path | None = None  # the server's folder, once known
        self._before: set[Path] = set()
        self._lock: int | None = None  # the lock's descriptor while this start holds the turn
        self._since = 0.0
        self._done = False

    def begin(self) -> PythonEnvClaim:
        self._lock = _take_turn(self.lock_file)
        self._before = python_envs(self.folder)
        self._since = time.monotonic()
        return self

    def poll(self, pid: int) -> None:
        if self._done:
            return
        if all_stub_pids(pid):
            self._settle(pid)
        elif time.monotonic() - self._since > LOCK_HOLD_S:
            self._give_turn()

    def finish(self, pid: int | None) -> Path | None:
        """The server's folder (None where unknown); gives the turn up in any case."""
        if not self._done and pid is not None and all_stub_pids(pid):
            self._settle(pid)
        self._done = True
        self._give_turn()
        return self.path

    def _settle(self, pid: int) -> None:
        self.path = claim(self._before, python_envs(self.folder))
        if self.path is None:
            logger.debug("the Python backend folder of tritonserver %d is not known for sure: it is left alone", pid)
        self._done = True
        self._give_turn()

    def _give_turn(self) -> None:
        if self._lock is not None:
            os.close(self._lock)  # closing the descriptor releases its lock
            self._lock = None


def _take_turn(lock_file: Path) -> int | None:
    """The lock's descriptor, held; None where it could not be had within LOCK_WAIT_S (or made at all)."""
    try:
        descriptor = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError:
        return None
    deadline = time.monotonic() + LOCK_WAIT_S
    while True:
        try:
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return descriptor
        except OSError:
            if time.monotonic() > deadline:
                os.close(descriptor)
                return None
            time.sleep(0.05)  # flock has no timeout of its own


def remove(path: Path | None) -> bool:
    """Remove a recorded python_env folder (and what the backend may have unpacked into it); True if it was
    there. Refuses any other path."""
    if path is None or not is_python_env(path) or not path.is_dir():
        return False
    with contextlib.suppress(OSError):
        shutil.rmtree(path)
    return not path.exists()
