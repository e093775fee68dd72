"""Cleans up after a launcher killed while its server ran (`kill -9` of `tritonforge serve`): the server dies with
its launcher (PR_SET_PDEATHSIG) and its stubs with the server (runtime/stub_watch.py), but nobody is left to
remove the run's work folder, its stubs' shared memory and the Python backend's folder in /tmp.

`TritonServer` starts one per server, in a session of its own, its standard input a pipe that only the launcher
holds open. The read ends when the launcher closes it (its `stop`, which cleaned up already: the work folder is
gone) or dies. In the second case it waits for the server's process group to end (SIGKILL after GROUP_GONE_S),
removes what the run left (`leftovers.remove_killed_run`) and exits, within a few seconds of the kill.

Usage: python -m tritonforge.serve.reaper WORK_DIR SERVER_PID
"""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

GROUP_GONE_S = 2.0  # how long the server and its stubs get to die by themselves
POLL_S = 0.05  # the group has no exit to wait on: it is no child of this process


def _group_alive(group: int) -> bool:
    try:
        os.killpg(group, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _wait_group_gone(group: int, within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while _group_alive(group):
        if time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def main(work_dir: Path, server_pid: int) -> None:
    while os.read(sys.stdin.fileno(), 4096):  # until the launcher closes the pipe or dies
        pass
    if not work_dir.exists():
        return  # the launcher stopped its server and removed what it made
    if not _wait_group_gone(server_pid, GROUP_GONE_S):  # the server's group is ours: it started it in a session
        try:
            os.killpg(server_pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _wait_group_gone(server_pid, GROUP_GONE_S)
    from .leftovers import remove_killed_run  # only now: a reaper that a stop ends needs none of it

    remove_killed_run(work_dir)


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]))
