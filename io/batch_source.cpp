#include "io/batch_source.h"

namespace ddp::io {
namespace {

class HostBatchSource final : public BatchSource {
 public:
  explicit HostBatchSource(const BatchReaderOptions& options) : reader_(options) {}

  int64_t num_batches() const override { return reader_.num_batches(); }
  std::optional<BatchView> next() override {
    const Batch* batch = reader_.next();
    if (batch == nullptr) return std::nullopt;
    return BatchView{batch->tokens.data(), batch->labels.data(), batch->batch_size, batch->seq,
                     batch->tokens.data()};
  }
  double input_wait_seconds() override { return reader_.wait_seconds(); }

 private:
  BatchReader reader_;
};

}  // namespace

std::unique_ptr<BatchSource> make_host_batch_source(const BatchReaderOptions& options) {
  return std::make_unique<HostBatchSource>(options);
}

}  // namespace ddp::io
