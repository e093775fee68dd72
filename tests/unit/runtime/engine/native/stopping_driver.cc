// Reads the STOPPING file named by argv[1] as the C++ models do (server_stop.h) and prints its deadline in
// nanoseconds, or "none": tests/unit/runtime/test_stop_protocol.py holds it to facts/environment.py's reader.
#include <cmath>
#include <cstdio>

#include "server_stop.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const auto deadline = tritonforge::server_stop::StopDeadline(argv[1]);
  if (deadline) {
    std::printf("%.0f\n", std::round(*deadline * 1e9));
  } else {
    std::printf("none\n");
  }
  return 0;
}
