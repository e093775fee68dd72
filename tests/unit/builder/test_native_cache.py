"""The compiled C++ backends' cache (builder/native.py): a backend compiled before from the same preprocessed source,
compiler and flags is copied instead of compiled again; a change in any header it includes compiles it again; a
cache that cannot be written costs a compile, never the build."""

import os
import re
import stat
from pathlib import Path

import pytest

from tritonforge.builder import native

pytestmark = pytest.mark.skipif(native.compiler() is None,
                                reason="needs a C++ compiler (g++, c++ or $CXX) to compile a backend")


@pytest.fixture()
def compiles(tmp_path, monkeypatch) -> Path:
    """The compiler, through a wrapper that notes each compile that writes a library (`-o`); the cache in tmp_path."""
    log = tmp_path / "compiles.log"
    wrapper = tmp_path / "cxx"
    wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" -o "*) echo compile >> "{log}";; esac\n'
                       f'exec "{native.compiler()}" "$@"\n')
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CXX", str(wrapper))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    log.touch()
    return log


def a_backend(folder: Path, header_text: str) -> native.NativeBackend:
    """A backend of one source that includes a header beside it and one of the floor's."""
    folder.mkdir(exist_ok=True)
    (folder / "answer.h").write_text(header_text)
    source = folder / "answer.cc"
    source.write_text('#include "answer.h"\n#include "json.h"\nextern "C" int answer() { return ANSWER; }\n')
    return native.NativeBackend("tritonforge_answer", source, "--answer")


def test_the_same_backend_built_twice_is_compiled_once_and_copied_whole(compiles, tmp_path):
    libraries = []
    for target in ("one", "two"):
        (tmp_path / target).mkdir()
        libraries.append(native.compile_backend(native.POSTPROCESSING, tmp_path / target))
    assert compiles.read_text().split() == ["compile"]
    assert libraries[1].read_bytes() == libraries[0].read_bytes()
    kept = [path.name for path in native.native_cache_dir().iterdir()]  # whole files only: no partial one left
    assert len(kept) == 1 and re.fullmatch(rf"[0-9a-f]{{{native.KEY_DIGITS}}}-{native.POSTPROCESSING.library}",
                                           kept[0]), kept


def test_a_change_in_an_included_header_compiles_again(compiles, tmp_path):
    for target, value in (("one", 41), ("two", 41), ("three", 42)):
        (tmp_path / target).mkdir()
        native.compile_backend(a_backend(tmp_path / "source", f"#define ANSWER {value}\n"), tmp_path / target)
    assert compiles.read_text().split() == ["compile", "compile"]  # 41 once, 42 once
    assert len(list(native.native_cache_dir().iterdir())) == 2


def test_a_cache_that_cannot_be_written_costs_a_compile_not_the_build(compiles, tmp_path):
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "tritonforge").write_text("a file where the cache's folder would be")
    for target in ("one", "two"):
        (tmp_path / target).mkdir()
        library = native.compile_backend(a_backend(tmp_path / "source", "#define ANSWER 1\n"), tmp_path / target)
        assert library.is_file()
    assert compiles.read_text().split() == ["compile", "compile"]
    assert (tmp_path / "cache" / "tritonforge").read_text() == "a file where the cache's folder would be"


def test_a_source_that_does_not_compile_says_why_and_leaves_nothing_in_the_cache(compiles, tmp_path):
    backend = a_backend(tmp_path / "source", "#define ANSWER not a number\n")
    (tmp_path / "one").mkdir()
    with pytest.raises(RuntimeError, match="compiling answer.cc failed"):
        native.compile_backend(backend, tmp_path / "one")
    assert not native.native_cache_dir().exists() or not os.listdir(native.native_cache_dir())
