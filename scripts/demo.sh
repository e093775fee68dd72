#!/usr/bin/env bash
# The main job on the embedded default: build a tiny model and its repository, serve it with tritonserver,
# answer a prompt over gRPC and HTTP (generate and generate_stream).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/bootstrap.sh
exec .venv/bin/tritonforge demo "$@"
