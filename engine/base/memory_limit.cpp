#include "engine/base/memory_limit.h"

#include <fmt/format.h>
#include <unistd.h>

#include <fstream>

#include "engine/base/errors.h"

namespace ddp {

double node_memory_bytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<double>(pages) * static_cast<double>(page_size);
}

double available_memory_bytes() {
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kilobytes = 0;
  std::string unit;
  while (meminfo >> key >> kilobytes >> unit) {
    if (key == "MemAvailable:") return kilobytes * 1024.0;
  }
  return node_memory_bytes();
}

void require_node_memory(double bytes, const std::string& what) {
  const double memory = node_memory_bytes();
  if (memory > 0 && bytes > memory) {
    throw UserError(fmt::format("{} needs {:.1f} GB, more than this node's {:.1f} GB of memory", what,
                                bytes / 1e9, memory / 1e9));
  }
}

}  // namespace ddp
