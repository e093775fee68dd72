"""What each tensor of the contract carries, in a line, keyed by tensor name: the meaning column of the generated
reference (`tritonforge.cli.reference_docs`). Names, dtypes, dims and optional flags live in `contract.py`; a test
checks that every tensor there has a meaning here. A name used by several models (the engine's `temperature` and
the ensemble's) means the same thing in each.

The meanings follow NVIDIA's `inflight_batcher_llm` configs and docs for TensorRT-LLM 1.1.0; what the
transformers engine does with each is in the docs (Request fields).
"""

from __future__ import annotations

from . import contract

MEANINGS: dict[str, str] = {
    # --- what clients send to the ensemble and the BLS
    contract.TEXT_INPUT: "the prompt, UTF-8 text",
    contract.MESSAGES: "ours: chat messages as a JSON list of {role, content}, rendered with the tokenizer's chat "
                       "template; sent instead of text_input",
    contract.DECODER_TEXT_INPUT: "the decoder's prompt of an encoder-decoder model",
    contract.MAX_TOKENS: "the most new tokens to generate",
    contract.NUM_RETURN_SEQUENCES: "how many sequences to return for the request",
    contract.BAD_WORDS: "phrases the engine must not generate, one per element",
    contract.STOP_WORDS: "phrases that end generation, one per element",
    contract.EXCLUDE_INPUT_IN_OUTPUT: "leave the prompt out of a non-streamed answer (streamed chunks never carry it)",
    contract.END_ID: "the token id that ends generation; through preprocessing it defaults to the tokenizer's EOS, "
                     "called directly the engine has none",
    contract.PAD_ID: "the token id that pads rows; through preprocessing it defaults to the tokenizer's pad, else EOS",
    contract.TOP_K: "sample from the k likeliest tokens; becomes the engine's runtime_top_k",
    contract.TOP_P: "sample from the smallest set of tokens whose probability reaches p; 0 or less is unset; becomes "
                    "runtime_top_p",
    contract.TEMPERATURE: "divides the logits before sampling",
    contract.LENGTH_PENALTY: "beam search's length penalty; becomes len_penalty",
    contract.REPETITION_PENALTY: "penalises tokens already in the sequence, by factor",
    contract.MIN_TOKENS: "the fewest new tokens before the end id may end generation",
    contract.PRESENCE_PENALTY: "penalises tokens already generated, once each",
    contract.FREQUENCY_PENALTY: "penalises tokens already generated, by how often",
    contract.SEED: "the sampling seed",
    contract.RETURN_LOG_PROBS: "also return cum_log_probs and output_log_probs",
    contract.RETURN_CONTEXT_LOGITS: "also return the prompt's logits (context_logits)",
    contract.RETURN_GENERATION_LOGITS: "also return the generated tokens' logits (generation_logits)",
    contract.RETURN_PERF_METRICS: "also return the KV-cache, timing and draft statistics",
    contract.RETURN_NUM_INPUT_TOKENS: "also return num_input_tokens",
    contract.RETURN_NUM_OUTPUT_TOKENS: "also return num_output_tokens",
    contract.BEAM_WIDTH: "beams of beam search (1: no beam search)",
    contract.STREAM: "stream the answer as it is generated; becomes the engine's streaming; needs a decoupled engine",
    contract.PROMPT_EMBEDDING_TABLE: "prompt-tuning embeddings the prompt's extra ids point into",
    contract.PROMPT_TABLE_EXTRA_ID: "a key of the prompt table, for KV-cache reuse across requests",
    contract.PROMPT_VOCAB_SIZE: "rows of prompt_embedding_table",
    contract.EMBEDDING_BIAS_WORDS: "words whose logits get a bias",
    contract.EMBEDDING_BIAS_WEIGHTS: "the bias of each of embedding_bias_words, same length",
    contract.LORA_TASK_ID: "the LoRA adapter's id: weights and config the first time, the id alone once cached",
    contract.LORA_WEIGHTS: "the LoRA adapter's weights, one row per module and layer",
    contract.LORA_CONFIG: "rows of (module id, layer, rank) describing lora_weights",
    contract.GUIDED_DECODING_GUIDE_TYPE: "how guided_decoding_guide constrains the output: json (any object or array), "
                                         "json_schema, regex, ebnf_grammar, or structural_tag (not in the "
                                         "tensorrtllm backend)",
    contract.GUIDED_DECODING_GUIDE: "the schema, regular expression, grammar or structural tag the output must match",
    contract.NUM_DRAFT_TOKENS: "BLS: draft tokens a step of speculative decoding proposes",
    contract.USE_DRAFT_LOGITS: "BLS: pass the draft model's logits to the target model",
    contract.STREAM_INTERVAL: "ours, BLS: engine responses merged into each streamed response after the first "
                              "(default 1): fewer, larger chunks",
    contract.NUM_TOP_LOG_PROBS: "ours, ensemble, BLS and engine: return each generated token's log probability with "
                                "this many of the likeliest tokens at its step (0 to 20; the ensemble's log "
                                "probabilities are the engine's output_log_probs, with return_log_probs)",
    contract.RETURN_PROMPT_LOG_PROBS: "ours, BLS and engine: with num_top_log_probs, the prompt's tokens' log "
                                      "probabilities too (the BLS's tokens then start with the prompt's)",
    # --- what clients get back
    contract.TEXT_OUTPUT: "the generated text, one string per sequence (a flat array: output[0].decode())",
    contract.CUM_LOG_PROBS: "the cumulative log probability of each beam",
    contract.OUTPUT_LOG_PROBS: "the log probability of each generated token, per beam",
    contract.TOKEN_IDS: "ours, BLS (num_top_log_probs): the tokens this response adds",
    contract.TOKEN_BYTES: "ours, BLS and ensemble (num_top_log_probs): each added token's bytes (part of a character, "
                          "at times)",
    contract.TOKEN_LOG_PROBS: "ours, BLS (num_top_log_probs): each added token's log probability",
    contract.TOP_TOKEN_IDS: "ours (num_top_log_probs): the likeliest tokens at each generated token's step, "
                            "likeliest first; the engine's per beam",
    contract.TOP_TOKEN_BYTES: "ours, BLS and ensemble (num_top_log_probs): the bytes of each of top_token_ids",
    contract.TOP_LOG_PROBS: "ours (num_top_log_probs): the log probability of each of top_token_ids",
    contract.PROMPT_LOG_PROBS: "ours, engine (return_prompt_log_probs), first response: each prompt token's log "
                               "probability, NaN for the first",
    contract.PROMPT_TOP_TOKEN_IDS: "ours, engine (return_prompt_log_probs): the likeliest tokens at each prompt "
                                   "token's place, [prompt tokens, k]",
    contract.PROMPT_TOP_LOG_PROBS: "ours, engine (return_prompt_log_probs): the log probability of each of "
                                   "prompt_top_token_ids",
    contract.CONTEXT_LOGITS: "the prompt's logits, [prompt tokens, vocabulary]",
    contract.GENERATION_LOGITS: "the generated tokens' logits, [beams, tokens, vocabulary]",
    contract.BATCH_INDEX: "the row of a batched request this response answers",
    contract.SEQUENCE_INDEX: "which of num_return_sequences this response carries",
    contract.KV_CACHE_ALLOC_NEW_BLOCKS: "KV-cache blocks newly allocated for the request",
    contract.KV_CACHE_REUSED_BLOCKS: "KV-cache blocks reused from earlier requests",
    contract.KV_CACHE_ALLOC_TOTAL_BLOCKS: "KV-cache blocks allocated for the request in all",
    contract.ARRIVAL_TIME_NS: "when the request arrived, ns since the epoch",
    contract.FIRST_SCHEDULED_TIME_NS: "when the request was first scheduled, ns since the epoch",
    contract.FIRST_TOKEN_TIME_NS: "when its first token was generated, ns since the epoch",
    contract.LAST_TOKEN_TIME_NS: "when its last token was generated, ns since the epoch",
    contract.ACCEPTANCE_RATE: "speculative decoding: the share of draft tokens accepted",
    contract.TOTAL_ACCEPTED_DRAFT_TOKENS: "speculative decoding: draft tokens accepted",
    contract.TOTAL_DRAFT_TOKENS: "speculative decoding: draft tokens proposed",
    contract.NUM_INPUT_TOKENS: "tokens of the prompt",
    contract.NUM_OUTPUT_TOKENS: "tokens generated",
    # --- preprocessing (the tokenizer step)
    contract.PRE_QUERY: "the prompt (the ensemble's text_input)",
    contract.PRE_MESSAGES: "ours: the chat messages (the ensemble's messages)",
    contract.PRE_DECODER_QUERY: "the decoder's prompt (decoder_text_input)",
    contract.PRE_REQUEST_OUTPUT_LEN: "the most new tokens (max_tokens), passed through",
    contract.PRE_BAD_WORDS_DICT: "the bad phrases (bad_words)",
    contract.PRE_STOP_WORDS_DICT: "the stop phrases (stop_words)",
    contract.PRE_EMBEDDING_BIAS_WORDS: "the biased words (embedding_bias_words)",
    contract.PRE_EMBEDDING_BIAS_WEIGHTS: "their biases (embedding_bias_weights)",
    contract.PRE_END_ID: "the client's end id, if given",
    contract.PRE_PAD_ID: "the client's pad id, if given",
    contract.PRE_PROMPT_TABLE_EXTRA_ID: "the client's prompt-table key, if given",
    contract.PRE_INPUT_ID: "the prompt's token ids, rows right-padded to the longest",
    contract.PRE_REQUEST_INPUT_LEN: "the true length of each row of INPUT_ID",
    contract.PRE_DECODER_INPUT_ID: "the decoder prompt's token ids",
    contract.PRE_REQUEST_DECODER_INPUT_LEN: "the true length of DECODER_INPUT_ID",
    contract.PRE_BAD_WORDS_IDS: "the bad phrases as a word list: row 0 their token ids, row 1 each phrase's end offset",
    contract.PRE_STOP_WORDS_IDS: "the stop phrases as a word list: row 0 their token ids, row 1 each phrase's end "
                                 "offset",
    contract.PRE_EMBEDDING_BIAS: "a bias for every token of the vocabulary, from the biased words",
    contract.PRE_OUT_END_ID: "the end id the engine uses: the client's, else the tokenizer's EOS",
    contract.PRE_OUT_PAD_ID: "the pad id the engine uses: the client's, else the tokenizer's pad or EOS",
    contract.PRE_OUT_PROMPT_TABLE_EXTRA_IDS: "per prompt token: the request's prompt-table key for a token past the "
                                             "vocabulary, else 0",
    # --- tensorrt_llm (the engine step)
    contract.INPUT_IDS: "the prompt's token ids",
    contract.ENCODER_INPUT_FEATURES: "an encoder's input features instead of token ids (Whisper, mllama)",
    contract.ENCODER_OUTPUT_LENGTHS: "the length of the encoder's output",
    contract.INPUT_LENGTHS: "the true length of each row of input_ids",
    contract.REQUEST_OUTPUT_LEN: "the most new tokens (the client's max_tokens)",
    contract.DRAFT_INPUT_IDS: "speculative decoding: the draft model's tokens",
    contract.DECODER_INPUT_IDS: "an encoder-decoder model's decoder prompt",
    contract.DECODER_INPUT_LENGTHS: "the length of decoder_input_ids",
    contract.DRAFT_LOGITS: "speculative decoding: the draft model's logits",
    contract.DRAFT_ACCEPTANCE_THRESHOLD: "speculative decoding: the probability a draft token needs to be accepted",
    contract.STOP_WORDS_LIST: "the stop phrases as a word list (preprocessing's STOP_WORDS_IDS)",
    contract.BAD_WORDS_LIST: "the bad phrases as a word list (preprocessing's BAD_WORDS_IDS)",
    contract.EMBEDDING_BIAS: "a bias added to the logits, one value per vocabulary token; empty: none",
    contract.RUNTIME_TOP_K: "top-k sampling (the client's top_k)",
    contract.RUNTIME_TOP_P: "top-p sampling (the client's top_p); 0 or less is unset",
    contract.RUNTIME_TOP_P_MIN: "the lowest top_p that top_p decay reaches",
    contract.RUNTIME_TOP_P_DECAY: "factor by which top_p decays each step",
    contract.RUNTIME_TOP_P_RESET_IDS: "the token id that resets top_p decay",
    contract.LEN_PENALTY: "beam search's length penalty (the client's length_penalty)",
    contract.EARLY_STOPPING: "beam search: stop once enough beams are finished",
    contract.BEAM_SEARCH_DIVERSITY_RATE: "beam search: how much beams are pushed apart",
    contract.STOP: "stop the running request that has the same request id",
    contract.STREAMING: "stream the answer (the client's stream); needs a decoupled model",
    contract.PROMPT_TABLE_EXTRA_IDS: "per prompt token, its prompt-table key (preprocessing's "
                                     "OUT_PROMPT_TABLE_EXTRA_IDS), for KV-cache reuse",
    contract.CROSS_ATTENTION_MASK: "the cross-attention mask (mllama)",
    contract.MROPE_ROTARY_COS_SIN: "multimodal rotary position embeddings (Qwen2-VL)",
    contract.MROPE_POSITION_DELTAS: "multimodal rotary position offsets (Qwen2-VL)",
    contract.CONTEXT_PHASE_PARAMS: "disaggregated serving: the context phase's state, handed to the generation phase",
    contract.SKIP_CROSS_ATTN_BLOCKS: "skip the cross-attention blocks (mllama)",
    contract.RETENTION_TOKEN_RANGE_STARTS: "KV-cache retention: where each token range starts",
    contract.RETENTION_TOKEN_RANGE_ENDS: "KV-cache retention: where each token range ends",
    contract.RETENTION_TOKEN_RANGE_PRIORITIES: "KV-cache retention: each range's priority",
    contract.RETENTION_TOKEN_RANGE_DURATIONS_MS: "KV-cache retention: how long each range keeps its priority",
    contract.RETENTION_DECODE_PRIORITY: "KV-cache retention: the generated tokens' priority",
    contract.RETENTION_DECODE_DURATION_MS: "KV-cache retention: how long the generated tokens keep it",
    contract.LOOKAHEAD_WINDOW_SIZE: "lookahead decoding: the window size",
    contract.LOOKAHEAD_NGRAM_SIZE: "lookahead decoding: the n-gram size",
    contract.LOOKAHEAD_VERIFICATION_SET_SIZE: "lookahead decoding: the verification set's size",
    contract.OUTPUT_IDS: "the tokens, [beams, tokens]: streamed, only the new ones; else the prompt too unless "
                         "excluded",
    contract.SEQUENCE_LENGTH: "the valid length of each beam of output_ids",
    # --- postprocessing (the detokenizer step)
    contract.POST_TOKENS_BATCH: "the engine's output_ids",
    contract.POST_SEQUENCE_LENGTH: "the engine's sequence_length",
    contract.POST_OUTPUT: "the decoded text, one string per sequence (the ensemble's text_output)",
}
