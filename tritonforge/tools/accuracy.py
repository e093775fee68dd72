"""`tritonforge eval`: does the served engine answer like the Hugging Face checkpoint it came from?

An engine built at reduced precision (FP8, INT8 SmoothQuant, INT4 AWQ, an FP8/INT8 KV cache) changes the
model's numerics; this is the check to run before such an engine ships, and `build --accuracy-gate` runs it
after a build. It compares the served `tensorrt_llm` model (any engine; the ensemble and the BLS put the
same engine behind the same tokenizer) with the checkpoint run by transformers, on a prompt set:

- greedy agreement: share of prompts whose first N generated tokens equal the reference's exactly, and the
  mean position of the first divergence (N where none);
- log-prob agreement: the served engine's `output_log_probs` for its own tokens against the reference
  model's log-probs of the same tokens (teacher-forced): mean absolute difference, and the share of tokens
  whose difference exceeds `logprob_tolerance`;
- optionally, task accuracy on a multiple-choice JSONL (question, choices, answer): both sides answer by the
  letter they generate greedily after the lettered choices, side by side.

The prompts are tokenized by the repository's own tokenizer, exactly as its preprocessing does.
"""

from __future__ import annotations

import json
import math
import string
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from ..clients.client import (
    RESPONSE_TIMEOUT_S,
    STOP_TIMEOUT_S,
    GenerationError,
    ResponseTimeout,
    check_serving,
    grpc_tensors,
    is_final,
    stream_error,
)
from ..facts.contract import (
    END_ID,
    ENGINE_MODEL,
    INPUT_IDS,
    INPUT_LENGTHS,
    MIN_TOKENS,
    OUTPUT_IDS,
    OUTPUT_LOG_PROBS,
    REQUEST_OUTPUT_LEN,
    RETURN_LOG_PROBS,
    RUNTIME_TOP_K,
    SEQUENCE_LENGTH,
    STREAMING,
)
from ..facts.settings import setting

DEFAULT_PROMPTS = Path(__file__).resolve().parent / "data" / "accuracy_prompts.jsonl"


@dataclass(frozen=True, kw_only=True)
class Thresholds:
    """What the served engine must reach against its checkpoint; each field is also `tritonforge eval`'s flag."""

    min_greedy_agreement: float = setting(0.9, "least share of prompts whose greedy tokens all agree")
    max_logprob_mae: float = setting(0.05, "largest mean |served - reference| log-probability")
    logprob_tolerance: float = setting(0.1, "a token's log-probability off by more than this (nats) counts as off")
    max_logprob_off_share: float = setting(0.05, "largest share of tokens off")
    max_task_accuracy_drop: float = setting(0.02, "largest drop of task accuracy against the reference (--choices)")


@dataclass
class Report:
    prompts: int
    tokens: int
    greedy_agreement: float
    mean_first_divergence: float
    logprob_mae: float | None
    logprob_off_share: float | None
    task_accuracy_served: float | None = None
    task_accuracy_reference: float | None = None
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def table(self) -> str:
        rows = [("prompts × generated tokens", f"{self.prompts} × {self.tokens}"),
                ("greedy agreement (first N tokens identical)", f"{self.greedy_agreement:.3f}"),
                ("mean position of the first divergence", f"{self.mean_first_divergence:.1f} of {self.tokens}"),
                ("log-prob mean |served − reference|", _fmt(self.logprob_mae)),
                ("tokens off by more than the tolerance", _fmt(self.logprob_off_share))]
        if self.task_accuracy_served is not None:
            rows.append(("task accuracy served / reference",
                         f"{self.task_accuracy_served:.3f} / {self.task_accuracy_reference:.3f}"))
        width = max(len(name) for name, _ in rows)
        lines = [f"  {name:<{width}}  {value}" for name, value in rows]
        lines.append("  PASS" if self.passed else "  FAIL: " + "; ".join(self.failures))
        return "\n".join(lines)

    def record(self) -> dict:
        return {**asdict(self), "passed": self.passed}


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.4f}"


def load_jsonl(path: Path, required: tuple[str, ...]) -> list[dict]:
    """The rows of a JSONL file, each an object with the `required` keys; a mistake is named by file and line."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file (a JSONL file of {{{', '.join(map(repr, required))}: ...}} "
                                f"objects, one a line)") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"{path}: cannot be read as UTF-8 text ({error})") from None
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{path}:{number}: not JSON ({error.msg}, column {error.colno})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object with {list(required)}, got "
                             f"{type(row).__name__}")
        missing = [key for key in required if key not in row]
        if missing:
            raise ValueError(f"{path}:{number}: missing {missing}")
        rows.append(row)
    if not rows:
        raise ValueError(f"{path} holds no rows")
    return rows


class Reference:
    """The checkpoint run by transformers on the CPU (or the first GPU), greedy, in float32."""

    def __init__(self, checkpoint: Path, tokenizer):
        import torch
        from transformers import AutoModelForCausalLM

        from ..runtime.text.tokenization import default_end_id

        self.torch = torch
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        self.model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).to(self.device).eval()
        self.tokenizer = tokenizer
        self.end_id = default_end_id(tokenizer)

    def greedy(self, prompt_ids: list[int], tokens: int) -> list[int]:
        torch = self.torch
        with torch.inference_mode():
            ids = torch.tensor([prompt_ids], device=self.device)
            out = self.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=tokens,
                                      min_new_tokens=tokens, do_sample=False, eos_token_id=self.end_id,
                                      pad_token_id=self.end_id)
        return out[0, len(prompt_ids):].tolist()

    def log_probs(self, prompt_ids: list[int], continuation: list[int]) -> list[float]:
        """log p(continuation[i] | prompt + continuation[:i]) for each i, with the end token masked as the
        served engine masks it while `min_tokens` holds."""
        torch = self.torch
        with torch.inference_mode():
            ids = torch.tensor([prompt_ids + continuation], device=self.device)
            logits = self.model(ids).logits[0, len(prompt_ids) - 1: -1].float()
            logits[:, self.end_id] = float("-inf")
            targets = torch.tensor(continuation, device=self.device)[:, None]
            chosen = torch.log_softmax(logits, dim=-1).gather(1, targets)
        return chosen[:, 0].tolist()


class Served:
    """The repository's `tensorrt_llm` model over gRPC: greedy tokens with their log-probs."""

    def __init__(self, url: str, end_id: int, model: str = ENGINE_MODEL):
        import tritonclient.grpc as grpcclient

        self.grpc = grpcclient
        self.url, self.end_id, self.model = url, end_id, model

    def greedy(self, prompt_ids: list[int], tokens: int) -> tuple[list[int], list[float]]:
        import queue

        arrays = {INPUT_IDS: np.array([prompt_ids], dtype=np.int32),
                  INPUT_LENGTHS: np.array([[len(prompt_ids)]], dtype=np.int32),
                  REQUEST_OUTPUT_LEN: np.array([[tokens]], dtype=np.int32),
                  MIN_TOKENS: np.array([[tokens]], dtype=np.int32),
                  END_ID: np.array([[self.end_id]], dtype=np.int32),  # as preprocessing sends it
                  RUNTIME_TOP_K: np.array([[1]], dtype=np.int32),
                  RETURN_LOG_PROBS: np.array([[True]]), STREAMING: np.array([[False]])}
        from tritonclient.utils import InferenceServerException

        inputs = grpc_tensors(self.grpc, arrays)
        client = self.grpc.InferenceServerClient(self.url)
        answers: queue.Queue = queue.Queue()
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        ids: list[int] = []
        log_probs: list[float] = []
        try:
            try:
                client.async_stream_infer(self.model, inputs, enable_empty_final_response=True)
            except InferenceServerException:
                # The stream failed before the request went out (the server gone): its callback has the cause.
                try:
                    _, error = answers.get(timeout=STOP_TIMEOUT_S)
                except queue.Empty:
                    raise GenerationError(f"the gRPC stream to {self.url} failed before the request was sent") from None
                raise stream_error(self.url, error, probe_http=True) from None
            while True:
                try:
                    result, error = answers.get(timeout=RESPONSE_TIMEOUT_S)
                except queue.Empty:
                    raise ResponseTimeout(self.model, RESPONSE_TIMEOUT_S) from None
                if error is not None:
                    raise stream_error(self.url, error, probe_http=True)
                output_ids = result.as_numpy(OUTPUT_IDS)
                if output_ids is not None:
                    length = int(result.as_numpy(SEQUENCE_LENGTH).reshape(-1)[0])
                    ids += output_ids.reshape(-1)[:length].tolist()
                    lp = result.as_numpy(OUTPUT_LOG_PROBS)
                    if lp is not None:
                        log_probs += lp.reshape(-1)[:length].tolist()
                if is_final(result):
                    break
        finally:
            client.stop_stream()
            client.close()
        return ids, log_probs


def first_divergence(a: list[int], b: list[int]) -> int:
    for position, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return position
    return min(len(a), len(b))


def run_eval(url: str, checkpoint: Path, tokenizer_dir: Path, *, prompts_path: Path | None = None,
             tokens: int = 32, thresholds: Thresholds = Thresholds(), choices_path: Path | None = None,
             model: str = "tensorrt_llm") -> Report:
    """The whole check: load the prompt sets, the repository's tokenizer and the reference; evaluate."""
    from ..runtime.text.tokenization import default_end_id, load_tokenizer

    # What can be checked at once goes before the reference model loads (seconds to minutes).
    prompts = load_jsonl(prompts_path or DEFAULT_PROMPTS, ("prompt",))
    choices = load_jsonl(choices_path, ("question", "choices", "answer")) if choices_path else None
    check_serving(url, {model: "--url"})
    tokenizer = load_tokenizer(tokenizer_dir)
    served = Served(url, default_end_id(tokenizer), model)
    return evaluate(served, Reference(checkpoint, tokenizer), tokenizer, prompts, tokens=tokens,
                    thresholds=thresholds, choices=choices)


def evaluate(served: Served, reference: Reference, tokenizer, prompts: list[dict], *, tokens: int = 32,
             thresholds: Thresholds = Thresholds(), choices: list[dict] | None = None) -> Report:
    agreements, divergences, differences = [], [], []
    for row in prompts:
        prompt_ids = tokenizer(row["prompt"]).input_ids
        served_ids, served_lp = served.greedy(prompt_ids, tokens)
        reference_ids = reference.greedy(prompt_ids, tokens)
        agreements.append(served_ids[:tokens] == reference_ids[:tokens])
        divergences.append(first_divergence(served_ids[:tokens], reference_ids[:tokens]))
        if served_lp and served_ids:
            reference_lp = reference.log_probs(prompt_ids, served_ids)
            differences += [abs(s - r) for s, r in zip(served_lp, reference_lp) if math.isfinite(s)]
    report = Report(prompts=len(prompts), tokens=tokens, greedy_agreement=float(np.mean(agreements)),
                    mean_first_divergence=float(np.mean(divergences)),
                    logprob_mae=float(np.mean(differences)) if differences else None,
                    logprob_off_share=float(np.mean([d > thresholds.logprob_tolerance for d in differences]))
                    if differences else None)
    if choices:
        report.task_accuracy_served, report.task_accuracy_reference = _task_accuracy(served, reference, tokenizer,
                                                                                      choices)
    _judge(report, thresholds)
    return report


def _judge(report: Report, thresholds: Thresholds) -> None:
    if report.greedy_agreement < thresholds.min_greedy_agreement:
        report.failures.append(f"greedy agreement {report.greedy_agreement:.3f} < {thresholds.min_greedy_agreement}")
    if report.logprob_mae is None:
        report.failures.append("the served engine returned no output_log_probs")
    else:
        if report.logprob_mae > thresholds.max_logprob_mae:
            report.failures.append(f"log-prob MAE {report.logprob_mae:.4f} > {thresholds.max_logprob_mae}")
        if report.logprob_off_share > thresholds.max_logprob_off_share:
            report.failures.append(f"{report.logprob_off_share:.3f} of tokens off by > {thresholds.logprob_tolerance} "
                                   f"(allowed {thresholds.max_logprob_off_share})")
    if report.task_accuracy_served is not None and (
            report.task_accuracy_reference - report.task_accuracy_served > thresholds.max_task_accuracy_drop):
        report.failures.append(f"task accuracy {report.task_accuracy_served:.3f} trails the reference's "
                               f"{report.task_accuracy_reference:.3f} by more than {thresholds.max_task_accuracy_drop}")


def _task_accuracy(served: Served, reference: Reference, tokenizer, rows: list[dict]) -> tuple[float, float]:
    """Each side answers with the letter it generates after the lettered choices."""
    served_right, reference_right = [], []
    for row in rows:
        letters = string.ascii_uppercase[:len(row["choices"])]
        prompt = row["question"] + "\n" + "".join(f"{letter}. {choice}\n" for letter, choice in
                                                  zip(letters, row["choices"])) + "Answer:"
        answer = row["answer"] if isinstance(row["answer"], str) else letters[int(row["answer"])]
        prompt_ids = tokenizer(prompt).input_ids
        served_text = tokenizer.decode(served.greedy(prompt_ids, 2)[0])
        reference_text = tokenizer.decode(reference.greedy(prompt_ids, 2))
        served_right.append(_letter(served_text, letters) == answer)
        reference_right.append(_letter(reference_text, letters) == answer)
    return float(np.mean(served_right)), float(np.mean(reference_right))


def _letter(text: str, letters: str) -> str | None:
    return next((char for char in text.strip() if char in letters), None)
