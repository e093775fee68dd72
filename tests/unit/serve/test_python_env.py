"""Which of the Python backend's `/tmp/python_env_*` folders a server of ours made: the one new folder once a
stub of it runs, never a folder another server may have made, and nothing else is ever removed as one."""

import subprocess
import sys
import time
from pathlib import Path

import pytest

from tritonforge.serve import python_env
from tritonforge.serve.processes import process_group
from tritonforge.serve.python_env import PythonEnvClaim, claim, is_python_env

EXEC_WITHIN_S = 10  # a child's exec, on a loaded machine
A, B, C = (Path(f"/tmp/python_env_{name}") for name in ("aaaaaa", "bbbbbb", "cccccc"))


@pytest.mark.parametrize("before, now, claimed", [
    ({A}, {A, B}, B),  # the one new folder: the server's
    ({A}, {B}, B),  # another server's folder removed meanwhile changes nothing
    ({A}, {A, B, C}, None),  # two new folders: another server started too, and either may be ours
    ({A}, {A}, None),  # none new: this backend made none
])
def test_a_servers_folder_is_the_one_new_folder_or_none(before, now, claimed):
    assert claim(before, now) == claimed


def test_only_a_python_env_folder_in_tmp_is_one():
    assert is_python_env(A)
    assert not is_python_env(Path("/tmp/python_env_short"))
    assert not is_python_env(Path("/home/python_env_aaaaaa"))
    assert not is_python_env(Path("/tmp/tritonforge-server-x"))


def test_remove_refuses_any_other_path(tmp_path):
    other = tmp_path / "python_env_aaaaaa"
    other.mkdir()
    assert python_env.remove(other) is False and other.exists()
    assert python_env.remove(None) is False


@pytest.fixture
def stub_child():
    """A child of this process whose command line names a model as a stub's does: this process stands in for a
    server whose first stub runs."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", "/repo/model/1/model.py"])
    # Popen returns once the child's exec closed its error pipe, which the kernel does before it sets the new
    # command line: /proc shows it a moment later (a server's stub is found by a later poll; this test has one).
    deadline = time.monotonic() + EXEC_WITHIN_S
    while not process_group(child.pid).startswith("stub:") and time.monotonic() < deadline:
        time.sleep(0.01)
    yield child
    child.kill()
    child.wait()


def test_a_claim_waits_for_the_servers_first_stub_and_takes_the_folder_made_before_it(tmp_path, stub_child):
    import os

    folders, lock = tmp_path / "tmp", tmp_path / "lock"
    folders.mkdir()
    (folders / "python_env_before").mkdir()
    watch = PythonEnvClaim(folders, lock).begin()
    made = folders / "python_env_server"
    made.mkdir()
    watch.poll(os.getpid())  # this process, whose child stands in for the server's stub
    assert watch.finish(os.getpid()) == made


def test_a_claim_with_no_stub_running_takes_nothing(tmp_path):
    folders = tmp_path / "tmp"
    folders.mkdir()
    watch = PythonEnvClaim(folders, tmp_path / "lock").begin()
    (folders / "python_env_others").mkdir()  # another server's: this one (with no stub) made none
    with_no_child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        assert watch.finish(with_no_child.pid) is None
    finally:
        with_no_child.kill()
        with_no_child.wait()


def test_starts_of_ours_take_turns_until_their_folder_is_known(tmp_path, stub_child):
    """While one start waits for its first stub, another waits for its turn: their folders cannot mix."""
    import fcntl
    import os

    folders, lock = tmp_path / "tmp", tmp_path / "lock"
    folders.mkdir()
    first = PythonEnvClaim(folders, lock).begin()
    descriptor = os.open(lock, os.O_RDWR)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
        first.finish(os.getpid())
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the turn is free once the folder is known
    finally:
        os.close(descriptor)
