// The ensemble's engine step as a C++ Triton backend ("tritonforge_coalescer"): it takes the engine's inputs,
// calls the engine model (`tensorrt_llm`, any engine kind, NVIDIA's tensorrtllm backend included) in-process, and
// answers with the engine's own outputs, folding the streamed responses that wait for their turn into one
// (coalescing.h says how each output folds).
//
// Why: Triton's ensemble scheduler does a response's bookkeeping in the thread that sends it and hands each one
// to the next step, so an ensemble carries a limited number of responses a second (15-22k measured on 16 cores,
// whatever the steps cost: docs/performance.md). At one token a response a real engine sends more than that. Here
// the ensemble sees at most `max_responses_per_second` responses from this step, each carrying every token the
// engine sent for its request since the last one:
// - a request's first response goes out at once (time to first token is not paced);
// - at low load every token is its own response: the budget is not reached, nothing waits;
// - under load one sender thread sends in passes over the requests that have tokens waiting, a pass of n
//   responses followed by the next no sooner than n / max_responses_per_second later; tokens that arrive
//   meanwhile join their request's waiting response.
// Non-streamed requests, beam search (which streams whole beams) and anything coalescing.h cannot fold pass
// through as the engine sent them, in order.
//
// | tensors | as the engine's (contract.ENGINE_INPUTS / ENGINE_OUTPUTS): every input of the request is passed on with  |
// |         | its shape and the request's id (so a `stop` request reaches the running request it names); the      |
// |         | outputs the request asks for are asked of the engine and sent back, folded                            |
//
// Threads: Execute (the instance's) starts the engine requests; the engine's response threads (Triton's, or the
// engine's own) fold each response into its request's waiting ones under the request's lock and queue the
// request; the instance's sender sends, and every kCheckPeriodMs passes the clients' cancellations on to the
// engine (TRITONSERVER_InferenceRequestCancel, read by the engines as the tensorrtllm backend does). A request
// lives until its final response is sent and the engine has returned its request and final response.
//
// Config parameters (CoalescerParameters in facts/model_parameters.py): `tensorrt_llm_model_name` (the engine
// model), `max_responses_per_second` (the instance's budget; 0 = no pacing, every waiting response is sent at
// once).

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../../text/native/detokenizer.h"
#include "triton_backend_api.h"
#include "backend_support.h"
#include "coalescing.h"
#include "server_stop.h"

namespace {

namespace json = tritonforge::json;
namespace backend = tritonforge::backend;
namespace coalescing = tritonforge::coalescing;
namespace server_stop = tritonforge::server_stop;
using backend::Error;
using backend::NowNs;

// --- names: facts/contract.py, facts/model_parameters.py ------------------------------------------------------------
constexpr char kBackend[] = "tritonforge_coalescer";
using tritonforge::contract::kBeamWidth;  // facts/contract.py, through contract.h
using tritonforge::contract::kStreaming;
using tritonforge::contract::kCoalescerParameterMaxResponsesPerSecond;
using tritonforge::contract::kCoalescerParameterTensorrtLlmModelName;
constexpr const char* kEngineModelParameter = kCoalescerParameterTensorrtLlmModelName;
constexpr const char* kMaxResponsesParameter = kCoalescerParameterMaxResponsesPerSecond;
constexpr int kCheckPeriodMs = tritonforge::contract::kCancellationCheckPeriodMs;  // as the engines poll
// triton_adapter.ERROR_AFTER_RESPONSE_S: a stream's last response, when it is an error, leaves no sooner than this
// after the response before it, time for that one to pass the ensemble's postprocessing (Triton 2.51 keeps an
// ensemble request whose error overtook its last chunk there in flight for ever).
constexpr std::chrono::seconds kErrorAfterResponse{1};

void Log(TRITONSERVER_LogLevel level, int line, const std::string& message) {
  backend::Log(kBackend, level, __FILE__, line, message);
}
void LogIfError(TRITONSERVER_Error* raw, const char* what, int line) {
  backend::LogIfError(kBackend, raw, what, __FILE__, line);
}

struct ModelState {
  TRITONSERVER_Server* server = nullptr;
  std::string name;
  std::string engine_model;
  double max_responses_per_second = 0;
  TRITONSERVER_ResponseAllocator* allocator = nullptr;

  ~ModelState() {
    if (allocator != nullptr) LogIfError(TRITONSERVER_ResponseAllocatorDelete(allocator), "delete allocator", __LINE__);
  }
};

// An engine response as coalescing.h folds it: its tensors copied, or its error.
coalescing::Response ReadResponse(TRITONSERVER_InferenceResponse* response) {
  coalescing::Response out;
  Error error(TRITONSERVER_InferenceResponseError(response));
  uint32_t count = 0;
  if (!error) error.reset(TRITONSERVER_InferenceResponseOutputCount(response, &count));
  for (uint32_t i = 0; !error && i < count; ++i) {
    const char* name = nullptr;
    TRITONSERVER_DataType datatype = TRITONSERVER_TYPE_INVALID;
    const int64_t* shape = nullptr;
    uint64_t rank = 0;
    const void* base = nullptr;
    size_t size = 0;
    TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
    int64_t memory_id = 0;
    void* userp = nullptr;
    error.reset(TRITONSERVER_InferenceResponseOutput(response, i, &name, &datatype, &shape, &rank, &base, &size,
                                                     &memory_type, &memory_id, &userp));
    if (error) break;
    coalescing::Tensor& tensor = out.tensors[name];
    tensor.datatype = datatype;
    tensor.shape.assign(shape, shape + rank);
    tensor.data.assign(static_cast<const char*>(base), size);
  }
  if (error) {
    out.tensors.clear();
    out.failed = true;
    out.error_code = TRITONSERVER_ErrorCode(error.get());
    out.error_message = TRITONSERVER_ErrorMessage(error.get());
  }
  return out;
}

class InstanceState;

// --- one request of the ensemble's ---------------------------------------------------------------------------------
class Request {
 public:
  Request(InstanceState* instance, const ModelState& model, TRITONBACKEND_Request* request)
      : instance_(instance), model_(model), request_(request), pending_(false) {}
  ~Request();

  TRITONSERVER_Error* Start();
  void FailNow(TRITONSERVER_Error* error);  // the one response of a request that never reached the engine

  // The sender's: sends what waits; returns how many responses it sent.
  int64_t Flush();
  void CancelIfClientLeft();
  // A launcher's stop whose deadline came with this request open: StopForServer sends nothing more of the engine's
  // and cancels the engine request; EndForServer, a second later, ends the client's stream with kServerStopping.
  void StopForServer();
  void EndForServer();

  bool TryAddRef() {
    int current = refs_.load();
    while (current > 0)
      if (refs_.compare_exchange_weak(current, current + 1)) return true;
    return false;
  }
  void AddRef() { refs_.fetch_add(1); }
  void DropRef() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }
  TRITONBACKEND_Request* request() const { return request_; }

 private:
  static void EngineReleased(TRITONSERVER_InferenceRequest*, const uint32_t, void* userp);
  static void EngineAnswered(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp);
  void OnEngineResponse(coalescing::Response response, bool final);
  TRITONSERVER_Error* NewEngineRequest();
  bool Send(const coalescing::Response& response, uint32_t flags, bool final_taken);

  InstanceState* instance_;
  const ModelState& model_;
  TRITONBACKEND_Request* request_;
  TRITONBACKEND_ResponseFactory* factory_ = nullptr;
  TRITONSERVER_InferenceRequest* engine_ = nullptr;
  // Execute's, the engine's final response's, the engine request's release, the final response to the client's.
  std::atomic<int> refs_{4};
  std::atomic<bool> cancel_sent_{false};

  std::mutex mutex_;  // guards what follows
  coalescing::Pending pending_;
  bool engine_final_ = false;  // the engine sent its last response
  bool queued_ = false;        // in the sender's queue
  bool first_sent_ = false;
  bool final_sent_ = false;
  bool server_stopped_ = false;  // StopForServer: the engine's responses are no longer the client's
  bool client_end_ = false;      // EndForServer: the final response waits in pending_
};

// --- the instance: its sender thread and its open requests --------------------------------------------------------
class InstanceState {
 public:
  InstanceState(const ModelState& model, std::string name) : model_(model), name_(std::move(name)) {
    if (model_.max_responses_per_second > 0)
      pass_per_response_ = std::chrono::nanoseconds(static_cast<int64_t>(1e9 / model_.max_responses_per_second));
    sender_ = std::thread([this] { Serve(); });
    stop_watch_ = std::make_unique<server_stop::StopWatch>(name_, [this](double deadline) { Drain(deadline); });
  }

  ~InstanceState() {
    {
      std::lock_guard<std::mutex> lock(open_mutex_);
      closed_ = true;
    }
    open_changed_.notify_all();
    stop_watch_.reset();
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closing_ = true;
    }
    wake_.notify_all();
    sender_.join();
    std::lock_guard<std::mutex> lock(open_mutex_);
    if (!open_.empty())
      Log(TRITONSERVER_LOG_WARN, __LINE__, name_ + ": " + std::to_string(open_.size()) + " requests still open");
  }

  const ModelState& model() const { return model_; }

  // Whether the stop's deadline has passed: a request that comes now is refused.
  bool ServerStopping() {
    std::lock_guard<std::mutex> lock(open_mutex_);
    return server_stopping_;
  }
  void Opened(Request* request) {
    std::lock_guard<std::mutex> lock(open_mutex_);
    open_.insert(request);
  }
  void Closed(Request* request) {
    {
      std::lock_guard<std::mutex> lock(open_mutex_);
      open_.erase(request);
    }
    open_changed_.notify_all();
  }

  // Queue `request` (which holds a reference for the queue) for the sender; a request whose first response
  // waits goes ahead of the pacing.
  void Queue(Request* request, bool first) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      (first ? firsts_ : ready_).push_back(request);
    }
    wake_.notify_one();
  }

 private:
  void Serve() {
    using Clock = std::chrono::steady_clock;
    auto next_pass = Clock::now();
    auto next_check = Clock::now() + std::chrono::milliseconds(kCheckPeriodMs);
    std::unique_lock<std::mutex> lock(mutex_);
    for (;;) {
      const auto now = Clock::now();
      if (now >= next_check) {
        lock.unlock();
        CheckCancellations();
        lock.lock();
        next_check = Clock::now() + std::chrono::milliseconds(kCheckPeriodMs);
        continue;
      }
      if (!firsts_.empty() || (!ready_.empty() && now >= next_pass)) {
        const bool firsts = !firsts_.empty();
        std::deque<Request*> batch;
        batch.swap(firsts ? firsts_ : ready_);
        lock.unlock();
        const auto started = Clock::now();
        int64_t sent = 0;
        for (Request* request : batch) {
          sent += request->Flush();
          request->DropRef();  // the queue's
        }
        if (!firsts) next_pass = started + pass_per_response_ * sent;
        lock.lock();
        continue;
      }
      if (closing_ && ready_.empty()) return;
      const auto until = ready_.empty() ? next_check : std::min(next_check, next_pass);
      wake_.wait_until(lock, until);
    }
  }

  // A launcher's stop (server_stop.h): open requests run until `deadline`; then each is cut off from its engine
  // request, which is cancelled (NVIDIA's engine reads no stop of ours), and a second later ends with
  // kServerStopping; a request that comes after the deadline is refused with it.
  void Drain(double deadline) {
    const auto done = [this] { return closed_ || open_.empty(); };
    std::unique_lock<std::mutex> lock(open_mutex_);
    if (open_changed_.wait_for(lock, server_stop::Span(deadline - server_stop::MonotonicSeconds()), done)) return;
    Log(TRITONSERVER_LOG_WARN, __LINE__, name_ + ": the server is stopping: ending " + std::to_string(open_.size()) +
                                             " open requests");
    server_stopping_ = true;
    std::vector<Request*> open;
    for (Request* request : open_)
      if (request->TryAddRef()) open.push_back(request);
    lock.unlock();
    for (Request* request : open) request->StopForServer();
    lock.lock();
    open_changed_.wait_for(lock, kErrorAfterResponse, [this] { return closed_; });
    lock.unlock();
    for (Request* request : open) {
      request->EndForServer();
      request->DropRef();
    }
    lock.lock();
    open_changed_.wait_for(lock, server_stop::kDrainEnd, done);
  }

  // A client that went away (or a cancel through an ensemble of a Triton that passes it on) cancels the engine.
  void CheckCancellations() {
    std::vector<Request*> open;
    {
      std::lock_guard<std::mutex> lock(open_mutex_);
      for (Request* request : open_)
        if (request->TryAddRef()) open.push_back(request);
    }
    for (Request* request : open) {
      request->CancelIfClientLeft();
      request->DropRef();
    }
  }

  const ModelState& model_;
  std::string name_;
  std::chrono::nanoseconds pass_per_response_{0};
  std::mutex mutex_;  // guards the queues and closing_
  std::condition_variable wake_;
  std::deque<Request*> firsts_;
  std::deque<Request*> ready_;
  bool closing_ = false;
  std::thread sender_;
  std::mutex open_mutex_;  // guards what follows
  std::condition_variable open_changed_;  // a request closed, or the instance closes
  std::set<Request*> open_;
  bool server_stopping_ = false;  // the stop's deadline passed
  bool closed_ = false;  // the instance is being finalized
  std::unique_ptr<server_stop::StopWatch> stop_watch_;  // calls Drain at a launcher's stop
};

// --- Request --------------------------------------------------------------------------------------------------------
Request::~Request() {
  instance_->Closed(this);
  if (engine_ != nullptr) LogIfError(TRITONSERVER_InferenceRequestDelete(engine_), "delete engine request", __LINE__);
  if (factory_ != nullptr) LogIfError(TRITONBACKEND_ResponseFactoryDelete(factory_), "delete factory", __LINE__);
  LogIfError(TRITONBACKEND_RequestRelease(request_, TRITONSERVER_REQUEST_RELEASE_ALL), "release request", __LINE__);
}

// The first value of a scalar input, or `fallback` when the request has none.
template <typename T>
T ScalarInput(TRITONBACKEND_Request* request, const char* name, T fallback) {
  TRITONBACKEND_Input* input = nullptr;
  if (Error(TRITONBACKEND_RequestInput(request, name, &input)) || input == nullptr) return fallback;
  const void* buffer = nullptr;
  uint64_t size = 0;
  TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
  int64_t memory_id = 0;
  if (Error(TRITONBACKEND_InputBuffer(input, 0, &buffer, &size, &memory_type, &memory_id)) || size < sizeof(T) ||
      memory_type == TRITONSERVER_MEMORY_GPU)
    return fallback;
  T value;
  std::memcpy(&value, buffer, sizeof(T));
  return value;
}

// The engine request: every input of the client's, its buffers shared (the client's request outlives it), the
// request's id, the outputs it asks for.
TRITONSERVER_Error* Request::NewEngineRequest() {
  if (TRITONSERVER_Error* error = TRITONSERVER_InferenceRequestNew(&engine_, model_.server, model_.engine_model.c_str(),
                                                                  -1))
    return error;
  const char* id = nullptr;
  if (TRITONSERVER_Error* error = TRITONBACKEND_RequestId(request_, &id)) return error;
  if (id != nullptr && id[0] != '\0')
    if (TRITONSERVER_Error* error = TRITONSERVER_InferenceRequestSetId(engine_, id)) return error;
  if (TRITONSERVER_Error* error = TRITONSERVER_InferenceRequestSetReleaseCallback(engine_, EngineReleased, this))
    return error;
  if (TRITONSERVER_Error* error =
          TRITONSERVER_InferenceRequestSetResponseCallback(engine_, model_.allocator, nullptr, EngineAnswered, this))
    return error;
  uint32_t count = 0;
  if (TRITONSERVER_Error* error = TRITONBACKEND_RequestInputCount(request_, &count)) return error;
  for (uint32_t i = 0; i < count; ++i) {
    TRITONBACKEND_Input* input = nullptr;
    if (TRITONSERVER_Error* error = TRITONBACKEND_RequestInputByIndex(request_, i, &input)) return error;
    const char* name = nullptr;
    TRITONSERVER_DataType datatype = TRITONSERVER_TYPE_INVALID;
    const int64_t* shape = nullptr;
    uint32_t rank = 0;
    uint64_t byte_size = 0;
    uint32_t buffers = 0;
    if (TRITONSERVER_Error* error =
            TRITONBACKEND_InputProperties(input, &name, &datatype, &shape, &rank, &byte_size, &buffers))
      return error;
    if (TRITONSERVER_Error* error = TRITONSERVER_InferenceRequestAddInput(engine_, name, datatype, shape, rank))
      return error;
    for (uint32_t b = 0; b < buffers; ++b) {
      const void* buffer = nullptr;
      uint64_t size = 0;
      TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
      int64_t memory_id = 0;
      if (TRITONSERVER_Error* error = TRITONBACKEND_InputBuffer(input, b, &buffer, &size, &memory_type, &memory_id))
        return error;
      if (TRITONSERVER_Error* error =
              TRITONSERVER_InferenceRequestAppendInputData(engine_, name, buffer, size, memory_type, memory_id))
        return error;
    }
  }
  if (TRITONSERVER_Error* error = TRITONBACKEND_RequestOutputCount(request_, &count)) return error;
  for (uint32_t i = 0; i < count; ++i) {
    const char* name = nullptr;
    if (TRITONSERVER_Error* error = TRITONBACKEND_RequestOutputName(request_, i, &name)) return error;
    if (TRITONSERVER_Error* error = TRITONSERVER_InferenceRequestAddRequestedOutput(engine_, name)) return error;
  }
  return nullptr;
}

TRITONSERVER_Error* Request::Start() {
  if (TRITONSERVER_Error* error = TRITONBACKEND_ResponseFactoryNew(&factory_, request_)) return error;
  // Folding is for streams of new tokens: a streamed request at beam width 1 (beam search streams whole beams).
  const bool streaming = ScalarInput<bool>(request_, kStreaming, false);
  const int32_t beam_width = ScalarInput<int32_t>(request_, kBeamWidth, 1);
  pending_ = coalescing::Pending(streaming && beam_width <= 1);
  if (instance_->ServerStopping())
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNAVAILABLE, server_stop::kServerStopping);
  if (TRITONSERVER_Error* error = NewEngineRequest()) return error;
  instance_->Opened(this);
  if (TRITONSERVER_Error* error = TRITONSERVER_ServerInferAsync(model_.server, engine_, nullptr)) return error;
  return nullptr;
}

void Request::FailNow(TRITONSERVER_Error* error) {
  // The engine never took the request: no callback will come, so its three references go now.
  if (factory_ != nullptr) {
    TRITONBACKEND_Response* response = nullptr;
    if (!Error(TRITONBACKEND_ResponseNewFromFactory(&response, factory_)))
      LogIfError(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error), "send", __LINE__);
  } else {
    TRITONBACKEND_Response* response = nullptr;
    if (!Error(TRITONBACKEND_ResponseNew(&response, request_)))
      LogIfError(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error), "send", __LINE__);
  }
  refs_.fetch_sub(3);
}

void Request::EngineReleased(TRITONSERVER_InferenceRequest*, const uint32_t, void* userp) {
  static_cast<Request*>(userp)->DropRef();
}

void Request::EngineAnswered(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp) {
  auto* self = static_cast<Request*>(userp);
  const bool final = (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) != 0;
  coalescing::Response read;
  if (response != nullptr) {
    try {
      read = ReadResponse(response);
    } catch (const std::exception& exception) {  // out of memory: the stream ends with the error
      read = coalescing::Response{};
      read.failed = true;
      read.error_code = TRITONSERVER_ERROR_INTERNAL;
      read.error_message = std::string("the engine's response could not be read: ") + exception.what();
    }
    LogIfError(TRITONSERVER_InferenceResponseDelete(response), "delete response", __LINE__);
  }
  self->OnEngineResponse(std::move(read), final);
  if (final) self->DropRef();
}

void Request::OnEngineResponse(coalescing::Response response, bool final) {
  bool queue = false;
  bool first = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (final_sent_ || server_stopped_) return;
    // A response with no outputs (the engine's flags-only final, a stop request's answer) carries nothing to send.
    const bool empty = !response.failed && response.tensors.empty();
    if (!empty) pending_.Add(std::move(response));
    engine_final_ = engine_final_ || final;
    if (!queued_ && (!empty || final)) {
      queued_ = true;
      queue = true;
      first = !first_sent_;
    }
  }
  if (queue) {
    AddRef();  // the queue's
    instance_->Queue(this, first);
  }
}

int64_t Request::Flush() {
  std::vector<coalescing::Response> responses;
  bool final = false;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    queued_ = false;
    if (final_sent_) return 0;
    responses = pending_.Take();
    final = engine_final_ || client_end_;
    final_sent_ = final;
    first_sent_ = first_sent_ || !responses.empty();
  }
  int64_t sent = 0;
  for (size_t i = 0; i < responses.size(); ++i) {
    const bool last = final && i + 1 == responses.size();
    ++sent;
    if (!Send(responses[i], last ? TRITONSERVER_RESPONSE_COMPLETE_FINAL : 0, final)) break;
  }
  if (final && responses.empty())
    LogIfError(TRITONBACKEND_ResponseFactorySendFlags(factory_, TRITONSERVER_RESPONSE_COMPLETE_FINAL), "send final",
               __LINE__);
  if (final) DropRef();  // the client's final response is sent
  return sent;
}

// Sends one response; false when it could not be built, which ends the client's stream with its error (never a
// silent gap in the tokens) and cancels the engine request. `final_taken`: Flush already took the final response's
// reference for this pass.
bool Request::Send(const coalescing::Response& response, uint32_t flags, bool final_taken) {
  TRITONBACKEND_Response* out = nullptr;
  Error error(TRITONBACKEND_ResponseNewFromFactory(&out, factory_));
  if (!error && response.failed) {
    Error failure(TRITONSERVER_ErrorNew(static_cast<TRITONSERVER_Error_Code>(response.error_code),
                                        response.error_message.c_str()));
    LogIfError(TRITONBACKEND_ResponseSend(out, flags, failure.get()), "send error", __LINE__);
    return true;
  }
  for (auto it = response.tensors.begin(); !error && it != response.tensors.end(); ++it) {
    const coalescing::Tensor& tensor = it->second;
    TRITONBACKEND_Output* output = nullptr;
    error.reset(TRITONBACKEND_ResponseOutput(out, &output, it->first.c_str(),
                                             static_cast<TRITONSERVER_DataType>(tensor.datatype), tensor.shape.data(),
                                             static_cast<uint32_t>(tensor.shape.size())));
    void* buffer = nullptr;
    TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
    int64_t memory_id = 0;
    if (!error) error.reset(TRITONBACKEND_OutputBuffer(output, &buffer, tensor.data.size(), &memory_type, &memory_id));
    if (!error && memory_type == TRITONSERVER_MEMORY_GPU && !tensor.data.empty())
      error.reset(TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, "GPU output memory is not written"));
    if (!error && !tensor.data.empty()) std::memcpy(buffer, tensor.data.data(), tensor.data.size());
  }
  if (!error) {
    LogIfError(TRITONBACKEND_ResponseSend(out, flags, nullptr), "send response", __LINE__);
    return true;
  }
  Log(TRITONSERVER_LOG_ERROR, __LINE__, std::string("build response: ") + TRITONSERVER_ErrorMessage(error.get()));
  if (out != nullptr) {
    LogIfError(TRITONBACKEND_ResponseSend(out, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error.get()), "send error",
               __LINE__);
  } else {
    LogIfError(TRITONBACKEND_ResponseFactorySendFlags(factory_, TRITONSERVER_RESPONSE_COMPLETE_FINAL), "send final",
               __LINE__);
  }
  if (!final_taken) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      final_sent_ = true;
    }
    refs_.fetch_sub(1);  // the client's final response is sent (never the last reference: the queue holds one)
  }
  LogIfError(TRITONSERVER_InferenceRequestCancel(engine_), "cancel", __LINE__);
  return false;
}

void Request::StopForServer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (final_sent_ || server_stopped_) return;
    server_stopped_ = true;
    pending_.Take();  // unsent: the stream's last response is then the one already sent, a second before the error
  }
  if (!cancel_sent_.exchange(true)) LogIfError(TRITONSERVER_InferenceRequestCancel(engine_), "cancel", __LINE__);
}

void Request::EndForServer() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (final_sent_ || client_end_) return;
    coalescing::Response stopping;
    stopping.failed = true;
    stopping.error_code = TRITONSERVER_ERROR_UNAVAILABLE;
    stopping.error_message = server_stop::kServerStopping;
    pending_.Add(std::move(stopping));
    client_end_ = true;
    if (queued_) return;  // the sender takes it with the rest
    queued_ = true;
  }
  AddRef();  // the queue's
  instance_->Queue(this, true);  // ahead of the pacing
}

void Request::CancelIfClientLeft() {
  if (cancel_sent_.load()) return;
  bool cancelled = false;
  LogIfError(TRITONBACKEND_RequestIsCancelled(request_, &cancelled), "is cancelled", __LINE__);
  if (cancelled && !cancel_sent_.exchange(true)) LogIfError(TRITONSERVER_InferenceRequestCancel(engine_), "cancel", __LINE__);
}

// --- config ---------------------------------------------------------------------------------------------------------
TRITONSERVER_Error* Refuse(const std::string& model, const std::string& what) {
  return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, (model + ": " + what).c_str());
}

TRITONSERVER_Error* InitializeModel(TRITONBACKEND_Model* model) {
  auto state = std::make_unique<ModelState>();
  const char* name = nullptr;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ModelName(model, &name)) return error;
  state->name = name;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ModelServer(model, &state->server)) return error;
  json::Value config;
  if (TRITONSERVER_Error* error = backend::ReadConfig(model, &config)) return error;
  if (!backend::Decoupled(config))
    return Refuse(state->name, "the coalescer streams: its config needs model_transaction_policy { decoupled: true }");
  state->engine_model = backend::Parameter(config, kEngineModelParameter);
  if (state->engine_model.empty())
    return Refuse(state->name, std::string("parameter ") + kEngineModelParameter + " (the engine model) is required");
  const std::string budget = backend::Parameter(config, kMaxResponsesParameter);
  if (!budget.empty()) {
    char* end = nullptr;
    state->max_responses_per_second = std::strtod(budget.c_str(), &end);
    if (end == budget.c_str() || *end != '\0' || !(state->max_responses_per_second >= 0))
      return Refuse(state->name, std::string("parameter ") + kMaxResponsesParameter + " must be a number >= 0, got '" +
                                     budget + "'");
  }
  if (TRITONSERVER_Error* error = TRITONSERVER_ResponseAllocatorNew(&state->allocator, backend::AllocateCpu,
                                                                  backend::DeallocateCpu, nullptr))
    return error;
  Log(TRITONSERVER_LOG_INFO, __LINE__, state->name + ": engine " + state->engine_model + ", at most " +
                                           (budget.empty() ? std::string("unpaced") : budget) + " responses a second");
  return backend::GiveState(model, std::move(state));
}

}  // namespace

extern "C" {

// Loads only into a server whose backend API has what this backend calls.
TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend*) { return backend::CheckApiVersion(kBackend); }

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  try {
    return InitializeModel(model);
  } catch (const std::exception& exception) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, exception.what());
  }
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  return backend::DeleteState<ModelState>(model);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  try {
    TRITONBACKEND_Model* model = nullptr;
    if (TRITONSERVER_Error* error = TRITONBACKEND_ModelInstanceModel(instance, &model)) return error;
    ModelState* state = nullptr;
    if (TRITONSERVER_Error* error = backend::StateOf(model, &state)) return error;
    const char* name = nullptr;
    if (TRITONSERVER_Error* error = TRITONBACKEND_ModelInstanceName(instance, &name)) return error;
    return backend::GiveState(instance, std::make_unique<InstanceState>(*state, name));
  } catch (const std::exception& exception) {
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, exception.what());
  }
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
  return backend::DeleteState<InstanceState>(instance);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, const uint32_t count) {
  // From here every request is ours: each is answered, and released once the engine is done with it.
  InstanceState* state = nullptr;
  Error failed(backend::StateOf(instance, &state));
  const uint64_t batch_start_ns = NowNs();
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t start_ns = NowNs();
    if (failed) {
      backend::AnswerAndRelease(kBackend, requests[i], failed.get());
      continue;
    }
    Request* request = nullptr;
    Error error;
    try {
      request = new Request(state, state->model(), requests[i]);
      error.reset(request->Start());
    } catch (const std::exception& exception) {  // out of memory: this request fails, not the server
      error.reset(TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, exception.what()));
    }
    if (request == nullptr) {
      backend::AnswerAndRelease(kBackend, requests[i], error.get());
      continue;
    }
    if (error) request->FailNow(error.get());
    backend::ReportRequest(kBackend, instance, requests[i], !error, start_ns);
    request->DropRef();  // Execute's: the request lives on with its engine request
  }
  backend::ReportBatch(kBackend, instance, count, batch_start_ns);
  return nullptr;
}

}  // extern "C"
