"""The build deletes only what it wrote: dangerous outputs are refused, --force removes its own files only."""

import json
import os
import shutil
from pathlib import Path

import pytest

from tritonforge.builder.build import BuildOptions, build
from tritonforge.builder.manifest import MANIFEST


def build_to(model, output, **kwargs):
    return build(BuildOptions(model=model, output=output, max_input_len=64, max_seq_len=256, **kwargs),
                 progress=lambda _: None)


@pytest.fixture
def checkpoint(tiny_models, tmp_path):
    copy = tmp_path / "work" / "checkpoint"
    shutil.copytree(tiny_models["bpe"], copy)
    return copy


def snapshot(folder):
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("where", ["checkpoint", "parent", "inside"])
def test_an_output_that_is_holds_or_sits_in_the_checkpoint_is_refused(checkpoint, where):
    output = {"checkpoint": checkpoint, "parent": checkpoint.parent, "inside": checkpoint / "repo"}[where]
    before = snapshot(checkpoint.parent)
    with pytest.raises(ValueError, match="checkpoint"):
        build_to(checkpoint, output, force=True)
    assert snapshot(checkpoint.parent) == before


def test_a_home_directory_or_root_is_refused(checkpoint, tmp_path, monkeypatch):
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("secret")
    monkeypatch.setenv("HOME", str(home))
    with pytest.raises(ValueError, match="home directory"):
        build_to(checkpoint, home, force=True)
    assert (home / ".ssh" / "id_ed25519").read_text() == "secret"
    with pytest.raises(ValueError, match="is /:"):
        build_to(checkpoint, tmp_path / ".." / ".." / ".." / ".." / ".." / ".." / "..", force=True)


def test_a_folder_without_our_record_is_never_deleted_even_with_force(checkpoint, tmp_path):
    output = tmp_path / "data"
    output.mkdir()
    (output / "precious.txt").write_text("keep")
    (output / MANIFEST).write_text("{}")  # a file of that name proves nothing
    with pytest.raises(FileExistsError, match="nothing is deleted"):
        build_to(checkpoint, output, force=True)
    assert (output / "precious.txt").read_text() == "keep"


def test_force_replaces_only_the_files_the_build_recorded(checkpoint, tmp_path):
    output = tmp_path / "repo"
    build_to(checkpoint, output)
    recorded = json.loads((output / MANIFEST).read_text())["files"]
    assert "ensemble/config.pbtxt" in recorded and "preprocessing/1/model.py" in recorded
    (output / "notes.txt").write_text("mine")
    (output / "preprocessing" / "my-extra.py").write_text("mine too")
    with pytest.raises(FileExistsError, match="--force"):
        build_to(checkpoint, output)
    build_to(checkpoint, output, force=True)
    assert (output / "notes.txt").read_text() == "mine"
    assert (output / "preprocessing" / "my-extra.py").read_text() == "mine too"
    assert "notes.txt" not in json.loads((output / MANIFEST).read_text())["files"]


def test_a_record_pointing_outside_the_repository_is_not_followed(checkpoint, tmp_path):
    output = tmp_path / "repo"
    build_to(checkpoint, output)
    outside = tmp_path / "outside.txt"
    outside.write_text("not yours")
    manifest = json.loads((output / MANIFEST).read_text())
    manifest["files"].append("../outside.txt")
    (output / MANIFEST).write_text(json.dumps(manifest))
    build_to(checkpoint, output, force=True)
    assert outside.read_text() == "not yours"


def test_weights_are_copied_not_linked(checkpoint, tmp_path):
    output = build_to(checkpoint, tmp_path / "repo")
    weights = next((output / "tensorrt_llm" / "1" / "checkpoint").glob("*.safetensors"))
    assert os.stat(weights).st_nlink == 1


def test_the_folder_of_all_homes_is_refused():
    """Checked by the refusal itself: a build that got past it would write into /home."""
    from tritonforge.builder.repository import _refuse_dangerous_output

    with pytest.raises(ValueError, match="^--output /home is a home directory"):
        _refuse_dangerous_output(Path("/home"), None)


def test_an_output_that_is_a_symbolic_link_is_refused_and_what_it_points_to_is_untouched(checkpoint, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir()
    (tmp_path / "link").symlink_to(target)
    with pytest.raises(FileExistsError, match="is not a folder"):
        build_to(checkpoint, tmp_path / "link")
    assert list(target.iterdir()) == []


def test_force_removes_the_model_folders_its_records_leave_empty(checkpoint, tmp_path):
    """A rebuild without the BLS: the old build's BLS files go, and so does the folder they leave, which
    Triton would otherwise meet as a model without a config."""
    output = tmp_path / "repo"
    build_to(checkpoint, output)
    assert (output / "tensorrt_llm_bls" / "config.pbtxt").is_file()
    build_to(checkpoint, output, force=True, frontends=("ensemble",))
    assert not (output / "tensorrt_llm_bls").exists()
