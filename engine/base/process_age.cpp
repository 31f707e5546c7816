#include "engine/base/process_age.h"

#include <time.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <sstream>
#include <string>

namespace ddp {
namespace {

// The process's start in seconds after boot (field 22 of /proc/self/stat, in clock ticks), or a negative
// number where it cannot be read.
double started_after_boot() {
  std::ifstream file("/proc/self/stat");
  std::string stat;
  if (!std::getline(file, stat)) return -1;
  // The command name (field 2) is in parentheses and may hold spaces: count from the last ')'.
  const std::size_t close = stat.rfind(')');
  if (close == std::string::npos) return -1;
  std::istringstream fields(stat.substr(close + 1));
  std::string field;
  for (int i = 3; i <= 22; ++i) {
    if (!(fields >> field)) return -1;
  }
  const long ticks_per_second = sysconf(_SC_CLK_TCK);
  if (ticks_per_second <= 0) return -1;
  try {
    return static_cast<double>(std::stoull(field)) / static_cast<double>(ticks_per_second);
  } catch (const std::exception&) {
    return -1;
  }
}

double seconds_since_boot() {
  timespec now{};
  if (clock_gettime(CLOCK_BOOTTIME, &now) != 0) return -1;
  return static_cast<double>(now.tv_sec) + 1e-9 * static_cast<double>(now.tv_nsec);
}

// The fallback's origin, taken as the library loads; /proc's start time is read on first use.
const std::chrono::steady_clock::time_point kLoaded = std::chrono::steady_clock::now();

}  // namespace

double seconds_since_process_start() {
  static const double started = started_after_boot();
  const double boot = seconds_since_boot();
  if (started >= 0 && boot >= started) return boot - started;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - kLoaded).count();
}

}  // namespace ddp
