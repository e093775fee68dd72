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



def _string_tensor(text: bytes) -> bytes:
    return len(text).to_bytes(4, "little") + text


def test_streams_read_from_a_perf_analyzer_export_are_checked_against_their_answers(tmp_path, monkeypatch):
    """perf_analyzer writes each tensor's raw bytes into its export: a stream's text is its text_output chunks
    joined, a direct stream's tokens its output_ids counted; a stream that differs is an error of its point."""
    import subprocess
    from pathlib import Path

    from tritonforge.tools import benchmark

    euro = "€".encode()  # a character of three bytes, split over two chunks of the ensemble's stream
    requests = [
        {"timestamp": 1, "response_timestamps": [2, 3], "request_inputs": {"text_input": _string_tensor(b"Hi")},
         "response_outputs": [{"text_output": _string_tensor(b" a" + euro[:1])},
                              {"text_output": _string_tensor(euro[1:] + b"\x00b")}]},
        {"timestamp": 1, "response_timestamps": [2, 3], "request_inputs": {"text_input": b"Hi"},
         "response_outputs": [{"text_output": _string_tensor(b" b")}, {"text_output": _string_tensor(b" a")}]},
        {"timestamp": 1, "response_timestamps": [2], "request_inputs": {"input_ids": 7},
         "response_outputs": [{"output_ids": (5).to_bytes(4, "little") * 2}, {"output_ids": b""}]},
        # perf_analyzer 2.60: chunks without the length prefix, numeric tensors as numbers.
        {"timestamp": 1, "response_timestamps": [2, 3], "request_inputs": {"text_input": b"Hi"},
         "response_outputs": [{"text_output": b" a" + euro[:1], "cum_log_probs": b""},
                              {"text_output": euro[1:] + b"\x00b"}]},
        {"timestamp": 1, "response_timestamps": [2, 3], "request_inputs": {"input_ids": [7, 8]},
         "response_outputs": [{"sequence_length": 1, "output_ids": 5, "batch_index": b""},
                              {"output_ids": [5, 6]}, {"sequence_length": b"", "output_ids": b""}]},
    ]

    def run(command, **_):
        export = command[command.index("--profile-export-file") + 1]
        # As perf_analyzer writes it: raw bytes inside JSON strings, control bytes escaped.
        text = b'{"experiments": [{"requests": [' + b", ".join(_raw_json(r) for r in requests) + b"]}]}"
        Path(export).write_bytes(text)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(benchmark.subprocess, "run", run)
    timings, _ = benchmark.perf_analyzer_load("h:1", "ensemble", [("Hi", [1])], 8, 2, 2.0, tmp_path)
    assert timings[0].prompt == "Hi" and timings[0].text == b" a" + euro + b"\x00b"
    assert timings[2].received_tokens == 2 and timings[3].text == timings[0].text
    assert timings[4].received_tokens == 3
    checked = benchmark.check_streams(timings, {"Hi": b" a" + euro + b"\x00b"}, output_tokens=2)
    assert checked == 5
    assert [t.difference is None for t in timings] == [True, False, True, True, False]
    assert timings[4].difference == "the stream carried 3 tokens, not 2"
    assert timings[1].difference.startswith("streamed text differs from its non-streamed answer")
    summary = benchmark.summarize(timings, 1.0)
    assert (summary["streams_checked"], summary["streams_differing"], summary["errors"]) == (5, 2, 0)
    short = benchmark.Timing(sent=0, arrivals=[1], tokens=2, received_tokens=1)
    benchmark.check_streams([short], {}, output_tokens=2)
    assert short.difference == "the stream carried 1 tokens, not 2"


def _raw_json(value) -> bytes:
    """JSON as rapidjson's writer makes it from raw buffers: bytes as they are, control bytes escaped."""
    if isinstance(value, dict):
        return b"{" + b", ".join(_raw_json(k.encode()) + b": " + _raw_json(v) for k, v in value.items()) + b"}"
    if isinstance(value, list):
        return b"[" + b", ".join(_raw_json(v) for v in value) + b"]"
    if isinstance(value, int):
        return str(value).encode()
    escaped = b"".join(b"\\u%04x" % byte if byte < 0x20 else b'\\"' if byte == 0x22 else b"\\\\"
                       if byte == 0x5C else bytes([byte]) for byte in value)
    return b'"' + escaped + b'"'


def test_the_ensembles_streams_may_show_a_character_cut_between_chunks_as_replacement_characters():
    """Its postprocessing decodes each chunk alone (docs: streaming): a character cut in two shows as U+FFFD on
    both sides; everything else must still arrive whole and in order."""
    from tritonforge.tools.benchmark import Timing, check_streams

    answer = "보냅니다. Emoji 🚀 travel".encode()
    cut = " ".join(["보냅\ufffd\ufffd다.", "Emoji", "\ufffd\ufffd travel"]).encode()
    timings = [Timing(sent=0, arrivals=[1], tokens=1, prompt="p", text=text)
               for text in (cut, cut, cut.replace(b"Emoji", b"Emojo"), cut.replace(b" travel", b""))]
    check_streams(timings[:1], {"p": answer}, 1, split_characters_replaced=True)
    check_streams(timings[1:2], {"p": answer}, 1)  # the BLS keeps characters whole: no allowance
    check_streams(timings[2:], {"p": answer}, 1, split_characters_replaced=True)
    assert timings[0].difference is None
    assert [t.difference is not None for t in timings[1:]] == [True, True, True]
