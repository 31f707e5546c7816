// Where the trainer takes its batches from: host memory for a CPU replica, device memory for a GPU replica.
//
// The device source puts a pipeline behind the BatchReader: the prefetch thread reads into pinned host
// buffers; a copy stream moves batch k+1 to the device while batch k computes, ordered by CUDA events over a
// ring of at least two device buffers, so the compute stream waits on an event instead of the host waiting
// on a copy.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>

#include "engine/base/batch_view.h"
#include "io/batch_reader.h"

namespace ddp::io {

// A batch in the consumer's memory; valid until the next call to next().
class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual int64_t num_batches() const = 0;
  // The next batch, or nothing after the last. A device batch is ready for work enqueued on the compute
  // stream after this call returns.
  virtual std::optional<BatchView> next() = 0;
  // Seconds the consumer was held up by input: the host blocked on the reader, plus, for a device source, the
  // time the compute stream waited for a host-to-device copy (read when those events have completed).
  virtual double input_wait_seconds() = 0;
};

std::unique_ptr<BatchSource> make_host_batch_source(const BatchReaderOptions& options);

// Device memory on CUDA device `device`; `compute_stream` is the replica's cudaStream_t; `depth` device
// buffers (at least 2). In a build without CUDA it throws a UserError.
std::unique_ptr<BatchSource> make_device_batch_source(const BatchReaderOptions& options, int device,
                                                      void* compute_stream, int depth);

}  // namespace ddp::io
