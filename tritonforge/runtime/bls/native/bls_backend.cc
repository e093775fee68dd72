// The BLS model as a C++ Triton backend ("tritonforge_bls"): the contract of `tensorrt_llm_bls`, the twin of the
// Python BLS (runtime/bls/orchestrator.py and row_stream.py), with no Python per token. Why C++: at one token a
// response the Python BLS spends ~260 us of CPU a token; here the text of a token costs a few microseconds.
//
// | input (the ensemble's, tensors.md)  |                                                                       |
// | text_input / messages, max_tokens,  | to `preprocessing`, once per request, as the ensemble wires them      |
// |   bad_words, stop_words, end_id, ...|                                                                       |
// | top_k, temperature, seed, ...       | to `tensorrt_llm`, as the ensemble wires them (per row)               |
// | stream, exclude_input_in_output     | the BLS's: the engine always streams, without the prompt              |
// | stream_interval (ours)              | engine responses per streamed response after the first (default 1)   |
// | num_top_log_probs (ours)            | each token's log prob and this many alternatives, per response        |
// | return_prompt_log_probs (ours)      | the prompt's tokens first among them, as the engine scores them       |
// | output                              |                                                                       |
// | text_output BYTES [1]               | whole UTF-8 characters; stop phrases never shown                      |
// | cum_log_probs, output_log_probs,    | as the Python BLS: log probs so far, tokens since the last response,  |
// |   num_output_tokens, batch_index,   |   the row of a batched request, and the engine's statistics as it    |
// |   the engine's statistics           |   sent them last                                                      |
// | token_ids, token_bytes,             | ours, with num_top_log_probs: the tokens each response adds, their   |
// |   token_log_probs, top_token_ids,   |   bytes and log probs, and the likeliest tokens at each one's step   |
// |   top_token_bytes, top_log_probs    |   (runtime/bls/token_log.py)                                          |
//
// A request's life: Execute copies its inputs and calls the `preprocessing` model in-process (TRITONSERVER_Server
// InferAsync); its answer starts one engine request per row on `tensorrt_llm`, decoupled and streaming. Each
// engine response is decoded (IncrementalDetokenizer), loses its stop phrases (StopPhraseFilter) and goes to a
// sender as a chunk; a stop phrase, the client's cancel or the server's stop cancels the engine request
// (TRITONSERVER_InferenceRequestCancel), which the engines read as the tensorrtllm backend does, through their
// response factory. Errors end their request only: the preprocessing's and the engine's pass through with their
// code and message; ours name the field (INVALID_ARG) as the Python BLS's do.
//
// Threads, and what each owns:
// - Execute (the instance's thread): parses and admits requests; it owns nothing past its return.
// - the preprocessing's response thread (Triton's): builds the rows and starts their engine requests.
// - the engine's response threads (Triton's): a row's text state, under the row's lock: the decoder, the stop
//   filter, the whole answer's pieces, the log probs and statistics; they queue chunks in the row's outbox.
// - the instance's senders (kSenderThreads): send a row's chunks, merged while they wait, one at a time per
//   row and in order, the row's last response last (runtime/sending.py's rules, with the stream interval, in
//   outbox.h, where tests hold them to Python's).
// - the instance's watcher: every kCheckPeriodMs, cancels the engine requests of requests whose client went
//   away, and ends every open request with UNAVAILABLE once the model stops being ready (unload, server stop).
// A request lives until its last response is sent and every call it made has returned its request and final
// response: each of those holds a `Reference` (the callbacks theirs through their userp); the last one to go
// releases Triton's request.
//
// Config parameters, as the Python model's (BlsParameters in facts/model_parameters.py): `tokenizer_dir` (its
// byte table, detokenizer.h), `max_input_len`, `max_seq_len` (required there; the limits are preprocessing's
// here), `tensorrt_llm_model_name`, `max_concurrency` (rows an instance runs at once; past it a request is
// answered UNAVAILABLE), `engine_grpc_url` and `add_special_tokens` (read by the Python BLS alone).

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "../../text/native/detokenizer.h"
#include "../../text/native/streaming_text.h"
#include "triton_backend_api.h"
#include "backend_support.h"
#include "server_stop.h"
#include "contract.h"
#include "outbox.h"

namespace {

namespace text = tritonforge::text;
namespace json = tritonforge::json;
namespace backend = tritonforge::backend;
namespace server_stop = tritonforge::server_stop;
namespace sending = tritonforge::sending;

// --- names: facts/contract.py and facts/errors.py through the generated contract.h; the parameters' keys are
// facts/model_parameters.py's BlsParameters.
constexpr char kBackend[] = "tritonforge_bls";
using namespace tritonforge::contract;  // NOLINT: the contract's names, as the Python models import them

// BlsParameters' keys and defaults (facts/model_parameters.py, through contract.h).
constexpr const char* kTokenizerDir = kBlsParameterTokenizerDir;
constexpr const char* kMaxInputLen = kBlsParameterMaxInputLen;
constexpr const char* kMaxSeqLen = kBlsParameterMaxSeqLen;
constexpr const char* kEngineModelKey = kBlsParameterTensorrtLlmModelName;
constexpr const char* kMaxConcurrency = kBlsParameterMaxConcurrency;
constexpr int64_t kDefaultMaxConcurrency = kBlsMaxConcurrency;
constexpr int kCheckPeriodMs = kCancellationCheckPeriodMs;
constexpr int kSenderThreads = 2;  // a send is a few microseconds here: two keep one slow client from the rest

using tritonforge::server_stop::kServerStopping;

using backend::NowNs;

// --- errors -----------------------------------------------------------------------------------------------------
using backend::Error;

void Log(TRITONSERVER_LogLevel level, int line, const std::string& message) {
  backend::Log(kBackend, level, __FILE__, line, message);
}

void LogIfError(TRITONSERVER_Error* raw, const char* what, int line) {
  backend::LogIfError(kBackend, raw, what, __FILE__, line);
}

// An error as data: what a request ends with, sent as many times as it takes (a Triton error is sent once).
struct Failure {
  TRITONSERVER_Error_Code code = TRITONSERVER_ERROR_INTERNAL;
  std::string message;

  static Failure Of(TRITONSERVER_Error* error) {  // reads, does not release
    return Failure{TRITONSERVER_ErrorCode(error), TRITONSERVER_ErrorMessage(error)};
  }
  static Failure Field(const std::string& field, const std::string& problem) {  // errors.RequestError
    return Failure{TRITONSERVER_ERROR_INVALID_ARG, field + ": " + problem};
  }
  static Failure Internal(const std::string& what) { return Failure{TRITONSERVER_ERROR_INTERNAL, kInternalPrefix + what}; }
  TRITONSERVER_Error* New() const { return TRITONSERVER_ErrorNew(code, message.c_str()); }
};

// --- tensors ----------------------------------------------------------------------------------------------------
// A tensor copied out of a request or a response: the BLS keeps nothing of Triton's past the call that gave it.
struct Tensor {
  std::string name;
  TRITONSERVER_DataType datatype = TRITONSERVER_TYPE_INVALID;
  std::vector<int64_t> shape;
  std::string data;  // the bytes; a BYTES tensor as Triton serializes it (4-byte length, bytes; per element)

  int64_t Elements() const {
    int64_t count = 1;
    for (int64_t dim : shape) count *= dim;
    return count;
  }
  template <typename T>
  std::vector<T> Values() const {  // copied: buffers need not be aligned
    std::vector<T> values(data.size() / sizeof(T));
    if (!values.empty()) std::memcpy(values.data(), data.data(), values.size() * sizeof(T));
    return values;
  }
};
using TensorPtr = std::shared_ptr<const Tensor>;

Tensor Scalar(const char* name, TRITONSERVER_DataType datatype, const void* value, size_t size,
              std::vector<int64_t> shape = {1, 1}) {
  return Tensor{name, datatype, std::move(shape), std::string(static_cast<const char*>(value), size)};
}

Tensor Int32(const char* name, std::vector<int64_t> shape, const std::vector<int32_t>& values) {
  return Tensor{name, TRITONSERVER_TYPE_INT32, std::move(shape),
                std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(int32_t))};
}

// The elements of a serialized BYTES tensor; false when the buffer is not one.
bool BytesElements(const std::string& data, std::vector<std::string_view>* elements) {
  for (size_t at = 0; at < data.size();) {
    if (data.size() - at < 4) return false;
    uint32_t length = 0;
    for (int i = 3; i >= 0; --i) length = (length << 8) | static_cast<unsigned char>(data[at + i]);
    at += 4;
    if (data.size() - at < length) return false;
    elements->emplace_back(data.data() + at, length);
    at += length;
  }
  return true;
}

// One row of a [B, ...] tensor, as orchestrator._engine_inputs takes it: a [B] input (a scalar reshaped) is
// [B, 1]; a tensor of one row is every row's.
bool RowOf(const Tensor& tensor, int64_t row, Tensor* out) {
  *out = Tensor{tensor.name, tensor.datatype, tensor.shape, ""};
  if (out->shape.size() == 1) out->shape.push_back(1);
  if (out->shape.empty() || out->shape[0] <= 1) {
    out->data = tensor.data;
    return true;
  }
  const int64_t rows = out->shape[0];
  out->shape[0] = 1;
  if (tensor.datatype != TRITONSERVER_TYPE_BYTES) {
    const size_t size = tensor.data.size() / static_cast<size_t>(rows);
    out->data = tensor.data.substr(static_cast<size_t>(row) * size, size);
    return true;
  }
  std::vector<std::string_view> elements;
  if (!BytesElements(tensor.data, &elements) || elements.size() % static_cast<size_t>(rows) != 0) return false;
  const size_t per_row = elements.size() / static_cast<size_t>(rows);
  for (size_t i = static_cast<size_t>(row) * per_row; i < (static_cast<size_t>(row) + 1) * per_row; ++i)
    text::AppendBytesElement(elements[i], &out->data);
  return true;
}

// --- the model's config ---------------------------------------------------------------------------------------
using backend::Decoupled;
using backend::Parameter;
using backend::ReadConfig;

// ModelParameters.from_config for an int field: absent or empty gives the default; one that does not read as an
// integer is refused naming the key. `required`: no default.
bool IntegerParameter(const json::Value& config, const char* key, bool required, int64_t* value,
                      std::string* problem) {
  std::string raw = Parameter(config, key);
  const size_t first = raw.find_first_not_of(" \t\n\r"), last = raw.find_last_not_of(" \t\n\r");
  raw = first == std::string::npos ? "" : raw.substr(first, last - first + 1);
  if (raw.empty()) {
    if (required) *problem = std::string("config parameter '") + key + "' is required by BlsParameters";
    return !required;
  }
  errno = 0;
  char* end = nullptr;
  const long long parsed = std::strtoll(raw.c_str(), &end, 10);
  if (errno == ERANGE || end != raw.c_str() + raw.size()) {
    *problem = std::string("config parameter '") + key + "' must be int, got '" + raw + "'";
    return false;
  }
  *value = parsed;
  return true;
}

// What the backend reads once per model, shared read-only by every instance.
struct ModelState {
  std::string name;
  int64_t version = 1;
  TRITONSERVER_Server* server = nullptr;
  bool decoupled = true;
  std::string engine_model = kEngineModel;
  int64_t max_concurrency = kDefaultMaxConcurrency;
  std::unique_ptr<text::TokenBytes> table;
  TRITONSERVER_ResponseAllocator* allocator = nullptr;

  ~ModelState() {
    if (allocator != nullptr) LogIfError(TRITONSERVER_ResponseAllocatorDelete(allocator), "delete allocator", __LINE__);
  }
};

// Every output of a response of a model the BLS called, copied; or its error.
TRITONSERVER_Error* ResponseTensors(TRITONSERVER_InferenceResponse* response, std::map<std::string, Tensor>* out) {
  if (TRITONSERVER_Error* error = TRITONSERVER_InferenceResponseError(response)) return error;
  uint32_t count = 0;
  if (TRITONSERVER_Error* error = TRITONSERVER_InferenceResponseOutputCount(response, &count)) return error;
  for (uint32_t i = 0; i < count; ++i) {
    const char* name = nullptr;
    TRITONSERVER_DataType datatype = TRITONSERVER_TYPE_INVALID;
    const int64_t* shape = nullptr;
    uint64_t rank = 0;
    const void* base = nullptr;
    size_t size = 0;
    TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
    int64_t memory_id = 0;
    void* userp = nullptr;
    if (TRITONSERVER_Error* error = TRITONSERVER_InferenceResponseOutput(response, i, &name, &datatype, &shape, &rank,
                                                                         &base, &size, &memory_type, &memory_id,
                                                                         &userp))
      return error;
    Tensor& tensor = (*out)[name];
    tensor.name = name;
    tensor.datatype = datatype;
    tensor.shape.assign(shape, shape + rank);
    tensor.data.assign(static_cast<const char*>(base), size);  // our allocator's CPU memory
  }
  return nullptr;
}

// A request to `model` with `tensors` as inputs, asking for `outputs`; each callback gets its own userp.
TRITONSERVER_Error* NewCall(const ModelState& state, const std::string& model, const std::vector<Tensor>& tensors,
                            const std::vector<std::string>& outputs, const std::string& id,
                            TRITONSERVER_InferenceRequestReleaseFn_t released,
                            TRITONSERVER_InferenceResponseCompleteFn_t answered, void* released_userp,
                            void* answered_userp, TRITONSERVER_InferenceRequest** call) {
  TRITONSERVER_InferenceRequest* request = nullptr;
  if (TRITONSERVER_Error* error = TRITONSERVER_InferenceRequestNew(&request, state.server, model.c_str(), -1))
    return error;
  TRITONSERVER_Error* error = id.empty() ? nullptr : TRITONSERVER_InferenceRequestSetId(request, id.c_str());
  if (error == nullptr) error = TRITONSERVER_InferenceRequestSetReleaseCallback(request, released, released_userp);
  if (error == nullptr)
    error = TRITONSERVER_InferenceRequestSetResponseCallback(request, state.allocator, nullptr, answered,
                                                             answered_userp);
  // The inputs point into `tensors`, which the caller keeps until the request is released.
  for (const Tensor& tensor : tensors) {
    if (error != nullptr) break;
    error = TRITONSERVER_InferenceRequestAddInput(request, tensor.name.c_str(), tensor.datatype, tensor.shape.data(),
                                                  tensor.shape.size());
    if (error == nullptr)
      error = TRITONSERVER_InferenceRequestAppendInputData(request, tensor.name.c_str(), tensor.data.data(),
                                                           tensor.data.size(), TRITONSERVER_MEMORY_CPU, 0);
  }
  for (const std::string& output : outputs) {
    if (error != nullptr) break;
    error = TRITONSERVER_InferenceRequestAddRequestedOutput(request, output.c_str());
  }
  if (error != nullptr) {
    LogIfError(TRITONSERVER_InferenceRequestDelete(request), "delete request", __LINE__);
    return error;
  }
  *call = request;
  return nullptr;
}

class InstanceState;
class ClientRequest;
struct Row;

// One counted reference to a ClientRequest, dropped when it goes: whatever may still use the request (Execute, each
// Triton callback still to come, each row's last step, the watcher's pass) owns one, so the request lives until the
// last of them is gone, with no count to pair by hand on any path.
class Reference {
 public:
  Reference() = default;
  static Reference Adopt(ClientRequest* request) {  // the reference a new request is made with
    Reference reference;
    reference.request_ = request;
    return reference;
  }
  static Reference Take(ClientRequest* request);  // one more
  static Reference TryTake(ClientRequest* request);  // one more, unless the request already ends (then empty)
  Reference(Reference&& other) noexcept : request_(std::exchange(other.request_, nullptr)) {}
  Reference& operator=(Reference&& other) noexcept {
    if (this != &other) {
      Drop();
      request_ = std::exchange(other.request_, nullptr);
    }
    return *this;
  }
  Reference(const Reference&) = delete;
  Reference& operator=(const Reference&) = delete;
  ~Reference() { Drop(); }

  ClientRequest* get() const { return request_; }
  ClientRequest* operator->() const { return request_; }
  explicit operator bool() const { return request_ != nullptr; }
  void Drop();  // now, not at the end of the scope

 private:
  ClientRequest* request_ = nullptr;
};

// What one callback of a call the BLS made owns (its userp): a reference to the request and the row the call is for
// (none for preprocessing's). Deleted by the callback's last call, or with the call when it never started.
struct CallbackHold {
  Reference request;
  Row* row = nullptr;
};
using HeldCallback = std::unique_ptr<CallbackHold>;

// Starts `call`: from then on its callbacks own `released` and `answered`; a call that cannot start keeps them, and
// they go (their references with them) with the caller's.
TRITONSERVER_Error* StartCall(const ModelState& state, TRITONSERVER_InferenceRequest* call, HeldCallback* released,
                              HeldCallback* answered) {
  CallbackHold* released_hold = released->release();  // before the start: a callback may run before it returns
  CallbackHold* answered_hold = answered->release();
  TRITONSERVER_Error* error = TRITONSERVER_ServerInferAsync(state.server, call, nullptr);
  if (error != nullptr) {  // not started: no callback will run
    released->reset(released_hold);
    answered->reset(answered_hold);
  }
  return error;
}

// --- one row: its engine request, its text, its responses --------------------------------------------------------
// A chunk of streamed text on its way to a sender, with what its response reports, copied as it was made
// (row_stream._Chunk).
struct Chunk {
  std::string text;
  int64_t tokens = 0;  // generated tokens not reported before (num_output_tokens)
  bool has_log_probs = false;
  std::vector<float> log_probs;  // every log prob so far
  std::map<std::string, TensorPtr> statistics;
  int64_t size = 0;  // engine responses it covers: the stream interval's unit
  size_t token_mark = 0;  // the token log's tokens up to here go out with this chunk (num_top_log_probs)
};

// A row's generated tokens with their log probs and likeliest alternatives (token_log.TokenLog), appended by the
// engine's response thread and read by a sender, both under the row's lock.
struct TokenLog {
  int32_t top = 0;  // alternatives per token
  std::vector<int32_t> ids;
  std::vector<float> log_probs;
  std::vector<int32_t> top_ids;  // `top` per token
  std::vector<float> top_log_probs;
  size_t sent = 0;  // tokens sent so far (the sender holding the row)
  bool prompt_pending = false;  // return_prompt_log_probs: the prompt's tokens go first, once the engine scores them
};

struct Row {
  ClientRequest* owner = nullptr;
  int64_t index = 0;
  // Set before the engine call starts, read-only after.
  std::vector<Tensor> engine_inputs;  // the engine request's tensors, which it points into until released
  std::vector<std::string> engine_outputs;
  std::vector<std::string> statistics;  // the engine's statistics the client gets
  std::vector<int32_t> prompt_ids;  // echoed in a whole answer unless exclude_input
  Reference last_step;  // the request lives until the row's last step has run (moved out by it)

  std::mutex mutex;  // guards everything below
  // The engine request: valid from its start until the request's end, so that a cancel may always reach it.
  TRITONSERVER_InferenceRequest* engine = nullptr;
  bool engine_started = false;
  bool engine_stopped = false;  // cancelled once: a stop phrase, the client's cancel, the server's stop
  // The text state (the engine's response thread while the engine call is open, then the last step's).
  std::unique_ptr<text::IncrementalDetokenizer> detokenizer;
  std::unique_ptr<text::StopPhraseFilter> stop_filter;
  std::string pieces;  // a whole answer's text
  std::vector<float> log_probs;
  std::unique_ptr<TokenLog> token_log;  // with num_top_log_probs
  std::map<std::string, TensorPtr> statistics_last;
  int64_t unreported = 0;  // generated tokens not yet reported in a response
  int64_t responses = 0;  // engine responses since the last chunk
  std::string tail;  // what the detokenizer and the stop filter held at the end
  bool ended = false;  // the engine call is over for the row (its final response, an error or a stop)
  bool has_error = false;
  Failure error;
  // Chunks waiting for a sender (their unit: engine responses, the stream interval's), and whether one holds the
  // row; a send that failed ends the row with an error, never a stream with a gap.
  sending::Outbox<Chunk> outbox;
};

// --- one client request: its rows, its responses, its end ----------------------------------------------------
class ClientRequest {
 public:
  ClientRequest(InstanceState* instance, TRITONBACKEND_Request* request);
  ~ClientRequest();

  // Parse, admit and send to preprocessing; an error (not yet answered) when it cannot start.
  TRITONSERVER_Error* Start();
  void FailNow(TRITONSERVER_Error* error);  // the one and final response of a request that never started

  // The watcher's: the client went away, or the server stops.
  TRITONBACKEND_Request* request() const { return request_; }
  void CancelEngines();
  void Stop(const Failure& failure);

  // Triton's callbacks.
  static void PreprocessingReleased(TRITONSERVER_InferenceRequest*, const uint32_t, void* userp);
  static void PreprocessingAnswered(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp);
  static void EngineReleased(TRITONSERVER_InferenceRequest*, const uint32_t, void* userp);
  static void EngineAnswered(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp);

  // A sender's: one turn of the row (sending.Outbox.take_turn); true when the row wants another turn.
  bool TakeTurn(Row* row);

  int64_t rows_admitted() const { return rows_admitted_; }

 private:
  TRITONSERVER_Error* ReadInputs();
  void Preprocessed();
  bool BuildRows(const std::map<std::string, Tensor>& encoded, Failure* failure);
  bool EngineInputs(const std::map<std::string, Tensor>& encoded, Row* row, Failure* failure);
  bool ReadTopLogProbs(Failure* failure);
  bool LogTokensLocked(Row* row, const std::map<std::string, Tensor>& tensors, const int32_t* ids, size_t count,
                       Failure* failure);
  void TokenLogOutputs(Row* row, size_t end, std::vector<TensorPtr>* outputs) const;
  void StartEngine(Row* row);
  void OnEngineResponse(Row* row, TRITONSERVER_InferenceResponse* response);
  void CountLocked(Row* row, const std::map<std::string, Tensor>& tensors, int64_t length);
  void EmitLocked(Row* row, std::string text, bool* schedule);
  void EndRow(Row* row, const Failure* failure);
  void CancelLocked(Row* row);
  void RunLast(Row* row, std::vector<Chunk> rest);
  bool SendChunks(Row* row, const std::vector<Chunk>& chunks);
  std::vector<TensorPtr> ResponseOutputs(Row* row, const std::string& text, const std::vector<float>* log_probs,
                                         const std::map<std::string, TensorPtr>& statistics, int64_t tokens) const;
  bool Send(const std::vector<TensorPtr>* outputs, const Failure* failure, bool row_done);
  bool SendLocked(const std::vector<TensorPtr>* outputs, const Failure* failure, uint32_t flags);
  void EndAll(const Failure& failure);  // every row of a request that failed before its engine calls
  bool Requested(const std::string& name) const { return requested_.empty() || requested_.count(name) > 0; }
  const Tensor* Input(const char* name) const {
    auto found = inputs_.find(name);
    return found == inputs_.end() ? nullptr : &found->second;
  }
  bool Flag(const char* name, bool fallback) const;

  // Counted by `Reference` alone.
  friend class Reference;
  void AddRef() { refs_.fetch_add(1); }
  bool TryAddRef() {  // never revives a request already ending
    int refs = refs_.load();
    while (refs > 0)
      if (refs_.compare_exchange_weak(refs, refs + 1)) return true;
    return false;
  }
  void DropRef() {
    if (refs_.fetch_sub(1) == 1) delete this;
  }

  InstanceState* instance_;
  const ModelState& model_;
  TRITONBACKEND_Request* request_;
  TRITONBACKEND_ResponseFactory* factory_ = nullptr;
  std::atomic<int> refs_{1};  // the first is Execute's (Reference::Adopt)
  std::map<std::string, Tensor> inputs_;  // the client's, copied
  std::set<std::string> requested_;  // the outputs the client asked for (empty: all)
  int64_t rows_admitted_ = 0;
  std::string id_;
  // Set before preprocessing answers, read-only after.
  bool stream_ = false, exclude_input_ = true, return_log_probs_ = false, count_tokens_ = false;
  int32_t top_log_probs_ = -1;  // num_top_log_probs; -1: not asked (0 with return_prompt_log_probs alone)
  bool prompt_log_probs_ = false;  // return_prompt_log_probs
  std::vector<Tensor> preprocessing_inputs_;
  TRITONSERVER_InferenceRequest* preprocessing_ = nullptr;
  std::map<std::string, Tensor> encoded_;  // preprocessing's answer (its response thread)
  bool preprocessing_failed_ = false;
  Failure preprocessing_error_;
  std::atomic<bool> cancelled_{false};  // the client went away (the watcher)
  std::mutex stop_mutex_;  // guards stopping_ and rows_' creation against the watcher's Stop
  bool stopping_ = false;
  Failure stop_failure_;
  std::vector<std::unique_ptr<Row>> rows_;
  std::mutex send_mutex_;  // held through a send: no response follows the final one
  int64_t open_rows_ = 0;
};

// --- the instance -------------------------------------------------------------------------------------------------
class InstanceState {
 public:
  InstanceState(const ModelState& model, std::string name)
      : model_(model),
        name_(std::move(name)),
        senders_(kSenderThreads, [](Row* row) { return row->owner->TakeTurn(row); }) {
    watcher_ = std::thread([this] { Watch(); });
    stop_watch_ = std::make_unique<server_stop::StopWatch>(name_, [this](double deadline) { Drain(deadline); });
  }

  ~InstanceState() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closing_ = true;
    }
    wake_.notify_all();
    open_changed_.notify_all();
    stop_watch_.reset();
    watcher_.join();
    senders_.Close();
    std::lock_guard<std::mutex> lock(mutex_);
    if (!open_.empty())
      Log(TRITONSERVER_LOG_WARN, __LINE__, name_ + ": " + std::to_string(open_.size()) + " requests still open");
  }

  const ModelState& model() const { return model_; }
  sending::Senders<Row>& senders() { return senders_; }
  const std::string& name() const { return name_; }
  std::string NextEngineId() { return name_ + "-" + std::to_string(next_id_.fetch_add(1)); }

  // Admit a request of `rows` rows, or say why not: UNAVAILABLE when stopping or full.
  TRITONSERVER_Error* Admit(ClientRequest* request, int64_t rows) {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNAVAILABLE, kServerStopping);
    // A request larger than the bound alone still runs when nothing else does: it could never run otherwise.
    if (open_rows_ > 0 && open_rows_ + rows > model_.max_concurrency) {
      const std::string message = std::string(kUnavailablePrefix) + "the BLS instance " + name_ + " runs " +
                                  std::to_string(open_rows_) + " requests, its max_concurrency is " +
                                  std::to_string(model_.max_concurrency) + "; retry later";
      return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNAVAILABLE, message.c_str());
    }
    open_rows_ += rows;
    open_.insert(request);
    return nullptr;
  }

  void Closed(ClientRequest* request) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (open_.erase(request) > 0) open_rows_ -= request->rows_admitted();
    }
    open_changed_.notify_all();
  }

 private:
  // A launcher's stop (server_stop.h): open requests run until `deadline`; then the watcher ends the rest with
  // kServerStopping, cancelling their engine requests (NVIDIA's engine reads no stop of ours), and refuses new
  // ones, as when the model is no longer served.
  void Drain(double deadline) {
    const auto done = [this] { return closing_ || open_.empty(); };
    std::unique_lock<std::mutex> lock(mutex_);
    if (open_changed_.wait_for(lock, server_stop::Span(deadline - server_stop::MonotonicSeconds()), done)) return;
    Log(TRITONSERVER_LOG_WARN, __LINE__, name_ + ": the server is stopping: ending " + std::to_string(open_.size()) +
                                             " open requests");
    stopping_ = true;
    wake_.notify_all();
    open_changed_.wait_for(lock, server_stop::kDrainEnd, done);
  }

  // The watcher: cancels for clients that went away; ends everything once the model is no longer served.
  void Watch() {
    bool seen_ready = false;
    std::unique_lock<std::mutex> lock(mutex_);
    while (!closing_) {
      wake_.wait_for(lock, std::chrono::milliseconds(kCheckPeriodMs));
      if (closing_) break;
      lock.unlock();
      bool ready = false;
      Error error(TRITONSERVER_ServerModelIsReady(model_.server, model_.name.c_str(), model_.version, &ready));
      const bool stopping = seen_ready && (error != nullptr || !ready);
      seen_ready = seen_ready || (error == nullptr && ready);
      lock.lock();
      if (stopping && !stopping_) {
        stopping_ = true;
        if (!open_.empty())
          Log(TRITONSERVER_LOG_WARN, __LINE__, name_ + ": the model is no longer served: ending " +
                                                   std::to_string(open_.size()) + " open requests");
      }
      std::vector<Reference> open;
      for (ClientRequest* request : open_)
        if (Reference reference = Reference::TryTake(request)) open.push_back(std::move(reference));
      const bool stop = stopping_;
      lock.unlock();
      for (Reference& request : open) {
        try {
          if (stop) {
            request->Stop(Failure{TRITONSERVER_ERROR_UNAVAILABLE, kServerStopping});
          } else {
            bool cancelled = false;
            LogIfError(TRITONBACKEND_RequestIsCancelled(request->request(), &cancelled), "is cancelled", __LINE__);
            if (cancelled) request->CancelEngines();
          }
        } catch (const std::exception& exception) {  // out of memory: tried again at the next check
          Log(TRITONSERVER_LOG_ERROR, __LINE__, std::string("watch: ") + exception.what());
        }
        request.Drop();  // here, not under the lock: the last reference closes the request, which takes it
      }
      lock.lock();
    }
  }

  const ModelState& model_;
  std::string name_;
  sending::Senders<Row> senders_;
  std::atomic<uint64_t> next_id_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable open_changed_;  // a request closed, or the instance closes
  bool closing_ = false;
  bool stopping_ = false;
  int64_t open_rows_ = 0;
  std::set<ClientRequest*> open_;
  std::thread watcher_;
  std::unique_ptr<server_stop::StopWatch> stop_watch_;  // calls Drain at a launcher's stop
};

// --- ClientRequest -------------------------------------------------------------------------------------------------
ClientRequest::ClientRequest(InstanceState* instance, TRITONBACKEND_Request* request)
    : instance_(instance), model_(instance->model()), request_(request) {}

ClientRequest::~ClientRequest() {
  instance_->Closed(this);
  if (preprocessing_ != nullptr)
    LogIfError(TRITONSERVER_InferenceRequestDelete(preprocessing_), "delete preprocessing request", __LINE__);
  for (auto& row : rows_)
    if (row->engine != nullptr) LogIfError(TRITONSERVER_InferenceRequestDelete(row->engine), "delete request", __LINE__);
  if (factory_ != nullptr) LogIfError(TRITONBACKEND_ResponseFactoryDelete(factory_), "delete factory", __LINE__);
  LogIfError(TRITONBACKEND_RequestRelease(request_, TRITONSERVER_REQUEST_RELEASE_ALL), "release request", __LINE__);
}

Reference Reference::Take(ClientRequest* request) {
  request->AddRef();
  return Adopt(request);
}

Reference Reference::TryTake(ClientRequest* request) {
  return request->TryAddRef() ? Adopt(request) : Reference();
}

void Reference::Drop() {
  if (ClientRequest* request = std::exchange(request_, nullptr)) request->DropRef();
}

bool ClientRequest::Flag(const char* name, bool fallback) const {  // orchestrator._flag: the first value
  const Tensor* tensor = Input(name);
  return tensor == nullptr || tensor->data.empty() ? fallback : tensor->data[0] != 0;
}

TRITONSERVER_Error* ClientRequest::ReadInputs() {
  const char* id = nullptr;
  LogIfError(TRITONBACKEND_RequestId(request_, &id), "request id", __LINE__);
  id_ = id == nullptr ? "" : id;
  uint32_t count = 0;
  if (TRITONSERVER_Error* error = TRITONBACKEND_RequestInputCount(request_, &count)) return error;
  for (uint32_t i = 0; i < count; ++i) {
    TRITONBACKEND_Input* input = nullptr;
    if (TRITONSERVER_Error* error = TRITONBACKEND_RequestInputByIndex(request_, i, &input)) return error;
    const char* name = nullptr;
    TRITONSERVER_DataType datatype = TRITONSERVER_TYPE_INVALID;
    const int64_t* shape = nullptr;
    uint32_t rank = 0, buffers = 0;
    uint64_t byte_size = 0;
    if (TRITONSERVER_Error* error =
            TRITONBACKEND_InputProperties(input, &name, &datatype, &shape, &rank, &byte_size, &buffers))
      return error;
    Tensor tensor{name, datatype, std::vector<int64_t>(shape, shape + rank), ""};
    tensor.data.reserve(byte_size);
    for (uint32_t b = 0; b < buffers; ++b) {
      const void* buffer = nullptr;
      uint64_t size = 0;
      TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
      int64_t memory_id = 0;
      if (TRITONSERVER_Error* error = TRITONBACKEND_InputBuffer(input, b, &buffer, &size, &memory_type, &memory_id))
        return error;
      if (memory_type == TRITONSERVER_MEMORY_GPU)
        return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED,
                                     (std::string(name) + ": GPU memory is not read, send it in CPU memory").c_str());
      tensor.data.append(static_cast<const char*>(buffer), size);
    }
    inputs_.emplace(tensor.name, std::move(tensor));
  }
  uint32_t outputs = 0;
  LogIfError(TRITONBACKEND_RequestOutputCount(request_, &outputs), "output count", __LINE__);
  for (uint32_t i = 0; i < outputs; ++i) {
    const char* name = nullptr;
    LogIfError(TRITONBACKEND_RequestOutputName(request_, i, &name), "output name", __LINE__);
    if (name != nullptr) requested_.insert(name);
  }
  return nullptr;
}

TRITONSERVER_Error* ClientRequest::Start() {
  if (TRITONSERVER_Error* error = TRITONBACKEND_ResponseFactoryNew(&factory_, request_)) return error;
  if (TRITONSERVER_Error* error = ReadInputs()) return error;
  int64_t rows = 1;  // the prompt's rows, as Preprocessor.encode counts them
  for (const char* name : {kTextInput, kMessages})
    if (const Tensor* tensor = Input(name); tensor != nullptr && !tensor->shape.empty())
      rows = std::max(rows, tensor->shape[0]);
  if (TRITONSERVER_Error* error = instance_->Admit(this, rows)) return error;
  rows_admitted_ = rows;

  for (const NamePair& pair : kPreprocessingFromClient) {
    if (const Tensor* tensor = Input(pair.from)) {
      preprocessing_inputs_.push_back(*tensor);
      preprocessing_inputs_.back().name = pair.to;
    }
  }
  std::vector<std::string> outputs = {kPreInputId, kPreRequestInputLen, kPreRequestOutputLen, kPreBadWordsIds, kPreStopWordsIds,
                                      kPreEmbeddingBias, kPreOutEndId, kPreOutPadId};
  if (Input(kPromptTableExtraId) != nullptr) outputs.push_back(kPreOutPromptTableExtraIds);  // made only when sent
  HeldCallback released(new CallbackHold{Reference::Take(this), nullptr});
  HeldCallback answered(new CallbackHold{Reference::Take(this), nullptr});
  if (TRITONSERVER_Error* error = NewCall(model_, kPreprocessingModel, preprocessing_inputs_, outputs, id_,
                                          PreprocessingReleased, PreprocessingAnswered, released.get(),
                                          answered.get(), &preprocessing_))
    return error;
  return StartCall(model_, preprocessing_, &released, &answered);
}

void ClientRequest::FailNow(TRITONSERVER_Error* error) {
  TRITONBACKEND_Response* response = nullptr;
  Error failed(factory_ != nullptr ? TRITONBACKEND_ResponseNewFromFactory(&response, factory_)
                                   : TRITONBACKEND_ResponseNew(&response, request_));
  if (failed) {
    Log(TRITONSERVER_LOG_ERROR, __LINE__, std::string("new response: ") + TRITONSERVER_ErrorMessage(failed.get()));
    return;
  }
  LogIfError(TRITONBACKEND_ResponseSend(response, TRITONSERVER_RESPONSE_COMPLETE_FINAL, error), "send", __LINE__);
}

void ClientRequest::PreprocessingReleased(TRITONSERVER_InferenceRequest*, const uint32_t, void* userp) {
  delete static_cast<CallbackHold*>(userp);  // the request object is deleted with the ClientRequest
}

void ClientRequest::PreprocessingAnswered(TRITONSERVER_InferenceResponse* response, const uint32_t flags,
                                          void* userp) {
  auto* hold = static_cast<CallbackHold*>(userp);
  ClientRequest* self = hold->request.get();
  if (response != nullptr) {
    if (Error error{ResponseTensors(response, &self->encoded_)}) {
      self->preprocessing_failed_ = true;
      self->preprocessing_error_ = Failure::Of(error.get());
    }
    LogIfError(TRITONSERVER_InferenceResponseDelete(response), "delete response", __LINE__);
  }
  if ((flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) == 0) return;
  try {
    self->Preprocessed();
  } catch (const std::exception& exception) {  // nothing may cross the C ABI into the server
    self->EndAll(Failure::Internal(exception.what()));
  }
  delete hold;  // the call's last answer
}

// preprocessing answered: its errors are the request's; then the BLS's own checks, in the Python BLS's order
// (orchestrator._rows), then one engine request per row.
void ClientRequest::Preprocessed() {
  if (preprocessing_failed_) return EndAll(preprocessing_error_);
  Failure failure;
  if (!BuildRows(encoded_, &failure)) return EndAll(failure);
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    if (stopping_) return EndAll(stop_failure_);
  }
  if (cancelled_) return EndAll(Failure{TRITONSERVER_ERROR_CANCELLED, "the request was cancelled"});
  for (auto& row : rows_) StartEngine(row.get());
}

bool ClientRequest::BuildRows(const std::map<std::string, Tensor>& encoded, Failure* failure) {
  auto found = encoded.find(kPreInputId);
  if (found == encoded.end() || found->second.shape.size() != 2 || found->second.datatype != TRITONSERVER_TYPE_INT32) {
    *failure = Failure::Internal("preprocessing answered no INPUT_ID [batch, tokens]");
    return false;
  }
  const int64_t batch = found->second.shape[0];
  stream_ = Flag(kStream, false);
  if (!model_.decoupled && (stream_ || batch > 1)) {
    *failure = Failure::Field(stream_ ? kStream : kTextInput, "streaming and batched requests need the BLS deployed "
                                                              "decoupled (build with streaming enabled)");
    return false;
  }
  exclude_input_ = Flag(kExcludeInputInOutput, true);
  return_log_probs_ = Flag(kReturnLogProbs, false);
  count_tokens_ = Flag(kReturnNumOutputTokens, false);

  std::vector<int32_t> intervals(static_cast<size_t>(batch), 1);
  if (const Tensor* tensor = Input(kStreamInterval)) {  // orchestrator._stream_intervals
    const std::vector<int32_t> values = tensor->Values<int32_t>();
    if (values.size() != 1 && values.size() != static_cast<size_t>(batch)) {
      *failure = Failure::Field(kStreamInterval, "has " + std::to_string(values.size()) + " values, the request has " +
                                                     std::to_string(batch) + " rows");
      return false;
    }
    for (size_t row = 0; row < intervals.size(); ++row) {
      intervals[row] = values[values.size() == 1 ? 0 : row];
      if (intervals[row] < 1) {
        *failure = Failure::Field(kStreamInterval, "must be >= 1, got " + std::to_string(intervals[row]));
        return false;
      }
    }
  }

  if (!ReadTopLogProbs(failure)) return false;

  std::vector<std::vector<std::string>> phrases(static_cast<size_t>(batch));
  if (const Tensor* tensor = Input(kStopWords)) {  // valid UTF-8: preprocessing checked each phrase
    std::vector<std::string_view> elements;
    if (!BytesElements(tensor->data, &elements) || tensor->shape.empty() || tensor->shape[0] != batch) {
      *failure = Failure::Field(kStopWords, "has " + std::to_string(tensor->shape.empty() ? 0 : tensor->shape[0]) +
                                                " rows, the request has " + std::to_string(batch));
      return false;
    }
    const size_t per_row = batch == 0 ? 1 : std::max<size_t>(1, elements.size() / static_cast<size_t>(batch));
    for (size_t i = 0; i < elements.size(); ++i) phrases[i / per_row].emplace_back(elements[i]);
  }

  std::vector<std::string> statistics;
  for (const char* name : kBlsEngineStatistics)
    if (Requested(name)) statistics.emplace_back(name);
  std::lock_guard<std::mutex> lock(stop_mutex_);
  for (int64_t index = 0; index < batch; ++index) {
    auto row = std::make_unique<Row>();
    row->owner = this;
    row->index = index;
    row->outbox.set_interval(intervals[static_cast<size_t>(index)]);
    row->statistics = statistics;
    row->engine_outputs = {kOutputIds, kSequenceLength, kCumLogProbs, kOutputLogProbs};
    row->engine_outputs.insert(row->engine_outputs.end(), statistics.begin(), statistics.end());
    if (top_log_probs_ >= 0) {
      row->token_log = std::make_unique<TokenLog>();
      row->token_log->top = top_log_probs_;
      row->token_log->prompt_pending = prompt_log_probs_;
      if (top_log_probs_ > 0) row->engine_outputs.insert(row->engine_outputs.end(), {kTopTokenIds, kTopLogProbs});
      if (prompt_log_probs_)
        row->engine_outputs.insert(row->engine_outputs.end(),
                                   {kPromptLogProbs, kPromptTopTokenIds, kPromptTopLogProbs});
    }
    row->detokenizer = std::make_unique<text::IncrementalDetokenizer>(*model_.table);
    row->stop_filter = std::make_unique<text::StopPhraseFilter>(std::move(phrases[static_cast<size_t>(index)]));
    if (!EngineInputs(encoded, row.get(), failure)) {
      rows_.clear();
      return false;
    }
    rows_.push_back(std::move(row));
  }
  open_rows_ = batch;
  for (auto& row : rows_) row->last_step = Reference::Take(this);
  return true;
}

// One row's engine request: EncodedRequest.engine_inputs(row), the client's sampling inputs, and the two the BLS
// sets itself: stream (when decoupled), without the prompt.
bool ClientRequest::EngineInputs(const std::map<std::string, Tensor>& encoded, Row* row, Failure* failure) {
  auto get = [&encoded](const char* name) -> const Tensor* {
    auto found = encoded.find(name);
    return found == encoded.end() ? nullptr : &found->second;
  };
  const Tensor* ids = get(kPreInputId);
  const Tensor* lengths = get(kPreRequestInputLen);
  const Tensor* output_lens = get(kPreRequestOutputLen);
  const Tensor* end_ids = get(kPreOutEndId);
  const Tensor* pad_ids = get(kPreOutPadId);
  const int64_t batch = ids->shape[0], width = ids->shape[1];
  const size_t r = static_cast<size_t>(row->index);
  auto column = [batch](const Tensor* tensor) {
    return tensor != nullptr && tensor->datatype == TRITONSERVER_TYPE_INT32 && tensor->Elements() == batch;
  };
  if (!column(lengths) || !column(output_lens) || !column(end_ids) || !column(pad_ids)) {
    *failure = Failure::Internal("preprocessing answered tensors of another batch than INPUT_ID");
    return false;
  }
  const std::vector<int32_t> all_ids = ids->Values<int32_t>();
  const int32_t length = std::clamp<int32_t>(lengths->Values<int32_t>()[r], 0, static_cast<int32_t>(width));
  row->prompt_ids.assign(all_ids.begin() + r * width, all_ids.begin() + r * width + length);

  std::vector<Tensor>& inputs = row->engine_inputs;
  inputs.push_back(Int32(kInputIds, {1, length}, row->prompt_ids));
  inputs.push_back(Int32(kInputLengths, {1, 1}, {length}));
  inputs.push_back(Int32(kRequestOutputLen, {1, 1}, {output_lens->Values<int32_t>()[r]}));
  inputs.push_back(Int32(kEndId, {1, 1}, {end_ids->Values<int32_t>()[r]}));
  inputs.push_back(Int32(kPadId, {1, 1}, {pad_ids->Values<int32_t>()[r]}));
  // Word lists [B, 2, n] and the bias [B, V], left out when empty (n or V is 0), as Python leaves them out.
  for (const NamePair pair : {NamePair{kPreStopWordsIds, kStopWordsList}, NamePair{kPreBadWordsIds, kBadWordsList},
                              NamePair{kPreEmbeddingBias, kEmbeddingBias}}) {
    const Tensor* tensor = get(pair.from);
    if (tensor == nullptr || tensor->shape.empty() || tensor->shape[0] != batch || tensor->shape.back() == 0) continue;
    Tensor one;
    RowOf(*tensor, row->index, &one);
    one.name = pair.to;
    inputs.push_back(std::move(one));
  }
  if (const Tensor* table_ids = get(kPreOutPromptTableExtraIds)) {  // [B, width] → the row's first `length`
    if (table_ids->shape.size() != 2 || table_ids->shape[0] != batch || table_ids->shape[1] < length) {
      *failure = Failure::Internal("preprocessing answered OUT_PROMPT_TABLE_EXTRA_IDS of another shape than INPUT_ID");
      return false;
    }
    const size_t start = (r * table_ids->shape[1]) * sizeof(uint64_t);
    inputs.push_back(Tensor{kPromptTableExtraIds, TRITONSERVER_TYPE_UINT64, {1, length},
                            table_ids->data.substr(start, static_cast<size_t>(length) * sizeof(uint64_t))});
  }
  const bool streaming = model_.decoupled, exclude = true;
  inputs.push_back(Scalar(kStreaming, TRITONSERVER_TYPE_BOOL, &streaming, 1));
  inputs.push_back(Scalar(kExcludeInputInOutput, TRITONSERVER_TYPE_BOOL, &exclude, 1));
  for (const NamePair& pair : kEngineFromClient) {
    const Tensor* tensor = Input(pair.from);
    if (tensor == nullptr) continue;
    Tensor one;
    if (!RowOf(*tensor, row->index, &one)) {
      *failure = Failure::Field(pair.from, "is not a tensor of strings");
      return false;
    }
    one.name = pair.to;
    inputs.push_back(std::move(one));
  }
  if (top_log_probs_ >= 0) {  // the token log: every token's log prob, and the alternatives where asked
    inputs.erase(std::remove_if(inputs.begin(), inputs.end(),
                                [](const Tensor& tensor) { return tensor.name == kReturnLogProbs; }),
                 inputs.end());
    const bool on = true;
    inputs.push_back(Scalar(kReturnLogProbs, TRITONSERVER_TYPE_BOOL, &on, 1));
    if (top_log_probs_ > 0) inputs.push_back(Int32(kNumTopLogProbs, {1, 1}, {top_log_probs_}));
    if (prompt_log_probs_) inputs.push_back(Scalar(kReturnPromptLogProbs, TRITONSERVER_TYPE_BOOL, &on, 1));
  }
  return true;
}

// num_top_log_probs (token_log.requested_top_log_probs): one value for every row, in [0, kMaxTopLogProbs]; 0
// when only return_prompt_log_probs asks for the token log.
bool ClientRequest::ReadTopLogProbs(Failure* failure) {
  prompt_log_probs_ = Flag(kReturnPromptLogProbs, false);
  const Tensor* tensor = Input(kNumTopLogProbs);
  if (tensor == nullptr || tensor->Elements() == 0) {
    if (prompt_log_probs_) top_log_probs_ = 0;
    return true;
  }
  const std::vector<int32_t> values = tensor->Values<int32_t>();
  const std::set<int32_t> distinct(values.begin(), values.end());
  if (distinct.size() != 1) {
    std::string listed;
    for (int32_t value : distinct) listed += (listed.empty() ? "" : ", ") + std::to_string(value);
    *failure = Failure::Field(kNumTopLogProbs, "must be one value for every row, got [" + listed + "]");
    return false;
  }
  const int32_t count = *distinct.begin();
  if (count < 0 || count > kMaxTopLogProbs) {
    *failure = Failure::Field(kNumTopLogProbs, "must be in [0, " + std::to_string(kMaxTopLogProbs) + "], got " +
                                                   std::to_string(count));
    return false;
  }
  top_log_probs_ = count;
  return true;
}

// A run of tokens into the row's token log, with their log probs and, where the log keeps alternatives, the
// likeliest at each one's step [count, width] (TokenLog._log).
bool LogRun(TokenLog* log, const int32_t* ids, size_t count, const Tensor& values, const Tensor* top_ids,
            const Tensor* top_values, Failure* failure) {
  if (log->top > 0) {
    if (top_ids == nullptr || top_values == nullptr || top_ids->shape.empty()) {
      *failure = Failure::Field(kNumTopLogProbs, "this engine returns no likeliest tokens beside the chosen one; "
                                                 "ask for 0");
      return false;
    }
    const size_t width = static_cast<size_t>(top_ids->shape.back());
    const std::vector<int32_t> all_ids = top_ids->Values<int32_t>();
    const std::vector<float> all_values = top_values->Values<float>();
    const size_t take = std::min<size_t>(static_cast<size_t>(log->top), width);
    if (all_ids.size() < count * width || all_values.size() < count * width) {
      *failure = Failure::Internal("the engine sent fewer top_token_ids than tokens");
      return false;
    }
    for (size_t token = 0; token < count; ++token) {
      for (size_t rank = 0; rank < static_cast<size_t>(log->top); ++rank) {
        log->top_ids.push_back(rank < take ? all_ids[token * width + rank] : -1);
        log->top_log_probs.push_back(rank < take ? all_values[token * width + rank] : -INFINITY);
      }
    }
  }
  const std::vector<float> chosen = values.Values<float>();
  for (size_t token = 0; token < count; ++token) log->log_probs.push_back(token < chosen.size() ? chosen[token] : 0.0f);
  log->ids.insert(log->ids.end(), ids, ids + count);
  return true;
}

// One engine response's tokens into the row's token log, the prompt's before the first (TokenLog.extend).
bool ClientRequest::LogTokensLocked(Row* row, const std::map<std::string, Tensor>& tensors, const int32_t* ids,
                                    size_t count, Failure* failure) {
  TokenLog& log = *row->token_log;
  auto find = [&tensors](const char* name) -> const Tensor* {
    auto found = tensors.find(name);
    return found == tensors.end() ? nullptr : &found->second;
  };
  if (log.prompt_pending) {
    const Tensor* prompt = find(kPromptLogProbs);
    if (prompt == nullptr) {
      *failure = Failure::Field(kReturnPromptLogProbs, "this engine does not return the prompt's log probabilities");
      return false;
    }
    if (!LogRun(&log, row->prompt_ids.data(), row->prompt_ids.size(), *prompt, find(kPromptTopTokenIds),
                find(kPromptTopLogProbs), failure))
      return false;
    log.prompt_pending = false;
  }
  const Tensor* log_probs = find(kOutputLogProbs);
  if (log_probs == nullptr) {
    *failure = Failure::Internal("the engine sent no output_log_probs (asked for num_top_log_probs)");
    return false;
  }
  return LogRun(&log, ids, count, *log_probs, find(kTopTokenIds), find(kTopLogProbs), failure);
}

// The client's tensors for the token log's tokens past those sent, up to `end`, which then count as sent
// (TokenLog.outputs); the caller holds the row's lock and is the sender holding the row.
void ClientRequest::TokenLogOutputs(Row* row, size_t end, std::vector<TensorPtr>* outputs) const {
  TokenLog& log = *row->token_log;
  const size_t start = std::min(log.sent, end), count = end - start, top = static_cast<size_t>(log.top);
  const int64_t tokens = static_cast<int64_t>(count), width = static_cast<int64_t>(top);
  std::vector<int32_t> ids(log.ids.begin() + start, log.ids.begin() + end);
  std::vector<int32_t> top_ids(log.top_ids.begin() + start * top, log.top_ids.begin() + end * top);
  std::vector<float> log_probs(log.log_probs.begin() + start, log.log_probs.begin() + end);
  std::vector<float> top_log_probs(log.top_log_probs.begin() + start * top, log.top_log_probs.begin() + end * top);
  log.sent = end;
  auto bytes_of = [this](const std::vector<int32_t>& tokens_of, const char* name, std::vector<int64_t> shape) {
    Tensor tensor{name, TRITONSERVER_TYPE_BYTES, std::move(shape), ""};
    for (int32_t token : tokens_of) {
      std::string one;
      model_.table->AppendDecode(&token, 1, &one);  // an id outside the vocabulary (padding): no bytes
      text::AppendBytesElement(one, &tensor.data);
    }
    return std::make_shared<const Tensor>(std::move(tensor));
  };
  auto floats = [](const char* name, std::vector<int64_t> shape, const std::vector<float>& values) {
    return std::make_shared<const Tensor>(Tensor{name, TRITONSERVER_TYPE_FP32, std::move(shape),
                                                 std::string(reinterpret_cast<const char*>(values.data()),
                                                             values.size() * sizeof(float))});
  };
  outputs->push_back(std::make_shared<const Tensor>(Int32(kTokenIds, {1, tokens}, ids)));
  outputs->push_back(bytes_of(ids, kTokenBytes, {1, tokens}));
  outputs->push_back(floats(kTokenLogProbs, {1, tokens}, log_probs));
  outputs->push_back(std::make_shared<const Tensor>(Int32(kTopTokenIds, {1, tokens, width}, top_ids)));
  outputs->push_back(bytes_of(top_ids, kTopTokenBytes, {1, tokens, width}));
  outputs->push_back(floats(kTopLogProbs, {1, tokens, width}, top_log_probs));
}

void ClientRequest::StartEngine(Row* row) {
  TRITONSERVER_InferenceRequest* engine = nullptr;
  HeldCallback released(new CallbackHold{Reference::Take(this), row});
  HeldCallback answered(new CallbackHold{Reference::Take(this), row});
  TRITONSERVER_Error* error = NewCall(model_, model_.engine_model, row->engine_inputs, row->engine_outputs,
                                      instance_->NextEngineId(), EngineReleased, EngineAnswered, released.get(),
                                      answered.get(), &engine);
  bool skip = false;
  if (error == nullptr) {
    std::lock_guard<std::mutex> lock(row->mutex);
    skip = row->ended || row->engine_stopped;  // the client went away, or the server stops, in the meantime
  }
  if (error == nullptr && skip) {
    LogIfError(TRITONSERVER_InferenceRequestDelete(engine), "delete request", __LINE__);
    error = TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_CANCELLED, "the request was cancelled");
  } else if (error == nullptr) {
    // Not under the row's lock: the engine's answers take it, on whichever thread the engine sends from.
    error = StartCall(model_, engine, &released, &answered);
    if (error != nullptr) {
      LogIfError(TRITONSERVER_InferenceRequestDelete(engine), "delete request", __LINE__);
    } else {
      std::lock_guard<std::mutex> lock(row->mutex);
      row->engine = engine;
      row->engine_started = true;
      // A stop asked while the call started (a cancel before InferAsync is lost): asked again now.
      if (row->engine_stopped) LogIfError(TRITONSERVER_InferenceRequestCancel(engine), "cancel", __LINE__);
    }
  }
  if (error != nullptr) {
    const Failure failure = Failure::Of(error);
    TRITONSERVER_ErrorDelete(error);
    EndRow(row, &failure);
  }
}

void ClientRequest::EngineReleased(TRITONSERVER_InferenceRequest*, const uint32_t, void* userp) {
  delete static_cast<CallbackHold*>(userp);  // the request object is deleted with the ClientRequest: a cancel may
                                             // still name it
}

void ClientRequest::EngineAnswered(TRITONSERVER_InferenceResponse* response, const uint32_t flags, void* userp) {
  auto* hold = static_cast<CallbackHold*>(userp);
  Row* row = hold->row;
  ClientRequest* self = hold->request.get();
  try {
    if (response != nullptr) self->OnEngineResponse(row, response);
    if (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) self->EndRow(row, nullptr);
  } catch (const std::exception& exception) {  // out of memory: this row fails, not the server
    const Failure failure = Failure::Internal(exception.what());
    self->EndRow(row, &failure);
  }
  if (response != nullptr) LogIfError(TRITONSERVER_InferenceResponseDelete(response), "delete response", __LINE__);
  if (flags & TRITONSERVER_RESPONSE_COMPLETE_FINAL) delete hold;  // the call's last answer
}

// One engine response (row_stream._on_engine_response): count it, detokenize it, hand the text on.
void ClientRequest::OnEngineResponse(Row* row, TRITONSERVER_InferenceResponse* response) {
  std::map<std::string, Tensor> tensors;
  if (Error error{ResponseTensors(response, &tensors)}) {
    const Failure failure = Failure::Of(error.get());
    return EndRow(row, &failure);
  }
  auto ids = tensors.find(kOutputIds);
  if (ids == tensors.end()) return;  // a response without tokens
  auto lengths = tensors.find(kSequenceLength);
  if (lengths == tensors.end() || lengths->second.data.size() < sizeof(int32_t)) {
    const Failure failure = Failure::Internal("the engine sent output_ids without sequence_length");
    return EndRow(row, &failure);
  }
  if ((return_log_probs_ || top_log_probs_ >= 0) && tensors.find(kOutputLogProbs) == tensors.end()) {
    const Failure failure = Failure::Internal("the engine sent no output_log_probs");
    return EndRow(row, &failure);
  }
  const int64_t length = lengths->second.Values<int32_t>()[0];
  const std::vector<int32_t> all = ids->second.Values<int32_t>();
  const size_t take = static_cast<size_t>(std::clamp<int64_t>(length, 0, static_cast<int64_t>(all.size())));
  bool schedule = false, failed = false, unlogged = false;
  Failure log_failure;
  {
    std::lock_guard<std::mutex> lock(row->mutex);
    if (row->ended) return;
    CountLocked(row, tensors, length);
    if (row->engine_stopped) return;  // after a stop phrase or a cancel: counted, never shown
    unlogged = row->token_log != nullptr && !LogTokensLocked(row, tensors, all.data(), take, &log_failure);
    if (!unlogged) {
      std::string decoded;
      row->detokenizer->Push(all.data(), take, &decoded);
      EmitLocked(row, row->stop_filter->Push(decoded), &schedule);
      failed = row->outbox.failed();  // the client missed a chunk: end with an error, not a stream with a gap
      if (!failed && row->stop_filter->stopped()) CancelLocked(row);
    }
  }
  if (unlogged) return EndRow(row, &log_failure);
  if (schedule) instance_->senders().Schedule(row);
  if (failed) {
    const Failure failure{TRITONSERVER_ERROR_INTERNAL, kResponseNotSent};
    EndRow(row, &failure);
  }
}

void ClientRequest::CountLocked(Row* row, const std::map<std::string, Tensor>& tensors, int64_t length) {
  row->unreported += length;
  row->responses += 1;
  for (const std::string& name : row->statistics) {
    auto found = tensors.find(name);
    if (found != tensors.end()) row->statistics_last[name] = std::make_shared<const Tensor>(found->second);
  }
  if (return_log_probs_) {
    const std::vector<float> values = tensors.at(kOutputLogProbs).Values<float>();
    const size_t take = static_cast<size_t>(std::clamp<int64_t>(length, 0, static_cast<int64_t>(values.size())));
    row->log_probs.insert(row->log_probs.end(), values.begin(), values.begin() + take);
  }
}

void ClientRequest::EmitLocked(Row* row, std::string text, bool* schedule) {
  if (text.empty()) return;
  if (!stream_) {
    row->pieces += text;
    return;
  }
  if (row->outbox.failed()) return;  // nothing follows a lost response: no chunk to build
  Chunk chunk;
  chunk.text = std::move(text);
  chunk.tokens = row->unreported;
  chunk.has_log_probs = return_log_probs_;
  if (return_log_probs_) chunk.log_probs = row->log_probs;
  chunk.statistics = row->statistics_last;
  chunk.size = row->responses;
  if (row->token_log != nullptr) chunk.token_mark = row->token_log->ids.size();
  row->unreported = 0;
  row->responses = 0;
  const int64_t size = chunk.size;
  if (row->outbox.Add(std::move(chunk), size)) *schedule = true;
}

// Stop the engine's request, once, from whichever thread asks first; its final response ends the row.
void ClientRequest::CancelLocked(Row* row) {
  if (row->engine_stopped) return;
  row->engine_stopped = true;
  if (row->engine_started) LogIfError(TRITONSERVER_InferenceRequestCancel(row->engine), "cancel", __LINE__);
}

void ClientRequest::CancelEngines() {
  cancelled_ = true;
  std::lock_guard<std::mutex> stop(stop_mutex_);
  for (auto& row : rows_) {
    std::lock_guard<std::mutex> lock(row->mutex);
    CancelLocked(row.get());
  }
}

void ClientRequest::Stop(const Failure& failure) {
  std::vector<Row*> rows;
  {
    std::lock_guard<std::mutex> lock(stop_mutex_);
    if (stopping_) return;
    stopping_ = true;
    stop_failure_ = failure;
    for (auto& row : rows_) rows.push_back(row.get());
  }
  for (Row* row : rows) {
    {
      std::lock_guard<std::mutex> lock(row->mutex);
      CancelLocked(row);
    }
    EndRow(row, &failure);
  }
}

// The row's engine call is over (row_stream.RowStream.run): with `failure`, the row ends with it; else what the
// detokenizer and the stop filter still hold is the row's tail. Its last step goes to a sender. Once per row.
void ClientRequest::EndRow(Row* row, const Failure* failure) {
  {
    std::lock_guard<std::mutex> lock(row->mutex);
    if (row->ended) return;
    row->ended = true;
    // After a stop phrase the text is complete: an engine that ends its cancelled request with an error (where
    // the Python BLS's `stop` input ends it cleanly) does not turn the answer into one.
    if (failure != nullptr) {
      if (!row->stop_filter->stopped()) {
        row->has_error = true;
        row->error = *failure;
        CancelLocked(row);
      }
    }
    if (!row->has_error) {
      std::string flushed;
      row->detokenizer->Flush(&flushed);
      row->tail = row->stop_filter->Push(flushed) + row->stop_filter->Flush();
    }
    if (!row->outbox.End()) return;  // the sender holding the row runs the last step after its sends
  }
  instance_->senders().Schedule(row);
}

void ClientRequest::EndAll(const Failure& failure) {
  if (rows_.empty()) {  // no row was made: the request's one response
    Error error(failure.New());
    FailNow(error.get());
    return;
  }
  for (auto& row : rows_) EndRow(row.get(), &failure);
}

bool ClientRequest::TakeTurn(Row* row) {
  auto send = [this, row](const std::vector<Chunk>& chunks) {
    try {
      return SendChunks(row, chunks);
    } catch (const std::exception& exception) {  // a response that could not be built: the row ends with an error
      Log(TRITONSERVER_LOG_ERROR, __LINE__, std::string("build response: ") + exception.what());
      return false;
    }
  };
  auto last = [this, row](std::vector<Chunk> rest) { RunLast(row, std::move(rest)); };
  return sending::TakeTurn(row->mutex, row->outbox, send, last);
}

bool ClientRequest::SendChunks(Row* row, const std::vector<Chunk>& chunks) {
  std::string text;
  int64_t tokens = 0;
  for (const Chunk& chunk : chunks) {
    text += chunk.text;
    tokens += chunk.tokens;
  }
  const Chunk& latest = chunks.back();
  auto outputs = ResponseOutputs(row, text, latest.has_log_probs ? &latest.log_probs : nullptr,
                                 latest.statistics, tokens);
  if (row->token_log != nullptr) {
    std::lock_guard<std::mutex> lock(row->mutex);
    TokenLogOutputs(row, latest.token_mark, &outputs);
  }
  return Send(&outputs, nullptr, false);
}

// The row's last response, after every chunk before it (row_stream._send_last): the rest of the text, or the error.
void ClientRequest::RunLast(Row* row, std::vector<Chunk> rest) {
  // Dropped last, as this returns: the row's last step may be what keeps the request (and the row) alive.
  const Reference last_step = std::move(row->last_step);
  bool has_error, failed;
  Failure error;
  std::string text;
  int64_t tokens = 0;
  std::vector<float> log_probs;
  std::map<std::string, TensorPtr> statistics;
  std::vector<TensorPtr> token_outputs;  // the token log's tokens not yet sent
  {
    std::lock_guard<std::mutex> lock(row->mutex);
    if (row->token_log != nullptr && row->token_log->ids.size() > row->token_log->sent)
      TokenLogOutputs(row, row->token_log->ids.size(), &token_outputs);
    has_error = row->has_error;
    failed = row->outbox.failed();
    error = row->error;
    for (const Chunk& chunk : rest) {
      text += chunk.text;
      tokens += chunk.tokens;
    }
    text += row->tail;
    tokens += row->unreported;
    if (!stream_) text = row->pieces + text;
    log_probs = row->log_probs;
    statistics = row->statistics_last;
  }
  try {
    if (has_error || failed) {
      const Failure failure = has_error ? error : Failure{TRITONSERVER_ERROR_INTERNAL, kResponseNotSent};
      Send(nullptr, &failure, true);
    } else if (!stream_) {
      std::string whole;
      if (!exclude_input_) model_.table->AppendDecodeText(row->prompt_ids.data(), row->prompt_ids.size(), &whole);
      whole += text;
      auto outputs = ResponseOutputs(row, whole, return_log_probs_ ? &log_probs : nullptr, statistics, tokens);
      outputs.insert(outputs.end(), token_outputs.begin(), token_outputs.end());
      Send(&outputs, nullptr, true);
    } else if (!text.empty() || (count_tokens_ && tokens != 0) || !token_outputs.empty()) {
      auto outputs = ResponseOutputs(row, text, nullptr, statistics, tokens);
      outputs.insert(outputs.end(), token_outputs.begin(), token_outputs.end());
      Send(&outputs, nullptr, true);
    } else {
      Send(nullptr, nullptr, true);  // the final flag alone, if this is the request's last row
    }
  } catch (const std::exception& exception) {  // a last response that could not be built: still an end
    const Failure failure = Failure::Internal(exception.what());
    Send(nullptr, &failure, true);
  }
}

// One response's outputs (row_stream.client_response): text_output flat, batch_index only for a batched request,
// the engine's statistics as it sent them last.
std::vector<TensorPtr> ClientRequest::ResponseOutputs(Row* row, const std::string& text,
                                                      const std::vector<float>* log_probs,
                                                      const std::map<std::string, TensorPtr>& statistics,
                                                      int64_t tokens) const {
  std::vector<TensorPtr> outputs;
  Tensor text_output{kTextOutput, TRITONSERVER_TYPE_BYTES, {1}, ""};
  text::AppendBytesElement(text, &text_output.data);
  outputs.push_back(std::make_shared<const Tensor>(std::move(text_output)));
  for (const auto& entry : statistics) outputs.push_back(entry.second);
  if (rows_.size() > 1) {
    const int32_t index = static_cast<int32_t>(row->index);
    outputs.push_back(std::make_shared<const Tensor>(Scalar(kBatchIndex, TRITONSERVER_TYPE_INT32, &index, 4)));
  }
  if (count_tokens_) {
    const int32_t count = static_cast<int32_t>(tokens);
    outputs.push_back(std::make_shared<const Tensor>(Scalar(kNumOutputTokens, TRITONSERVER_TYPE_INT32, &count, 4)));
  }
  if (log_probs != nullptr) {
    double sum = 0;  // as Python's sum over floats, then float32
    for (float value : *log_probs) sum += value;
    const float cumulative = static_cast<float>(sum);
    outputs.push_back(std::make_shared<const Tensor>(
        Tensor{kOutputLogProbs, TRITONSERVER_TYPE_FP32, {1, 1, static_cast<int64_t>(log_probs->size())},
               std::string(reinterpret_cast<const char*>(log_probs->data()), log_probs->size() * sizeof(float))}));
    outputs.push_back(std::make_shared<const Tensor>(Scalar(kCumLogProbs, TRITONSERVER_TYPE_FP32, &cumulative, 4)));
  }
  return outputs;
}

// Send a row's response (RequestRows.send): `outputs`, or the error `failure`, or nothing but the request's final
// flag; `row_done`: the row's last. A row's last response that cannot be sent is replaced by an error response,
// so that the request still ends. True when sent.
bool ClientRequest::Send(const std::vector<TensorPtr>* outputs, const Failure* failure, bool row_done) {
  std::lock_guard<std::mutex> lock(send_mutex_);
  if (row_done) --open_rows_;
  const bool final = row_done && open_rows_ == 0;
  if (outputs == nullptr && failure == nullptr && !final) return true;
  const uint32_t flags = final ? TRITONSERVER_RESPONSE_COMPLETE_FINAL : 0;
  if (SendLocked(outputs, failure, flags)) return true;
  if (row_done) {
    const Failure lost{TRITONSERVER_ERROR_INTERNAL, kResponseNotSent};
    if (!SendLocked(nullptr, &lost, flags) && final)
      LogIfError(TRITONBACKEND_ResponseFactorySendFlags(factory_, flags), "send final flag", __LINE__);
  }
  return false;
}

bool ClientRequest::SendLocked(const std::vector<TensorPtr>* outputs, const Failure* failure, uint32_t flags) {
  if (outputs == nullptr && failure == nullptr) {
    Error error(TRITONBACKEND_ResponseFactorySendFlags(factory_, flags));
    if (error) Log(TRITONSERVER_LOG_ERROR, __LINE__, std::string("send flags: ") + TRITONSERVER_ErrorMessage(error.get()));
    return !error;
  }
  TRITONBACKEND_Response* response = nullptr;
  Error error(TRITONBACKEND_ResponseNewFromFactory(&response, factory_));
  for (size_t i = 0; outputs != nullptr && !error && i < outputs->size(); ++i) {
    const Tensor& tensor = *(*outputs)[i];
    if (!Requested(tensor.name)) continue;  // a response carries only what its caller asked for
    TRITONBACKEND_Output* output = nullptr;
    error.reset(TRITONBACKEND_ResponseOutput(response, &output, tensor.name.c_str(), tensor.datatype,
                                             tensor.shape.data(), static_cast<uint32_t>(tensor.shape.size())));
    void* buffer = nullptr;
    TRITONSERVER_MemoryType memory_type = TRITONSERVER_MEMORY_CPU;
    int64_t memory_id = 0;
    if (!error) error.reset(TRITONBACKEND_OutputBuffer(output, &buffer, tensor.data.size(), &memory_type, &memory_id));
    if (!error && memory_type == TRITONSERVER_MEMORY_GPU && !tensor.data.empty())
      error.reset(TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_UNSUPPORTED, "GPU output memory is not written"));
    if (!error && !tensor.data.empty()) std::memcpy(buffer, tensor.data.data(), tensor.data.size());
  }
  if (error) {
    Log(TRITONSERVER_LOG_ERROR, __LINE__, std::string("build response: ") + TRITONSERVER_ErrorMessage(error.get()));
    if (response != nullptr) LogIfError(TRITONBACKEND_ResponseDelete(response), "delete response", __LINE__);
    return false;
  }
  Error sent_error(failure != nullptr ? failure->New() : nullptr);
  error.reset(TRITONBACKEND_ResponseSend(response, flags, sent_error.get()));
  if (error) Log(TRITONSERVER_LOG_ERROR, __LINE__, std::string("send response: ") + TRITONSERVER_ErrorMessage(error.get()));
  return !error;
}

// Where a relative path parameter points: the model's folder, as triton_adapter.resolve_path resolves it.
std::string Resolve(TRITONBACKEND_Model* model, const std::string& path) {
  TRITONBACKEND_ArtifactType artifact = TRITONBACKEND_ARTIFACT_FILESYSTEM;
  const char* location = nullptr;
  LogIfError(TRITONBACKEND_ModelRepository(model, &artifact, &location), "model repository", __LINE__);
  std::error_code unresolved;
  const std::filesystem::path joined = std::filesystem::path(location == nullptr ? "" : location) / path;
  const std::filesystem::path resolved = std::filesystem::weakly_canonical(joined, unresolved);
  return (unresolved ? joined : resolved).string();
}

TRITONSERVER_Error* Refuse(const std::string& model, const std::string& what) {
  return TRITONSERVER_ErrorNew(TRITONSERVER_ERROR_INVALID_ARG, (model + ": " + what).c_str());
}

}  // namespace

extern "C" {

// Loads only into a server whose backend API has what this backend calls.
TRITONSERVER_Error* TRITONBACKEND_Initialize(TRITONBACKEND_Backend*) { return backend::CheckApiVersion(kBackend); }

static TRITONSERVER_Error* InitializeModel(TRITONBACKEND_Model* model) {  // ModelInitialize, which may throw
  auto state = std::make_unique<ModelState>();
  const char* name = nullptr;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ModelName(model, &name)) return error;
  state->name = name;
  uint64_t version = 1;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ModelVersion(model, &version)) return error;
  state->version = static_cast<int64_t>(version);
  if (TRITONSERVER_Error* error = TRITONBACKEND_ModelServer(model, &state->server)) return error;
  json::Value config;
  if (TRITONSERVER_Error* error = ReadConfig(model, &config)) return error;
  state->decoupled = Decoupled(config);

  std::string problem;
  int64_t unused = 0;
  for (const char* key : {kMaxInputLen, kMaxSeqLen})  // required by BlsParameters, as Python refuses their absence
    if (!IntegerParameter(config, key, true, &unused, &problem)) return Refuse(state->name, problem);
  if (!IntegerParameter(config, kMaxConcurrency, false, &state->max_concurrency, &problem))
    return Refuse(state->name, problem);
  if (state->max_concurrency < 1)
    return Refuse(state->name, std::string("config parameter '") + kMaxConcurrency + "' must be >= 1, got " +
                                   std::to_string(state->max_concurrency));
  const std::string engine = Parameter(config, kEngineModelKey);
  if (!engine.empty()) state->engine_model = engine;
  const std::string tokenizer_dir = Parameter(config, kTokenizerDir);
  if (tokenizer_dir.empty())
    return Refuse(state->name, std::string("config parameter '") + kTokenizerDir + "' is required by BlsParameters");
  const std::string path = Resolve(model, tokenizer_dir);
  try {
    state->table = std::make_unique<text::TokenBytes>(text::TokenBytes::Load(path));
  } catch (const std::exception& error) {  // nothing may cross the C ABI into the server
    return Refuse(state->name, error.what());
  }
  if (TRITONSERVER_Error* error = TRITONSERVER_ResponseAllocatorNew(&state->allocator, backend::AllocateCpu,
                                                                  backend::DeallocateCpu, nullptr))
    return error;
  Log(TRITONSERVER_LOG_INFO, __LINE__, state->name + ": " + std::to_string(state->table->size()) +
                                           " token byte strings from " + path + "; engine model '" +
                                           state->engine_model + "', " + std::to_string(state->max_concurrency) +
                                           " rows per instance" + (state->decoupled ? "" : ", not decoupled"));
  return backend::GiveState(model, std::move(state));
}

TRITONSERVER_Error* TRITONBACKEND_ModelInitialize(TRITONBACKEND_Model* model) {
  try {
    return InitializeModel(model);
  } catch (const std::exception& exception) {  // nothing may cross the C ABI into the server
    return Failure::Internal(exception.what()).New();
  }
}

TRITONSERVER_Error* TRITONBACKEND_ModelFinalize(TRITONBACKEND_Model* model) {
  return backend::DeleteState<ModelState>(model);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceInitialize(TRITONBACKEND_ModelInstance* instance) {
  TRITONBACKEND_Model* model = nullptr;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ModelInstanceModel(instance, &model)) return error;
  ModelState* state = nullptr;
  if (TRITONSERVER_Error* error = backend::StateOf(model, &state)) return error;
  const char* name = nullptr;
  if (TRITONSERVER_Error* error = TRITONBACKEND_ModelInstanceName(instance, &name)) return error;
  std::unique_ptr<InstanceState> instance_state;
  try {
    instance_state = std::make_unique<InstanceState>(*state, name);
  } catch (const std::exception& exception) {  // its threads could not start
    return Failure::Internal(exception.what()).New();
  }
  return backend::GiveState(instance, std::move(instance_state));
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceFinalize(TRITONBACKEND_ModelInstance* instance) {
  return backend::DeleteState<InstanceState>(instance);
}

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceExecute(TRITONBACKEND_ModelInstance* instance,
                                                       TRITONBACKEND_Request** requests, const uint32_t count) {
  // From here every request is ours: each is answered, and released once its last call returns.
  InstanceState* state = nullptr;
  Error failed(backend::StateOf(instance, &state));
  const uint64_t batch_start_ns = NowNs();
  for (uint32_t i = 0; i < count; ++i) {
    const uint64_t start_ns = NowNs();
    if (failed) {
      backend::AnswerAndRelease(kBackend, requests[i], failed.get());
      continue;
    }
    Reference request = Reference::Adopt(new ClientRequest(state, requests[i]));
    Error error;
    try {
      error.reset(request->Start());
    } catch (const std::exception& exception) {  // out of memory: this request fails, not the server
      error.reset(Failure::Internal(exception.what()).New());
    }
    if (error) request->FailNow(error.get());
    backend::ReportRequest(kBackend, instance, requests[i], !error, start_ns);
    request.Drop();  // Execute's: the request lives on with its calls
  }
  backend::ReportBatch(kBackend, instance, count, batch_start_ns);
  return nullptr;
}

}  // extern "C"
