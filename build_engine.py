#!/usr/bin/env python3
"""Build a ready-to-mount Triton model repository from a Hugging Face checkpoint.

The same as `tritonforge build`; see `python build_engine.py --help`.
"""

import sys

from tritonforge.cli import main

if __name__ == "__main__":
    sys.exit(main(["build", *sys.argv[1:]]))
