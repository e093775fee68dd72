"""Guided decoding of one request: what its `guided_decoding_guide_type` and `guided_decoding_guide` ask for.

The guide types are the tensorrtllm backend's (`getGuidedDecodingParamsFromTensors` in its utils.cc: json,
json_schema, regex, ebnf_grammar) and the LLM API's structural tag:
- `json`: any JSON object or array (xgrammar's built-in JSON grammar, as TensorRT-LLM compiles it); a guide
  sent with it is ignored, as the backend does;
- `json_schema`: JSON valid under the schema in the guide;
- `regex`: text the guide's regular expression matches in full;
- `ebnf_grammar`: text of the guide's EBNF grammar (xgrammar's dialect, rule `root` first);
- `structural_tag`: the guide's structural tag (xgrammar's JSON format, or the older one of `structures` and
  `triggers`). The tensorrtllm backend has no such type.

The backend ignores a type it does not know, which leaves the answer unguided; engines here refuse it (and
a guide without a type), naming the field. Free of torch and xgrammar: each engine compiles the guide its way.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ...facts.contract import GUIDED_DECODING_GUIDE, GUIDED_DECODING_GUIDE_TYPE
from ...facts.errors import RequestError

JSON = "json"
JSON_SCHEMA = "json_schema"
REGEX = "regex"
EBNF_GRAMMAR = "ebnf_grammar"
STRUCTURAL_TAG = "structural_tag"
GUIDE_TYPES = (JSON, JSON_SCHEMA, REGEX, EBNF_GRAMMAR, STRUCTURAL_TAG)


@dataclass(frozen=True)
class GuidedDecoding:
    """One request's guide: its type (one of GUIDE_TYPES) and its text ("" for `json`)."""

    guide_type: str
    guide: str = ""


def guided_decoding(guide_type: str, guide: str) -> GuidedDecoding | None:
    """A row's guide from the two inputs as text ("" where absent), or None when it asks for none."""
    if not guide_type:
        if guide:
            raise RequestError(GUIDED_DECODING_GUIDE_TYPE, f"must name the type of guided_decoding_guide, one of "
                                                           f"{', '.join(GUIDE_TYPES)}")
        return None
    if guide_type not in GUIDE_TYPES:
        raise RequestError(GUIDED_DECODING_GUIDE_TYPE, f"must be one of {', '.join(GUIDE_TYPES)}, got {guide_type!r}")
    if guide_type == JSON:
        return GuidedDecoding(JSON)
    if not guide.strip():
        raise RequestError(GUIDED_DECODING_GUIDE, f"is required with guided_decoding_guide_type {guide_type}")
    return GuidedDecoding(guide_type, guide)


def compile_error(error: Exception) -> str:
    """xgrammar's message without its log prefix ("[12:53:30] /project/cpp/x.cc:94: ") and check wording."""
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    text = re.sub(r"^\[[\d:.]+\]\s+\S+:\d+:\s*", "", text)
    return re.sub(r"^Check failed: \(.*?\) is false:\s*", "", text)
