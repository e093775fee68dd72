# tritonforge on NVIDIA's Triton + TensorRT-LLM image. The pinned pair is named in tritonforge/facts/release.py
# (TRITON_IMAGE, TRTLLM_VERSION); keep this tag equal to it.
#   docker build -t tritonforge .
#   build: docker run --rm --gpus all -v /path/to/hf-checkpoint:/checkpoint:ro -v "$PWD/model_repository:/models" \
#            tritonforge build --model /checkpoint --output /models --engine tensorrtllm --force
#   serve: docker run --rm --gpus all --shm-size=2g -p 8000:8000 -p 8001:8001 -v "$PWD/model_repository:/models" \
#            tritonforge serve /models --address 0.0.0.0
FROM nvcr.io/nvidia/tritonserver:26.07-trtllm-python-py3

WORKDIR /opt/tritonforge
COPY pyproject.toml README.md build_engine.py ./
COPY tritonforge ./tritonforge
COPY preprocessing ./preprocessing
COPY postprocessing ./postprocessing
COPY tensorrt_llm_transformers ./tensorrt_llm_transformers
COPY tensorrt_llm_pytorch ./tensorrt_llm_pytorch
COPY tensorrt_llm_bls ./tensorrt_llm_bls
# Editable, so that the model sources beside the package are found by the build. The image's own torch,
# transformers and TensorRT-LLM stay as they are: no dependency is upgraded.
COPY scripts/ensure_trtllm_examples.py ./scripts/
RUN python3 -m pip install --no-cache-dir --no-deps -e . \
    && python3 -m pip install --no-cache-dir "tritonclient[grpc,http]" \
    && python3 -m pip install --no-cache-dir "fastapi>=0.110" "uvicorn>=0.30,<1" uvloop httptools prometheus_client \
    && python3 -c "import tritonforge.cli"
# The build runs TensorRT-LLM's convert_checkpoint.py / quantize.py from EXAMPLES_DIR in
# tritonforge/builder/trtllm.py (/app/examples, where NVIDIA's image recipe copies them): make sure they are
# there, at the pinned release, whatever the image ships.
RUN python3 scripts/ensure_trtllm_examples.py

ENTRYPOINT ["tritonforge"]
CMD ["--help"]
