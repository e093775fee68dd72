"""Checkpoint → ready-to-mount repository: the build options (options.py) and steps (build.py, a module per
engine kind in engines/), the memory plan, the TensorRT-LLM commands, the typed model configs, the repository's
assembly and the compiling of the C++ backends whose sources lie in runtime/ (native.py)."""
