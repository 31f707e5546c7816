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

}  // namespace ddp::progress
