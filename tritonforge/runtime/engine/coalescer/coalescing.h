// The rules by which the coalescer folds an engine's streamed responses into fewer, larger ones, free of Triton
// (coalescer_backend.cc is their edge). A response is a set of named tensors, as the tensorrtllm backend sends it
// for one row of one request (batch dim 1):
//
// | output                                   | streamed at beam width 1           | folded                           |
// | output_ids [1, 1, T], output_log_probs   | the new tokens (and their log      | appended along the token axis    |
// |   [1, 1, T], generation_logits [1,1,T,V],|   probabilities, logits, likeliest |                                  |
// |   top_token_ids, top_log_probs [1,1,T,k] |   alternatives: ours)              |                                  |
// | sequence_length [1, 1], num_output_tokens| the new tokens' count              | summed                           |
// | batch_index, sequence_index [1, 1]       | which row / returned sequence      | never folded across two values   |
// | everything else (cum_log_probs, context  | the state after this response, or  | the latest response's value      |
// |   logits, statistics, ...)               |   sent once                        |   (one sent once is kept)        |
//
// Beam search streams whole beams each time and a non-streamed request answers once: there nothing is folded,
// every response goes out as the engine sent it. A response whose tensors do not have the shapes above (another
// engine's extension) is never folded either: it waits behind the ones before it and goes out as it came.
#pragma once

#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "contract.h"

namespace tritonforge::coalescing {

// The engine's output names (facts/contract.py, through the generated contract.h).
using contract::kBatchIndex;
using contract::kGenerationLogits;
using contract::kNumOutputTokens;
using contract::kOutputIds;
using contract::kOutputLogProbs;
using contract::kSequenceIndex;
using contract::kSequenceLength;
using contract::kTopLogProbs;
using contract::kTopTokenIds;

struct Tensor {
  int datatype = 0;  // Triton's TRITONSERVER_DataType, kept as the engine sent it
  std::vector<int64_t> shape;
  std::string data;  // the bytes, row-major
};

// One response to send: the engine's tensors, folded, or an error that ends the stream.
struct Response {
  std::map<std::string, Tensor> tensors;
  bool failed = false;
  int error_code = 0;
  std::string error_message;
  int64_t engine_responses = 0;  // how many of the engine's responses it carries
};

enum class Fold { kAppend, kSum, kKey, kLatest };

inline Fold FoldOf(const std::string& name) {
  if (name == kOutputIds || name == kOutputLogProbs || name == kGenerationLogits || name == kTopTokenIds ||
      name == kTopLogProbs)
    return Fold::kAppend;
  if (name == kSequenceLength || name == kNumOutputTokens) return Fold::kSum;
  if (name == kBatchIndex || name == kSequenceIndex) return Fold::kKey;
  return Fold::kLatest;
}

constexpr int kInt32 = 8;  // TRITONSERVER_TYPE_INT32

// [1, 1, T, ...]: one row, one beam, T tokens; appending along T is appending the bytes.
inline bool TokenAxisShape(const Tensor& tensor) {
  return tensor.shape.size() >= 3 && tensor.shape[0] == 1 && tensor.shape[1] == 1;
}

inline bool ScalarInt32(const Tensor& tensor) {
  int64_t elements = 1;
  for (int64_t dim : tensor.shape) elements *= dim;
  return tensor.datatype == kInt32 && elements == 1 && tensor.data.size() == 4;
}

inline int32_t Int32Of(const Tensor& tensor) {
  int32_t value = 0;
  std::memcpy(&value, tensor.data.data(), sizeof(value));
  return value;
}

// Whether `next` may be folded into `into`: every tensor of either is foldable by its rule and both belong to the
// same row and returned sequence.
inline bool Foldable(const Response& into, const Response& next) {
  if (into.failed || next.failed) return false;
  for (const auto& [name, tensor] : next.tensors) {
    const auto found = into.tensors.find(name);
    const Fold fold = FoldOf(name);
    if (fold == Fold::kLatest) continue;
    if (found == into.tensors.end()) return false;  // a token tensor in one response only: not the stream we know
    const Tensor& old = found->second;
    if (old.datatype != tensor.datatype) return false;
    switch (fold) {
      case Fold::kAppend: {
        if (!TokenAxisShape(old) || !TokenAxisShape(tensor) || old.shape.size() != tensor.shape.size()) return false;
        for (size_t axis = 3; axis < old.shape.size(); ++axis)
          if (old.shape[axis] != tensor.shape[axis]) return false;
        break;
      }
      case Fold::kSum:
        if (!ScalarInt32(old) || !ScalarInt32(tensor)) return false;
        break;
      case Fold::kKey:
        if (old.data != tensor.data) return false;
        break;
      case Fold::kLatest:
        break;
    }
  }
  for (const auto& [name, tensor] : into.tensors)  // a token tensor the next response lacks
    if (FoldOf(name) != Fold::kLatest && next.tensors.count(name) == 0) return false;
  return true;
}

// Folds `next` into `into`; call only when Foldable.
inline void FoldInto(Response* into, Response next) {
  for (auto& [name, tensor] : next.tensors) {
    Tensor& old = into->tensors[name];
    switch (FoldOf(name)) {
      case Fold::kAppend:
        old.data += tensor.data;
        old.shape[2] += tensor.shape[2];
        break;
      case Fold::kSum: {
        const int32_t sum = Int32Of(old) + Int32Of(tensor);
        std::memcpy(old.data.data(), &sum, sizeof(sum));
        break;
      }
      case Fold::kKey:
        break;
      case Fold::kLatest:
        old = std::move(tensor);
        break;
    }
  }
  into->engine_responses += next.engine_responses;
}

// What waits to be sent for one request: responses in the engine's order, a new one folded into the last waiting
// one of its row and sequence when the request streams at beam width 1 and the two are foldable.
class Pending {
 public:
  explicit Pending(bool foldable) : foldable_(foldable) {}

  void Add(Response next) {
    next.engine_responses = 1;
    if (foldable_ && !next.failed) {
      // Into the last response of its row and sequence: each keeps its order (rows and sequences are streams
      // of their own, told apart by the client through batch_index and sequence_index).
      for (auto it = waiting_.rbegin(); it != waiting_.rend(); ++it) {
        if (it->failed) break;  // nothing moves ahead of an error
        if (!SameKey(*it, next)) continue;
        if (Foldable(*it, next)) return FoldInto(&*it, std::move(next));
        break;
      }
    }
    waiting_.push_back(std::move(next));
  }

  bool empty() const { return waiting_.empty(); }
  std::vector<Response> Take() { return std::exchange(waiting_, {}); }

 private:
  static std::string KeyOf(const Response& response, const char* name) {
    const auto found = response.tensors.find(name);
    return found == response.tensors.end() ? std::string() : found->second.data;
  }
  static bool SameKey(const Response& a, const Response& b) {
    return KeyOf(a, kBatchIndex) == KeyOf(b, kBatchIndex) && KeyOf(a, kSequenceIndex) == KeyOf(b, kSequenceIndex);
  }

  bool foldable_;
  std::vector<Response> waiting_;
};

}  // namespace tritonforge::coalescing
