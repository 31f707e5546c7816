// How long file work may take on the slowest storage a healthy run should survive (a busy network file
// system): the waits for rank 0's checkpoint reads and writes allow this much on top of comm.timeout_s.
#pragma once

#include <cstddef>

namespace ddp {

constexpr double kSlowestStorageBytesPerS = 10e6;

inline double slowest_storage_seconds(std::size_t bytes) {
  return static_cast<double>(bytes) / kSlowestStorageBytesPerS;
}

}  // namespace ddp
