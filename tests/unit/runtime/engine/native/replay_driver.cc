// Drives the replay backend (runtime/engine/replay/replay_backend.cc) through fake_triton_api.cc, as Triton would
// call it, for tests/unit/runtime/engine/test_replay_error_paths.py.
//   replay_driver SCENARIO FOLDER TOKEN_FILE
// FOLDER is the model's repository folder (also the heartbeat folder, so the engine's stop watch runs as under
// `tritonforge serve`); TOKEN_FILE, in it, the token ids the backend reads. Scenarios:
//   serves           one streaming request (request_output_len 3)
//   factory-fails    a batch of three requests whose second one's response factory cannot be made
//   bad-request      a batch of a request without request_output_len and one whose input_ids are FP32
//   set-state-fails  an instance whose state cannot be set (three sender threads); prints "threads-at-refusal N"
//   thread-fails     an instance (three senders) whose second thread cannot start (the system refuses it), then
//                    one whose fourth, the stop watch's, cannot
//   bad-token-file   an instance initialized with TOKEN_FILE, which the test makes malformed
//   bad-parameter    an instance for each numeric parameter given a value that is not a number or out of range
// Every request's prompt is kPrompt, so its tokens start at offset 3 of the token file.
// Prints the outcome of each call into the backend ("NAME ok", "NAME error=CODE MESSAGE", "NAME threw WHAT"),
// then the calls the fake recorded, one a line, then "threads-left N" (threads still running beyond those before
// the backend started) and "unfreed ..." (the fake's objects the backend never deleted).
#include <dirent.h>
#include <dlfcn.h>
#include <pthread.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "contract.h"
#include "triton_backend_api.h"

// What the backend defines for the server to call (tritonbackend.h).
extern "C" {
TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend* backend);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, const uint32_t count);
}

// The fake's controls (fake_triton_api.cc); a declaration that differs from its definition does not link.
namespace fake_triton {
const char* CodeName(TRITONSERVER_Error_Code code);
void SetModel(const std::string& config_json, const std::string& repository, const std::string& instance_name);
TRITONBACKEND_ModelInstance* Instance();
void FailResponseFactoryFor(const std::string& label);
void FailModelInstanceSetState(std::function<void()> on_refusal);
TRITONBACKEND_Request* NewRequest(const std::string& label, const std::string& id);
void AddInput(TRITONBACKEND_Request* request, const std::string& name, TRITONSERVER_DataType datatype,
              const std::vector<int64_t>& shape, const void* data, size_t byte_size);
bool WaitForFinalResponses(const std::vector<std::string>& labels, std::chrono::milliseconds timeout);
std::vector<std::string> Log();
std::string UnfreedObjects();
}  // namespace fake_triton

namespace {

namespace contract = tritonforge::contract;
namespace fake = fake_triton;

using Parameters = std::vector<std::pair<const char*, std::string>>;

const std::vector<int32_t> kPrompt = {1, 2};
std::atomic<int> threads_allowed{-1};  // how many more threads may start; -1: any number
// Long enough for a slow (sanitized) run; a broken backend that never answers ends the wait.
constexpr std::chrono::seconds kResponseTimeout{20};

int Threads() {
  DIR* tasks = opendir("/proc/self/task");
  if (tasks == nullptr) return -1;
  int count = 0;
  while (const dirent* entry = readdir(tasks)) count += entry->d_name[0] != '.';
  closedir(tasks);
  return count;
}

// Threads running beyond `baseline`. A joined thread leaves /proc/self/task a moment after its joiner wakes (the
// kernel reaps it after waking the joiner), so this reads again for up to a second while some seem left.
int ThreadsLeft(int baseline) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  int left = Threads() - baseline;
  while (left > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    left = Threads() - baseline;
  }
  return left;
}

// A backend call as the server makes it, and what came back; an exception is caught here to say so, where in the
// server it would cross the C ABI and end the process.
bool Call(const std::string& what, const std::function<TRITONSERVER_Error*()>& call) {
  TRITONSERVER_Error* error = nullptr;
  try {
    error = call();
  } catch (const std::exception& failure) {
    std::printf("%s threw %s\n", what.c_str(), failure.what());
    return false;
  } catch (...) {
    std::printf("%s threw\n", what.c_str());
    return false;
  }
  if (error == nullptr) {
    std::printf("%s ok\n", what.c_str());
    return true;
  }
  std::printf("%s error=%s %s\n", what.c_str(), fake::CodeName(TRITONSERVER_ErrorCode(error)),
              TRITONSERVER_ErrorMessage(error));
  TRITONSERVER_ErrorDelete(error);
  return false;
}

// The parameters the build writes for the C++ replay engine (builder/engines/replay.py), at a 1 ms step.
Parameters BuiltParameters(const std::string& token_file, int sender_threads) {
  return {{contract::kReplayParameterReplayTokens, token_file},
          {contract::kReplayParameterReplayStepMs, "1"},
          {contract::kReplayParameterMaxBatchSize, "4"},
          {contract::kReplayParameterExcludeInputInOutput, "true"},
          {contract::kReplayParameterReplaySenderThreads, std::to_string(sender_threads)},
          {contract::kReplayParameterStreamInterval, "1"}};
}

// The model's config as Triton serializes it: compact JSON, every parameter a string_value.
std::string ConfigJson(const Parameters& parameters) {
  std::string json = std::string("{\"name\":\"") + contract::kEngineModel +
                     "\",\"backend\":\"tritonforge_replay\",\"max_batch_size\":4,"
                     "\"model_transaction_policy\":{\"decoupled\":true},\"parameters\":{";
  for (size_t i = 0; i < parameters.size(); ++i)
    json += (i ? ",\"" : "\"") + std::string(parameters[i].first) + "\":{\"string_value\":\"" +
            parameters[i].second + "\"}";
  return json + "}}";
}

// Initializes the instance as Triton loads a model; true when it did.
bool Initialize(const std::string& what, const std::string& folder, const Parameters& parameters) {
  fake::SetModel(ConfigJson(parameters), folder, "tensorrt_llm_0_0");
  return Call(what, [] { return TRITONBACKEND_ModelInstanceInitialize(fake::Instance()); });
}

// Triton finalizes an instance as it unloads it, and also after its initialization failed.
void Finalize() {
  Call("finalize", [] { return TRITONBACKEND_ModelInstanceFinalize(fake::Instance()); });
}

TRITONBACKEND_Request* Request(const std::string& label, bool streaming, int32_t output_len) {
  TRITONBACKEND_Request* request = fake::NewRequest(label, label);
  fake::AddInput(request, contract::kInputIds, TRITONSERVER_TYPE_INT32, {1, static_cast<int64_t>(kPrompt.size())},
                 kPrompt.data(), kPrompt.size() * sizeof(int32_t));
  fake::AddInput(request, contract::kRequestOutputLen, TRITONSERVER_TYPE_INT32, {1, 1}, &output_len,
                 sizeof(output_len));
  const char streams = streaming ? 1 : 0;  // a BOOL is one byte
  fake::AddInput(request, contract::kStreaming, TRITONSERVER_TYPE_BOOL, {1, 1}, &streams, 1);
  return request;
}

// Hands the batch to the instance, waits for the final responses of `answered` and unloads the instance (which
// joins its senders, so that every call they make is in the log).
void ServeAndUnload(std::vector<TRITONBACKEND_Request*> batch, const std::vector<std::string>& answered) {
  Call("execute", [&] {
    return TRITONBACKEND_ModelInstanceExecute(fake::Instance(), batch.data(), static_cast<uint32_t>(batch.size()));
  });
  if (!fake::WaitForFinalResponses(answered, kResponseTimeout)) std::printf("timed out waiting for final responses\n");
  Finalize();
}

bool RunScenario(const std::string& scenario, const std::string& folder, const std::string& token_file,
                 int baseline) {
  if (scenario == "serves") {
    if (Initialize("initialize", folder, BuiltParameters(token_file, 1)))
      ServeAndUnload({Request("r1", true, 3)}, {"r1"});
    else
      Finalize();
  } else if (scenario == "factory-fails") {
    fake::FailResponseFactoryFor("r2");
    if (Initialize("initialize", folder, BuiltParameters(token_file, 1)))
      ServeAndUnload({Request("r1", true, 2), Request("r2", true, 2), Request("r3", false, 2)}, {"r1", "r3"});
    else
      Finalize();
  } else if (scenario == "bad-request") {
    TRITONBACKEND_Request* no_output_len = fake::NewRequest("r1", "r1");
    fake::AddInput(no_output_len, contract::kInputIds, TRITONSERVER_TYPE_INT32, {1, 2}, kPrompt.data(),
                   kPrompt.size() * sizeof(int32_t));
    TRITONBACKEND_Request* float_prompt = fake::NewRequest("r2", "r2");
    const float prompt[2] = {1.0f, 2.0f};
    fake::AddInput(float_prompt, contract::kInputIds, TRITONSERVER_TYPE_FP32, {1, 2}, prompt, sizeof(prompt));
    if (Initialize("initialize", folder, BuiltParameters(token_file, 1)))
      ServeAndUnload({no_output_len, float_prompt}, {"r1", "r2"});
    else
      Finalize();
  } else if (scenario == "set-state-fails") {
    // How many threads the engine runs as it is refused: without any, "threads-left 0" would prove nothing.
    fake::FailModelInstanceSetState([baseline] {
      std::printf("threads-at-refusal %d\n", Threads() - baseline);
    });
    Initialize("initialize", folder, BuiltParameters(token_file, 3));
    Finalize();
  } else if (scenario == "thread-fails") {
    for (const int allowed : {1, 3}) {  // the second sender refused; the stop watch's thread (the fourth) refused
      threads_allowed = allowed;
      Initialize("initialize " + std::to_string(allowed) + "-threads-allowed", folder,
                 BuiltParameters(token_file, 3));
      threads_allowed = -1;
      Finalize();
    }
  } else if (scenario == "bad-token-file") {
    Initialize("initialize", folder, BuiltParameters(token_file, 1));
    Finalize();
  } else if (scenario == "bad-parameter") {
    const Parameters not_numbers = {{contract::kReplayParameterReplayStepMs, "fast"},
                                    {contract::kReplayParameterReplayStepMs, "1e999"},
                                    {contract::kReplayParameterMaxBatchSize, "many"},
                                    {contract::kReplayParameterMaxBatchSize, "99999999999"},
                                    {contract::kReplayParameterReplaySenderThreads, "two"},
                                    {contract::kReplayParameterStreamInterval, "every"}};
    for (const auto& [key, value] : not_numbers) {
      Parameters parameters = BuiltParameters(token_file, 1);
      for (auto& parameter : parameters)
        if (std::string(parameter.first) == key) parameter.second = value;
      Initialize(std::string("initialize ") + key + "=" + value, folder, parameters);
      Finalize();
    }
  } else {
    return false;
  }
  return true;
}

}  // namespace

// The C library's pthread_create (std::thread's), interposed for thread-fails: past `threads_allowed` a thread is
// refused as the system refuses one past its limits.
extern "C" int pthread_create(pthread_t* thread, const pthread_attr_t* attributes, void* (*start)(void*),
                              void* argument) noexcept {
  using Create = int (*)(pthread_t*, const pthread_attr_t*, void* (*)(void*), void*);
  static const Create next = reinterpret_cast<Create>(dlsym(RTLD_NEXT, "pthread_create"));
  int allowed = threads_allowed.load();
  while (allowed > 0 && !threads_allowed.compare_exchange_weak(allowed, allowed - 1)) {
  }
  if (allowed == 0) return EAGAIN;
  return next(thread, attributes, start, argument);
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: replay_driver SCENARIO FOLDER TOKEN_FILE\n");
    return 2;
  }
  const std::string scenario = argv[1], folder = argv[2], token_file = argv[3];
  setvbuf(stdout, nullptr, _IOLBF, 0);  // every line out before a backend that ends the process does
  setenv(contract::kHeartbeatDirEnv, folder.c_str(), 1);
  if (!Call("backend initialize", [] { return TRITONBACKEND_Initialize(nullptr); })) return 1;
  const int baseline = Threads();
  if (!RunScenario(scenario, folder, token_file, baseline)) {
    std::fprintf(stderr, "unknown scenario %s\n", scenario.c_str());
    return 2;
  }
  for (const std::string& line : fake::Log()) std::printf("%s\n", line.c_str());
  std::printf("threads-left %d\n", ThreadsLeft(baseline));
  std::printf("unfreed %s\n", fake::UnfreedObjects().c_str());
  return 0;
}
