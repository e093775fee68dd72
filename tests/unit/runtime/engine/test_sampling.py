"""Batched sampling (`SlotSampler`) against a plain one-row-at-a-time reference, and its seeded noise."""

import math

import numpy as np
import pytest
import torch

from tritonforge.facts.errors import RequestError
from tritonforge.runtime.engine.sampling import SamplingParams, SlotSampler, gumbel_noise

VOCAB = 64
EXACT = 1e-6  # float32 ops in another order: the batched and the per-row results agree to rounding
DRAWS = 20_000
# Sampled frequencies vs the probabilities: 4 standard deviations of a binomial at DRAWS, for every token.
FREQUENCY_SIGMAS = 4


def reference_logits(logits, params: SamplingParams, seen: list[int], generated: list[int], bias) -> torch.Tensor:
    """One row's bias and penalties, written out as the sampling module's docstring defines them."""
    logits = logits.clone()
    if bias is not None:
        logits += torch.as_tensor(bias)
    for token in set(seen):
        value = logits[token]
        logits[token] = value / params.repetition_penalty if value > 0 else value * params.repetition_penalty
    for token in set(generated):
        logits[token] -= params.presence_penalty + params.frequency_penalty * generated.count(token)
    return logits


def reference_probs(logits, params: SamplingParams) -> torch.Tensor:
    """One sampling row's distribution: temperature, then top-k, then the smallest top-p prefix."""
    scores = logits / params.temperature
    if params.top_k > 1:
        kth = torch.topk(scores, params.top_k).values[-1]
        scores = scores.masked_fill(scores < kth, -math.inf)
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1:
        order = torch.argsort(probs, descending=True)
        kept, mass = [], 0.0
        for token in order.tolist():
            if mass >= params.top_p:
                break
            kept.append(token)
            mass += float(probs[token])
        keep = torch.zeros_like(probs, dtype=torch.bool)
        keep[kept] = True
        probs = torch.where(keep, probs, 0.0)
        probs = probs / probs.sum()
    return probs


ROWS = [  # (params, prompt, generated, bias)
    (SamplingParams(), [1, 2], [3], None),  # greedy, no penalty: its row must not change
    (SamplingParams(top_k=5, temperature=0.7, repetition_penalty=1.3), [4, 5, 6], [7, 7], None),
    (SamplingParams(top_p=0.6, temperature=1.5, presence_penalty=0.5, frequency_penalty=0.25), [8], [9, 9, 9, 10],
     None),
    (SamplingParams(top_k=10, top_p=0.8, temperature=1.0), [11], [], np.linspace(-1, 1, VOCAB, dtype=np.float32)),
]


@pytest.fixture()
def filled():
    """A sampler whose slots hold ROWS, with each row's generated tokens recorded as the engine does."""
    torch.manual_seed(0)
    sampler = SlotSampler(len(ROWS), VOCAB, torch.device("cpu"))
    for slot, (params, prompt, generated, bias) in enumerate(ROWS):
        sampler.admit(slot, params, prompt, bias)
        for token in generated:
            sampler.record(slice(slot, slot + 1), torch.tensor([token]))
    return sampler, torch.randn(len(ROWS), VOCAB) * 3


def test_batched_penalties_and_bias_equal_the_per_row_reference(filled):
    sampler, logits = filled
    processed = sampler.process(logits, slice(0, len(ROWS)), biased=True, penalised=True, banned=[])
    for row, (params, prompt, generated, bias) in enumerate(ROWS):
        expected = reference_logits(logits[row], params, prompt + generated, generated, bias)
        torch.testing.assert_close(processed[row], expected, atol=EXACT, rtol=EXACT)
    assert torch.equal(processed[0], logits[0])  # neutral values leave a plain row bit-exact


def test_banned_tokens_get_minus_infinity_in_their_row_only(filled):
    sampler, logits = filled
    processed = sampler.process(logits, slice(0, len(ROWS)), biased=False, penalised=False, banned=[(1, 3), (2, 5)])
    assert processed[1, 3] == -math.inf and processed[2, 5] == -math.inf
    assert torch.isfinite(processed[0]).all() and torch.isfinite(processed[3]).all()


def test_batched_sampling_distribution_equals_the_per_row_reference(filled):
    sampler, logits = filled
    scores = sampler.scores(logits, slice(0, len(ROWS)), top_k=True, top_p=True)
    for row, (params, *_) in enumerate(ROWS):
        if params.greedy:
            continue
        torch.testing.assert_close(torch.softmax(scores[row], dim=-1), reference_probs(logits[row], params),
                                   atol=EXACT, rtol=EXACT)


def test_greedy_rows_take_the_argmax_beside_sampling_rows(filled):
    sampler, logits = filled
    tokens = sampler.choose(logits, slice(0, len(ROWS)), torch.zeros(len(ROWS), dtype=torch.long), sampling=True,
                            top_k=True, top_p=True)
    assert tokens[0] == torch.argmax(logits[0])


def test_noise_draws_follow_the_distribution():
    """Gumbel-max over the counter-based noise, one draw per step, samples softmax(scores)."""
    scores = torch.tensor([2.0, 1.0, 0.5, 0.0, -1.0, -math.inf])
    steps = torch.arange(DRAWS)
    noise = gumbel_noise(torch.full((DRAWS,), 12345), torch.full((DRAWS,), 678), steps, scores.shape[0])
    drawn = torch.argmax(scores[None, :] + noise, dim=-1)
    frequencies = torch.bincount(drawn, minlength=scores.shape[0]).double() / DRAWS
    probs = torch.softmax(scores.double(), dim=-1)
    sigma = torch.sqrt(probs * (1 - probs) / DRAWS)
    assert frequencies[-1] == 0  # -inf is never drawn
    assert torch.all((frequencies - probs).abs() <= FREQUENCY_SIGMAS * sigma + 1e-12), (frequencies, probs)


def test_noise_depends_on_seed_step_and_token_only():
    vocab = 1000
    a = gumbel_noise(torch.tensor([1, 1, 2]), torch.tensor([0, 0, 0]), torch.tensor([5, 6, 5]), vocab)
    again = gumbel_noise(torch.tensor([2, 1]), torch.tensor([0, 0]), torch.tensor([5, 5]), vocab)
    assert torch.equal(a[0], again[1]) and torch.equal(a[2], again[0])  # whatever the other rows
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[0], a[2])  # another step, another seed
    high = gumbel_noise(torch.tensor([1]), torch.tensor([1]), torch.tensor([5]), vocab)
    assert not torch.equal(a[0], high[0])  # the seed's upper 32 bits count


def test_slots_given_as_a_tensor_sample_and_record_as_a_slice_does(filled):
    """Requests prefilled together sit in slots that need not be contiguous: their rows come as a tensor."""
    sampler, logits = filled
    tokens = torch.tensor([5, 9, 5, 1])
    steps = torch.arange(len(ROWS))
    as_slice = sampler.choose(logits, slice(0, len(ROWS)), steps, sampling=True, top_k=True, top_p=True)
    as_tensor = sampler.choose(logits, torch.arange(len(ROWS)), steps, sampling=True, top_k=True, top_p=True)
    assert torch.equal(as_slice, as_tensor)
    seen, counts = sampler.seen.clone(), sampler.counts.clone()
    sampler.record(slice(0, len(ROWS)), tokens)
    by_slice = sampler.seen.clone(), sampler.counts.clone()
    sampler.seen.copy_(seen), sampler.counts.copy_(counts)
    sampler.record(torch.tensor([2, 0, 3, 1]), tokens[[2, 0, 3, 1]])
    assert torch.equal(sampler.seen, by_slice[0]) and torch.equal(sampler.counts, by_slice[1])
    assert not torch.equal(counts, by_slice[1])


def test_a_ban_mask_bans_what_the_banned_pairs_do(filled):
    """The captured step's fixed-shape form of the banned (row, token) pairs."""
    sampler, logits = filled
    banned = [(1, 3), (2, 5), (2, 6)]
    ban = torch.zeros_like(logits, dtype=torch.bool)
    ban[[1, 2, 2], [3, 5, 6]] = True
    rows = slice(0, len(ROWS))
    by_pairs = sampler.process(logits, rows, biased=True, penalised=True, banned=banned)
    by_mask = sampler.process(logits, rows, biased=True, penalised=True, banned=[], ban=ban)
    assert torch.equal(by_pairs, by_mask)


def test_slots_never_admitted_sample_finite_greedy_tokens():
    """A captured step decodes every slot; the free ones must not turn its math into NaN."""
    sampler = SlotSampler(2, VOCAB, torch.device("cpu"))
    sampler.admit(0, SamplingParams(top_k=5, seed=1), [1], None)
    logits = torch.randn(2, VOCAB)
    scores = sampler.scores(logits, slice(0, 2), top_k=True, top_p=True)
    assert torch.isfinite(scores[1]).all()
    tokens = sampler.choose(logits, slice(0, 2), torch.zeros(2, dtype=torch.long), sampling=True, top_k=True,
                            top_p=True)
    assert tokens[1] == torch.argmax(logits[1])


def test_the_noise_is_finite_for_every_token_so_a_masked_token_is_never_drawn():
    """The largest 32-bit draw must not round to a uniform of 1.0 (noise +inf): checked on the extremes of the
    bit pattern and over many draws of a large vocabulary."""
    import torch

    from tritonforge.runtime.engine.sampling import gumbel_noise, uniform_from_bits

    extremes = uniform_from_bits(torch.tensor([0, 2**32 - 1], dtype=torch.int64))
    assert 0.0 < extremes[0].item() and extremes[1].item() < 1.0
    seeds = torch.arange(64)
    assert torch.isfinite(gumbel_noise(seeds, seeds * 7 + 1, torch.arange(64), 50_000)).all()


def test_temperature_zero_is_accepted_and_decodes_greedily_whatever_top_k_and_top_p():
    """OpenAI clients send temperature 0 for deterministic output, often beside top_k or top_p."""
    params = SamplingParams(temperature=0.0, top_k=50, top_p=0.5, seed=3)
    assert params.greedy
    sampler = SlotSampler(3, VOCAB, torch.device("cpu"))
    for slot in range(3):
        sampler.admit(slot, params, [1], None)
    logits = torch.randn(3, VOCAB) * 3
    tokens = sampler.choose(logits, slice(0, 3), torch.arange(3), sampling=True, top_k=True, top_p=True)
    assert torch.equal(tokens, torch.argmax(logits, dim=-1))


def test_the_largest_seed_is_accepted_and_one_more_refused():
    assert SamplingParams(seed=2**64 - 1).seed == 2**64 - 1
    with pytest.raises(RequestError, match="^seed"):
        SamplingParams(seed=2**64)


@pytest.mark.parametrize(("field", "value"), [("presence_penalty", math.nan), ("frequency_penalty", math.inf)])
def test_a_penalty_that_is_not_a_finite_number_is_refused_naming_it(field, value):
    """It would turn the logit of every token it touches into NaN or -inf."""
    with pytest.raises(RequestError, match=f"^{field}"):
        SamplingParams(**{field: value})


def test_a_top_k_larger_than_the_vocabulary_samples_from_the_whole_vocabulary():
    sampler = SlotSampler(1, VOCAB, torch.device("cpu"))
    sampler.admit(0, SamplingParams(top_k=VOCAB * 10, seed=1), [1], None)
    logits = torch.randn(1, VOCAB)
    scores = sampler.scores(logits, slice(0, 1), top_k=True, top_p=False)
    assert torch.equal(scores, logits)  # temperature 1, every token kept
    token = sampler.choose(logits, slice(0, 1), torch.tensor([0]), sampling=True, top_k=True, top_p=False)
    assert 0 <= int(token[0]) < VOCAB


@pytest.mark.parametrize("penalty", [{"repetition_penalty": 2.0}, {"presence_penalty": 1.5},
                                     {"frequency_penalty": 1.5}])
def test_each_penalty_alone_changes_the_logits_of_a_generated_token(penalty):
    params = SamplingParams(**penalty)
    sampler = SlotSampler(1, VOCAB, torch.device("cpu"))
    sampler.admit(0, params, [1], None)
    sampler.record(slice(0, 1), torch.tensor([7]))
    logits = torch.full((1, VOCAB), 2.0)
    processed = sampler.process(logits, slice(0, 1), biased=False, penalised=params.penalised, banned=[])
    expected = reference_logits(logits[0], params, [1, 7], [7], None)
    torch.testing.assert_close(processed[0], expected, atol=EXACT, rtol=EXACT)
    assert processed[0, 7] < 2.0


def test_a_seed_decides_the_draws_with_all_its_64_bits_and_zero_is_a_seed():
    """Rows that differ only in their seed's upper 32 bits draw differently; seed 0 draws the same each time,
    as any given seed does, where no seed draws anew."""
    logits = torch.zeros(1, VOCAB)  # every token equally likely: the seed alone picks

    def draws(seed: int | None) -> list[int]:
        sampler = SlotSampler(1, VOCAB, torch.device("cpu"))
        sampler.admit(0, SamplingParams(top_k=VOCAB, seed=seed), [1], None)
        return [int(sampler.choose(logits, slice(0, 1), torch.tensor([step]), sampling=True, top_k=True,
                                   top_p=False)[0]) for step in range(16)]

    assert draws(1) != draws(2**32 + 1)
    assert draws(0) == draws(0) and draws(2**32 + 1) == draws(2**32 + 1)
    assert draws(None) != draws(None)  # 16 draws from 64 tokens: equal by chance once in 2^96
