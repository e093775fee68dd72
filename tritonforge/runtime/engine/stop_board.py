"""Stops that reach the instance running their request, where the engine model runs several instances.

Triton hands a request with `stop` (the BLS's stop phrases and cancels, NVIDIA's streaming clients) to any
instance of the engine model, not to the one running the request it names; the tensorrtllm backend runs as one
instance, so its stops always land. With one engine instance per GPU, each instance posts every stop it takes on
a board that the instances of the model share: a folder of empty files, one a stop, named by the digest of the
request id and the time of the stop. Each instance reads the folder at most once per check period (the
cancellation check's, 100 ms) and stops its rows whose request id is posted after the row arrived, so a request
id used again later is not stopped by an old stop. Stops older than `KEPT_S` are removed by the next post.

The folder is under the temporary folder, which `tritonforge serve` points into the server's work folder
(removed when the server stops); it is keyed by the model's directory, as the replay engine's shared batch is.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import time
from pathlib import Path

KEPT_S = 60.0  # a stop no instance took by then names a request that had ended or never came


def _digest(request_id: str) -> str:
    return hashlib.sha256(request_id.encode()).hexdigest()[:32]  # any characters a request id holds: a file name


class StopBoard:
    """`post` from the thread that takes a stop request; `stopped` from the engine's thread (a row's sink)."""

    def __init__(self, folder: str | Path, period_s: float):
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self.period_s = period_s
        self._posted: dict[str, int] = {}  # digest → the latest time it was posted (ns)
        self._read_at = float("-inf")

    @classmethod
    def for_model(cls, model_directory: str, period_s: float) -> StopBoard:
        """The board of the model served from `model_directory`, shared by its instances."""
        key = hashlib.sha256(os.path.realpath(model_directory).encode()).hexdigest()[:16]
        return cls(Path(tempfile.gettempdir()) / f"tritonforge-stops-{key}", period_s)

    def post(self, request_id: str) -> None:
        now = time.time_ns()
        (self.folder / f"{_digest(request_id)}.{now}").touch()
        for name, posted in self._entries():
            if now - posted > KEPT_S * 1e9:
                (self.folder / name).unlink(missing_ok=True)  # another instance may have removed it first

    def stopped(self, request_id: str, since_ns: int) -> bool:
        """Whether a stop for `request_id` was posted at or after `since_ns` (time.time_ns), as of the last
        reading of the board, which is at most one period old."""
        if time.monotonic() - self._read_at >= self.period_s:
            posted: dict[str, int] = {}
            for name, at in self._entries():
                digest = name.partition(".")[0]
                posted[digest] = max(at, posted.get(digest, 0))
            self._posted, self._read_at = posted, time.monotonic()
        return self._posted.get(_digest(request_id), -1) >= since_ns

    def _entries(self) -> list[tuple[str, int]]:
        entries = []
        try:
            names = os.listdir(self.folder)
        except FileNotFoundError:  # removed with the server's work folder while stopping
            return entries
        for name in names:
            digest, _, at = name.partition(".")
            if digest and at.isdigit():
                entries.append((name, int(at)))
        return entries
