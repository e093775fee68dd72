"""Ends a Python stub whose tritonserver is gone: a process of its own, started by the stub
(`triton_adapter.start_heartbeat`), that waits for either of the two to end and SIGKILLs the stub if the server
ended first.

A thread of the stub cannot do it. A stub thread waiting on the server over shared memory with the GIL held
(Triton 2.51's `Metric.set`, which the engine's metrics thread calls ten times a second) waits for ever once the
server is gone, and then no Python thread of that stub runs again, the heartbeat's check of its parent included;
the stub's own C++ health thread, which notices the dead parent, deadlocks on a lock of the stub in its way out.
An engine stub was seen holding 429 MB and its shared memory five minutes after its `serve` was killed.
PR_SET_PDEATHSIG cannot do it either: its parent is the tritonserver thread that forked it, one of the short-lived
threads Triton loads model instances with, so the signal would come as soon as that thread ended.

Run as a script by path with `python -I -S`: the standard library only, nothing of tritonforge or the site.
Usage: stub_watch.py SERVER_PID STUB_PID (the stub is this process's parent).
"""

from __future__ import annotations

import os
import select
import signal
import sys
import time

POLL_S = 1.0  # where pidfds are missing (Linux < 5.3): how often the fallback looks


def parent_of(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return int(stat.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return None


def watch(server: int, stub: int) -> None:
    try:
        stub_fd = os.pidfd_open(stub)
    except ProcessLookupError:
        return
    except (AttributeError, OSError):  # no pidfds: poll the stub's parent instead
        return _poll(server, stub)
    if os.getppid() != stub:  # the stub ended before this began: the pid may name another process now
        return
    try:
        server_fd = os.pidfd_open(server)
    except ProcessLookupError:
        server_fd = None
    # While the server is the stub's parent, its pid names that server: a pid is reused only once it is free.
    if server_fd is not None and parent_of(stub) == server:
        readable, _, _ = select.select([server_fd, stub_fd], [], [])
        if stub_fd in readable:
            return
    try:
        signal.pidfd_send_signal(stub_fd, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _poll(server: int, stub: int) -> None:
    while os.getppid() == stub:  # this process is adopted once the stub ends
        if parent_of(stub) != server:
            try:
                os.kill(stub, signal.SIGKILL)
            except ProcessLookupError:
                pass
            return
        time.sleep(POLL_S)


if __name__ == "__main__":
    watch(int(sys.argv[1]), int(sys.argv[2]))
