"""Checkpoint → ready-to-mount repository: the build options and steps (builder.py), the memory plan, the
TensorRT-LLM commands, the typed model configs, the repository's assembly, the tuning of its serving settings
and the replay engine's C++ backend (native/)."""
