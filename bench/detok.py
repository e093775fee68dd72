"""Cost per streamed token of incremental detokenization at positions 20, 200 and 2000, both tokenizer families.

Compares our byte-table decoder (what the postprocessing model and the BLS run) with the common approach of
re-decoding the whole sequence every token (NVIDIA's BLS with accumulate_tokens). Ratios, not absolute times:
the machines are shared. Run: .venv/bin/python bench/detok.py
"""

from __future__ import annotations

import random
import sys
import tempfile
import time

from tritonforge.runtime.text.detokenization import IncrementalDetokenizer, TokenBytes
from tritonforge.runtime.text.tokenization import load_tokenizer
from tritonforge.tools.tiny_model import TOKENIZER_FAMILIES, make_tiny_model

POSITIONS = (20, 200, 2000)
REPEATS = 200


def per_token_seconds(step, repeats: int = REPEATS) -> float:
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - start) / repeats


def main() -> int:
    print("µs per streamed token (median of 5 runs); 'full re-decode' decodes all tokens so far every step")
    print(f"{'family':<14}{'position':>9}{'byte table':>12}{'full re-decode':>16}{'ratio':>8}")
    with tempfile.TemporaryDirectory() as work:
        for family in TOKENIZER_FAMILIES:
            tokenizer = load_tokenizer(make_tiny_model(f"{work}/{family}", tokenizer_family=family))
            table = TokenBytes(tokenizer)
            rng = random.Random(0)
            ids = [rng.randrange(len(tokenizer)) for _ in range(max(POSITIONS) + 1)]
            for position in POSITIONS:
                prefix, token = ids[:position], ids[position]
                detokenizer = IncrementalDetokenizer(table)
                detokenizer.push(prefix)
                def ours_step(d=detokenizer, t=token):
                    d.push([t])

                def full_step(k=tokenizer, p=prefix, t=token):
                    k.decode(p + [t])

                ours = sorted(per_token_seconds(ours_step) for _ in range(5))[2]
                full = sorted(per_token_seconds(full_step, 20) for _ in range(5))[2]
                print(f"{family:<14}{position:>9}{ours * 1e6:>12.2f}{full * 1e6:>16.1f}{full / ours:>8.0f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
