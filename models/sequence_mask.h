// Masking (model.mask_padding): sequences are left-padded with token 0, and a row's real part starts at its
// first non-zero token. A row of padding only keeps its last step, so every sequence is at least one step
// long (cuDNN takes no empty sequence) and the CPU replica, the GPU's kernel and the GPU's host code, which
// all call this, agree on every row.
#pragma once

#include <cstdint>

#include "engine/base/host_device.h"

namespace ddp::models {

DDP_HOST_DEVICE int masked_start(const int32_t* row, int seq) {
  int start = 0;
  while (start + 1 < seq && row[start] == 0) ++start;
  return start;
}

}  // namespace ddp::models
