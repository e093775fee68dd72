// A test double of the part of Triton's backend API (runtime/native/triton_backend_api.h) that replay_backend.cc
// and backend_support.h call, linked into one program with the backend and replay_driver.cc in place of
// libtritonserver. Why: the error paths under test (a response factory that cannot be made, an instance state
// that cannot be set) cannot be reached through a real server, which never fails those calls on request.
//
// It keeps the API's rules a backend must follow and records what the backend did about them, one line each, in a
// log the driver prints:
//   "sent LABEL final|more error=CODE MESSAGE" or "sent LABEL final|more output_ids=1,2 sequence_length=2"
//   "released LABEL"              a request released (each release, so a second one shows)
//   "factory-deleted LABEL"       a response factory deleted (likewise)
//   "send-flags LABEL final"      a response factory's flags sent without a response
//   "used-after-release LABEL FUNCTION"  a request or its input touched after its release
//   "set-state refused"           ModelInstanceSetState failed, as switched (the switch's callback runs then)
// LABEL names the request a response, factory or input belongs to. Errors, messages, responses and factories
// are counted while alive, so that what the backend leaves undeleted shows (UnfreedObjects).
// Errors passed to ResponseSend stay the caller's, and a response handed to ResponseSend is the server's from then
// on, sent or not, as in Triton's core.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "backend_support.h"
#include "triton_backend_api.h"

struct TRITONSERVER_Error {
  TRITONSERVER_Error_Code code;
  std::string message;
};

struct TRITONSERVER_Message {
  std::string json;
};

struct TRITONBACKEND_Model {
  std::string config_json;
  std::string repository;
};

struct TRITONBACKEND_ModelInstance {
  TRITONBACKEND_Model* model = nullptr;
  std::string name;
  void* state = nullptr;
};

struct TRITONBACKEND_Request;

struct TRITONBACKEND_Input {
  TRITONBACKEND_Request* request = nullptr;
  std::string name;
  TRITONSERVER_DataType datatype = TRITONSERVER_TYPE_INVALID;
  std::vector<int64_t> shape;
  std::string bytes;
};

struct TRITONBACKEND_Request {
  std::string label;
  std::string id;
  std::deque<TRITONBACKEND_Input> inputs;  // a deque: the backend holds pointers to them while more are added
  bool released = false;
};

struct TRITONBACKEND_ResponseFactory {
  std::string label;
};

struct TRITONBACKEND_Output {
  std::string name;
  std::vector<int64_t> shape;
  std::string bytes;
};

struct TRITONBACKEND_Response {
  std::string label;
  std::deque<TRITONBACKEND_Output> outputs;
};

namespace fake_triton {
namespace {

std::mutex mutex;  // guards the log, the switches and final_responses: the backend's senders call from their threads
std::condition_variable response_sent;
std::vector<std::string> call_log;
std::set<std::string> factory_fails_for;
std::function<void()> set_state_refused;  // set: ModelInstanceSetState fails, after calling it
std::map<std::string, int> final_responses;  // by label
std::deque<std::unique_ptr<TRITONBACKEND_Request>> requests;  // kept to the end: a use after release shows
TRITONBACKEND_Model model;
TRITONBACKEND_ModelInstance instance{&model, "", nullptr};

std::atomic<int> live_errors{0}, live_messages{0}, live_responses{0}, live_factories{0};

void Record(std::string line) {
  std::lock_guard<std::mutex> lock(mutex);
  call_log.push_back(std::move(line));
}

// A request (or its input) is the server's again once released: a backend must not touch it after.
void CheckNotReleased(const TRITONBACKEND_Request* request, const char* function) {
  if (request->released) Record("used-after-release " + request->label + " " + function);
}

TRITONSERVER_Error* NewError(TRITONSERVER_Error_Code code, std::string message) {
  ++live_errors;
  return new TRITONSERVER_Error{code, std::move(message)};
}

std::string Int32s(const std::string& bytes) {
  std::string out;
  for (size_t at = 0; at + sizeof(int32_t) <= bytes.size(); at += sizeof(int32_t)) {
    int32_t value = 0;
    std::memcpy(&value, bytes.data() + at, sizeof(value));
    out += (out.empty() ? "" : ",") + std::to_string(value);
  }
  return out;
}

}  // namespace

const char* CodeName(TRITONSERVER_Error_Code code) {
  switch (code) {
    case TRITONSERVER_ERROR_UNKNOWN: return "UNKNOWN";
    case TRITONSERVER_ERROR_INTERNAL: return "INTERNAL";
    case TRITONSERVER_ERROR_NOT_FOUND: return "NOT_FOUND";
    case TRITONSERVER_ERROR_INVALID_ARG: return "INVALID_ARG";
    case TRITONSERVER_ERROR_UNAVAILABLE: return "UNAVAILABLE";
    case TRITONSERVER_ERROR_UNSUPPORTED: return "UNSUPPORTED";
    case TRITONSERVER_ERROR_ALREADY_EXISTS: return "ALREADY_EXISTS";
    case TRITONSERVER_ERROR_CANCELLED: return "CANCELLED";
  }
  return "?";
}

void SetModel(const std::string& config_json, const std::string& repository, const std::string& instance_name) {
  model.config_json = config_json;
  model.repository = repository;
  instance.name = instance_name;
}

TRITONBACKEND_ModelInstance* Instance() { return &instance; }

void FailResponseFactoryFor(const std::string& label) {
  std::lock_guard<std::mutex> lock(mutex);
  factory_fails_for.insert(label);
}

void FailModelInstanceSetState(std::function<void()> on_refusal) {
  std::lock_guard<std::mutex> lock(mutex);
  set_state_refused = std::move(on_refusal);
}

TRITONBACKEND_Request* NewRequest(const std::string& label, const std::string& id) {
  requests.push_back(std::make_unique<TRITONBACKEND_Request>());
  requests.back()->label = label;
  requests.back()->id = id;
  return requests.back().get();
}

void AddInput(TRITONBACKEND_Request* request, const std::string& name, TRITONSERVER_DataType datatype,
              const std::vector<int64_t>& shape, const void* data, size_t byte_size) {
  request->inputs.push_back({request, name, datatype, shape, std::string(static_cast<const char*>(data), byte_size)});
}

// Waits until each of `labels` has had a final response, or `timeout` passed; false then.
bool WaitForFinalResponses(const std::vector<std::string>& labels, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex);
  return response_sent.wait_for(lock, timeout, [&] {
    return std::all_of(labels.begin(), labels.end(), [](const std::string& label) {
      return final_responses.count(label) > 0;
    });
  });
}

std::vector<std::string> Log() {
  std::lock_guard<std::mutex> lock(mutex);
  return call_log;
}

std::string UnfreedObjects() {
  return "errors=" + std::to_string(live_errors) + " messages=" + std::to_string(live_messages) +
         " responses=" + std::to_string(live_responses) + " factories=" + std::to_string(live_factories);
}

}  // namespace fake_triton

namespace fake = fake_triton;

extern "C" {

TRITONSERVER_Error* TRITONSERVER_ErrorNew(TRITONSERVER_Error_Code code, const char* msg) {
  return fake::NewError(code, msg);
}

void TRITONSERVER_ErrorDelete(TRITONSERVER_Error* error) {
  if (error == nullptr) return;
  --fake::live_errors;
  delete error;
}

const char* TRITONSERVER_ErrorMessage(TRITONSERVER_Error* error) { return error->message.c_str(); }

TRITONSERVER_Error_Code TRITONSERVER_ErrorCode(TRITONSERVER_Error* error) { return error->code; }

TRITONSERVER_Error* TRITONSERVER_LogMessage(TRITONSERVER_LogLevel level, const char* filename, const int line,
                                           const char* msg) {
  std::fprintf(stderr, "log %d %s:%d %s\n", static_cast<int>(level), filename, line, msg);
  return nullptr;
}

TRITONSERVER_Error* TRITONSERVER_MessageSerializeToJson(TRITONSERVER_Message* message, const char** base,
                                                        size_t* byte_size) {
  *base = message->json.data();
  *byte_size = message->json.size();
  return nullptr;
}

TRITONSERVER_Error* TRITONSERVER_MessageDelete(TRITONSERVER_Message* message) {
  --fake::live_messages;
  delete message;
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ApiVersion(uint32_t* major, uint32_t* minor) {
  // The API this double stands in for: the one the backends are written against.
  *major = tritonforge::backend::kApiMajor;
  *minor = tritonforge::backend::kApiMinor;
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelConfig(TRITONBACKEND_Model* model, uint32_t config_version,
                                              TRITONSERVER_Message** model_config) {
  if (config_version != 1)
    return fake::NewError(TRITONSERVER_ERROR_UNSUPPORTED, "only model config version 1 is supported");
  ++fake::live_messages;
  *model_config = new TRITONSERVER_Message{model->config_json};
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelRepository(TRITONBACKEND_Model* model, TRITONBACKEND_ArtifactType* artifact_type,
                                                  const char** location) {
  *artifact_type = TRITONBACKEND_ARTIFACT_FILESYSTEM;
  *location = model->repository.c_str();
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceModel(TRITONBACKEND_ModelInstance* instance,
                                                     TRITONBACKEND_Model** model) {
  *model = instance->model;
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceName(TRITONBACKEND_ModelInstance* instance, const char** name) {
  *name = instance->name.c_str();
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceState(TRITONBACKEND_ModelInstance* instance, void** state) {
  *state = instance->state;
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceSetState(TRITONBACKEND_ModelInstance* instance, void* state) {
  std::function<void()> refused;
  {
    std::lock_guard<std::mutex> lock(fake::mutex);
    refused = fake::set_state_refused;
  }
  if (refused) {
    fake::Record("set-state refused");
    refused();
    return fake::NewError(TRITONSERVER_ERROR_INTERNAL, "fake: the instance's state cannot be set");
  }
  instance->state = state;
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportStatistics(TRITONBACKEND_ModelInstance*,
                                                              TRITONBACKEND_Request* request, bool, uint64_t,
                                                              uint64_t, uint64_t, uint64_t) {
  fake::CheckNotReleased(request, "ModelInstanceReportStatistics");
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportBatchStatistics(TRITONBACKEND_ModelInstance*, uint64_t,
                                                                   uint64_t, uint64_t, uint64_t, uint64_t) {
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_RequestId(TRITONBACKEND_Request* request, const char** id) {
  fake::CheckNotReleased(request, "RequestId");
  *id = request->id.c_str();
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_RequestInput(TRITONBACKEND_Request* request, const char* name,
                                               TRITONBACKEND_Input** input) {
  fake::CheckNotReleased(request, "RequestInput");
  for (TRITONBACKEND_Input& candidate : request->inputs) {
    if (candidate.name == name) {
      *input = &candidate;
      return nullptr;
    }
  }
  *input = nullptr;
  return fake::NewError(TRITONSERVER_ERROR_NOT_FOUND, std::string("no input ") + name);
}

TRITONSERVER_Error* TRITONBACKEND_RequestOutputCount(TRITONBACKEND_Request* request, uint32_t* count) {
  fake::CheckNotReleased(request, "RequestOutputCount");
  *count = 0;  // none named: the client wants every output
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_RequestOutputName(TRITONBACKEND_Request* request, uint32_t index, const char**) {
  fake::CheckNotReleased(request, "RequestOutputName");
  return fake::NewError(TRITONSERVER_ERROR_INVALID_ARG, "no requested output " + std::to_string(index));
}

TRITONSERVER_Error* TRITONBACKEND_RequestRelease(TRITONBACKEND_Request* request, uint32_t release_flags) {
  if (release_flags != TRITONSERVER_REQUEST_RELEASE_ALL)
    return fake::NewError(TRITONSERVER_ERROR_INVALID_ARG, "a request is released with RELEASE_ALL");
  fake::Record("released " + request->label);
  request->released = true;
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_InputProperties(TRITONBACKEND_Input* input, const char** name,
                                                  TRITONSERVER_DataType* datatype, const int64_t** shape,
                                                  uint32_t* dims_count, uint64_t* byte_size, uint32_t* buffer_count) {
  fake::CheckNotReleased(input->request, "InputProperties");
  // As in Triton, each property is written only where the caller asks for it.
  if (name != nullptr) *name = input->name.c_str();
  if (datatype != nullptr) *datatype = input->datatype;
  if (shape != nullptr) *shape = input->shape.data();
  if (dims_count != nullptr) *dims_count = static_cast<uint32_t>(input->shape.size());
  if (byte_size != nullptr) *byte_size = input->bytes.size();
  if (buffer_count != nullptr) *buffer_count = 1;
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_InputBuffer(TRITONBACKEND_Input* input, uint32_t index, const void** buffer,
                                              uint64_t* buffer_byte_size, TRITONSERVER_MemoryType* memory_type,
                                              int64_t* memory_type_id) {
  fake::CheckNotReleased(input->request, "InputBuffer");
  if (index != 0) return fake::NewError(TRITONSERVER_ERROR_INVALID_ARG, "an input of one buffer");
  *buffer = input->bytes.data();
  *buffer_byte_size = input->bytes.size();
  *memory_type = TRITONSERVER_MEMORY_CPU;
  *memory_type_id = 0;
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ResponseNew(TRITONBACKEND_Response** response, TRITONBACKEND_Request* request) {
  fake::CheckNotReleased(request, "ResponseNew");
  ++fake::live_responses;
  *response = new TRITONBACKEND_Response{request->label, {}};
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryNew(TRITONBACKEND_ResponseFactory** factory,
                                                     TRITONBACKEND_Request* request) {
  fake::CheckNotReleased(request, "ResponseFactoryNew");
  {
    std::lock_guard<std::mutex> lock(fake::mutex);
    if (fake::factory_fails_for.count(request->label) > 0) {
      *factory = nullptr;
      return fake::NewError(TRITONSERVER_ERROR_INTERNAL, "fake: no response factory for " + request->label);
    }
  }
  ++fake::live_factories;
  *factory = new TRITONBACKEND_ResponseFactory{request->label};
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryDelete(TRITONBACKEND_ResponseFactory* factory) {
  fake::Record("factory-deleted " + factory->label);
  --fake::live_factories;
  delete factory;
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ResponseFactorySendFlags(TRITONBACKEND_ResponseFactory* factory,
                                                           uint32_t send_flags) {
  {
    std::lock_guard<std::mutex> lock(fake::mutex);
    fake::call_log.push_back("send-flags " + factory->label +
                        (send_flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL ? " final" : " more"));
    if (send_flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) ++fake::final_responses[factory->label];
  }
  fake::response_sent.notify_all();
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryIsCancelled(TRITONBACKEND_ResponseFactory*, bool* is_cancelled) {
  *is_cancelled = false;
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ResponseNewFromFactory(TRITONBACKEND_Response** response,
                                                         TRITONBACKEND_ResponseFactory* factory) {
  ++fake::live_responses;
  *response = new TRITONBACKEND_Response{factory->label, {}};
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ResponseOutput(TRITONBACKEND_Response* response, TRITONBACKEND_Output** output,
                                                 const char* name, TRITONSERVER_DataType datatype,
                                                 const int64_t* shape, uint32_t dims_count) {
  if (datatype != TRITONSERVER_TYPE_INT32)
    return fake::NewError(TRITONSERVER_ERROR_UNSUPPORTED, "this double reads INT32 outputs only");
  response->outputs.push_back({name, std::vector<int64_t>(shape, shape + dims_count), ""});
  *output = &response->outputs.back();
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_OutputBuffer(TRITONBACKEND_Output* output, void** buffer, uint64_t buffer_byte_size,
                                               TRITONSERVER_MemoryType* memory_type, int64_t* memory_type_id) {
  output->bytes.assign(buffer_byte_size, '\0');
  *buffer = output->bytes.data();
  *memory_type = TRITONSERVER_MEMORY_CPU;
  *memory_type_id = 0;
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ResponseSend(TRITONBACKEND_Response* response, uint32_t send_flags,
                                               TRITONSERVER_Error* error) {
  const std::unique_ptr<TRITONBACKEND_Response> sent(response);  // the server's from here on
  --fake::live_responses;
  const bool final = send_flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL;
  std::string line = "sent " + response->label + (final ? " final" : " more");
  if (error != nullptr) {
    line += std::string(" error=") + fake::CodeName(error->code) + " " + error->message;
  } else {
    for (const TRITONBACKEND_Output& output : response->outputs)
      line += " " + output.name + "=" + fake::Int32s(output.bytes);
  }
  {
    std::lock_guard<std::mutex> lock(fake::mutex);
    fake::call_log.push_back(std::move(line));
    if (final) ++fake::final_responses[response->label];
  }
  fake::response_sent.notify_all();
  return nullptr;
}

TRITONSERVER_Error* TRITONBACKEND_ResponseDelete(TRITONBACKEND_Response* response) {
  --fake::live_responses;
  delete response;
  return nullptr;
}

}  // extern "C"
