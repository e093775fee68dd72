"""Put TensorRT-LLM's examples/ folder (the pinned release) where the build looks for it, if it is not there.

Run once while the image is built (see the Dockerfile): NVIDIA's Triton image ships the TensorRT-LLM wheel, and
whether it also ships the example scripts (convert_checkpoint.py, quantize.py) is not something the build
should rely on. Downloads the release's source archive from GitHub and extracts only examples/.
"""

from __future__ import annotations

import sys
import tarfile
import tempfile
import urllib.request
from pathlib import Path

from tritonforge.builder.trtllm import EXAMPLES_DIR
from tritonforge.facts.release import TRTLLM_VERSION

ARCHIVE = f"https://github.com/NVIDIA/TensorRT-LLM/archive/refs/tags/v{TRTLLM_VERSION}.tar.gz"
REQUIRED = ("quantization/quantize.py", "models/core/llama/convert_checkpoint.py",
            "models/core/qwen/convert_checkpoint.py")


def main() -> int:
    target = Path(EXAMPLES_DIR)
    if all((target / script).is_file() for script in REQUIRED):
        print(f"TensorRT-LLM examples present in {target}")
        return 0
    if target.exists() and any(target.iterdir()):
        print(f"{target} exists but lacks {REQUIRED}; not touching it", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory() as scratch:
        archive = Path(scratch) / "trtllm.tar.gz"
        print(f"downloading {ARCHIVE}")
        urllib.request.urlretrieve(ARCHIVE, archive)
        prefix = f"TensorRT-LLM-{TRTLLM_VERSION}/examples/"
        with tarfile.open(archive) as tar:
            members = [member for member in tar.getmembers() if member.name.startswith(prefix)]
            for member in members:
                member.name = member.name[len(prefix):]
            target.mkdir(parents=True, exist_ok=True)
            tar.extractall(target, members=[m for m in members if m.name], filter="data")
    missing = [script for script in REQUIRED if not (target / script).is_file()]
    if missing:
        print(f"the v{TRTLLM_VERSION} archive lacks {missing}", file=sys.stderr)
        return 1
    print(f"TensorRT-LLM {TRTLLM_VERSION} examples extracted to {target}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
