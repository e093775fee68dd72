// Drives coalescing.h (tritonforge/runtime/engine/coalescer/) for tests/unit/runtime/engine/test_coalescing.py,
// without Triton. Reads one request's engine responses from stdin, one a line, and prints the responses the
// coalescer would send, one a line.
//   in:  "fold 1" (the request streams at beam width 1) or "fold 0", "top <k>" (each token's k likeliest
//        alternatives: ids 100 * id + j, log probs -j), then per response
//        "R <batch_index> <sequence_index> <beams> <tokens a beam> <first token id>"  (log prob of token t: -t/10,
//        cum_log_probs the response's first token id, context_logits on the first response only), or "E <message>"
//   out: "R <batch_index> <sequence_index> <shape of output_ids> | <ids> | <sequence_length> | <log probs> |
//        <cum_log_probs> | <context_logits present> | <engine responses>[ | <shape of top_token_ids> | <their ids>
//        | <their log probs>]", or "E <message>"
#include <iostream>
#include <sstream>
#include <string>

#include "coalescing.h"

namespace c = tritonforge::coalescing;

constexpr int kFp32 = 11;  // TRITONSERVER_TYPE_FP32

template <typename T>
c::Tensor Make(int datatype, std::vector<int64_t> shape, const std::vector<T>& values) {
  c::Tensor tensor;
  tensor.datatype = datatype;
  tensor.shape = std::move(shape);
  tensor.data.assign(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
  return tensor;
}

template <typename T>
std::vector<T> Values(const c::Tensor& tensor) {
  std::vector<T> values(tensor.data.size() / sizeof(T));
  std::memcpy(values.data(), tensor.data.data(), tensor.data.size());
  return values;
}

// " <shape>, |" then " <value>" each: a tensor as the output line shows it.
template <typename T>
void PrintShapeAndValues(const c::Tensor& tensor) {
  for (int64_t dim : tensor.shape) std::cout << dim << ",";
  std::cout << " |";
  for (T value : Values<T>(tensor)) std::cout << " " << value;
}

int main() {
  std::string word;
  int fold = 0, top = 0;
  std::cin >> word >> fold >> word >> top;
  c::Pending pending(fold != 0);
  bool first = true;
  std::string line;
  std::getline(std::cin, line);
  while (std::getline(std::cin, line)) {
    std::istringstream in(line);
    std::string kind;
    in >> kind;
    c::Response response;
    if (kind == "E") {
      response.failed = true;
      std::getline(in, response.error_message);
    } else if (kind == "R") {
      int32_t batch = 0, sequence = 0, beams = 0, tokens = 0, id = 0;
      in >> batch >> sequence >> beams >> tokens >> id;
      std::vector<int32_t> ids;
      std::vector<float> log_probs;
      for (int b = 0; b < beams; ++b)
        for (int t = 0; t < tokens; ++t) {
          ids.push_back(id + t);
          log_probs.push_back(-(id + t) / 10.0f);
        }
      response.tensors[c::kOutputIds] = Make(c::kInt32, {1, beams, tokens}, ids);
      response.tensors[c::kSequenceLength] = Make(c::kInt32, {1, beams}, std::vector<int32_t>(beams, tokens));
      response.tensors[c::kOutputLogProbs] = Make(kFp32, {1, beams, tokens}, log_probs);
      response.tensors["cum_log_probs"] = Make(kFp32, {1, beams}, std::vector<float>(beams, float(id)));
      response.tensors[c::kBatchIndex] = Make(c::kInt32, {1, 1}, std::vector<int32_t>{batch});
      response.tensors[c::kSequenceIndex] = Make(c::kInt32, {1, 1}, std::vector<int32_t>{sequence});
      if (top > 0) {
        std::vector<int32_t> top_ids;
        std::vector<float> top_log_probs;
        for (int b = 0; b < beams; ++b)
          for (int t = 0; t < tokens; ++t)
            for (int j = 0; j < top; ++j) {
              top_ids.push_back(100 * (id + t) + j);
              top_log_probs.push_back(-float(j));
            }
        response.tensors[c::kTopTokenIds] = Make(c::kInt32, {1, beams, tokens, top}, top_ids);
        response.tensors[c::kTopLogProbs] = Make(kFp32, {1, beams, tokens, top}, top_log_probs);
      }
      if (first) response.tensors["context_logits"] = Make(kFp32, {1, 1, 2}, std::vector<float>{0.5f, 0.25f});
      first = false;
    } else {
      continue;
    }
    pending.Add(std::move(response));
  }
  for (const c::Response& response : pending.Take()) {
    if (response.failed) {
      std::cout << "E" << response.error_message << "\n";
      continue;
    }
    const auto& t = response.tensors;
    std::cout << "R " << Values<int32_t>(t.at(c::kBatchIndex))[0] << " " << Values<int32_t>(t.at(c::kSequenceIndex))[0]
              << " ";
    PrintShapeAndValues<int32_t>(t.at(c::kOutputIds));
    std::cout << " |";
    for (int32_t length : Values<int32_t>(t.at(c::kSequenceLength))) std::cout << " " << length;
    std::cout << " |";
    for (float p : Values<float>(t.at(c::kOutputLogProbs))) std::cout << " " << p;
    std::cout << " | " << Values<float>(t.at("cum_log_probs"))[0] << " | " << t.count("context_logits") << " | "
              << response.engine_responses;
    if (t.count(c::kTopTokenIds)) {
      std::cout << " | ";
      PrintShapeAndValues<int32_t>(t.at(c::kTopTokenIds));
      std::cout << " |";
      for (float p : Values<float>(t.at(c::kTopLogProbs))) std::cout << " " << p;
    }
    std::cout << "\n";
  }
  return 0;
}
