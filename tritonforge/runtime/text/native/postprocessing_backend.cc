// The postprocessing model as a C++ Triton backend ("tritonforge_postprocessing"): token ids in, the exact
// UTF-8 bytes of their text out, the same bytes as the Python model (postprocessing/1/model.py) for every
// request. Why C++: at one token a response, the Python stub's ~200 us of CPU a response is most of the
// pipeline's cost; here a response costs a few microseconds.
//
// | input           | dtype | dims (after the batch dim) |                                 |
// | TOKENS_BATCH    | INT32 | [-1, -1]                   | [beams, tokens]                 |
// | SEQUENCE_LENGTH | INT32 | [-1]                       | valid tokens per beam           |
// | top_token_ids   | INT32 | [-1, -1, -1]               | ours, optional: [beams, tokens, k], the engine's |
// |                 |       |                            |   likeliest tokens beside each token             |
// | output          |       |                            |                                 |
// | OUTPUT          | BYTES | [-1]                       | one string per beam, flat: [B * beams] |
// | token_bytes     | BYTES | [-1, -1]                   | ours, with top_token_ids: each token's bytes, [beams, tokens] |
// | top_token_bytes | BYTES | [-1, -1, -1]               | ours, with top_token_ids: each of those's bytes  |
//
// One response per request, in order, each decoded alone (stateless: streamed chunks may go to any instance;
// a character split across two responses shows as U+FFFD in each, as in Python). A request Python refuses
// with INVALID_ARG gets the same message; one bad request never fails the others of its batch.
// Config parameters, as the Python model's (PostprocessingParameters): `tokenizer_dir` (required; relative
// to the model's folder), where the build saved the byte table (detokenizer.h). The table is loaded once per
// model and shared, read-only, by every instance; each instance's Execute runs on that instance's own thread
// and keeps no state past its return.

#include <chrono>
#include <cstring>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "detokenizer.h"
#include "triton_backend_api.h"
#include "backend_support.h"

namespace {

namespace text = tritonforge::text;
namespace backend = tritonforge::backend;

using tritonforge::contract::kInternalPrefix;  // facts/, through contract.h
using tritonforge::contract::kPostOutput;
using tritonforge::contract::kTokenBytes;
using tritonforge::contract::kTopTokenBytes;
using tritonforge::contract::kTopTokenIds;
constexpr const char* kTokenizerDir = tritonforge::contract::kPostprocessingParameterTokenizerDir;

constexpr char kBackend[] = "tritonforge_postprocessing";

using backend::Decoupled;
using backend::Error;
using backend::NowNs;
using backend::Parameter;
using backend::ReadConfig;

void Log(TRITONSERVER_LogLevel level, int line, const std::string& message) {
  backend::Log(kBackend, level, __FILE__, line, message);
}

void LogIfError(TRITONSERVER_Error* raw, const char* what, int line) {
  backend::LogIfError(kBackend, raw, what, __FILE__, line);
}

TRITONSERVER_Error* NewError(TRITONSERVER_Error_Code code, const std::string& message) {
  return TRITONSERVER_ErrorNew(code, message.c_str());
}

struct ModelState {
  text::TokenBytes table;
};

// An INT32 input named `name`, copied out (its buffers may be several, and need not be aligned for int32).
TRITONSERVER_Error* ReadInt32(TRITONBACKEND_Input* input, const char* name, std::vector<int32_t>* values,
                              std::vector<int64_t>* shape) {
  TRITONSERVER_DataType datatype = TRITONSERVER_TYPE_INVALID;
  const int64_t* dims = nullptr;
  uint32_t rank = 0, buffers = 0;
  uint64_t byte_size = 0;
  if (TRITONSERVER_Error* error =
          TRITONBACKEND_InputProperties(input, nullptr, &datatype, &dims, &rank, &byte_size, &buffers))
    return error;
  if (datatype != TRITONSERVER_TYPE_INT32)
    return NewError(TRITONSERVER_ERROR_INVALID_ARG, std::string(name) + ": must be INT32");
  shape->assign(dims, dims + rank);
  uint64_t count = 1;
  for (int64_t dim : *shape) {
    if (dim < 0 || (dim > 0 && count > UINT64_MAX / 4 / static_cast<uint64_t>(dim)))
      return NewError(TRITONSERVER_ERROR_INVALID_ARG, std::string(name) + ": a shape of no size");
    count *= static_cast<uint64_t>(dim);
  }
  if (count * sizeof(int32_t) != byte_size)  // Triton passes a batch of 0 rows with its shape but no data
    return NewError(TRITONSERVER_ERROR_INVALID_ARG, std::string(name) + ": " + std::to_string(byte_size) +
                                                        " bytes do not fill its shape");
  values->resize(count);
  char* into = reinterpret_cast<char*>(values->data());
  for (uint32_t i = 0; i < buffers; ++i) {
    const void* buffer = nullptr;
    uint64_t size = 0;
    TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
    int64_t memory_id = 0;
    if (TRITONSERVER_Error* error = TRITONBACKEND_InputBuffer(input, i, &buffer, &size, &memory_type, &memory_id))
      return error;
    if (memory_type == TRITONSERVER_MEMORY_GPU)
      return NewError(TRITONSERVER_ERROR_UNSUPPORTED, std::string(name) + ": GPU memory is not read, send it in "
                                                      "CPU memory");
    if (size > byte_size - (into - reinterpret_cast<char*>(values->data())))
      return NewError(TRITONSERVER_ERROR_INTERNAL, std::string(name) + ": buffers larger than the tensor");
    if (size > 0) std::memcpy(into, buffer, size);
    into += size;
  }
  return nullptr;
}

TRITONSERVER_Error* ReadInt32(TRITONBACKEND_Request* request, const char* name, std::vector<int32_t>* values,
                              std::vector<int64_t>* shape) {
  TRITONBACKEND_Input* input = nullptr;
  if (Error missing{TRITONBACKEND_RequestInput(request, name, &input)})
    return NewError(TRITONSERVER_ERROR_INVALID_ARG, std::string(name) + ": missing");
  return ReadInt32(input, name, values, shape);
}

bool Requested(TRITONBACKEND_Request* request, const char* name) {
  uint32_t count = 0;
  LogIfError(TRITONBACKEND_RequestOutputCount(request, &count), "output count", __LINE__);
  if (count == 0) return true;  // none named: every output
  for (uint32_t i = 0; i < count; ++i) {
    const char* requested = nullptr;
    LogIfError(TRITONBACKEND_RequestOutputName(request, i, &requested), "output name", __LINE__);
    if (requested != nullptr && std::strcmp(requested, name) == 0) return true;
  }
  return false;
}

// A BYTES output of `shape` made of `elements`, one serialized element each (4-byte length, then the bytes).
TRITONSERVER_Error* AddBytesOutput(TRITONBACKEND_Response* response, const char* name, const std::vector<int64_t>& shape,
                                   const std::string& serialized) {
  TRITONBACKEND_Output* output = nullptr;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ResponseOutput(response, &output, name, TRITONSERVER_TYPE_BYTES,
                                                               shape.data(), static_cast<uint32_t>(shape.size())))
    return error;
  void* buffer = nullptr;
  TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
  int64_t memory_id = 0;
  if (TRITONSERVER_Error* error = TRITONBACKEND_OutputBuffer(output, &buffer, serialized.size(), &memory_type,
                                                             &memory_id))
    return error;
  if (memory_type == TRITONSERVER_MEMORY_GPU && !serialized.empty())
    return NewError(TRITONSERVER_ERROR_UNSUPPORTED, std::string(name) + ": GPU memory is not written, ask for it in "
                                                    "CPU memory");
  if (!serialized.empty()) std::memcpy(buffer, serialized.data(), serialized.size());
  return nullptr;
}

// With the engine's likeliest tokens beside each token (the ensemble's num_top_log_probs): token_bytes, each
// token's bytes ([B, beams, tokens]; none past its beam's length), and top_token_bytes, each alternative's
// (Postprocessor.log_prob_bytes). `tokens_shape` is TOKENS_BATCH's, already checked against `lengths`.
TRITONSERVER_Error* AnswerLogProbBytes(const ModelState& state, TRITONBACKEND_Request* request,
                                       TRITONBACKEND_Response* response, const std::vector<int32_t>& tokens,
                                       std::vector<int64_t> tokens_shape, const std::vector<int32_t>& lengths) {
  TRITONBACKEND_Input* input = nullptr;
  if (Error absent{TRITONBACKEND_RequestInput(request, kTopTokenIds, &input)}) return nullptr;  // not asked
  std::vector<int32_t> top;
  std::vector<int64_t> top_shape;
  if (TRITONSERVER_Error* error = ReadInt32(input, kTopTokenIds, &top, &top_shape)) return error;
  auto bytes_of = [&state](int32_t id, std::string* serialized) {
    std::string one;
    state.table.AppendDecode(&id, 1, &one);  // an id outside the vocabulary (padding): no bytes
    text::AppendBytesElement(one, serialized);
  };
  if (tokens_shape.size() == 2) tokens_shape.insert(tokens_shape.begin() + 1, 1);  // [B, tokens]: one beam
  if (Requested(request, kTokenBytes)) {
    const int64_t length_of_row = tokens_shape[2];
    std::string serialized;
    for (size_t index = 0; index < tokens.size(); ++index) {
      const int64_t beam_row = static_cast<int64_t>(index) / length_of_row;
      const bool valid = static_cast<int64_t>(index % length_of_row) < lengths[static_cast<size_t>(beam_row)];
      bytes_of(valid ? tokens[index] : -1, &serialized);
    }
    if (TRITONSERVER_Error* error = AddBytesOutput(response, kTokenBytes, tokens_shape, serialized)) return error;
  }
  if (Requested(request, kTopTokenBytes)) {
    std::string serialized;
    for (int32_t id : top) bytes_of(id, &serialized);
    if (TRITONSERVER_Error* error = AddBytesOutput(response, kTopTokenBytes, top_shape, serialized)) return error;
  }
  return nullptr;
}

// One request's OUTPUT, added to `response`; an error (its response's, not yet sent) when it is refused.
TRITONSERVER_Error* Answer(const ModelState& state, TRITONBACKEND_Request* request, TRITONBACKEND_Response* response) {
  std::vector<int32_t> tokens, lengths;
  std::vector<int64_t> tokens_shape, lengths_shape;
  if (TRITONSERVER_Error* error = ReadInt32(request, text::kPostTokensBatch, &tokens, &tokens_shape)) return error;
  if (TRITONSERVER_Error* error = ReadInt32(request, text::kPostSequenceLength, &lengths, &lengths_shape)) return error;
  std::string serialized;
  size_t elements = 0;
  const auto problem = text::DecodeBatch(state.table, tokens.data(), tokens_shape, lengths.data(), lengths.size(),
                                         &serialized, &elements);
  if (problem) return NewError(TRITONSERVER_ERROR_INVALID_ARG, problem->message());
  if (Requested(request, kPostOutput)) {
    const std::vector<int64_t> shape = {static_cast<int64_t>(elements)};  // flat, as NVIDIA's postprocessing answers
    if (TRITONSERVER_Error* error = AddBytesOutput(response, kPostOutput, shape, serialized)) return error;
  }
  return AnswerLogProbBytes(state, request, response, tokens, tokens_shape, lengths);
}

}  // namespace

extern "C" {

// Loads only into a server whose backend API has what this backend calls.
TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend*) { return backend::CheckApiVersion(kBackend); }

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  const char* name = nullptr;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ModelName(model, &name)) return error;
  tritonforge::json::Value config;
  if (TRITONSERVER_Error* error = ReadConfig(model, &config)) return error;
  if (Decoupled(config))
    return NewError(TRITONSERVER_ERROR_INVALID_ARG, std::string(name) + ": tritonforge_postprocessing answers each "
                                                    "request with one response: its config must not be decoupled");
  const std::string tokenizer_dir = Parameter(config, kTokenizerDir);
  if (tokenizer_dir.empty())
    return NewError(TRITONSERVER_ERROR_INVALID_ARG, std::string(name) + ": config parameter '" + kTokenizerDir +
                                                    "' is required by tritonforge_postprocessing");
  TRITONBACKEND_ArtifactType artifact = TRITONBACKEND_ARTIFACT_FILESYSTEM;
  const char* location = nullptr;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ModelRepository(model, &artifact, &location)) return error;
  // Relative to the model's folder, resolved as triton_adapter.resolve_path does, so a repository mounts anywhere.
  std::error_code unresolved;
  std::filesystem::path joined = std::filesystem::path(location) / tokenizer_dir;
  std::filesystem::path resolved = std::filesystem::weakly_canonical(joined, unresolved);
  const std::string path = (unresolved ? joined : resolved).string();
  std::unique_ptr<ModelState> state;
  try {
    state.reset(new ModelState{text::TokenBytes::Load(path)});
  } catch (const std::exception& error) {  // nothing may cross the C ABI into the server
    return NewError(TRITONSERVER_ERROR_INVALID_ARG, std::string(name) + ": " + error.what());
  }
  Log(TRITONSERVER_LOG_INFO, __LINE__, std::string(name) + ": " + std::to_string(state->table.size()) +
                                           " token byte strings from " + path);
  return backend::GiveState(model, std::move(state));
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  return backend::DeleteState<ModelState>(model);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, const uint32_t count) {
  // From here every request is ours: each gets its response and is released, whatever fails.
  TRITONBACKEND_Model* model = nullptr;
  ModelState* state = nullptr;
  Error failed(TRITONBACKEND_ModelInstanceModel(instance, &model));
  if (!failed) failed.reset(backend::StateOf(model, &state));
  const uint64_t batch_start_ns = NowNs();
  for (uint32_t i = 0; i < count; ++i) {
    TRITONBACKEND_Request* request = requests[i];
    const uint64_t start_ns = NowNs();
    TRITONBACKEND_Response* response = nullptr;
    Error error(TRITONBACKEND_ResponseNew(&response, request));
    if (!error) {
      try {
        error.reset(failed ? NewError(TRITONSERVER_ERROR_INTERNAL, TRITONSERVER_ErrorMessage(failed.get()))
                           : Answer(*state, request, response));
      } catch (const std::exception& exception) {  // out of memory: this request fails, not the server
        error.reset(NewError(TRITONSERVER_ERROR_INTERNAL, std::string(kInternalPrefix) + exception.what()));
      }
      if (error) {  // an error response carries no half-made outputs
        LogIfError(TRITONBACKEND_ResponseDelete(response), "delete response", __LINE__);
        response = nullptr;
        LogIfError(TRITONBACKEND_ResponseNew(&response, request), "new response", __LINE__);
      }
      if (response != nullptr)  // the send takes the response; the error stays ours
        LogIfError(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error.get()),
                   "send response", __LINE__);
    } else {
      Log(TRITONSERVER_LOG_ERROR, __LINE__, std::string("new response: ") + TRITONSERVER_ErrorMessage(error.get()));
    }
    backend::ReportRequest(kBackend, instance, request, !error, start_ns);
    LogIfError(TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL), "release request", __LINE__);
  }
  backend::ReportBatch(kBackend, instance, count, batch_start_ns);
  return nullptr;
}

}  // extern "C"
