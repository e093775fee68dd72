// FOR BENCHMARKING ONLY: the replay engine as a C++ Triton backend ("tritonforge_replay").
//
// It stands in for NVIDIA's tensorrtllm backend where the question is how much of an engine's token rate
// survives the pipeline around it. The Python replay engine (tritonforge/runtime/engine/replay/engine.py) sends every
// token through a Python stub, ~200 us of CPU a response: at a 29k tokens/s engine that took 6-8 cores of
// the 16 the pipeline needs. A C++ engine sends a response for a few microseconds, as this one does, so
// what the pipeline loses is the pipeline's own cost.
//
// What it does, as the Python replay engine: every `replay_step_ms` each running request gets its next
// token, a slice of the token ids written by the build (`replay_tokens`) starting at an offset taken from
// the prompt; up to `max_batch_size` requests run at once, the rest wait and join at a step. A request runs
// to `request_output_len`; sampling, end_id, stop and bad words are ignored. Streaming requests get one
// response per token (the last one flagged final); others one response with every token (after the prompt
// unless `exclude_input_in_output`); with `stream_interval` N, the first token goes out at once and then N
// at a time. Responses carry `output_ids` [1, 1, n] and `sequence_length` [1, 1],
// when requested. A `stop` request ends the running request with its request id; a cancelled request ends
// at the next step. `replay_sender_threads` threads each run their own share of the batch at the same step time.
// It reports Triton's per-model statistics for the time it takes to accept requests (perf_analyzer needs
// them for every model it profiles), and publishes no engine metrics.
//
// A stop of `tritonforge serve` ends its streams as it ends the Python engines' (EngineService.drain, called
// by triton_adapter.start_heartbeat; the files are tritonforge/facts/environment.py's): where the server's
// environment names a heartbeat folder, the engine says there that it drains (`<pid>-<instance>.drains`) and
// a thread of its own looks for the launcher's STOPPING file every second (server_stop.h's StopWatch, which the
// BLS and the coalescer share). Open requests get until the
// deadline it holds (a time.monotonic(), written as Python writes a float) to finish; the engine then ends
// those still running or waiting, and any that comes after, with "unavailable: the server is shutting down;
// the generation was stopped" (errors.ServerStopping), and says it is drained (`.drained`) once none is open.
// As in the Python engines, a stream's last response, when it is an error, leaves no sooner than 1 s after
// the response before it (triton_adapter.ERROR_AFTER_RESPONSE_S): time for that response to pass the
// ensemble's postprocessing, without which Triton 2.51 keeps the ensemble request in flight for ever.

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <deque>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "backend_support.h"
#include "json.h"
#include "server_stop.h"
#include "triton_backend_api.h"

namespace {

namespace backend = tritonforge::backend;
namespace contract = tritonforge::contract;
namespace json = tritonforge::json;
namespace server_stop = tritonforge::server_stop;

using backend::NowNs;
using Clock = std::chrono::steady_clock;
constexpr char kBackend[] = "tritonforge_replay";

// Triton's log, as the other backends write it (backend_support.h).
#define LogError(what, error) backend::LogIfError(kBackend, (error), (what), __FILE__, __LINE__)

// What the Python engines answer (tritonforge/facts/errors.py, runtime/triton_adapter.py); the stop's files and
// clock are server_stop.h's.
using contract::kEngineShuttingDown;  // errors.EngineShuttingDown
constexpr std::chrono::seconds kErrorAfterResponse{1};  // triton_adapter.ERROR_AFTER_RESPONSE_S
using server_stop::kDrainEnd;
using server_stop::kServerStopping;
using server_stop::MonotonicSeconds;
using server_stop::Span;

struct Settings {
  double step_ms = 8.5;
  int max_batch_size = 1;
  int sender_threads = 1;
  int stream_interval = 1;  // streamed tokens per response after the first
  bool exclude_input_in_output = true;
  // false: a stop of the launcher's is not read, as by NVIDIA's engine (tests of the models around it)
  bool reads_stop = true;
  std::vector<int32_t> tokens;
};

// The string value of a model parameter in the config's compact JSON ("key":{"string_value":"..."}), or "".
// The whole pattern is matched: a parameter may share its name with a top-level field (max_batch_size).
// The recording (a JSON list of token ids); throws where the file is missing or anything else is in it.
std::vector<int32_t> ReadTokenIds(const std::string& path) {
  std::ifstream file(path);
  if (!file) throw std::runtime_error("cannot be read");
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  const json::Value list = json::Parse(text);
  if (list.kind != json::Value::Kind::kArray) throw std::runtime_error("is not a list");
  std::vector<int32_t> ids;
  for (const json::Value& item : list.items) {
    if (item.kind != json::Value::Kind::kNumber || item.text.find_first_of(".eE") != std::string::npos)
      throw std::runtime_error("holds something other than an integer");
    const long long id = std::stoll(item.text);
    if (id < INT32_MIN || id > INT32_MAX) throw std::runtime_error("holds a token id past int32");
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

struct Stream {
  TRITONBACKEND_ResponseFactory* factory = nullptr;
  std::string id;
  std::vector<int32_t> prompt;
  std::vector<int32_t> generated;
  size_t sent = 0;  // streamed tokens already sent
  int max_new_tokens = 0;
  size_t offset = 0;
  bool streaming = false;
  bool exclude_input = true;
  bool want_output_ids = true;
  bool want_sequence_length = true;
  bool responded = false;  // a response was sent, the last at `last_sent`
  Clock::time_point last_sent;
  std::atomic<bool> stopped{false};
};

// Sends one response of `count` token ids (or `error`, which it takes); true when the stream ended: with
// `final`, or where the response could not be made (then the stream ends with that error). An ended stream's
// factory is deleted; the stream is the caller's to close.
bool Send(Stream* stream, const int32_t* ids, size_t count, bool final, TRITONSERVER_Error* error = nullptr) {
  TRITONBACKEND_Response* response = nullptr;
  TRITONSERVER_Error* failed = TRITONBACKEND_ResponseNewFromFactory(&response, stream->factory);
  if (failed == nullptr && error == nullptr) {
    TRITONBACKEND_Output* output = nullptr;
    void* buffer = nullptr;
    TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
    int64_t memory_id = 0;
    if (stream->want_output_ids) {
      const int64_t shape[3] = {1, 1, static_cast<int64_t>(count)};
      failed = TRITONBACKEND_ResponseOutput(response, &output, contract::kOutputIds, TRITONSERVER_TYPE_INT32, shape, 3);
      if (failed == nullptr)
        failed = TRITONBACKEND_OutputBuffer(output, &buffer, count * sizeof(int32_t), &memory_type, &memory_id);
      if (failed == nullptr && count > 0) std::memcpy(buffer, ids, count * sizeof(int32_t));
    }
    if (failed == nullptr && stream->want_sequence_length) {
      const int64_t shape[2] = {1, 1};
      const int32_t length = static_cast<int32_t>(count);
      failed = TRITONBACKEND_ResponseOutput(response, &output, contract::kSequenceLength, TRITONSERVER_TYPE_INT32,
                                            shape, 2);
      if (failed == nullptr)
        failed = TRITONBACKEND_OutputBuffer(output, &buffer, sizeof(int32_t), &memory_type, &memory_id);
      if (failed == nullptr) std::memcpy(buffer, &length, sizeof(int32_t));
    }
  }
  if (failed != nullptr) {  // the response could not be built: end the stream with that error
    if (response != nullptr) LogError("delete response", TRITONBACKEND_ResponseDelete(response));
    response = nullptr;
    if (error != nullptr) TRITONSERVER_ErrorDelete(error);
    error = failed;
    final = true;
    LogError("new response", TRITONBACKEND_ResponseNewFromFactory(&response, stream->factory));
  }
  if (response != nullptr) {
    TRITONSERVER_Error* not_sent =
        TRITONBACKEND_ResponseSend(response, final ? TRITONSERVER_RESPONSE_COMPLETE_FINAL : 0, error);
    if (not_sent == nullptr) {
      stream->responded = true;
      stream->last_sent = Clock::now();
    }
    LogError("send response", not_sent);
  }
  if (error != nullptr) TRITONSERVER_ErrorDelete(error);
  if (final) LogError("delete response factory", TRITONBACKEND_ResponseFactoryDelete(stream->factory));
  return final;
}

class Engine {
 public:
  // `instance_name`: names the files that say, at a launcher's stop, that this engine drains and has drained.
  Engine(Settings settings, const std::string& instance_name) : settings_(std::move(settings)) {
    try {
      const int threads = std::max(1, settings_.sender_threads);
      for (int i = 0; i < threads; ++i) {
        // Each thread runs its share of the batch, so together they run max_batch_size requests.
        const int share = settings_.max_batch_size / threads + (i < settings_.max_batch_size % threads ? 1 : 0);
        workers_.emplace_back([this, share] { Run(std::max(share, 1)); });
      }
      if (settings_.reads_stop)
        stop_watch_ =
            std::make_unique<server_stop::StopWatch>(instance_name, [this](double deadline) { Drain(deadline); });
    } catch (...) {
      // A thread that could not start: those that did end before the exception leaves, as a joinable
      // std::thread destroyed with the members would end the server's process.
      StopWorkers();
      throw;
    }
  }

  ~Engine() {
    StopWorkers();
    for (Stream* stream : waiting_) End(stream, kEngineShuttingDown);
    stop_watch_.reset();  // after a drain it woke ends; none is open now
  }

  void Submit(Stream* stream) {
    bool refused = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      ++open_;
      refused = server_stopping_;
      if (!refused) {
        if (!stream->id.empty()) by_id_.emplace(stream->id, stream);
        waiting_.push_back(stream);
      }
    }
    if (refused) {
      End(stream, kServerStopping);  // as the Python engines end a request that comes after the deadline
      return;
    }
    wake_.notify_one();
  }

  void Stop(const std::string& id) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto range = by_id_.equal_range(id);
    for (auto it = range.first; it != range.second; ++it) it->second->stopped = true;
  }

  const Settings& settings() const { return settings_; }

 private:
  // Wakes the senders to end and waits for them.
  void StopWorkers() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_all();
    open_changed_.notify_all();
    for (auto& worker : workers_) worker.join();
  }

  // A stream that ended (its final response sent): no stop reaches it any more, and it is no longer open.
  void Close(Stream* stream) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      auto range = by_id_.equal_range(stream->id);
      for (auto it = range.first; it != range.second; ++it) {
        if (it->second == stream) {
          by_id_.erase(it);
          break;
        }
      }
      --open_;
    }
    open_changed_.notify_all();
    delete stream;
  }

  // Ends a stream with an UNAVAILABLE error, ERROR_AFTER_RESPONSE_S after its last response at the earliest.
  void End(Stream* stream, const char* message) {
    if (stream->responded) std::this_thread::sleep_until(stream->last_sent + kErrorAfterResponse);
    Send(stream, nullptr, 0, true, TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNAVAILABLE, message));
    Close(stream);
  }

  // Ends a stream that ran out of tokens, was stopped or cancelled: the tokens not yet sent, flagged final.
  void Finish(Stream* stream) {
    if (stream->streaming) {
      Send(stream, stream->generated.data() + stream->sent, stream->generated.size() - stream->sent, true);
    } else {
      std::vector<int32_t> ids = stream->exclude_input ? std::vector<int32_t>() : stream->prompt;
      ids.insert(ids.end(), stream->generated.begin(), stream->generated.end());
      Send(stream, ids.data(), ids.size(), true);
    }
    Close(stream);
  }

  // EngineService.drain: open requests get until `deadline` (time.monotonic) to finish; then every stream still
  // running or waiting ends with ServerStopping, and so does any that comes later. Returns once none is open,
  // or a few seconds later (DRAIN_END_S), or when the model unloads.
  void Drain(double deadline) {
    const auto done = [this] { return stopping_ || open_ == 0; };
    std::unique_lock<std::mutex> lock(mutex_);
    if (open_changed_.wait_for(lock, Span(deadline - MonotonicSeconds()), done)) return;
    backend::Log(kBackend, TRITONSERVER_LOG_INFO, __FILE__, __LINE__,
                 "the server is stopping: ending " + std::to_string(open_) + " open requests");
    server_stopping_ = true;
    std::deque<Stream*> waiting;
    waiting.swap(waiting_);  // the running streams end at their workers' next step
    lock.unlock();
    for (Stream* stream : waiting) End(stream, kServerStopping);
    lock.lock();
    open_changed_.wait_for(lock, kDrainEnd, done);
  }

  void Run(int capacity) {
    std::vector<Stream*> running;
    const auto step = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(
        settings_.step_ms));
    auto next_step = Clock::now();
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        if (running.empty()) {
          wake_.wait(lock, [this] { return stopping_ || !waiting_.empty(); });
          next_step = Clock::now();
        }
        if (stopping_) break;
        while (!waiting_.empty() && static_cast<int>(running.size()) < capacity) {
          running.push_back(waiting_.front());
          waiting_.pop_front();
        }
      }
      Step(&running);
      // A fixed cadence: a step that overran starts the next at once (no burst of catch-up steps).
      next_step = std::max(next_step + step, Clock::now());
      std::this_thread::sleep_until(next_step);
    }
    for (Stream* stream : running) End(stream, kEngineShuttingDown);
  }

  void Step(std::vector<Stream*>* running) {
    const std::vector<int32_t>& tokens = settings_.tokens;
    const bool server_stopping = server_stopping_;
    size_t kept = 0;
    for (Stream* stream : *running) {
      if (server_stopping) {  // the stop's deadline passed with the stream still running
        End(stream, kServerStopping);
        continue;
      }
      bool cancelled = false;
      LogError("is cancelled", TRITONBACKEND_ResponseFactoryIsCancelled(stream->factory, &cancelled));
      if (cancelled || stream->stopped) {
        stream->stopped = true;
        Finish(stream);
        continue;
      }
      stream->generated.push_back(tokens[(stream->offset + stream->generated.size()) % tokens.size()]);
      if (static_cast<int>(stream->generated.size()) >= stream->max_new_tokens) {
        Finish(stream);  // the last token goes out with the final flag
        continue;
      }
      const size_t unsent = stream->generated.size() - stream->sent;
      if (stream->streaming && (stream->sent == 0 || unsent >= static_cast<size_t>(settings_.stream_interval))) {
        if (Send(stream, stream->generated.data() + stream->sent, unsent, false)) {  // it could not be made
          Close(stream);
          continue;
        }
        stream->sent = stream->generated.size();
      }
      (*running)[kept++] = stream;
    }
    running->resize(kept);
  }

  Settings settings_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable open_changed_;  // open_ fell, or the model unloads
  std::deque<Stream*> waiting_;
  std::unordered_multimap<std::string, Stream*> by_id_;
  std::vector<std::thread> workers_;
  std::unique_ptr<server_stop::StopWatch> stop_watch_;  // calls Drain at a launcher's stop
  int open_ = 0;  // streams submitted and not yet ended
  bool stopping_ = false;  // the model unloads
  std::atomic<bool> server_stopping_{false};  // the stop's deadline passed (written under mutex_)
};

TRITONSERVER_Error* InvalidArg(const std::string& message) {
  return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, message.c_str());
}

// The values of an input as int32 (INT32 or BOOL), or an empty vector when the request lacks it.
TRITONSERVER_Error* ReadInput(TRITONBACKEND_Request* request, const char* name, std::vector<int32_t>* values,
                              int64_t* batch) {
  values->clear();
  TRITONBACKEND_Input* input = nullptr;
  TRITONSERVER_Error* missing = TRITONBACKEND_RequestInput(request, name, &input);
  if (missing != nullptr) {
    TRITONSERVER_ErrorDelete(missing);
    return nullptr;
  }
  TRITONSERVER_DataType datatype;
  const int64_t* shape = nullptr;
  uint32_t dims = 0, buffers = 0;
  uint64_t byte_size = 0;
  TRITONSERVER_Error* error =
      TRITONBACKEND_InputProperties(input, nullptr, &datatype, &shape, &dims, &byte_size, &buffers);
  if (error != nullptr) return error;
  if (datatype != TRITONSERVER_TYPE_INT32 && datatype != TRITONSERVER_TYPE_BOOL)
    return InvalidArg(std::string(name) + ": the replay engine reads INT32 or BOOL");
  if (batch != nullptr && dims > 0) *batch = shape[0];
  std::string bytes;
  for (uint32_t i = 0; i < buffers; ++i) {
    const void* buffer = nullptr;
    uint64_t size = 0;
    TRITONSERVER_MemoryType memory_type;
    int64_t memory_id;
    error = TRITONBACKEND_InputBuffer(input, i, &buffer, &size, &memory_type, &memory_id);
    if (error != nullptr) return error;
    if (memory_type == TRITONSERVER_MEMORY_GPU) return InvalidArg(std::string(name) + ": GPU memory is not read");
    bytes.append(static_cast<const char*>(buffer), size);
  }
  if (datatype == TRITONSERVER_TYPE_BOOL) {
    for (char value : bytes) values->push_back(value != 0);
  } else {
    values->resize(bytes.size() / sizeof(int32_t));
    std::memcpy(values->data(), bytes.data(), values->size() * sizeof(int32_t));
  }
  return nullptr;
}

bool Requested(TRITONBACKEND_Request* request, const char* name) {
  uint32_t count = 0;
  LogError("output count", TRITONBACKEND_RequestOutputCount(request, &count));
  if (count == 0) return true;  // none named: every output
  for (uint32_t i = 0; i < count; ++i) {
    const char* requested = nullptr;
    LogError("output name", TRITONBACKEND_RequestOutputName(request, i, &requested));
    if (requested != nullptr && std::strcmp(requested, name) == 0) return true;
  }
  return false;
}

// Parses one request into a stream (nullptr and no error for a stop request, which is answered here).
TRITONSERVER_Error* Accept(Engine* engine, TRITONBACKEND_Request* request, TRITONBACKEND_ResponseFactory* factory,
                           Stream** accepted) {
  *accepted = nullptr;
  const char* id = nullptr;
  LogError("request id", TRITONBACKEND_RequestId(request, &id));
  std::vector<int32_t> stop, prompt, output_len, streaming, exclude;
  int64_t batch = 1;
  TRITONSERVER_Error* error = ReadInput(request, contract::kStop, &stop, nullptr);
  if (error == nullptr && !stop.empty() && stop[0]) {
    if (id == nullptr || id[0] == '\0') return InvalidArg("stop: needs the request id of the request to stop");
    engine->Stop(id);
    LogError("send flags", TRITONBACKEND_ResponseFactorySendFlags(factory, TRITONSERVER_RESPONSE_COMPLETE_FINAL));
    LogError("delete response factory", TRITONBACKEND_ResponseFactoryDelete(factory));
    return nullptr;
  }
  if (error == nullptr) error = ReadInput(request, contract::kInputIds, &prompt, &batch);
  if (error == nullptr) error = ReadInput(request, contract::kRequestOutputLen, &output_len, nullptr);
  if (error == nullptr) error = ReadInput(request, contract::kStreaming, &streaming, nullptr);
  if (error == nullptr) error = ReadInput(request, contract::kExcludeInputInOutput, &exclude, nullptr);
  if (error != nullptr) return error;
  if (batch != 1)
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, "input_ids: the replay engine takes one row");
  if (output_len.empty() || output_len[0] < 1) return InvalidArg("request_output_len: must be >= 1");
  auto stream = std::make_unique<Stream>();
  stream->factory = factory;
  stream->id = id == nullptr ? "" : id;
  stream->max_new_tokens = output_len[0];
  stream->streaming = !streaming.empty() && streaming[0];
  stream->exclude_input = exclude.empty() ? engine->settings().exclude_input_in_output : exclude[0] != 0;
  stream->want_output_ids = Requested(request, contract::kOutputIds);
  stream->want_sequence_length = Requested(request, contract::kSequenceLength);
  int64_t sum = 0;
  for (int32_t token : prompt) sum += token;
  stream->offset = static_cast<size_t>(sum % static_cast<int64_t>(engine->settings().tokens.size()));
  stream->prompt = std::move(prompt);
  *accepted = stream.release();
  return nullptr;
}

}  // namespace

extern "C" {

// Loads only into a server whose backend API has what this backend calls.
TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend*) { return backend::CheckApiVersion(kBackend); }

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  TRITONBACKEND_Model* model = nullptr;
  TRITONSERVER_Error* error = TRITONBACKEND_ModelInstanceModel(instance, &model);
  json::Value config;
  if (error == nullptr) error = backend::ReadConfig(model, &config);
  if (error != nullptr) return error;
  using backend::Parameter;
  TRITONBACKEND_ArtifactType artifact;
  const char* location = nullptr;
  error = TRITONBACKEND_ModelRepository(model, &artifact, &location);
  if (error != nullptr) return error;

  Settings settings;
  try {
    settings.step_ms = std::stod(Parameter(config, contract::kReplayParameterReplayStepMs));
    settings.max_batch_size = std::stoi(Parameter(config, contract::kReplayParameterMaxBatchSize));
    const std::string threads = Parameter(config, contract::kReplayParameterReplaySenderThreads);
    settings.sender_threads = threads.empty() ? 1 : std::stoi(threads);
    settings.exclude_input_in_output = Parameter(config, contract::kReplayParameterExcludeInputInOutput) != "false";
    settings.reads_stop = Parameter(config, contract::kReplayParameterReplayReadsStop) != "false";
    const std::string interval = Parameter(config, contract::kReplayParameterStreamInterval);
    settings.stream_interval = interval.empty() ? 1 : std::stoi(interval);
  } catch (const std::exception&) {
    return InvalidArg("tritonforge_replay: parameters replay_step_ms and max_batch_size must be numbers");
  }
  const std::string tokens_path =
      std::string(location) + "/" + Parameter(config, contract::kReplayParameterReplayTokens);
  try {
    settings.tokens = ReadTokenIds(tokens_path);
  } catch (const std::exception& failure) {  // nothing may cross the C ABI into the server
    return InvalidArg("tritonforge_replay: " + tokens_path + " is not a JSON list of token ids: " + failure.what());
  }
  if (settings.tokens.empty()) return InvalidArg("tritonforge_replay: no token ids in " + tokens_path);
  if (settings.step_ms <= 0 || settings.max_batch_size < 1 || settings.stream_interval < 1)
    return InvalidArg("tritonforge_replay: replay_step_ms must be > 0, max_batch_size and stream_interval >= 1");
  backend::Log(kBackend, TRITONSERVER_LOG_INFO, __FILE__, __LINE__,
               "the REPLAY engine (benchmarking only): " + std::to_string(settings.max_batch_size) + " slots, " +
                   std::to_string(settings.step_ms) + " ms a step, " + std::to_string(settings.sender_threads) +
                   " sender threads");
  const char* name = nullptr;
  error = TRITONBACKEND_ModelInstanceName(instance, &name);
  if (error != nullptr) return error;
  std::unique_ptr<Engine> engine;
  try {  // its threads start here: nothing they throw may cross the C ABI into the server
    engine = std::make_unique<Engine>(std::move(settings), name);
  } catch (const std::exception& failure) {
    const std::string message = std::string("tritonforge_replay: the engine could not start: ") + failure.what();
    return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, message.c_str());
  }
  return backend::GiveState(instance, std::move(engine));  // refused: it stops its threads there
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
  return backend::DeleteState<Engine>(instance);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, const uint32_t count) {
  Engine* engine = nullptr;
  TRITONSERVER_Error* error = backend::StateOf(instance, &engine);
  if (error != nullptr) return error;
  const uint64_t started_ns = NowNs();
  for (uint32_t i = 0; i < count; ++i) {
    TRITONBACKEND_ResponseFactory* factory = nullptr;
    error = TRITONBACKEND_ResponseFactoryNew(&factory, requests[i]);
    if (error != nullptr) {  // no stream can be answered: the request gets its error, then is released
      backend::AnswerAndRelease(kBackend, requests[i], error);
      TRITONSERVER_ErrorDelete(error);
      continue;
    }
    Stream* stream = nullptr;
    try {  // nothing may cross the C ABI into the server
      error = Accept(engine, requests[i], factory, &stream);
    } catch (const std::exception& failure) {
      error = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INTERNAL, failure.what());
    }
    backend::ReportRequest(kBackend, instance, requests[i], error == nullptr, started_ns);
    // The factory outlives the request: release it now, as it is read.
    LogError("release request", TRITONBACKEND_RequestRelease(requests[i], TRITONSERVER_REQUEST_RELEASE_ALL));
    if (error != nullptr) {
      TRITONBACKEND_Response* response = nullptr;
      LogError("new response", TRITONBACKEND_ResponseNewFromFactory(&response, factory));
      if (response != nullptr)
        LogError("send error", TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error));
      TRITONSERVER_ErrorDelete(error);
      LogError("delete response factory", TRITONBACKEND_ResponseFactoryDelete(factory));
    } else if (stream != nullptr) {
      try {
        engine->Submit(stream);
      } catch (const std::exception& failure) {  // out of memory: logged, never thrown into the server
        backend::Log(kBackend, TRITONSERVER_LOG_ERROR, __FILE__, __LINE__,
                     std::string("a request could not be queued: ") + failure.what());
      }
    }
  }
  backend::ReportBatch(kBackend, instance, count, started_ns);
  return nullptr;
}

}  // extern "C"
