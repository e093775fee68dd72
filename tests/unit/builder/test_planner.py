"""Memory plans for known shapes, against figures computed by hand from the published configs."""

import pytest

from tritonforge.builder.planner import GIB, ModelShape, PlanRefused, plan_memory
from tritonforge.facts.release import TOKENS_PER_BLOCK

LLAMA_3_1_8B = ModelShape(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                          num_heads=32, num_kv_heads=8, head_dim=128, tied_embeddings=False)
LLAMA_3_1_70B = ModelShape(vocab_size=128256, hidden_size=8192, intermediate_size=28672, num_layers=80,
                           num_heads=64, num_kv_heads=8, head_dim=128, tied_embeddings=False)
RESERVE = 2 * GIB  # the planner's default runtime reserve

# By hand, 8B: per layer q 4096·4096 + k,v 2·4096·1024 + o 4096·4096 + mlp 3·4096·14336 = 218,103,808;
# × 32 layers = 6,979,321,856 linear; embeddings 2 · 128256·4096 = 1,050,673,152; norms 65·4096 = 266,240.
LINEAR_8B, OTHER_8B = 6_979_321_856, 1_050_939_392
# 70B: per layer 67,108,864 + 16,777,216 + 67,108,864 + 704,643,072 = 855,638,016; × 80 = 68,451,041,280;
# embeddings 2 · 128256·8192 = 2,101,346,304; norms 161·8192 = 1,318,912.
LINEAR_70B, OTHER_70B = 68_451_041_280, 2_102_665_216


def expected_sequences(weights, kv_per_token, gpu_gib, max_seq_len, fraction=0.9):
    kv_memory = int((gpu_gib * 2**30 - weights - RESERVE) * fraction)  # the GPU size is read in GiB
    blocks = kv_memory // kv_per_token // 32
    return blocks * 32, blocks // -(-max_seq_len // 32)


def test_parameter_counts_match_the_published_8b_size():
    assert LLAMA_3_1_8B.linear_params == LINEAR_8B and LLAMA_3_1_8B.other_params == OTHER_8B
    assert LINEAR_8B + OTHER_8B == 8_030_261_248  # Llama-3.1-8B's 8.03 B parameters


@pytest.mark.parametrize("gpu_gib", [79.6, 140])
def test_llama_8b_fp16(gpu_gib):
    plan = plan_memory(LLAMA_3_1_8B, gpu_memory_gib=gpu_gib, max_seq_len=8192, max_batch_size=64)
    weights = (LINEAR_8B + OTHER_8B) * 2  # 16,060,522,496 bytes
    assert plan.weight_bytes_per_gpu == weights
    assert plan.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    assert (plan.kv_tokens, plan.max_sequences) == expected_sequences(weights, 131_072, gpu_gib, 8192)


@pytest.mark.parametrize("gpu_gib", [79.6, 140])
def test_llama_8b_fp8_weights_and_fp8_kv(gpu_gib):
    plan = plan_memory(LLAMA_3_1_8B, gpu_memory_gib=gpu_gib, quantization="fp8", kv_cache_dtype="fp8",
                       max_seq_len=8192, max_batch_size=64)
    weights = LINEAR_8B * 1 + OTHER_8B * 2  # 9,081,200,640: embeddings and lm_head stay 16-bit
    assert plan.weight_bytes_per_gpu == weights
    assert plan.kv_bytes_per_token == 65_536
    assert (plan.kv_tokens, plan.max_sequences) == expected_sequences(weights, 65_536, gpu_gib, 8192)


def test_llama_70b_fp8_on_four_gpus():
    plan = plan_memory(LLAMA_3_1_70B, gpu_memory_gib=80, quantization="fp8", tp_size=4, max_seq_len=8192,
                       max_batch_size=64)
    weights = (LINEAR_70B + OTHER_70B * 2) // 4  # 18,164,092,928 bytes per GPU
    assert plan.weight_bytes_per_gpu == weights
    assert plan.kv_bytes_per_token == 2 * 80 * 2 * 128 * 2 == 81_920  # 8 KV heads over tp=4
    assert (plan.kv_tokens, plan.max_sequences) == expected_sequences(weights, 81_920, 80, 8192)


def test_a_sequence_takes_whole_kv_blocks_so_one_token_past_a_block_costs_a_block():
    """TensorRT-LLM pages the KV cache in blocks of TOKENS_PER_BLOCK tokens: a sequence of k blocks and one
    token holds k + 1 of them, so fewer such sequences fit than of k blocks exactly."""
    exact = plan_memory(LLAMA_3_1_8B, gpu_memory_gib=80, max_seq_len=8 * TOKENS_PER_BLOCK, max_batch_size=4096)
    one_more = plan_memory(LLAMA_3_1_8B, gpu_memory_gib=80, max_seq_len=8 * TOKENS_PER_BLOCK + 1,
                           max_batch_size=4096)
    blocks = exact.kv_tokens // TOKENS_PER_BLOCK
    assert (exact.max_sequences, one_more.max_sequences) == (blocks // 8, blocks // 9)


def test_70b_in_fp16_on_one_gpu_is_refused_with_advice():
    with pytest.raises(PlanRefused, match="tp-size"):
        plan_memory(LLAMA_3_1_70B, gpu_memory_gib=80, max_seq_len=8192, max_batch_size=8)


def test_plan_where_not_one_sequence_fits_is_refused_with_advice():
    with pytest.raises(PlanRefused, match="not one sequence") as error:
        plan_memory(LLAMA_3_1_8B, gpu_memory_gib=24, max_seq_len=131072, max_batch_size=8,
                    kv_cache_free_gpu_mem_fraction=0.5)
    assert "--max-seq-len" in str(error.value) and "fp8" in str(error.value)


def test_heads_that_do_not_split_over_tp_are_refused():
    with pytest.raises(PlanRefused, match="tp=3"):
        plan_memory(LLAMA_3_1_8B, gpu_memory_gib=80, tp_size=3, max_seq_len=4096, max_batch_size=8)


# Mixtral-8x7B (published config): per layer attention 4096·4096·2 + 2·4096·1024 = 41,943,040, 8 experts
# × 3·4096·14336 = 1,409,286,144, router 4096·8 = 32,768; × 32 = 46,440,382,464 linear; embeddings
# 2 · 32000·4096 = 262,144,000; norms 65·4096 = 266,240: 46.70 B parameters, 87.0 GiB in bf16.
MIXTRAL_8X7B_CONFIG = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 14336,
                       "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
                       "num_local_experts": 8, "num_experts_per_tok": 2, "tie_word_embeddings": False}


def test_mixture_of_experts_counts_every_expert():
    shape = ModelShape.from_hf_config(MIXTRAL_8X7B_CONFIG)
    assert shape.linear_params == 46_440_382_464
    assert shape.linear_params + shape.other_params == 46_702_792_704
    plan = plan_memory(shape, gpu_memory_gib=140, dtype="bfloat16", max_seq_len=4096, max_batch_size=8)
    assert plan.weight_bytes_per_gpu == 46_702_792_704 * 2


def test_mixtral_bf16_on_one_80gb_gpu_is_refused():
    with pytest.raises(PlanRefused, match="tp-size"):
        plan_memory(ModelShape.from_hf_config(MIXTRAL_8X7B_CONFIG), gpu_memory_gib=79.6, dtype="bfloat16",
                    max_seq_len=4096, max_batch_size=8)


def test_qwen_moe_counts_expert_width_and_the_shared_expert():
    config = {"vocab_size": 1000, "hidden_size": 64, "intermediate_size": 512, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 4, "num_experts": 4, "moe_intermediate_size": 32,
              "shared_expert_intermediate_size": 128, "tie_word_embeddings": False}
    attention = 4 * 64 * 64
    experts = 4 * 3 * 64 * 32 + 64 * 4
    shared = 3 * 64 * 128 + 64
    assert ModelShape.from_hf_config(config).linear_params == 2 * (attention + experts + shared)


def test_python_instances_follow_the_streams_as_measured_at_128():
    plan = plan_memory(LLAMA_3_1_8B, gpu_memory_gib=140, max_seq_len=2048, max_batch_size=128)
    assert (plan.preprocessing_instances, plan.postprocessing_instances, plan.bls_instances) == (8, 8, 8)
    small = plan_memory(LLAMA_3_1_8B, gpu_memory_gib=140, max_seq_len=2048, max_batch_size=8)
    assert (small.preprocessing_instances, small.postprocessing_instances, small.bls_instances) == (2, 2, 1)


def test_python_instances_follow_the_sequences_that_fit_when_fewer_than_the_batch():
    """8B in fp16 on a 24 GiB GPU holds 6 sequences of 8192 tokens: a batch of 256 never runs more streams."""
    plan = plan_memory(LLAMA_3_1_8B, gpu_memory_gib=24, max_seq_len=8192, max_batch_size=256)
    assert plan.max_sequences == 6
    assert (plan.preprocessing_instances, plan.postprocessing_instances, plan.bls_instances) == (2, 2, 1)


@pytest.mark.parametrize("fraction", [0, 1.0])
def test_a_kv_cache_fraction_outside_zero_to_one_is_refused(fraction):
    with pytest.raises(PlanRefused, match=r"^kv_cache_free_gpu_mem_fraction must be in \(0, 1\)"):
        plan_memory(LLAMA_3_1_8B, gpu_memory_gib=80, max_seq_len=8192, max_batch_size=64,
                    kv_cache_free_gpu_mem_fraction=fraction)


def test_an_int8_kv_cache_takes_a_byte_per_element_as_fp8_does():
    plan = plan_memory(LLAMA_3_1_8B, gpu_memory_gib=80, kv_cache_dtype="int8", max_seq_len=8192, max_batch_size=64)
    assert plan.kv_bytes_per_token == 2 * 32 * 8 * 128 * 1 == 65_536


def test_fewer_kv_heads_than_gpus_keeps_one_kv_head_per_gpu():
    """8 KV heads over tp=16: each GPU holds a copy of one KV head, not a sixteenth of eight."""
    plan = plan_memory(LLAMA_3_1_70B, gpu_memory_gib=80, tp_size=16, max_seq_len=8192, max_batch_size=64)
    assert plan.kv_bytes_per_token == 2 * 80 * 1 * 128 * 2 == 40_960


def test_pipeline_stages_split_the_layers_and_an_uneven_split_is_refused():
    plan = plan_memory(LLAMA_3_1_8B, gpu_memory_gib=80, pp_size=2, max_seq_len=8192, max_batch_size=64)
    assert plan.kv_bytes_per_token == 2 * 16 * 8 * 128 * 2
    with pytest.raises(PlanRefused, match="^32 layers do not split into 3 pipeline stages$"):
        plan_memory(LLAMA_3_1_8B, gpu_memory_gib=80, pp_size=3, max_seq_len=8192, max_batch_size=64)


def test_the_serving_limits_follow_the_batch_size():
    """The BLS takes twice the engine's batch at once, and the engine queues four batches before it refuses."""
    plan = plan_memory(LLAMA_3_1_8B, gpu_memory_gib=80, max_seq_len=8192, max_batch_size=48)
    assert (plan.bls_max_concurrency, plan.max_queue_size, plan.max_queue_delay_microseconds) == (96, 192, 0)
