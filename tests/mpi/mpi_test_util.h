// Helpers shared by the MPI test files.
#pragma once

#include <mpi.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/host_group.h"
#include "io/synthetic.h"
#include "tests/test_util.h"

namespace ddp::testing {

inline int world_rank() {
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  return rank;
}

inline int world_size() {
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  return size;
}

// One directory shared by all ranks (they run on one machine): rank 0 makes it, the others learn its name.
class SharedDir {
 public:
  SharedDir() {
    if (world_rank() == 0) dir_ = std::make_unique<TempDir>();
    std::string name = world_rank() == 0 ? dir_->path().string() : std::string();
    int length = static_cast<int>(name.size());
    MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD);
    name.resize(static_cast<std::size_t>(length));
    MPI_Bcast(name.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD);
    path_ = name;
  }
  ~SharedDir() { MPI_Barrier(MPI_COMM_WORLD); }
  SharedDir(const SharedDir&) = delete;
  SharedDir& operator=(const SharedDir&) = delete;
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::unique_ptr<TempDir> dir_;
  std::filesystem::path path_;
};

// Rank `rank`'s gradients of `step`: floats whose sums round, so that the order of a sum shows in the bits.
inline std::vector<float> rounding_gradients(int rank, int step, std::size_t n) {
  std::mt19937 rng(static_cast<unsigned>(1000 * step + rank));
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> values(n);
  for (float& x : values) x = normal(rng) * (1.0f + static_cast<float>(rank));
  return values;
}

// Whether every rank of `group` holds exactly `data`'s bits.
inline bool same_bits_everywhere(comm::HostGroup& group, const std::vector<float>& data) {
  std::string bits(data.size() * sizeof(float), '\0');
  std::memcpy(bits.data(), data.data(), bits.size());
  const std::vector<std::string> all = group.all_gather(bits);
  return std::all_of(all.begin(), all.end(), [&](const std::string& b) { return b == bits; });
}

// Rank 0 writes a synthetic dataset (options.output a path every rank sees); the others wait for it.
inline void write_synthetic_on_rank0(const io::SyntheticOptions& options) {
  if (world_rank() == 0) io::write_synthetic(options);
  MPI_Barrier(MPI_COMM_WORLD);
}

}  // namespace ddp::testing
