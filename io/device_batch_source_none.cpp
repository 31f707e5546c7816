#include "engine/base/errors.h"
#include "io/batch_source.h"

namespace ddp::io {

std::unique_ptr<BatchSource> make_device_batch_source(const BatchReaderOptions&, int, void*, int) {
  throw UserError("device = cuda: this ddptrain was built without CUDA");
}

}  // namespace ddp::io
