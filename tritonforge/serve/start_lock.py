"""The machine-wide start lock: the tritonservers started by every process that names the same lock file in
SERVER_START_LOCK_ENV load one at a time."""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os

from ..facts.environment import SERVER_START_LOCK_ENV

logger = logging.getLogger(__name__)


@contextlib.contextmanager
def machine_start_lock():
    """Held from a server's launch until it is ready or failed, where SERVER_START_LOCK_ENV names a lock file:
    the starts of every process that names the same file then load one at a time (a lock the system releases
    when its holder dies, however it dies). Without the variable, nothing is held."""
    path = os.environ.get(SERVER_START_LOCK_ENV)
    if not path:
        yield
        return
    with open(path, "a") as lock:  # created if absent, never truncated
        if not _try_lock(lock):
            logger.info("waiting for another server's start to end (%s=%s)", SERVER_START_LOCK_ENV, path)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _try_lock(lock) -> bool:
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True
