// GPU tests skip, with the reason printed, where no GPU is visible (CI has the CUDA toolkit but no device).
#pragma once

#include <gtest/gtest.h>

#include "engine/device.h"

#define DDP_REQUIRE_GPU()                                                                   \
  do {                                                                                      \
    const ::ddp::engine::GpuInventory ddp_inventory_ = ::ddp::engine::probe_gpus();         \
    if (ddp_inventory_.gpus.empty()) GTEST_SKIP() << "no GPU: " << ddp_inventory_.why_none; \
  } while (0)
