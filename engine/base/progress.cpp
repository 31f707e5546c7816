#include "engine/base/progress.h"

#include <fmt/format.h>
#include <algorithm>
#include <cmath>

namespace ddp::progress {

std::string bar(double fraction, int width) {
  const double done = std::isfinite(fraction) ? std::clamp(fraction, 0.0, 1.0) : 0.0;
  const int filled = static_cast<int>(done * width);
  std::string cells(static_cast<std::size_t>(filled), '=');
  if (filled < width) cells += '>' + std::string(static_cast<std::size_t>(width - filled - 1), '.');
  return "[" + cells + "]";
}

std::string seconds_text(double seconds) {
  return seconds < 100 ? fmt::format("{:.1f}s", seconds) : fmt::format("{:.0f}s", seconds);
}

std::string bytes_text(double bytes) {
  static const char* const kUnits[] = {"B", "kB", "MB", "GB", "TB", "PB"};
  std::size_t unit = 0;
  while (bytes >= 999.5 && unit + 1 < std::size(kUnits)) {
    bytes /= 1000;
    ++unit;
  }
  if (unit == 0) return fmt::format("{:.0f} B", bytes);
  return fmt::format("{:.{}f} {}", bytes, bytes < 9.995 ? 2 : bytes < 99.95 ? 1 : 0, kUnits[unit]);
}

}  // namespace ddp::progress
