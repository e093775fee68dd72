"""The TensorRT-LLM build: the pinned release, its exact commands, and the engine pinning guard.

Flow (TensorRT-LLM's documented two-step engine flow, run as subprocesses with argument lists):
1. checkpoint → TensorRT-LLM checkpoint: `convert_checkpoint.py` for full precision and weight-only INT8/INT4;
   ModelOpt's `quantize.py` for the calibrated formats (FP8, INT8 SmoothQuant, INT4 AWQ), calibrated on a local
   dataset folder (`--calib-dataset`): the scripts' default downloads one from the hub, which an offline
   build cannot;
2. `trtllm-build` → `rank{r}.engine` + `config.json`.
The LLM API would build the same engine, but the Triton `tensorrtllm` backend serves an engine directory,
and the two explicit steps are where users need control (parallelism, quantization, max shapes); each is
also rerunnable alone from the printed commands.

An engine only runs on the GPU architecture and TensorRT / TensorRT-LLM versions it was built with.
`engine_info.json` records them beside the engine; `check_engine` compares it with the running machine and
says what differs, instead of TensorRT's deserialization error at load.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ..facts.release import TOKENS_PER_BLOCK, TRITON_IMAGE, TRTLLM_VERSION

# The `-trtllm-python-py3` containers from 25.12 (the previous pin) to the pin: (Triton, TensorRT-LLM).
# TensorRT-LLM per container: Triton's compatibility matrix
# (triton-inference-server/server/docs/introduction/compatibility.md @0f963c9a; it lists no trtllm container
# after 26.07). Triton per container: 25.12 = 2.64 as the previous pin recorded, 26.01 = 2.65 ... 26.06 = 2.70
# from the server's TRITON_VERSION file on each rYY.MM branch (triton-inference-server/server); 26.07 = 2.71
# follows the monthly step and was not read anywhere.
CONTAINERS = {
    (25, 12): ((2, 64), "1.1.0"), (26, 1): ((2, 65), "1.1.0"), (26, 2): ((2, 66), "1.1.0"),
    (26, 3): ((2, 67), "1.2.0"), (26, 4): ((2, 68), "1.2.1"), (26, 5): ((2, 69), "1.2.1"),
    (26, 6): ((2, 70), "1.2.1"), (26, 7): ((2, 71), "1.2.1"),
}
TRITON_VERSION = CONTAINERS[(26, 7)][0]  # Triton in TRITON_IMAGE
EXECUTOR_WORKER_PATH = "/opt/tritonserver/backends/tensorrtllm/trtllmExecutorWorker"
# Every `parameters` key of NVIDIA's tensorrt_llm/config.pbtxt template, in its order, as stored at
# NVIDIA/TensorRT-LLM triton_backend/all_models/inflight_batcher_llm/tensorrt_llm/config.pbtxt @2a9abd95 (the
# 1.2 line; the tag v1.2.1 itself could not be resolved here). The 1.1.0 list had `enable_trt_overlap` too:
# that template comments it out ("deprecated", no effect on the runtime), and the backend reads it inside
# try/default, so a config without it loads on every container from 25.12 on.
# The backend reads most keys inside try/default; `gpt_model_type`, `gpt_model_path`, `tokenizer_dir`,
# `xgrammar_tokenizer_info_path` and `guided_decoding_backend` it reads with no default
# (ModelInstanceState::getGuidedDecodingConfigFromParams and the executor config in
# inflight_batcher_llm/src/model_instance_state.cc, the same in both stored 1.x versions): a config without
# them fails to load.
BACKEND_PARAMETER_KEYS = (
    "max_beam_width", "FORCE_CPU_ONLY_INPUT_TENSORS", "gpt_model_type", "gpt_model_path", "encoder_model_path",
    "max_tokens_in_paged_kv_cache", "max_attention_window_size", "sink_token_length", "batch_scheduler_policy",
    "kv_cache_free_gpu_mem_fraction", "cross_kv_cache_fraction", "kv_cache_host_memory_bytes",
    "kv_cache_onboard_blocks", "exclude_input_in_output", "cancellation_check_period_ms",
    "stats_check_period_ms", "iter_stats_max_iterations", "request_stats_max_iterations", "enable_kv_cache_reuse",
    "normalize_log_probs", "enable_chunked_context", "gpu_device_ids", "participant_ids", "num_nodes",
    "lora_cache_optimal_adapter_size", "lora_cache_max_adapter_size", "lora_cache_gpu_memory_fraction",
    "lora_cache_host_memory_bytes", "lora_prefetch_dir", "decoding_mode", "executor_worker_path",
    "lookahead_window_size", "lookahead_ngram_size", "lookahead_verification_set_size", "medusa_choices",
    "eagle_choices", "gpu_weights_percent", "enable_context_fmha_fp32_acc", "multi_block_mode", "cuda_graph_mode",
    "cuda_graph_cache_size", "speculative_decoding_fast_logits", "tokenizer_dir", "guided_decoding_backend",
    "xgrammar_tokenizer_info_path",
)
# TensorRT-LLM's example scripts (convert_checkpoint.py, quantize.py) in the image: the recipe of the
# `-trtllm-python-py3` images (triton-inference-server/tensorrtllm_backend
# dockerfile/Dockerfile.triton.trt_llm_backend @0b9d7d5, TENSORRTLLM_VER=1.2.1, and likewise since 1.0.0)
# copies the release's examples/ to /app/examples. The Dockerfile makes sure they are there
# (scripts/ensure_trtllm_examples.py); --examples-dir points elsewhere.
EXAMPLES_DIR = "/app/examples"
# The printed commands run in the image, so they name its Python, not the one planning the build.
PYTHON = "python3"

QUANTIZATIONS = ("none", "fp8", "int8_sq", "int4_awq", "int8_wo", "int4_wo")
# What the LLM API (the PyTorch workflow) takes: `LLM(dtype=...)` and `KvCacheConfig(dtype=...)`.
LLMAPI_DTYPES = ("auto", "float16", "bfloat16", "float32")
LLMAPI_KV_CACHE_DTYPES = ("auto", "fp8")
CALIBRATED = ("fp8", "int8_sq", "int4_awq")  # quantize.py runs the model over a calibration set
KV_CACHE_DTYPES = ("auto", "fp8", "int8")
BATCH_SCHEDULER_POLICIES = ("guaranteed_no_evict", "max_utilization")
# Bytes per weight of the quantized linear layers; embeddings and lm_head stay in the model dtype.
WEIGHT_BYTES = {"none": None, "fp8": 1.0, "int8_sq": 1.0, "int8_wo": 1.0, "int4_awq": 0.5, "int4_wo": 0.5}
DTYPE_BYTES = {"float16": 2, "bfloat16": 2, "float32": 4}


class TensorRTLLMMissing(RuntimeError):
    pass


# Guided decoding in the tensorrtllm backend (`guided_decoding_backend` "xgrammar"): the C++ backend reads no
# tokenizer, but a JSON file of it at `xgrammar_tokenizer_info_path`, with three keys
# (ModelInstanceState::getGuidedDecodingConfigFromParams in inflight_batcher_llm/src/model_instance_state.cc,
# as stored for the 1.x line): `encoded_vocab` (each token id's token as the tokenizer's vocabulary spells it),
# `tokenizer_str` (the fast tokenizer's JSON, from which xgrammar tells how the vocabulary encodes bytes) and
# `stop_token_ids`. NVIDIA ships a script that writes it; the build writes it itself, beside the engine.
GUIDED_DECODING_BACKEND = "xgrammar"
XGRAMMAR_TOKENIZER_INFO = "xgrammar_tokenizer_info.json"


def xgrammar_tokenizer_info(tokenizer) -> dict | None:
    """The file's content for a Hugging Face tokenizer; None for one without a fast backend, whose vocabulary
    xgrammar could not decode from the file."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    vocab = tokenizer.get_vocab()
    encoded = [""] * (max(vocab.values()) + 1)  # index = id; an id with no token stays "", never allowed
    for token, token_id in vocab.items():
        encoded[token_id] = token
    stop = [] if tokenizer.eos_token_id is None else [int(tokenizer.eos_token_id)]
    return {"encoded_vocab": encoded, "tokenizer_str": backend.to_str(), "stop_token_ids": stop}


def parse_target_triton(text: str) -> tuple[int, int]:
    """`--target-triton`: a Triton version ("2.71") or a `-trtllm-python-py3` container ("26.07")."""
    import argparse

    try:
        major, minor = (int(part) for part in text.split(".")[:2])
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a Triton version like 2.71 or a container like 26.07, got "
                                         f"{text!r}") from None
    if major < 20:
        return major, minor
    if (major, minor) not in CONTAINERS:
        known = ", ".join(f"{y}.{m:02d}" for y, m in CONTAINERS)
        raise argparse.ArgumentTypeError(f"container {text} is not one of the -trtllm-python-py3 containers "
                                         f"known here ({known}); give its Triton version instead")
    return CONTAINERS[(major, minor)][0]


def container_of(triton: tuple[int, int]) -> tuple[str, str] | None:
    """The container tag and TensorRT-LLM release of a Triton version, when it is one of CONTAINERS."""
    for (year, month), (version, release) in CONTAINERS.items():
        if version == triton:
            return f"{year}.{month:02d}", release
    return None


def require_trtllm() -> None:
    spec = importlib.util.find_spec("tensorrt_llm")
    if spec is None or spec.origin is None:  # None origin: a bare folder of that name, not the package
        raise TensorRTLLMMissing(
            f"TensorRT-LLM is not installed here. Build the engine inside {TRITON_IMAGE} (TensorRT-LLM "
            f"{TRTLLM_VERSION}), e.g. with the Dockerfile's build command; --dry-run plans and prints the "
            f"commands without it.")


@dataclass(frozen=True, kw_only=True)
class TrtBuildSpec:
    """One engine build: the paths, and the settings of `BuildOptions` that reach TensorRT-LLM's commands
    (validated there; `engines.tensorrtllm.build_spec` makes this)."""

    checkpoint: Path
    work_dir: Path  # converted TensorRT-LLM checkpoint goes here
    engine_dir: Path
    architecture: str
    dtype: str  # float16 | bfloat16, resolved from the checkpoint when the build says auto
    tp_size: int
    pp_size: int
    quantization: str
    kv_cache_dtype: str
    max_batch_size: int
    max_input_len: int
    max_seq_len: int
    max_num_tokens: int
    examples_dir: str
    calib_dataset: str | None
    use_paged_context_fmha: bool = True  # needed by KV-cache reuse and chunked context
    # --lora (builder/trtllm_lora.py): TensorRT-LLM's modules the LoRA plugin adapts (none: no plugin), largest rank.
    lora_target_modules: tuple[str, ...] = ()
    max_lora_rank: int = 0

    @property
    def workers(self) -> int:
        return self.world_size

    @property
    def world_size(self) -> int:
        return self.tp_size * self.pp_size

    @property
    def converted(self) -> Path:
        return self.work_dir / "trtllm_checkpoint"


def _family_dir(architecture: str) -> str:
    if architecture in ("LlamaForCausalLM", "MistralForCausalLM", "MixtralForCausalLM"):
        return "llama"
    if architecture.startswith("Qwen"):
        return "qwen"
    raise ValueError(f"no TensorRT-LLM converter wired for {architecture}; supported: Llama, Mistral, Mixtral, "
                     f"Qwen")


def quantize_script(spec: TrtBuildSpec) -> str:
    return f"{spec.examples_dir}/quantization/quantize.py"


def converter_script(spec: TrtBuildSpec) -> str:
    return f"{spec.examples_dir}/models/core/{_family_dir(spec.architecture)}/convert_checkpoint.py"


def check_inputs(spec: TrtBuildSpec) -> None:
    """Before a build starts: the example script and the calibration set exist, with what to do if not."""
    script = quantize_script(spec) if spec.quantization in CALIBRATED else converter_script(spec)
    if not Path(script).is_file():
        raise FileNotFoundError(
            f"{script} does not exist: TensorRT-LLM {TRTLLM_VERSION}'s examples are not at --examples-dir "
            f"{spec.examples_dir}. Build in the project's image (its Dockerfile installs them there) or pass "
            f"--examples-dir to a checkout of TensorRT-LLM v{TRTLLM_VERSION}'s examples/ folder")
    if spec.quantization in CALIBRATED and not Path(spec.calib_dataset).is_dir():
        raise FileNotFoundError(f"--calib-dataset {spec.calib_dataset} is not a folder")


# Every flag the two steps print, checked in NVIDIA/TensorRT-LLM's 1.x sources as stored (the tag v1.2.1 itself
# could not be resolved here; each is also in the 1.1.0 release the previous pin was checked against):
# - examples/quantization/quantize.py @c8c6df08: --model_dir, --output_dir, --dtype {auto,float16,bfloat16,
#   float32}, --qformat (fp8, int8_sq, int4_awq among its choices), --calib_dataset (a hub name or a local
#   directory), --tp_size, --pp_size, --kv_cache_dtype {int8,fp8};
# - examples/models/core/llama/convert_checkpoint.py @fd96a08b (qwen's takes the same): --model_dir,
#   --output_dir, --dtype, --tp_size, --pp_size, --workers, --use_weight_only, --weight_only_precision
#   {int8,int4,...}, --fp8_kv_cache, --int8_kv_cache;
# - tensorrt_llm/commands/build.py @65f1d153: --checkpoint_dir, --output_dir, --max_batch_size, --max_input_len,
#   --max_seq_len, --max_num_tokens, --kv_cache_type {continuous,paged,disabled} (--paged_kv_cache deprecated),
#   --workers; tensorrt_llm/plugin/plugin.py @c20322ff:
#   --remove_input_padding, --context_fmha, --use_paged_context_fmha {enable,disable}, --gpt_attention_plugin
#   auto, --gemm_plugin {auto,fp8,...}, --tokens_per_block (32), --lora_plugin {auto,float16,...,disable}; and
#   build.py's "LoRA arguments": --max_lora_rank (int, default 64), --lora_target_modules (nargs "+", choices
#   LoraManager.LORA_MODULE_IDS), with which the plugin builds without --lora_dir.
def convert_command(spec: TrtBuildSpec) -> list[str]:
    """Step 1: HF checkpoint → TensorRT-LLM checkpoint (parallelism and quantization are fixed here)."""
    parallel = ["--tp_size", str(spec.tp_size), "--pp_size", str(spec.pp_size)]
    if spec.quantization in CALIBRATED:
        command = [PYTHON, quantize_script(spec), "--model_dir", str(spec.checkpoint),
                   "--output_dir", str(spec.converted), "--dtype", spec.dtype, "--qformat", spec.quantization,
                   "--calib_dataset", str(spec.calib_dataset), *parallel]
        if spec.kv_cache_dtype != "auto":
            command += ["--kv_cache_dtype", spec.kv_cache_dtype]
        return command
    command = [PYTHON, converter_script(spec), "--model_dir", str(spec.checkpoint),
               "--output_dir", str(spec.converted), "--dtype", spec.dtype, *parallel, "--workers", str(spec.workers)]
    if spec.quantization in ("int8_wo", "int4_wo"):
        command += ["--use_weight_only", "--weight_only_precision", spec.quantization.split("_")[0]]
    if spec.kv_cache_dtype == "fp8":
        command.append("--fp8_kv_cache")
    elif spec.kv_cache_dtype == "int8":
        command.append("--int8_kv_cache")
    return command


def build_command(spec: TrtBuildSpec) -> list[str]:
    """Step 2: `trtllm-build` with a paged KV cache and the max shapes that become hard request limits."""
    command = ["trtllm-build", "--checkpoint_dir", str(spec.converted), "--output_dir", str(spec.engine_dir),
               "--max_batch_size", str(spec.max_batch_size), "--max_input_len", str(spec.max_input_len),
               "--max_seq_len", str(spec.max_seq_len), "--max_num_tokens", str(spec.max_num_tokens),
               "--kv_cache_type", "paged", "--remove_input_padding", "enable", "--context_fmha", "enable",
               "--use_paged_context_fmha", "enable" if spec.use_paged_context_fmha else "disable",
               "--gpt_attention_plugin", "auto", "--gemm_plugin", "fp8" if spec.quantization == "fp8" else "auto",
               "--tokens_per_block", str(TOKENS_PER_BLOCK), "--workers", str(spec.workers)]
    if spec.lora_target_modules:
        command += ["--lora_plugin", "auto", "--max_lora_rank", str(spec.max_lora_rank),
                    "--lora_target_modules", *spec.lora_target_modules]
    return command


def run_build(spec: TrtBuildSpec, log_path: Path, progress=print) -> list[list[str]]:
    """Run both steps, each logged to log_path; raise with the log's tail when one fails."""
    require_trtllm()
    check_inputs(spec)
    commands = [convert_command(spec), build_command(spec)]
    spec.work_dir.mkdir(parents=True, exist_ok=True)
    with open(log_path, "a") as log:
        for step, command in zip(("convert", "build"), commands):
            progress(f"[{step}] {' '.join(command)}  (log: {log_path})")
            log.write(f"$ {' '.join(command)}\n")
            log.flush()
            result = subprocess.run(command, stdout=log, stderr=subprocess.STDOUT, check=False)
            if result.returncode != 0:
                tail = "\n".join(log_path.read_text(errors="replace").splitlines()[-20:])
                raise RuntimeError(f"{step} step failed with exit code {result.returncode}:\n{tail}")
    return commands


# ---- engine pinning guard ----------------------------------------------------------------------------------

ENGINE_INFO = "engine_info.json"
PINNED_KEYS = ("tensorrt_llm_version", "tensorrt_version", "gpu_name", "compute_capability")


def _installed_version(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def _gpu_query(fields: str) -> list[str] | None:
    """The first GPU's fields from nvidia-smi: no CUDA context is created in this process (the server owns
    the GPUs; importing torch or TensorRT-LLM here would hold a context on GPU 0 for the server's life)."""
    if shutil.which("nvidia-smi") is None:
        return None
    result = subprocess.run(["nvidia-smi", f"--query-gpu={fields}", "--format=csv,noheader,nounits", "-i", "0"],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0 or not result.stdout.strip():
        return None
    return [field.strip() for field in result.stdout.splitlines()[0].split(",")]


def gpu_memory_gib() -> float | None:
    fields = _gpu_query("memory.total")  # MiB
    return float(fields[0]) / 1024 if fields else None


def visible_gpus() -> int | None:
    """How many GPUs a server started from here sees: nvidia-smi's, as many as CUDA_VISIBLE_DEVICES lists where it
    is set; None where nvidia-smi is absent or finds none (no CUDA context is made, as for `_gpu_query`)."""
    if shutil.which("nvidia-smi") is None:
        return None
    result = subprocess.run(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"], capture_output=True,
                            text=True, check=False)
    count = len(result.stdout.split()) if result.returncode == 0 else 0
    if not count:
        return None
    listed = os.environ.get("CUDA_VISIBLE_DEVICES")
    return count if listed is None else min(count, len([device for device in listed.split(",") if device.strip()]))


def runtime_facts() -> dict[str, str]:
    """The versions and GPU of this machine, read from package metadata and nvidia-smi (nothing imported)."""
    facts: dict[str, str] = {}
    # TensorRT's wheel is named for its CUDA major in some images; the first found names the version.
    for key, distributions in (("tensorrt_llm_version", ("tensorrt_llm",)),
                               ("tensorrt_version", ("tensorrt", "tensorrt_cu13", "tensorrt_cu12"))):
        version = next(filter(None, map(_installed_version, distributions)), None)
        if version:
            facts[key] = version
    gpu = _gpu_query("name,compute_cap")
    if gpu:
        facts["gpu_name"], facts["compute_capability"] = gpu
    return facts


def write_engine_info(spec: TrtBuildSpec, commands: list[list[str]], facts: dict[str, str]) -> Path:
    info = {**facts, "tp_size": spec.tp_size, "pp_size": spec.pp_size, "dtype": spec.dtype,
            "quantization": spec.quantization, "kv_cache_dtype": spec.kv_cache_dtype,
            "max_batch_size": spec.max_batch_size, "max_input_len": spec.max_input_len,
            "max_seq_len": spec.max_seq_len, "max_num_tokens": spec.max_num_tokens,
            "commands": commands}
    path = spec.engine_dir / ENGINE_INFO
    path.write_text(json.dumps(info, indent=2) + "\n")
    return path


class EngineMismatch(RuntimeError):
    pass


def check_engine(engine_dir: Path, facts: dict[str, str], world_size: int | None = None) -> None:
    """Fail with what differs between the engine's build machine and this one, before TensorRT does."""
    path = Path(engine_dir) / ENGINE_INFO
    if not path.is_file():
        raise EngineMismatch(f"{path} is missing: the engine was not built by tritonforge; rebuild it or check "
                             f"its versions by hand")
    info = json.loads(path.read_text())
    differences = [f"{key}: engine built with {info.get(key)!r}, this machine has {facts.get(key)!r}"
                   for key in PINNED_KEYS if key in info and info.get(key) != facts.get(key)]
    if world_size is not None and info.get("tp_size", 1) * info.get("pp_size", 1) != world_size:
        differences.append(f"world size: engine built for tp*pp = {info['tp_size'] * info['pp_size']}, "
                           f"serving with {world_size}")
    if differences:
        raise EngineMismatch("the TensorRT-LLM engine does not match this machine; rebuild it here "
                             "(python build_engine.py --engine tensorrtllm ...):\n  " + "\n  ".join(differences))
