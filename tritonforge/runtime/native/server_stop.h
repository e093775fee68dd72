// How a C++ model takes part in a launcher's stop (serve/server.py TritonServer._drain), as the Python models do
// through triton_adapter.start_heartbeat: where the launcher names a heartbeat folder, an instance says it drains
// (a `.drains` file), watches the folder's STOPPING file, and once that holds a deadline (Python's
// time.monotonic()) lets its open requests run until then, ends the rest with kServerStopping, and says it has
// drained (a `.drained` file): the launcher signals the server only then, and the server exits by itself.
// Triton-free: the replay engine, the coalescer and the BLS use it.
#pragma once

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <fstream>
#include <functional>
#include <iterator>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>

#include <unistd.h>

namespace tritonforge::server_stop {

// The launcher's names (facts/environment.py) and what a request still open at the deadline is told
// (facts/errors.py ServerStopping).
constexpr char kServerStopping[] = "unavailable: the server is shutting down; the generation was stopped";
constexpr std::chrono::seconds kDrainEnd{5};  // service.DRAIN_END_S: how long ending the rest may take
constexpr std::chrono::seconds kHeartbeatPeriod{1};  // environment.HEARTBEAT_PERIOD_S: how often STOPPING is read
constexpr char kHeartbeatDirEnv[] = "TRITONFORGE_HEARTBEAT_DIR";  // environment.HEARTBEAT_DIR_ENV
constexpr char kStoppingFile[] = "stopping";  // environment.STOPPING_FILE
constexpr char kDrainsSuffix[] = ".drains";  // environment.DRAINS_SUFFIX
constexpr char kDrainedSuffix[] = ".drained";  // environment.DRAINED_SUFFIX

using Clock = std::chrono::steady_clock;

// Python's time.monotonic() on Linux: the clock of the deadline in the STOPPING file.
inline double MonotonicSeconds() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<double>(now.tv_sec) + static_cast<double>(now.tv_nsec) * 1e-9;
}

// Seconds as a condition variable waits them: none for a negative or NaN span, a year at most.
inline Clock::duration Span(double seconds) {
  const double bounded = std::isnan(seconds) ? 0.0 : std::clamp(seconds, 0.0, 365.0 * 24 * 3600);
  return std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(bounded));
}

// Python's float(text): whitespace around it, a sign, then inf, infinity or nan in any case, or a decimal
// number (digits, single underscores between them, around an optional point, an optional exponent).
inline std::optional<double> PythonFloat(std::string text) {
  const char* space = " \t\n\v\f\r";
  const size_t first = text.find_first_not_of(space);
  if (first == std::string::npos) return std::nullopt;
  text = text.substr(first, text.find_last_not_of(space) + 1 - first);
  std::string plain;  // the number without its underscores, for strtod
  size_t i = 0;
  if (text[i] == '+' || text[i] == '-') plain += text[i++];
  std::string word = text.substr(i);
  for (char& c : word) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (word == "inf" || word == "infinity") return plain == "-" ? -HUGE_VAL : HUGE_VAL;
  if (word == "nan") return std::nan("");
  const auto is_digit = [&text](size_t at) { return at < text.size() && text[at] >= '0' && text[at] <= '9'; };
  const auto digits = [&]() {  // a digit part: false where none starts here
    if (!is_digit(i)) return false;
    while (is_digit(i) || (i < text.size() && text[i] == '_' && is_digit(i + 1))) {
      if (text[i] != '_') plain += text[i];
      ++i;
    }
    return true;
  };
  const bool whole = digits();
  bool fraction = false;
  if (i < text.size() && text[i] == '.') {
    plain += text[i++];
    fraction = digits();
  }
  if (!whole && !fraction) return std::nullopt;
  if (i < text.size() && (text[i] == 'e' || text[i] == 'E')) {
    plain += text[i++];
    if (i < text.size() && (text[i] == '+' || text[i] == '-')) plain += text[i++];
    if (!digits()) return std::nullopt;
  }
  if (i != text.size()) return std::nullopt;
  return std::strtod(plain.c_str(), nullptr);  // out of range: inf or 0, as Python's
}

// triton_adapter._deadline: the time.monotonic() by which a stopping server's open requests must end, or
// nothing while the server is not stopping (no file, or no number in it: the launcher writes it whole).
inline std::optional<double> StopDeadline(const std::string& path) {
  std::ifstream file(path);
  if (!file) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) return std::nullopt;
  return PythonFloat(std::move(text));
}

inline void Touch(const std::string& path) {
  std::FILE* file = std::fopen(path.c_str(), "a");
  if (file == nullptr) {
    std::fprintf(stderr, "tritonforge: cannot write %s: %s\n", path.c_str(), std::strerror(errno));
    return;
  }
  std::fclose(file);
}

// One instance's part in a stop. `drain(deadline)` runs once, on the watch's own thread, when the launcher
// stops the server: it lets the instance's open requests run until `deadline` (MonotonicSeconds), ends the
// rest with kServerStopping and returns once none is open or kDrainEnd later; it must also return soon once the
// instance closes (its owner wakes it before this object goes). Nothing happens where no launcher named a
// heartbeat folder. The files are named by the server's pid, as a Python stub's are by its own, and the instance.
class StopWatch {
 public:
  StopWatch(const std::string& instance_name, std::function<void(double)> drain) : drain_(std::move(drain)) {
    const char* folder = std::getenv(kHeartbeatDirEnv);
    if (folder == nullptr || folder[0] == '\0') return;
    marker_ = std::string(folder) + "/" + std::to_string(getpid()) + "-" + instance_name;
    std::remove((marker_ + kDrainedSuffix).c_str());  // an earlier instance's, unloaded
    Touch(marker_ + kDrainsSuffix);
    thread_ = std::thread([this, stopping_file = std::string(folder) + "/" + kStoppingFile] { Watch(stopping_file); });
  }

  StopWatch(const StopWatch&) = delete;
  StopWatch& operator=(const StopWatch&) = delete;

  ~StopWatch() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      closing_ = true;
    }
    wake_.notify_all();
    if (thread_.joinable()) thread_.join();
    if (!marker_.empty()) Touch(marker_ + kDrainedSuffix);  // the instance is gone: none of its requests is open
  }

 private:
  void Watch(const std::string& stopping_file) {
    std::optional<double> deadline;
    for (;;) {
      deadline = StopDeadline(stopping_file);
      std::unique_lock<std::mutex> lock(mutex_);
      if (closing_) return;
      if (deadline) break;
      wake_.wait_for(lock, kHeartbeatPeriod, [this] { return closing_; });
    }
    drain_(*deadline);
    Touch(marker_ + kDrainedSuffix);
  }

  std::function<void(double)> drain_;
  std::string marker_;  // the path of the instance's files, less their suffix; "" without a launcher
  std::mutex mutex_;
  std::condition_variable wake_;
  bool closing_ = false;
  std::thread thread_;
};

}  // namespace tritonforge::server_stop
