// GPU tests skip, with the reason printed, where no GPU is visible (CI has the CUDA toolkit but no device).
#pragma once

#include <gtest/gtest.h>
#include <mpi.h>

#include "engine/device.h"

#define DDP_REQUIRE_GPU()                                                                   \
  do {                                                                                      \
    const ::ddp::engine::GpuInventory ddp_inventory_ = ::ddp::engine::probe_gpus();         \
    if (ddp_inventory_.gpus.empty()) GTEST_SKIP() << "no GPU: " << ddp_inventory_.why_none; \
  } while (0)

namespace ddp::testing_gpu {

// MPI only for the tests that need it (this binary runs without a launcher, and a GPU-less run never touches
// MPI); finalized once after all tests, if started here. Under mpirun every rank runs every test.
inline bool g_mpi_started_here = false;

inline void ensure_mpi() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (initialized) return;
  ASSERT_EQ(MPI_Init(nullptr, nullptr), MPI_SUCCESS);
  g_mpi_started_here = true;
}

class MpiEnvironment : public ::testing::Environment {
 public:
  void TearDown() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (g_mpi_started_here && !finalized) MPI_Finalize();
  }
};
inline ::testing::Environment* const g_mpi_environment =
    ::testing::AddGlobalTestEnvironment(new MpiEnvironment);

}  // namespace ddp::testing_gpu
