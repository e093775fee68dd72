#!/usr/bin/env python3
"""Build a ready-to-mount Triton model repository from a Hugging Face checkpoint.

The same as `tritonforge build`; see `.venv/bin/python build_engine.py --help`.
"""

import sys

try:
    from tritonforge.cli import main
except ImportError as error:  # run with a Python that lacks tritonforge's packages (the system's)
    sys.exit(f"error: this Python ({sys.executable}) cannot import tritonforge's packages ({error.name or error}): "
             f"run `bash scripts/bootstrap.sh` once, then `.venv/bin/python build_engine.py ...` "
             f"(or `.venv/bin/tritonforge build ...`)")

if __name__ == "__main__":
    sys.exit(main(["build", *sys.argv[1:]]))
