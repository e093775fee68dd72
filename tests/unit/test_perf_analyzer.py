"""How the benchmark drives perf_analyzer: the flags for decoupled streams, and its errors in our report."""


def test_perf_analyzer_measures_streams_in_count_windows_and_reports_its_errors():
    import subprocess
    from pathlib import Path

    from tritonforge.tools.benchmark import perf_analyzer_command, perf_analyzer_error

    command = perf_analyzer_command("h:1", "ensemble", Path("in.json"), 128, 6.0, 64, Path("out.json"))
    flag = {name: command[i + 1] for i, name in enumerate(command[:-1]) if name.startswith("--")}
    assert "--streaming" in command and flag["--measurement-mode"] == "count_windows"
    # 128 streams × 64 tokens at 8.5 ms: ~235 requests/s, so ~2 s a window makes 470 requests.
    assert flag["--measurement-request-count"] == "470"
    assert flag["--stability-percentage"] == "999" and flag["--max-threads"] == "128"
    # An engine twice as fast completes twice the requests in the same time: windows sized from its step.
    faster = perf_analyzer_command("h:1", "ensemble", Path("in.json"), 128, 6.0, 64, Path("out.json"),
                                   expected_ms_per_token=4.25)
    assert faster[faster.index("--measurement-request-count") + 1] == "941"
    usage = "Usage: perf_analyzer [options]\n -m <model>\n" * 40
    failed = subprocess.CompletedProcess([], 99, stdout=usage,
                                         stderr="Error: Failed to parse --profile-export-file. Path must not "
                                                "already exist.\n")
    assert perf_analyzer_error(failed) == ("Error: Failed to parse --profile-export-file. Path must not "
                                           "already exist.")


def test_perf_analyzer_streams_openai_completions_from_the_gateway(tmp_path, monkeypatch):
    """The gateway's load: perf_analyzer's OpenAI service kind, streamed /v1/completions of exactly N tokens,
    measured with the same count windows as the gRPC paths."""
    import json
    import subprocess

    from tritonforge.tools import benchmark

    commands = []

    def run(command, **_):
        commands.append(command)
        export = command[command.index("--profile-export-file") + 1]
        with open(export, "w") as file:
            json.dump({"experiments": [{"requests": [
                {"timestamp": 1_000_000_000, "response_timestamps": [1_010_000_000, 1_600_000_000]}]}]}, file)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(benchmark.subprocess, "run", run)
    timings, wall = benchmark.perf_analyzer_openai_load("http://127.0.0.1:9000", "served", [("Hello", [1, 2])],
                                                        128, 64, 6.0, tmp_path)
    command = commands[0]
    flag = {name: command[i + 1] for i, name in enumerate(command[:-1]) if name.startswith("-")}
    assert flag["--service-kind"] == "openai" and flag["--endpoint"] == "v1/completions"
    assert flag["-u"] == "http://127.0.0.1:9000" and flag["-m"] == "served" and "-i" not in flag
    # It streams because the payload asks; it refuses --streaming ("only allowed with gRPC").
    assert "--streaming" not in command and "--async" in command and flag["--measurement-mode"] == "count_windows"
    payload = json.loads(open(flag["--input-data"]).read())["data"][0]["payload"][0]
    assert payload == {"model": "served", "prompt": "Hello", "max_tokens": 64, "min_tokens": 64, "stream": True}
    assert timings[0].tokens == 64 and round(timings[0].arrivals[0] - timings[0].sent, 3) == 0.01
    assert round(wall, 3) == 0.6


def test_a_failed_perf_analyzer_fails_its_point_alone_with_its_error(tmp_path, monkeypatch):
    import subprocess

    from tritonforge.tools import benchmark

    def run(command, **_):
        return subprocess.CompletedProcess(command, 99, "", "error: failed to get model config: restricted\n")

    monkeypatch.setattr(benchmark.subprocess, "run", run)
    for load in (lambda: benchmark.perf_analyzer_load("h:1", "ensemble", [("Hi", [1])], 8, 64, 2.0, tmp_path),
                 lambda: benchmark.perf_analyzer_openai_load("http://h:2", "m", [("Hi", [1])], 8, 64, 2.0, tmp_path)):
        timings, wall = load()
        assert wall == 2.0 and len(timings) == 1 and not timings[0].arrivals
        assert timings[0].error.startswith("perf_analyzer: perf_analyzer exited 99: error: failed to get model config")


def test_a_perf_analyzer_that_never_ends_fails_its_point_within_its_timeout(tmp_path, monkeypatch):
    """A stream that never ends (perf_analyzer then waits for it forever) fails the point with a clear error,
    after a time that scales with the point's duration."""
    import subprocess

    from tritonforge.tools import benchmark

    waited = []

    def run(command, timeout, **_):
        waited.append(timeout)
        raise subprocess.TimeoutExpired(command, timeout)

    monkeypatch.setattr(benchmark.subprocess, "run", run)
    timings, _ = benchmark.perf_analyzer_load("h:1", "ensemble", [("Hi", [1])], 8, 64, 4.0, tmp_path)
    assert timings[0].error.startswith("perf_analyzer: no result in 120 s")
    benchmark.perf_analyzer_load("h:1", "ensemble", [("Hi", [1])], 8, 64, 30.0, tmp_path)
    assert waited == [120, 600]


def test_result_files_keep_every_dot_of_their_name(tmp_path):
    from tritonforge.tools.benchmark import with_extension

    for name in ("run-4.25ms", "run-8.5ms"):
        with_extension(tmp_path / name, ".json").write_text(name)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run-4.25ms.json", "run-8.5ms.json"]

