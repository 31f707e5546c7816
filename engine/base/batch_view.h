// One batch as the data path hands it from io/ (a BatchSource) to models/ (a Replica): row-major tokens
// [batch, seq], left-padded with token 0, and labels [batch]. The memory is the replica's: the host's for a
// CPU replica, the GPU's for a CUDA one. Not owned: valid until the source's next batch. host_tokens are the
// same tokens in host memory (== tokens for a CPU replica): what a GPU replica reads on the host, such as
// the sequence lengths cuDNN's descriptors take; null where a source has no host copy.
#pragma once

#include <cstdint>

namespace ddp {

struct BatchView {
  const int32_t* tokens = nullptr;
  const float* labels = nullptr;
  int batch = 0;
  int seq = 0;
  const int32_t* host_tokens = nullptr;
};

}  // namespace ddp
