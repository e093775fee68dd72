"""The pure parts of the server launcher: its command lines (one server, one per MPI rank), its environment
and what it logs, with a stand-in `tritonserver` script that only answers `--help`."""

import os
import stat
import sys
from pathlib import Path

import pytest

from tritonforge.serve import server as launcher
from tritonforge.serve.binary import ServerBinary
from tritonforge.serve.errors import ServerError
from tritonforge.serve.server import TritonServer, redacted


def fake_binary(tmp_path: Path, help_text: str) -> ServerBinary:
    """A `tritonserver` stand-in: the launcher runs the real binary only for `--help` before starting it."""
    executable = tmp_path / "bin" / "tritonserver"
    executable.parent.mkdir(parents=True)
    executable.write_text(f"#!/bin/sh\necho '{help_text}'\n")
    executable.chmod(executable.stat().st_mode | stat.S_IEXEC)
    return ServerBinary(executable, tmp_path / "backends")


@pytest.fixture
def server(tmp_path):
    return TritonServer(tmp_path / "repo", http_port=1, grpc_port=2, metrics_port=3, extra_args=["--extra"])


def option(command: list[str], name: str) -> str:
    values = [part.split("=", 1)[1] for part in command if part.startswith(f"{name}=")]
    assert len(values) == 1, (name, command)
    return values[0]


def test_the_command_serves_the_repository_on_the_given_ports_and_stops_on_load_errors(server, tmp_path):
    binary = fake_binary(tmp_path, "--http-port <int>")
    command = server.command(binary)
    assert command[0] == str(binary.executable) and command[-1] == "--extra"
    assert option(command, "--model-repository") == str((tmp_path / "repo").resolve())
    assert option(command, "--backend-directory") == str(tmp_path / "backends")
    assert [option(command, f"--{name}-port") for name in ("http", "grpc", "metrics")] == ["1", "2", "3"]
    assert option(command, "--exit-on-error") == "true" and option(command, "--strict-readiness") == "true"
    # Triton's own wait for open requests and unloading, once signalled: the end of our exit timeout that open
    # requests do not get
    assert option(command, "--exit-timeout-secs") == str(int(server.stop_reserve_s))


@pytest.mark.parametrize("exit_timeout_s, drain_s, reserve_s",
                         [(20, 10, 10), (55, 45, 10), (8, 3, 5), (6, 1.2, 4.8), (12, 6, 6)])
def test_a_stop_gives_open_requests_all_of_its_exit_timeout_but_a_reserve_for_ending_and_unloading(
        tmp_path, exit_timeout_s, drain_s, reserve_s):
    server = TritonServer(tmp_path / "repo", exit_timeout_s=exit_timeout_s)
    assert (server.drain_s, server.stop_reserve_s) == pytest.approx((drain_s, reserve_s))
    assert TritonServer(tmp_path / "repo", exit_timeout_s=exit_timeout_s, drain_timeout_s=1).drain_s == 1


def test_restricted_apis_need_a_fresh_random_key_that_logs_never_show(server, tmp_path):
    binary = fake_binary(tmp_path, "")
    first, second = server.command(binary), server.command(binary)
    key = option(first, "--http-restricted-api").rsplit("admin-key=", 1)[1]
    assert len(key) == 32 and key != option(second, "--http-restricted-api").rsplit("admin-key=", 1)[1]
    assert option(first, "--grpc-restricted-protocol").endswith(f"admin-key={key}")
    assert key not in redacted(first) and "admin-key=<hidden>" in redacted(first)


def test_the_http_body_cap_is_passed_only_to_a_server_that_has_the_option(tmp_path):
    old = TritonServer(tmp_path / "repo").command(fake_binary(tmp_path / "old", "--http-port <int>"))
    new = TritonServer(tmp_path / "repo").command(fake_binary(tmp_path / "new", "--http-max-input-size <int>"))
    assert not any(part.startswith("--http-max-input-size") for part in old)
    assert option(new, "--http-max-input-size") == str(8 * 1024 * 1024)


def test_one_server_per_mpi_rank_rank_zero_serves_everything(tmp_path):
    binary = fake_binary(tmp_path, "")
    single = TritonServer(tmp_path / "repo", world_size=1)
    assert single.mpi_command(binary)[0] == str(binary.executable)
    server = TritonServer(tmp_path / "repo", world_size=2)
    command = server.mpi_command(binary)
    assert command[:2] == ["mpirun", "--allow-run-as-root"]
    ranks = " ".join(command[2:]).split(" : ")
    assert len(ranks) == 2 and all(rank.startswith("-n 1 ") for rank in ranks)
    assert f"shm-region-prefix-name={server.shm_prefix}0_" in ranks[0] and "--model-control-mode" not in ranks[0]
    assert f"shm-region-prefix-name={server.shm_prefix}1_" in ranks[1]
    assert "--model-control-mode=explicit" in ranks[1] and "--load-model=tensorrt_llm" in ranks[1]


def test_the_stub_finds_this_interpreter_first_on_path(server, tmp_path):
    env = server.environment(fake_binary(tmp_path, ""))
    assert env["PATH"].split(os.pathsep)[0] == str(Path(sys.executable).parent)


def test_a_failure_summary_puts_the_model_that_failed_to_load_first(server, tmp_path):
    server.log_path = tmp_path / "log"
    server.log_path.write_text("I1 starting\nE1 some error\nE2 failed to load 'preprocessing': bad config\nI2 end\n")
    assert server.failure_summary() == "E2 failed to load 'preprocessing': bad config"
    server.log_path.write_text("I1 starting\nE1 some error\nI2 end\n")
    assert server.failure_summary() == "E1 some error"
    server.log_path.write_text("I1 starting\nterminate called after throwing an instance of 'std::bad_alloc'\n"
                               "  what():  std::bad_alloc\nSignal (6) received.\n")
    assert server.failure_summary().splitlines() == [
        "terminate called after throwing an instance of 'std::bad_alloc'", "  what():  std::bad_alloc",
        "Signal (6) received."]


def test_a_failure_summary_names_the_option_tritonserver_refused_not_its_usage_text(server, tmp_path):
    server.log_path = tmp_path / "log"
    server.log_path.write_text("Usage: tritonserver [options]\n  --log-error <boolean>\n\tEnable/disable error-level "
                               "logging.\n  --exit-on-error <boolean>\nInvalid option value. Got abc\n")
    assert server.failure_summary() == "Invalid option value. Got abc"


# Triton 2.51's lines for a Python model that raised in `initialize` (quoted, its traceback escaped), and for the
# models that then fail or stop with it.
ENGINE_LOAD_FAILURE = (
    'E1206 12:44:36.816327 30542 model_lifecycle.cc:642] "failed to load \'tensorrt_llm\' version 1: Internal: '
    'LlmApiMissing: TensorRT-LLM is not installed here\\n\\nAt:\\n  /x/engine.py(62): load_llm_api\\n"\n'
    'I1206 12:44:36.816366 30542 model_lifecycle.cc:777] "failed to load \'tensorrt_llm\'"\n'
    'E1206 12:44:36.9 30542 model_lifecycle.cc:642] "failed to load \'ensemble\' version 1: Invalid argument: '
    'ensemble \'ensemble\' depends on \'tensorrt_llm\' which has no loaded version"\n'
    'error: creating server: Internal - failed to load all models\n')


@pytest.mark.parametrize("log, reason", [
    (ENGINE_LOAD_FAILURE, "tensorrt_llm failed to load: Internal: LlmApiMissing: TensorRT-LLM is not installed here"),
    ("Vertex:\n\nMetrics:\n  --metrics-port <integer>\n\tThe port.\n\nThe server cannot listen to HTTP requests "
     "and GRPC requests at the same address and port 127.0.0.1:8100\n",
     "The server cannot listen to HTTP requests and GRPC requests at the same address and port 127.0.0.1:8100"),
    ("I1 starting\nE1206 12:00:00.1 7 server.cc:1] \"some error\"\nI2 end\n", "some error"),
])
def test_the_reason_a_server_stopped_is_one_line_without_tritons_prefix(server, tmp_path, log, reason):
    server.log_path = tmp_path / "log"
    server.log_path.write_text(log)
    assert server.failure_reason() == reason


def test_a_server_that_exits_while_loading_says_why_on_the_first_line_of_its_error(tmp_path):
    """What `tritonforge serve` prints alone: tritonserver's usage text, then its reason, once it has exited."""
    executable = tmp_path / "bin" / "tritonserver"
    executable.parent.mkdir()
    executable.write_text("#!/bin/sh\nprintf 'Usage: tritonserver\\n  --grpc-port <integer>\\n\\nThe server cannot "
                          "listen to HTTP requests and GRPC requests at the same address and port x\\n'\nexit 1\n")
    executable.chmod(executable.stat().st_mode | stat.S_IEXEC)
    (tmp_path / "repo" / "model").mkdir(parents=True)
    (tmp_path / "repo" / "model" / "config.pbtxt").write_text("")
    with pytest.raises(ServerError) as failed:
        TritonServer(tmp_path / "repo", executable=str(executable)).start()
    assert str(failed.value).splitlines()[0] == ("tritonserver exited with code 1: The server cannot listen to HTTP "
                                                 "requests and GRPC requests at the same address and port x")


def test_a_server_not_ready_in_time_names_the_models_still_loading(server, tmp_path):
    """Triton's own lifecycle lines: a model whose load began and neither succeeded nor failed is still loading."""
    server.log_path = tmp_path / "log"
    server.log_path.write_text(
        'I1202 model_lifecycle.cc:472] "loading: postprocessing:1"\n'
        'I1202 model_lifecycle.cc:472] "loading: tensorrt_llm:1"\n'
        'I1202 model_lifecycle.cc:472] "loading: tensorrt_llm_bls:1"\n'
        'I1202 model_lifecycle.cc:839] "successfully loaded \'postprocessing\'"\n'
        'E1202 model_lifecycle.cc:638] "failed to load \'tensorrt_llm_bls\' version 1: bad config"\n')
    assert server.models_loading() == ["tensorrt_llm"]


def test_each_server_names_its_stubs_shared_memory_and_removes_only_its_own(tmp_path, monkeypatch):
    monkeypatch.setattr(launcher, "SHARED_MEMORY_DIR", tmp_path)  # the name a stop reads (from serve/leftovers.py)
    ours, other = TritonServer(tmp_path / "repo"), TritonServer(tmp_path / "repo")
    assert ours.shm_prefix != other.shm_prefix
    prefix = option(ours.command(fake_binary(tmp_path, "")), "--backend-config")
    assert prefix == f"python,shm-region-prefix-name={ours.shm_prefix}0_"
    left_by_a_killed_stub = tmp_path / f"{ours.shm_prefix}0_region"
    not_ours = [tmp_path / f"{other.shm_prefix}0_region", tmp_path / "triton_python_backend_shm_region_x"]
    for region in [left_by_a_killed_stub, *not_ours]:
        region.write_bytes(b"")
    ours.stop()  # never started: nothing to wait for, only its leftovers to remove
    assert not left_by_a_killed_stub.exists() and all(region.exists() for region in not_ours)


def test_the_sweep_removes_only_what_dead_runs_of_ours_left(tmp_path):
    """Work folders whose recorded processes are all gone, and shared-memory regions naming a gone process; never
    a live run's, nor anything without our record."""
    import json
    import subprocess

    from tritonforge.serve.leftovers import OWNER_RECORD, WORK_DIR_PREFIX, sweep_leftovers

    exited = subprocess.Popen(["true"])
    exited.wait()  # its pid names no process now
    dead, alive = exited.pid, os.getpid()
    temporary, shared = tmp_path / "tmp", tmp_path / "shm"
    temporary.mkdir()
    shared.mkdir()
    folders = {}
    for name, pids in (("dead", [dead]), ("alive", [dead, alive])):
        folders[name] = temporary / f"{WORK_DIR_PREFIX}{name}"
        folders[name].mkdir()
        (folders[name] / OWNER_RECORD).write_text(json.dumps({"pids": pids}))
    folders["unrecorded"] = temporary / f"{WORK_DIR_PREFIX}unrecorded"
    folders["unrecorded"].mkdir()
    regions = {"dead": shared / f"tritonforge_pid{dead}_0123abcd_0_region",
               "alive": shared / f"tritonforge_pid{alive}_0123abcd_0_region",
               "old naming": shared / "tritonforge_0123456789ab_0_region",
               "not ours": shared / "triton_python_backend_shm_region_1"}
    for region in regions.values():
        region.write_bytes(b"")
    removed = sweep_leftovers(temporary, shared)
    assert sorted(removed) == sorted([folders["dead"], regions["dead"]])
    assert not folders["dead"].exists() and not regions["dead"].exists()
    assert all(folders[name].exists() for name in ("alive", "unrecorded"))
    assert all(regions[name].exists() for name in ("alive", "old naming", "not ours"))


def test_the_sweep_ends_the_stubs_still_running_from_a_dead_runs_folder(tmp_path):
    """A stub whose server was killed while it loaded waits for ever, holding its memory: the sweep that removes
    the dead run's folder ends the programs running from it, and no other."""
    import json
    import shutil
    import subprocess

    from tritonforge.serve.leftovers import OWNER_RECORD, WORK_DIR_PREFIX, sweep_leftovers

    exited = subprocess.Popen(["true"])
    exited.wait()
    folder = tmp_path / f"{WORK_DIR_PREFIX}dead"
    (folder / "backends").mkdir(parents=True)
    (folder / OWNER_RECORD).write_text(json.dumps({"pids": [exited.pid]}))
    stub_program = folder / "backends" / "stub"
    shutil.copy(shutil.which("sleep"), stub_program)  # stands in for the copied triton_python_backend_stub
    stub = subprocess.Popen([str(stub_program), "600"])
    elsewhere = subprocess.Popen([shutil.which("sleep"), "600"])
    try:
        assert folder in sweep_leftovers(tmp_path, tmp_path / "no-shm")
        assert stub.wait(timeout=30) == -9 and not folder.exists()
        assert elsewhere.poll() is None
    finally:
        for process in (stub, elsewhere):
            process.kill()
            process.wait()


def test_the_model_control_and_repository_apis_are_behind_the_key(server, tmp_path):
    """The load API uploads code: never open to a client without the operator's key."""
    command = server.command(fake_binary(tmp_path, ""))
    for flag in ("--http-restricted-api", "--grpc-restricted-protocol"):
        apis = option(command, flag).split(":admin-key=", 1)[0].split(",")
        assert {"model-repository", "model-config", "shared-memory", "logging"} <= set(apis)


def test_a_folder_of_folders_without_model_configs_is_no_repository(tmp_path):
    from tritonforge.serve.repository import RepositoryError, check_repository

    (tmp_path / "checkpoint" / "tokenizer").mkdir(parents=True)
    with pytest.raises(RepositoryError, match="holds no model"):
        check_repository(tmp_path / "checkpoint")
    (tmp_path / "checkpoint" / "model").mkdir()
    (tmp_path / "checkpoint" / "model" / "config.pbtxt").write_text("")
    assert check_repository(tmp_path / "checkpoint") == ["model"]


def test_a_folder_that_is_no_repository_is_answered_with_a_build_that_would_write_it(tmp_path, monkeypatch):
    """The build refuses an output that is, holds or sits in the checkpoint, and a non-empty folder it did not
    write: what `serve` suggests avoids both."""
    from tritonforge.serve.repository import RepositoryError, check_repository

    checkpoint, empty, other = tmp_path / "ckpt", tmp_path / "empty", tmp_path / "other"
    for folder in (checkpoint, empty, other):
        folder.mkdir()
    (checkpoint / "config.json").write_text("{}")
    (other / "notes.txt").write_text("")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(RepositoryError, match=f"^{checkpoint} is a Hugging Face checkpoint, not a model repository: "
                                              f"build one from it with `tritonforge build --model {checkpoint} "
                                              f"--output model_repository`, then serve model_repository$"):
        check_repository(checkpoint)
    with pytest.raises(RepositoryError, match=f"--output {empty}`$"):
        check_repository(empty)
    with pytest.raises(RepositoryError, match="--output model_repository`$"):
        check_repository(other)
    monkeypatch.chdir(checkpoint)  # model_repository would sit inside the checkpoint
    with pytest.raises(RepositoryError, match=f"--output {tmp_path.resolve() / 'ckpt-repository'}`"):
        check_repository(Path("."))


def test_the_runs_serving_a_repository_are_those_whose_record_names_it(tmp_path):
    """Other live runs count only for the repository they serve; this process's own run never does."""
    import json

    from tritonforge.serve.leftovers import OWNER_RECORD, WORK_DIR_PREFIX, serving_processes

    live = os.getppid()  # a live process that is not this one
    for name, repository, starter in [("a", tmp_path / "served", live), ("b", tmp_path / "other", live),
                                      ("c", tmp_path / "served", os.getpid())]:
        folder = tmp_path / f"{WORK_DIR_PREFIX}{name}"
        folder.mkdir()
        (folder / OWNER_RECORD).write_text(json.dumps({"pids": [starter], "repository": str(repository)}))
    assert serving_processes(tmp_path / "served", temporary_dir=tmp_path) == [live]
    assert serving_processes(tmp_path / "nothing", temporary_dir=tmp_path) == []


def test_the_sweep_removes_a_dead_runs_python_backend_folder_and_says_what_it_removed_in_one_line(tmp_path, caplog):
    """The folder the dead run's record names in /tmp goes with its work folder and regions; the next start says
    so (it used to remove them without a word)."""
    import json
    import logging
    import subprocess
    import uuid

    from tritonforge.serve.leftovers import OWNER_RECORD, WORK_DIR_PREFIX, sweep_leftovers

    exited = subprocess.Popen(["true"])
    exited.wait()
    folder = tmp_path / f"{WORK_DIR_PREFIX}dead"
    folder.mkdir()
    env = Path("/tmp") / f"python_env_{uuid.uuid4().hex[:6]}"  # as the backend names it, there
    env.mkdir()
    shared = tmp_path / "shm"
    shared.mkdir()
    region = shared / f"tritonforge_pid{exited.pid}_0123abcd_0_region"
    region.write_bytes(b"")
    (folder / OWNER_RECORD).write_text(json.dumps({"pids": [exited.pid], "python_env": str(env)}))
    try:
        with caplog.at_level(logging.WARNING, logger="tritonforge.serve.leftovers"):
            removed = sweep_leftovers(tmp_path, shared)
    finally:
        if env.exists():
            env.rmdir()
    assert sorted(removed) == sorted([folder, env, region]) and not env.exists()
    (line,) = [record.getMessage() for record in caplog.records]
    assert line == (f"removed what killed tritonforge servers (started by pid {exited.pid}) left: 1 work folder, "
                    f"1 shared-memory region, 1 Python backend folder")


def test_the_sweep_ends_a_dead_runs_stubs_by_their_shared_memory_prefix_where_they_run_from_elsewhere(tmp_path):
    """NVIDIA's container runs the stubs of its own backends folder: a stub program whose region carries the
    dead run's prefix is ended, and no other program, even one that names the prefix."""
    import json
    import subprocess
    import sys

    from tritonforge.serve.leftovers import OWNER_RECORD, WORK_DIR_PREFIX, sweep_leftovers

    exited = subprocess.Popen(["true"])
    exited.wait()
    prefix = f"tritonforge_pid{exited.pid}_0123abcd_"
    folder = tmp_path / f"{WORK_DIR_PREFIX}dead"
    folder.mkdir()
    (folder / OWNER_RECORD).write_text(json.dumps({"pids": [exited.pid], "shm_prefix": prefix}))
    stub_program = tmp_path / "backends" / "python" / "triton_python_backend_stub"
    stub_program.parent.mkdir(parents=True)
    stub_program.symlink_to(sys.executable)  # stands in for the stub: named as it is, run from elsewhere
    sleep = "import time; time.sleep(600)"
    stub = subprocess.Popen([str(stub_program), "-c", sleep, "/repo/model/1/model.py", f"{prefix}0_region"])
    other = subprocess.Popen([sys.executable, "-c", sleep, f"{prefix}0_region"])
    try:
        assert folder in sweep_leftovers(tmp_path, tmp_path / "no-shm")
        assert stub.wait(timeout=30) == -9
        assert other.poll() is None
    finally:
        for process in (stub, other):
            process.kill()
            process.wait()
