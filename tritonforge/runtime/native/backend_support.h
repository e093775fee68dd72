// What tritonforge's C++ backends share at their edge to Triton: owned errors, log lines, the states they give
// models and instances, statistics on the clock Triton's own use, and the model's config read as JSON with its
// string parameters. Header-only; the floor of the native backends (runtime/native/), which includes nothing above
// it.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <string_view>

#include "json.h"
#include "triton_backend_api.h"

namespace tritonforge::backend {

inline uint64_t NowNs() {  // the clock Triton's own statistics use
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct ErrorDelete {
  void operator()(TRITONSERVER_Error* error) const { TRITONSERVER_ErrorDelete(error); }
};
using Error = std::unique_ptr<TRITONSERVER_Error, ErrorDelete>;  // owns an error that is not handed on

struct MessageDelete {
  void operator()(TRITONSERVER_Message* message) const { Error(TRITONSERVER_MessageDelete(message)); }
};

inline void Log(const char* backend, TRITONSERVER_LogLevel level, const char* file, int line,
                const std::string& message) {
  Error(TRITONSERVER_LogMessage(level, file, line, (std::string(backend) + ": " + message).c_str()));
}

// Logs and releases an error that nothing can be done about (a failed send, a statistics report).
inline void LogIfError(const char* backend, TRITONSERVER_Error* raw, const char* what, const char* file, int line) {
  Error error(raw);
  if (error) {
    Log(backend, TRITONSERVER_LOG_ERROR, file, line, std::string(what) + ": " + TRITONSERVER_ErrorMessage(error.get()));
  }
}

// Answers `request` with `error` as its one, final response and releases it: a request that never reached the
// backend's own work (the instance's state could not be read, its work could not be made).
inline void AnswerAndRelease(const char* backend, TRITONBACKEND_Request* request, TRITONSERVER_Error* error) {
  TRITONBACKEND_Response* response = nullptr;
  if (!Error(TRITONBACKEND_ResponseNew(&response, request)))
    LogIfError(backend, TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error), "send",
               __FILE__, __LINE__);
  LogIfError(backend, TRITONBACKEND_RequestRelease(request, TRITONSERVER_REQUEST_RELEASE_ALL), "release", __FILE__,
             __LINE__);
}

// The state a backend gave a model or an instance, typed (what ModelSetState / ModelInstanceSetState were given).
template <typename State>
TRITONSERVER_Error* StateOf(TRITONBACKEND_Model* model, State** state) {
  void* raw = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelState(model, &raw);
  *state = static_cast<State*>(raw);
  return error;
}

template <typename State>
TRITONSERVER_Error* StateOf(TRITONBACKEND_ModelInstance* instance, State** state) {
  void* raw = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelInstanceState(instance, &raw);
  *state = static_cast<State*>(raw);
  return error;
}

// Gives `state` to the model or instance, which owns it from then on, until its Finalize deletes it (DeleteState);
// one Triton refuses is deleted here, with whatever threads it runs.
template <typename State>
TRITONSERVER_Error* GiveState(TRITONBACKEND_Model* model, std::unique_ptr<State> state) {
  if (TRITONSERVER_Error* error = TRITONBACKEND_ModelSetState(model, state.get())) return error;
  state.release();
  return nullptr;
}

template <typename State>
TRITONSERVER_Error* GiveState(TRITONBACKEND_ModelInstance* instance, std::unique_ptr<State> state) {
  if (TRITONSERVER_Error* error = TRITONBACKEND_ModelInstanceSetState(instance, state.get())) return error;
  state.release();
  return nullptr;
}

// A Finalize's whole work: deletes the state the model or instance owns.
template <typename State, typename Owner>
TRITONSERVER_Error* DeleteState(Owner* owner) {
  State* state = nullptr;
  TRITONSERVER_Error* error = StateOf(owner, &state);
  delete state;
  return error;
}

// Statistics on Triton's clock, each logged and let go when Triton refuses it: one request's, answered or handed on
// now (its execution and compute one span, from `start_ns`), and its batch's, once every request of it is.
inline void ReportRequest(const char* backend, TRITONBACKEND_ModelInstance* instance, TRITONBACKEND_Request* request,
                          bool success, uint64_t start_ns) {
  const uint64_t end_ns = NowNs();
  LogIfError(backend, TRITONBACKEND_ModelInstanceReportStatistics(instance, request, success, start_ns, start_ns,
                                                                  end_ns, end_ns),
             "statistics", __FILE__, __LINE__);
}

inline void ReportBatch(const char* backend, TRITONBACKEND_ModelInstance* instance, uint32_t count, uint64_t start_ns) {
  const uint64_t end_ns = NowNs();
  LogIfError(backend, TRITONBACKEND_ModelInstanceReportBatchStatistics(instance, count, start_ns, start_ns, end_ns,
                                                                       end_ns),
             "batch statistics", __FILE__, __LINE__);
}

// A response allocator's pair for the models a backend calls in-process: their outputs land in plain CPU memory
// the backend owns until it deletes the response.
inline TRITONSERVER_Error* AllocateCpu(TRITONSERVER_ResponseAllocator*, const char*, size_t byte_size,
                                       TRITONSERVER_MemoryType, int64_t, void*, void** buffer, void** buffer_userp,
                                       TRITONSERVER_MemoryType* actual_memory_type, int64_t* actual_memory_type_id) {
  *buffer = byte_size == 0 ? nullptr : std::malloc(byte_size);
  *buffer_userp = nullptr;
  *actual_memory_type = TRITONSERVER_MEMORY_CPU;
  *actual_memory_type_id = 0;
  if (byte_size != 0 && *buffer == nullptr) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, "out of memory");
  return nullptr;
}

inline TRITONSERVER_Error* DeallocateCpu(TRITONSERVER_ResponseAllocator*, void* buffer, void*, size_t,
                                         TRITONSERVER_MemoryType, int64_t) {
  std::free(buffer);
  return nullptr;
}

// The TRITONBACKEND API these backends are written against: Triton 2.51's, 1.19 (its libtritonserver's
// TRITONBACKEND_ApiVersion; tests/unit/builder/test_native_checks.py reads it there). A server of another major
// version, or an older minor one, may lack what they call: the backend refuses to load there, as NVIDIA's do.
constexpr uint32_t kApiMajor = 1;
constexpr uint32_t kApiMinor = 19;

inline TRITONSERVER_Error* CheckApiVersion(const char* backend) {
  uint32_t major = 0, minor = 0;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ApiVersion(&major, &minor)) return error;
  if (major == kApiMajor && minor >= kApiMinor) return nullptr;
  const std::string message = std::string(backend) + ": this server's backend API is " + std::to_string(major) +
                              "." + std::to_string(minor) + "; this backend needs " + std::to_string(kApiMajor) +
                              "." + std::to_string(kApiMinor) + " or a later 1.x (Triton 2.51 or newer)";
  return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, message.c_str());
}

// The model's config as Triton holds it (JSON), parsed.
inline TRITONSERVER_Error* ReadConfig(TRITONBACKEND_Model* model, json::Value* config) {
  TRITONSERVER_Message* raw = nullptr;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ModelConfig(model, 1, &raw)) return error;
  std::unique_ptr<TRITONSERVER_Message, MessageDelete> message(raw);
  const char* text = nullptr;
  size_t size = 0;
  if (TRITONSERVER_Error* error = TRITONSERVER_MessageSerializeToJson(message.get(), &text, &size)) return error;
  try {
    *config = json::Parse(std::string_view(text, size));
  } catch (const std::exception& error) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL,
                                 (std::string("the model config is not JSON: ") + error.what()).c_str());
  }
  return nullptr;
}

// The string value of a config parameter, "" when absent (Triton keeps parameters as strings).
inline std::string Parameter(const json::Value& config, const char* key) {
  const json::Value* parameters = config.Find("parameters");
  const json::Value* entry = parameters == nullptr ? nullptr : parameters->Find(key);
  const json::Value* value = entry == nullptr ? nullptr : entry->Find("string_value");
  return value != nullptr && value->kind == json::Value::Kind::kString ? value->text : "";
}

inline bool Decoupled(const json::Value& config) {
  const json::Value* policy = config.Find("model_transaction_policy");
  const json::Value* decoupled = policy == nullptr ? nullptr : policy->Find("decoupled");
  return decoupled != nullptr && decoupled->kind == json::Value::Kind::kBool && decoupled->boolean;
}

}  // namespace tritonforge::backend
