"""How the benchmark drives perf_analyzer: the flags for decoupled streams, and its errors in our report."""


def test_perf_analyzer_measures_streams_in_count_windows_and_reports_its_errors():
    import subprocess
    from pathlib import Path

    from tritonforge.benchmark import perf_analyzer_command, perf_analyzer_error

    command = perf_analyzer_command("h:1", "ensemble", Path("in.json"), 128, 6.0, 64, Path("out.json"))
    flag = {name: command[i + 1] for i, name in enumerate(command[:-1]) if name.startswith("--")}
    assert "--streaming" in command and flag["--measurement-mode"] == "count_windows"
    # 128 streams × 64 tokens at 8.5 ms: ~235 requests/s, so ~2 s a window makes 470 requests.
    assert flag["--measurement-request-count"] == "470"
    assert flag["--stability-percentage"] == "999" and flag["--max-threads"] == "128"
    usage = "Usage: perf_analyzer [options]\n -m <model>\n" * 40
    failed = subprocess.CompletedProcess([], 99, stdout=usage,
                                         stderr="Error: Failed to parse --profile-export-file. Path must not "
                                                "already exist.\n")
    assert perf_analyzer_error(failed) == ("Error: Failed to parse --profile-export-file. Path must not "
                                           "already exist.")
