"""The build cache of `serve CHECKPOINT`: its key changes with what changes the repository (the checkpoint's files,
a build option, a file an option names, the machine an engine is built for) and with nothing else, and a folder
is found only once a complete build was renamed there."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest

from tritonforge.builder import cache
from tritonforge.builder.cache import BuildCache, CacheEntryInvalid, cache_key, default_cache_dir
from tritonforge.builder.manifest import MANIFEST
from tritonforge.builder.model_configs import ServingConfig
from tritonforge.builder.options import BuildOptions
from tritonforge.tools.accuracy_gate import GateOptions

KEY = "0123456789abcdef0123456789abcdef"


@pytest.fixture
def checkpoint(tmp_path) -> Path:
    """The files a key reads of a checkpoint (their contents need not load: the key never parses them)."""
    folder = tmp_path / "checkpoint"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 300}))
    (folder / "tokenizer.json").write_text('{"model": {"type": "BPE"}}')
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 4)
    return folder


NO_GATE = GateOptions()


def key(checkpoint: Path, gate: GateOptions = NO_GATE, **options) -> str:
    return cache_key(BuildOptions(model=checkpoint, **options), extra=(gate,))


def test_the_same_checkpoint_and_options_give_the_same_key_wherever_the_checkpoint_and_the_output_are(
        checkpoint, tmp_path):
    first = key(checkpoint)
    assert key(checkpoint) == first and len(first) == cache.KEY_DIGITS
    copy = shutil.copytree(checkpoint, tmp_path / "elsewhere" / "copy")  # copy2: modification times kept
    assert key(copy) == first
    assert key(checkpoint, output=tmp_path / "other", force=True) == first  # where it goes is no build option


@pytest.mark.parametrize("change", ["config edited, same size", "tokenizer file added", "small weights rewritten",
                                    "file removed"])
def test_a_changed_checkpoint_file_gives_another_key(checkpoint, change):
    before = key(checkpoint)
    if change == "config edited, same size":
        config = checkpoint / "config.json"
        config.write_text(config.read_text().replace("300", "301"))
    elif change == "tokenizer file added":
        (checkpoint / "tokenizer_config.json").write_text("{}")
    elif change == "small weights rewritten":
        weights = checkpoint / "model.safetensors"
        stat = weights.stat()
        weights.write_bytes(bytes(reversed(weights.read_bytes())))
        os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # a file this small is read, not stat'ed
    else:
        (checkpoint / "tokenizer.json").unlink()
    assert key(checkpoint) != before


def test_hidden_files_and_subfolders_of_the_checkpoint_are_not_keyed(checkpoint):
    """The build reads neither: a download tool's `.cache/`, a release's `original/` weights."""
    before = key(checkpoint)
    (checkpoint / ".cache").mkdir()
    (checkpoint / ".cache" / "download.lock").write_text("x")
    (checkpoint / "original").mkdir()
    (checkpoint / "original" / "consolidated.00.pth").write_bytes(b"weights in another format")
    (checkpoint / ".gitattributes").write_text("*.safetensors filter=lfs")
    assert key(checkpoint) == before


def test_weights_above_the_content_limit_are_keyed_by_size_and_time_not_read(checkpoint, monkeypatch):
    monkeypatch.setattr(cache, "CONTENT_HASHED_BYTES", 16)  # the weights file (1 KiB) is now "large"
    weights = checkpoint / "model.safetensors"
    before, stat = key(checkpoint), weights.stat()
    weights.write_bytes(bytes(reversed(weights.read_bytes())))
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert key(checkpoint) == before  # the rule: same name, size and modification time, same key
    os.utime(weights, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    assert key(checkpoint) != before  # rewritten in place: its time moves


@pytest.mark.parametrize("options", [
    {"max_batch_size": 4}, {"engine": "replay"}, {"frontends": ("ensemble",)}, {"text_backend": "python"},
    {"serving": ServingConfig(preprocessing_instances=3)}, {"stream_interval": 2},
], ids=lambda options: next(iter(options)))
def test_a_changed_build_option_gives_another_key(checkpoint, options):
    assert key(checkpoint, **options) != key(checkpoint)


def test_the_gate_and_the_contents_of_the_files_options_name_are_keyed_not_their_paths(checkpoint, tmp_path,
                                                                                      monkeypatch):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "The server"}\n')
    without_gate, gated = key(checkpoint), key(checkpoint, GateOptions(accuracy_gate=prompts))
    assert gated != without_gate
    monkeypatch.chdir(tmp_path)
    assert key(checkpoint, GateOptions(accuracy_gate=Path("prompts.jsonl"))) == gated  # the same file, named anew
    prompts.write_text('{"prompt": "The client"}\n')
    assert key(checkpoint, GateOptions(accuracy_gate=prompts)) != gated
    dataset = tmp_path / "calibration"
    dataset.mkdir()
    (dataset / "train.jsonl").write_text('{"text": "a"}\n')
    calibrated = cache_key(BuildOptions(model=checkpoint, engine="tensorrtllm", quantization="fp8",
                                        calib_dataset=str(dataset)))
    (dataset / "train.jsonl").write_text('{"text": "b"}\n')
    assert cache_key(BuildOptions(model=checkpoint, engine="tensorrtllm", quantization="fp8",
                                  calib_dataset=str(dataset))) != calibrated


def test_the_machine_an_engine_is_built_for_is_keyed(checkpoint, monkeypatch):
    """A TensorRT-LLM engine serves only on the GPU and release it was built with: another one builds anew."""
    gpu = {"gpu_name": "NVIDIA H100"}
    monkeypatch.setattr(cache, "engine_kind", lambda name: SimpleNamespace(machine_facts=lambda: dict(gpu)))
    on_h100 = key(checkpoint)
    gpu["gpu_name"] = "NVIDIA H200"
    assert key(checkpoint) != on_h100


def test_another_tritonforge_code_gives_another_key(checkpoint, monkeypatch):
    before = key(checkpoint)
    monkeypatch.setattr(cache, "code_digest", lambda: "the code of another release")
    assert key(checkpoint) != before


def test_the_code_digest_changes_with_the_build_code_and_the_model_sources_only(tmp_path, monkeypatch):
    for name in ("tritonforge/builder/build.py", "tritonforge/runtime/text/native/detokenizer.h",
                 "tritonforge/gateway/routes.py", "preprocessing/1/model.py"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("# version 1\n")
    monkeypatch.setattr(cache, "SOURCE_ROOT", tmp_path)
    digest = cache.code_digest.__wrapped__  # uncached
    before = digest()
    (tmp_path / "tritonforge/gateway/routes.py").write_text("# version 2\n")  # nothing of it is in a repository
    assert digest() == before
    for name in ("tritonforge/builder/build.py", "tritonforge/runtime/text/native/detokenizer.h",
                 "preprocessing/1/model.py"):
        (tmp_path / name).write_text("# version 2\n")
        assert digest() != before, name
        before = digest()


# --- the folders -------------------------------------------------------------------------------------------------

def complete_build(folder: Path) -> None:
    """What `write` leaves of a complete build: files, the manifest last."""
    (folder / "ensemble").mkdir()
    (folder / "ensemble" / "config.pbtxt").write_text("name: 'ensemble'")
    (folder / MANIFEST).write_text("{}")


def test_a_complete_build_is_renamed_into_place_and_found_again(tmp_path):
    store = BuildCache(tmp_path / "cache")
    assert store.find(KEY) is None
    entry, ours = store.build(KEY, complete_build)
    assert ours and entry == tmp_path / "cache" / KEY and (entry / "ensemble" / "config.pbtxt").is_file()
    assert store.find(KEY) == entry
    assert [path.name for path in (tmp_path / "cache").iterdir()] == [KEY]  # no temporary folder left


def test_a_partial_build_folder_is_no_hit_even_with_every_file(tmp_path):
    """What a build killed outright leaves (no rename happened) is never reused."""
    root = tmp_path / "cache"
    partial = root / f".{KEY}{cache.PARTIAL_MARK}12345-abcd"
    partial.mkdir(parents=True)
    complete_build(partial)
    assert BuildCache(root).find(KEY) is None
    entry, ours = BuildCache(root).build(KEY, complete_build)
    assert ours and partial.is_dir()  # the dead build's folder is not this run's to remove


def test_a_build_whose_manifest_is_written_is_no_hit_until_it_is_complete(tmp_path):
    """The accuracy gate runs after the build wrote its manifest: a serve killed meanwhile must leave nothing that
    the next one would serve ungated, and a serve started meanwhile must not serve a build still being written."""
    store = BuildCache(tmp_path / "cache")
    seen = []

    def gated(folder: Path) -> None:
        complete_build(folder)
        seen.append((folder.parent == store.root, folder != store.entry(KEY), store.find(KEY)))

    store.build(KEY, gated)
    assert seen == [(True, True, None)]


@pytest.mark.parametrize("failure", [RuntimeError("the build failed"), KeyboardInterrupt()],
                         ids=["error", "interrupt"])
def test_a_build_that_fails_leaves_nothing_and_nothing_is_found(tmp_path, failure):
    store = BuildCache(tmp_path / "cache")

    def fails_halfway(folder: Path) -> None:
        (folder / "ensemble").mkdir()
        (folder / "ensemble" / "config.pbtxt").write_text("half")
        raise failure

    with pytest.raises(type(failure)):
        store.build(KEY, fails_halfway)
    assert list((tmp_path / "cache").iterdir()) == []
    assert store.find(KEY) is None


def test_a_folder_at_the_key_that_no_build_completed_is_refused_and_kept(tmp_path):
    entry = tmp_path / "cache" / KEY
    entry.mkdir(parents=True)
    (entry / "notes.txt").write_text("mine")
    with pytest.raises(CacheEntryInvalid, match=f"{entry} holds no repository a complete build left there"):
        BuildCache(tmp_path / "cache").find(KEY)
    assert (entry / "notes.txt").read_text() == "mine"


def test_a_build_another_process_completed_first_is_used_and_this_ones_folder_removed(tmp_path):
    store = BuildCache(tmp_path / "cache")

    def overtaken(folder: Path) -> None:
        complete_build(folder)
        theirs = store.entry(KEY)
        theirs.mkdir()
        complete_build(theirs)
        (theirs / "theirs").write_text("")

    entry, ours = store.build(KEY, overtaken)
    assert not ours and (entry / "theirs").is_file()
    assert [path.name for path in (tmp_path / "cache").iterdir()] == [KEY]


def test_a_cache_dir_that_is_a_file_is_refused_naming_it(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match="--cache-dir .*file is not a folder"):
        BuildCache(tmp_path / "file")


@pytest.mark.parametrize(("xdg", "expected"), [
    ("/var/cache/me", Path("/var/cache/me/tritonforge/repositories")),
    ("", Path.home() / ".cache" / "tritonforge" / "repositories"),
    ("relative/cache", Path.home() / ".cache" / "tritonforge" / "repositories"),  # XDG: a relative one is ignored
], ids=["set", "unset", "relative"])
def test_the_default_cache_dir_follows_xdg(monkeypatch, xdg, expected):
    monkeypatch.setenv("XDG_CACHE_HOME", xdg)
    assert default_cache_dir() == expected

