"""The limits of a build's engine: the one type that the build, preprocessing, the BLS and the engines check."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class EngineLimits:
    """Prompts of at most `max_input_len` tokens, prompt plus generated tokens at most `max_seq_len`, at most
    `max_batch_size` sequences running at once and `max_queue_size` waiting (0: unbounded).

    The build writes them into each model's parameters. Preprocessing and the BLS check a prompt and its
    `max_tokens` before the engine sees them; they leave the engine's capacity (`max_batch_size`) unset.
    """

    max_input_len: int
    max_seq_len: int
    max_batch_size: int | None = None
    max_queue_size: int = 0

    def __post_init__(self):
        if self.max_input_len < 1 or self.max_seq_len <= self.max_input_len:
            raise ValueError(f"max_seq_len ({self.max_seq_len}) must exceed max_input_len ({self.max_input_len}), "
                             f"which must be >= 1")
        if self.max_batch_size is not None and self.max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {self.max_batch_size}")
        if self.max_queue_size < 0:
            raise ValueError(f"max_queue_size must be >= 0, got {self.max_queue_size}")

    @property
    def max_output_len(self) -> int:
        """The most tokens one request may ask for: at least one prompt token leaves max_seq_len - 1."""
        return self.max_seq_len - 1
