"""The build cache of `tritonforge serve CHECKPOINT`: a repository built from a checkpoint is kept in a folder named
by the key of what it was built from, found again by that key, and never found half-written.

The key covers what can change the repository:
- the checkpoint: each file at the top level of its folder (hidden ones aside; the build reads no subfolder,
  e.g. a release's `original/` weights in another format), by name and content, except a file larger than
  CONTENT_HASHED_BYTES (the weights), by name, size and modification time;
- every build option, the accuracy gate's included, but where the build reads and writes (`--model`,
  `--output`) and `--force`; an option that names a file or folder (the calibration dataset, the gate's prompts
  and reference checkpoint) by the contents of that file or of every file under that folder, under the same
  size rule, not by its path;
- the tritonforge release and the code that writes a repository or is copied or compiled into one;
- for an engine that serves only where it was built, what it depends on of this machine (its `machine_facts`).
So the same checkpoint copied elsewhere with its modification times (`cp -a`) finds the same repository; a fresh
download of the same weights builds again.

A build goes into a hidden sibling, `.<key>.building-<pid>-<random>`, that is renamed to `<key>` once complete;
a rename never replaces a folder that holds files. A folder named by its key is therefore whole, and only
such a folder holding a manifest is a hit: what a build killed outright leaves is never reused, and nothing
here deletes what another process made.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import secrets
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

from ..facts.environment import tritonforge_cache_dir
from ..facts.settings import setting
from .engines import engine_kind
from .lora import parse_spec
from .manifest import MANIFEST, options_record
from .options import BuildOptions
from .repository import SOURCE_ROOT

# Files up to this size are keyed by their content: a checkpoint's config, tokenizer and small files, read in
# milliseconds. Larger ones (weights: gigabytes, which take seconds to minutes to read on every start) by name,
# size and modification time, as make's and rsync's quick checks: a file rewritten in place changes its time.
CONTENT_HASHED_BYTES = 64 * 2**20
KEY_DIGITS = 32  # hex digits of the sha256 that name a repository: 128 bits
KEY_FORMAT = 1  # what the key covers; a change of it must never find a repository keyed the old way
PARTIAL_MARK = ".building-"  # in the name of a build's folder until it is complete: `.<key>.building-...`
# Build options that change where the build reads or writes, or whether it may replace files, not what it builds.
UNKEYED_OPTIONS = ("model", "output", "force")
# Build options that name a path, as text: keyed by what is there (a relative path names other files from elsewhere).
PATH_OPTIONS = ("calib_dataset",)
# The code a repository depends on: what writes it (builder/, facts/, and runtime/, whose tokenizer byte table
# and C++ sources go into it) and the model sources at the top of the project, copied into it.
BUILD_CODE = ("tritonforge/builder", "tritonforge/facts", "tritonforge/runtime")
READ_CHUNK_BYTES = 1 << 20


@dataclass(frozen=True, kw_only=True)
class CacheOptions:
    """Where `tritonforge serve CHECKPOINT` keeps the repositories it builds."""

    cache_dir: Path | None = setting(None, "where the repositories built from checkpoints are kept, one folder per "
                                           "checkpoint and build options (default: $XDG_CACHE_HOME/tritonforge/"
                                           "repositories, else ~/.cache/tritonforge/repositories)", parse=Path)


def default_cache_dir() -> Path:
    """$XDG_CACHE_HOME/tritonforge/repositories, else ~/.cache/tritonforge/repositories."""
    return tritonforge_cache_dir() / "repositories"


def file_sha256(path: Path) -> str:
    """The file's sha256, read in chunks."""
    sha = hashlib.sha256()
    with path.open("rb") as file:
        while chunk := file.read(READ_CHUNK_BYTES):
            sha.update(chunk)
    return sha.hexdigest()


def _file_record(path: Path, name: str) -> list:
    stat = path.stat()  # through a link: Hugging Face's cache links a snapshot's files to its blobs
    if stat.st_size <= CONTENT_HASHED_BYTES:
        return [name, stat.st_size, file_sha256(path)]
    return [name, stat.st_size, stat.st_mtime_ns]


def _visible(path: Path, top: Path) -> bool:
    return not any(part.startswith(".") for part in path.relative_to(top).parts)


def checkpoint_record(checkpoint: Path) -> list[list]:
    """What the key holds of a checkpoint folder: each file at its top level, hidden ones aside."""
    return [_file_record(path, path.name) for path in sorted(checkpoint.iterdir())
            if _visible(path, checkpoint) and path.is_file()]


def contents_record(path: Path) -> list[list] | None:
    """What the key holds of a file or folder an option names: the file, or each file under the folder (hidden
    ones aside); None where nothing is there (the build then says so)."""
    if path.is_file():
        return [_file_record(path, path.name)]
    if not path.is_dir():
        return None
    files = sorted(file for file in path.rglob("*") if _visible(file, path) and file.is_file())
    return [_file_record(file, str(file.relative_to(path))) for file in files]


@functools.cache
def code_digest() -> str:
    """The digest of the tritonforge code a repository depends on (BUILD_CODE and the model sources)."""
    files = [file for folder in BUILD_CODE for file in (SOURCE_ROOT / folder).rglob("*")
             if file.is_file() and "__pycache__" not in file.parts]
    files += SOURCE_ROOT.glob("*/1/model.py")
    sha = hashlib.sha256()
    for file in sorted(files):
        sha.update(f"{file.relative_to(SOURCE_ROOT)}\0{file_sha256(file)}\0".encode())
    return sha.hexdigest()


def _release() -> str:
    try:
        return version("tritonforge")
    except PackageNotFoundError:
        return "unknown"


def settings_record(settings, *, unkeyed: tuple[str, ...] = (), paths: tuple[str, ...] = ()) -> dict:
    """A dataclass of options as the key holds it: every field but the `unkeyed` ones, a path (a Path, or a field
    named in `paths`) by the contents of what it names."""
    record = options_record(settings)
    for name in unkeyed:
        record.pop(name)
    for name in record:
        value = getattr(settings, name)
        if value is not None and (isinstance(value, Path) or name in paths):
            record[name] = {"contents": contents_record(Path(value))}
    return record


def cache_key(options: BuildOptions, *, extra: tuple = ()) -> str:
    """The key of the repository `options` build: the same for the same checkpoint files, build options,
    tritonforge and machine facts, another when any of them changes (the module's docstring says what each
    covers). `extra`: further option dataclasses the repository depends on (the accuracy gate's)."""
    described = {
        "format": KEY_FORMAT,
        "tritonforge": _release(),
        "code": code_digest(),
        "checkpoint": checkpoint_record(options.model),
        "options": settings_record(options, unkeyed=UNKEYED_OPTIONS, paths=PATH_OPTIONS),
        # Each LoRA adapter by its name and the contents of its folder (a retrained adapter builds anew).
        "lora": [[name, contents_record(folder)] for name, folder in map(parse_spec, options.lora)],
        "extra": {type(settings).__name__: settings_record(settings) for settings in extra},
        "machine": engine_kind(options.engine).machine_facts(),
    }
    text = json.dumps(described, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:KEY_DIGITS]


class CacheEntryInvalid(FileExistsError):
    """A folder sits where a key's repository goes, and it is none that a complete build renamed there."""


@dataclass(frozen=True)
class BuildCache:
    """A folder of repositories, each in a folder named by its key."""

    root: Path

    def __post_init__(self):
        if self.root.exists() and not self.root.is_dir():
            raise NotADirectoryError(f"--cache-dir {self.root} is not a folder")

    def entry(self, key: str) -> Path:
        return self.root / key

    def find(self, key: str) -> Path | None:
        """The repository complete under `key`, or None; refuses a folder there that no build completed."""
        entry = self.entry(key)
        if (entry / MANIFEST).is_file():
            return entry
        if entry.exists() or entry.is_symlink():
            raise CacheEntryInvalid(f"{entry} holds no repository a complete build left there (no {MANIFEST}): "
                                    f"remove it, or pass another --cache-dir")
        return None

    def build(self, key: str, write: Callable[[Path], object]) -> tuple[Path, bool]:
        """Build the repository of `key` with `write(folder)` into a folder of this build's own, then rename that
        into place; whatever fails or interrupts it first removes that folder. Returns the repository and whether
        this build put it there (False: another finished first; this one's folder is removed, theirs kept)."""
        self.root.mkdir(parents=True, exist_ok=True)
        partial = self.root / f".{key}{PARTIAL_MARK}{os.getpid()}-{secrets.token_hex(4)}"
        partial.mkdir()  # a new name: fails rather than write into another's; the umask's permissions, unlike mkdtemp
        try:
            write(partial)
        except BaseException:
            shutil.rmtree(partial, ignore_errors=True)
            raise
        try:
            partial.rename(self.entry(key))  # atomic; refused where a folder that holds files already is
        except OSError as error:
            shutil.rmtree(partial, ignore_errors=True)
            if error.errno in (errno.EEXIST, errno.ENOTEMPTY) and self.find(key) is not None:
                return self.entry(key), False
            raise
        return self.entry(key), True

