// How a C++ model takes part in a launcher's stop (serve/server.py TritonServer._drain), as the Python models do
// through triton_adapter.start_heartbeat: where the launcher names a heartbeat folder, an instance says it drains
// (a `.drains` file), watches the folder's STOPPING file, and once that holds a deadline (Python's
// time.monotonic(), in the format facts/environment.py states) lets its open requests run until then, ends the
// rest with kServerStopping, and says it has drained (a `.drained` file): the launcher signals the server only
// then, and the server exits by itself.
// Triton-free: the replay engine, the coalescer and the BLS use it.
#pragma once

#include <algorithm>
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

#include "contract.h"

namespace tritonforge::server_stop {

// The launcher's names and times, and what a request still open at the deadline is told: contract.h, from
// facts/environment.py and facts/errors.py.
using contract::kDrainedSuffix;
using contract::kDrainsSuffix;
using contract::kHeartbeatDirEnv;
using contract::kServerStopping;
using contract::kStoppingFile;
constexpr std::chrono::seconds kDrainEnd{contract::kModelDrainEndSeconds};  // how long ending the rest may take
constexpr std::chrono::seconds kHeartbeatPeriod{contract::kHeartbeatPeriodSeconds};  // how often STOPPING is read

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

// The deadline in a STOPPING file's text, in its one format (facts/environment.py stopping_text): whole
// nanoseconds of CLOCK_MONOTONIC in decimal digits, then a newline; nothing for any other text.
inline std::optional<double> StoppingDeadline(const std::string& text) {
  const size_t digits = text.size() - 1;
  if (text.empty() || text.back() != '\n' || digits == 0 || digits > contract::kStoppingDigits) return std::nullopt;
  if (!std::all_of(text.begin(), text.end() - 1, [](char c) { return c >= '0' && c <= '9'; })) return std::nullopt;
  return static_cast<double>(std::stoll(text.substr(0, digits))) * 1e-9;
}

// The deadline (MonotonicSeconds) by which a stopping server's open requests must end, or nothing while the
// server is not stopping (no file, or not the format: the launcher writes it whole, with a rename).
inline std::optional<double> StopDeadline(const std::string& path) {
  std::ifstream file(path);
  if (!file) return std::nullopt;
  std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (file.bad()) return std::nullopt;
  return StoppingDeadline(text);
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
