#include "io/batch_reader.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "engine/base/errors.h"
#include "engine/base/timeline.h"
#include "io/damaged_file_guard.h"
#include "io/hdf5_util.h"
#include "io/mix.h"

namespace ddp::io {

namespace {

uint64_t splitmix64(uint64_t& state) {
  state += 0x9E3779B97F4A7C15ULL;
  return mix64(state);
}

// The permutation seed of one epoch: every (seed, epoch) pair gets an unrelated order.
uint64_t epoch_seed(uint64_t seed, int64_t epoch) {
  return mix64(seed ^ mix64(static_cast<uint64_t>(epoch) + 0x632BE59BD9B4E019ULL));
}

uint64_t checked_shard_size(const BatchReaderOptions& o) {
  if (o.shard.begin < 0 || o.shard.end < o.shard.begin) {
    throw std::invalid_argument("BatchReader: bad shard [" + std::to_string(o.shard.begin) + ", " +
                                std::to_string(o.shard.end) + ")");
  }
  return static_cast<uint64_t>(o.shard.size());
}

void validate(const BatchReaderOptions& o) {
  if (o.split != "train" && o.split != "test" && o.split != "val") {
    throw std::invalid_argument("BatchReader: unknown split " + o.split);
  }
  if (o.batch_size < 1) throw std::invalid_argument("BatchReader: batch_size must be at least 1");
  if (o.prefetch < 1) throw std::invalid_argument("BatchReader: prefetch must be at least 1");
  if (o.first_batch < 0) throw std::invalid_argument("BatchReader: first_batch must not be negative");
  if (o.max_batches < -1) throw std::invalid_argument("BatchReader: max_batches must be -1 or more");
}

// A descriptor of the data file for reads that bypass HDF5, closed with the reader.
class RawFile {
 public:
  RawFile() = default;
  ~RawFile() {
    if (fd_ >= 0) ::close(fd_);
  }
  RawFile(const RawFile&) = delete;
  RawFile& operator=(const RawFile&) = delete;

  bool open(const std::string& path) {
    fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    return fd_ >= 0;
  }
  // `bytes` at `offset`, all of them; false on an error or the end of the file.
  bool read(void* out, std::size_t bytes, uint64_t offset) const {
    auto* at = static_cast<char*>(out);
    while (bytes > 0) {
      const ssize_t got = ::pread(fd_, at, bytes, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0) return false;
      at += got;
      bytes -= static_cast<std::size_t>(got);
      offset += static_cast<uint64_t>(got);
    }
    return true;
  }

 private:
  int fd_ = -1;
};

// Where a dataset's elements lie in the file as they are in memory, so that a row is `row_bytes` at
// `offset + row * row_bytes`: stored contiguously in the file itself (not chunked, compact or external),
// written in full, of exactly the memory type (byte order included), in a file without a user block. Else
// HADDR_UNDEF, and reads go through HDF5.
haddr_t raw_offset(hid_t file, hid_t dataset, hid_t memory_type) {
  Hid create(H5Dget_create_plist(dataset), Hid::Kind::kPropertyList);
  Hid file_create(H5Fget_create_plist(file), Hid::Kind::kPropertyList);
  Hid type(H5Dget_type(dataset), Hid::Kind::kDatatype);
  Hid space(H5Dget_space(dataset), Hid::Kind::kDataspace);
  if (!create.valid() || !file_create.valid() || !type.valid() || !space.valid()) return HADDR_UNDEF;
  hsize_t user_block = 1;
  const hssize_t elements = H5Sget_simple_extent_npoints(space.get());
  if (H5Pget_layout(create.get()) != H5D_CONTIGUOUS || H5Pget_external_count(create.get()) != 0 ||
      H5Pget_userblock(file_create.get(), &user_block) < 0 || user_block != 0 ||
      H5Tequal(type.get(), memory_type) <= 0 || elements < 0 ||
      H5Dget_storage_size(dataset) != static_cast<hsize_t>(elements) * H5Tget_size(memory_type)) {
    return HADDR_UNDEF;
  }
  return H5Dget_offset(dataset);
}

}  // namespace

IndexPermutation::IndexPermutation(uint64_t n, uint64_t seed) : n_(n) {
  // Smallest domain 4^h >= n (h >= 1), so cycle-walking needs fewer than 4 steps on average.
  while (half_bits_ < 32 && (uint64_t{1} << (2 * half_bits_)) < n_) ++half_bits_;
  half_mask_ = (uint64_t{1} << half_bits_) - 1;
  uint64_t state = seed;
  for (uint64_t& key : keys_) key = splitmix64(state);
}

uint64_t IndexPermutation::round_function(uint64_t half, int round) const {
  return mix64(half ^ keys_[round]) & half_mask_;
}

uint64_t IndexPermutation::operator()(uint64_t i) const {
  if (i >= n_) {
    throw std::out_of_range("IndexPermutation: index " + std::to_string(i) + " >= " + std::to_string(n_));
  }
  // A Feistel network is a bijection of [0, 4^h); applying it until the value falls below n walks the cycle
  // through i and so stays a bijection of [0, n).
  uint64_t value = i;
  do {
    uint64_t left = value >> half_bits_;
    uint64_t right = value & half_mask_;
    for (int round = 0; round < 4; ++round) {
      const uint64_t next = left ^ round_function(right, round);
      left = right;
      right = next;
    }
    value = (left << half_bits_) | right;
  } while (value >= n_);
  return value;
}

// The file and both datasets stay open for the reader's lifetime; the dataspaces and scratch buffers are only
// touched by the prefetch thread. Where both datasets lie in the file as they are in memory (raw_offset),
// batches are read from `raw` with one pread per run of consecutive rows: HDF5's selection of a batch's
// scattered rows costs ten times the reads themselves, on the core the prefetch thread takes from compute.
struct BatchReader::Source {
  Hid file;
  Hid x;
  Hid y;
  Hid x_space;
  Hid y_space;
  RawFile raw;
  bool read_raw = false;
  uint64_t x_offset = 0;
  uint64_t y_offset = 0;
  std::vector<hsize_t> rows;    // the batch's row numbers, sorted
  std::vector<uint8_t> labels;  // raw labels before conversion to float
};

int64_t BatchReader::batches_per_epoch(int64_t shard_size, int batch_size, bool drop_last) {
  if (shard_size < 0 || batch_size < 1) {
    throw std::invalid_argument("batches_per_epoch: bad shard or batch size");
  }
  return drop_last ? shard_size / batch_size : (shard_size + batch_size - 1) / batch_size;
}

BatchReader::BatchReader(const BatchReaderOptions& options) try
    : options_(options), permutation_(checked_shard_size(options), epoch_seed(options.seed, options.epoch)) {
  validate(options_);
  const std::string& path = options_.path;
  const std::string x_name = "/" + options_.split + "/x";
  const std::string y_name = "/" + options_.split + "/y";
  source_ = std::make_unique<Source>();
  {
    const DamagedFileGuard guard(path);
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    source_->file = open_file_readonly(path);
    // Stamped after the open: a file swapped in at any moment before is found.
    if (!options_.expected_stamp.empty() && file_stamp(path) != options_.expected_stamp) {
      throw UserError(
          path +
          ": the file changed during the run (replaced or rewritten since the run first read it): "
          "stopping rather than train or score on other data (to go on with the new file: --resume "
          "with checkpoint.allow_data_change = true)");
    }
    source_->x = open_dataset(source_->file.get(), path, x_name);
    source_->y = open_dataset(source_->file.get(), path, y_name);
    const std::vector<int64_t> x_dims = dataset_dims(source_->x.get());
    const std::vector<int64_t> y_dims = dataset_dims(source_->y.get());
    if (x_dims.size() != 2 || x_dims[1] < 1 || y_dims.size() != 1 || x_dims[0] != y_dims[0]) {
      throw UserError(path + ": " + x_name + " and " + y_name + " must be [N, maxlen] and [N]");
    }
    if (options_.shard.end > x_dims[0]) {
      throw UserError(path + ": shard [" + std::to_string(options_.shard.begin) + ", " +
                      std::to_string(options_.shard.end) + ") is outside " + x_name + " of " +
                      std::to_string(x_dims[0]) + " rows");
    }
    seq_ = static_cast<int>(x_dims[1]);
    source_->x_space =
        Hid(check_h5_id(H5Dget_space(source_->x.get()), "H5Dget_space"), Hid::Kind::kDataspace);
    source_->y_space =
        Hid(check_h5_id(H5Dget_space(source_->y.get()), "H5Dget_space"), Hid::Kind::kDataspace);
    open_raw_reads(x_dims[0]);
  }
  const int64_t per_epoch = batches_per_epoch(options_.shard.size(), options_.batch_size, options_.drop_last);
  num_batches_ = std::max<int64_t>(0, per_epoch - options_.first_batch);
  if (options_.max_batches >= 0) num_batches_ = std::min(num_batches_, options_.max_batches);
  // One slot more than the read-ahead: the caller holds one batch while `prefetch` others are filled.
  ring_.resize(static_cast<size_t>(options_.prefetch) + 1);
  source_->rows.reserve(static_cast<size_t>(options_.batch_size));
  source_->labels.reserve(static_cast<size_t>(options_.batch_size));
  if (num_batches_ > 0) thread_ = std::thread(&BatchReader::prefetch_loop, this);
} catch (const Hdf5Error& e) {
  throw_unreadable_file(options.path, e);
}

bool BatchReader::reads_rows_directly() const {
  return source_->read_raw;
}

void BatchReader::open_raw_reads(int64_t rows) {
  const DamagedFileGuard guard(options_.path);
  Source& s = *source_;
  const haddr_t x_offset = raw_offset(s.file.get(), s.x.get(), H5T_NATIVE_INT32);
  const haddr_t y_offset = raw_offset(s.file.get(), s.y.get(), H5T_NATIVE_UINT8);
  if (rows < 1 || x_offset == HADDR_UNDEF || y_offset == HADDR_UNDEF || !s.raw.open(options_.path)) return;
  s.x_offset = x_offset;
  s.y_offset = y_offset;
  // The first and the last row both ways: the raw path is taken only where it reads what HDF5 reads.
  const std::size_t columns = static_cast<std::size_t>(seq_);
  std::vector<int32_t> x_hdf5(columns), x_raw(columns);
  Hid x_memory(
      check_h5_id(H5Screate_simple(1, std::array<hsize_t, 1>{columns}.data(), nullptr), "H5Screate_simple"),
      Hid::Kind::kDataspace);
  Hid y_memory(
      check_h5_id(H5Screate_simple(1, std::array<hsize_t, 1>{1}.data(), nullptr), "H5Screate_simple"),
      Hid::Kind::kDataspace);
  bool same = true;
  for (const auto row : {hsize_t{0}, static_cast<hsize_t>(rows - 1)}) {
    const hsize_t start[2] = {row, 0};
    const hsize_t x_count[2] = {1, columns};
    const hsize_t y_count[1] = {1};
    uint8_t y_hdf5 = 0, y_raw = 0;
    check_h5(H5Sselect_hyperslab(s.x_space.get(), H5S_SELECT_SET, start, nullptr, x_count, nullptr),
             "H5Sselect_hyperslab");
    check_h5(H5Sselect_hyperslab(s.y_space.get(), H5S_SELECT_SET, start, nullptr, y_count, nullptr),
             "H5Sselect_hyperslab");
    check_h5(
        H5Dread(s.x.get(), H5T_NATIVE_INT32, x_memory.get(), s.x_space.get(), H5P_DEFAULT, x_hdf5.data()),
        "H5Dread");
    check_h5(H5Dread(s.y.get(), H5T_NATIVE_UINT8, y_memory.get(), s.y_space.get(), H5P_DEFAULT, &y_hdf5),
             "H5Dread");
    same =
        same &&
        s.raw.read(x_raw.data(), columns * sizeof(int32_t), s.x_offset + row * columns * sizeof(int32_t)) &&
        s.raw.read(&y_raw, 1, s.y_offset + row) && x_raw == x_hdf5 && y_raw == y_hdf5;
  }
  s.read_raw = same;
}

BatchReader::~BatchReader() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

const Batch* BatchReader::next() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (consumed_ >= num_batches_) return nullptr;
  if (produced_ == consumed_ && !error_) {
    const auto start = std::chrono::steady_clock::now();
    cv_.wait(lock, [this] { return produced_ > consumed_ || error_; });
    wait_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  // Batches read before a failure are still handed out; the error surfaces where the failed batch would be.
  if (produced_ == consumed_) std::rethrow_exception(error_);
  const Batch* batch = &ring_[static_cast<size_t>(consumed_ % static_cast<int64_t>(ring_.size()))];
  ++consumed_;
  lock.unlock();
  cv_.notify_all();
  return batch;
}

void BatchReader::prefetch_loop() {
  try {
    quiet_hdf5_errors();  // this thread's own error stack
    timeline::name_this_thread(options_.timeline_track.c_str());
    const int64_t slots = static_cast<int64_t>(ring_.size());
    for (int64_t t = 0; t < num_batches_; ++t) {
      Batch* slot = nullptr;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        // At most `prefetch` ready batches: the slot of batch consumed_ - 1, held by the caller, stays
        // intact.
        cv_.wait(lock, [&] { return stop_ || produced_ - consumed_ < options_.prefetch; });
        if (stop_) return;
        slot = &ring_[static_cast<size_t>(produced_ % slots)];
      }
      {
        timeline::Span span("HDF5 read", options_.first_batch + t);
        read_batch(options_.first_batch + t, *slot);
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        ++produced_;
      }
      cv_.notify_all();
    }
  } catch (...) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      error_ = std::current_exception();
    }
    cv_.notify_all();
  }
}

void BatchReader::read_batch(int64_t batch_index, Batch& out) try {
  const int64_t batch_size = options_.batch_size;
  const int64_t first = batch_index * batch_size;
  const int64_t count = std::min(batch_size, options_.shard.size() - first);
  std::vector<hsize_t>& rows = source_->rows;
  rows.resize(static_cast<size_t>(count));
  for (int64_t j = 0; j < count; ++j) {
    const uint64_t position = static_cast<uint64_t>(first + j);
    const uint64_t offset = options_.shuffle ? permutation_(position) : position;
    rows[j] = static_cast<hsize_t>(options_.shard.begin) + offset;
  }
  // File order: one selection of few, merged blocks, and a deterministic order inside the batch.
  std::sort(rows.begin(), rows.end());

  out.index = batch_index;
  out.batch_size = static_cast<int>(count);
  out.seq = seq_;
  out.tokens.resize(static_cast<size_t>(count * seq_));
  out.labels.resize(static_cast<size_t>(count));
  source_->labels.resize(static_cast<size_t>(count));

  if (source_->read_raw) {
    read_rows_raw(out);
  } else {
    read_rows_with_hdf5(out);
  }
  std::transform(source_->labels.begin(), source_->labels.end(), out.labels.begin(),
                 [](uint8_t label) { return static_cast<float>(label); });
} catch (const Hdf5Error& e) {
  throw_unreadable_file(options_.path, e);
}

void BatchReader::read_rows_raw(Batch& out) {
  const std::vector<hsize_t>& rows = source_->rows;
  const std::size_t row_bytes = static_cast<std::size_t>(seq_) * sizeof(int32_t);
  for (std::size_t i = 0; i < rows.size();) {
    std::size_t end = i + 1;
    while (end < rows.size() && rows[end] == rows[end - 1] + 1) ++end;
    const std::size_t count = end - i;
    errno = 0;
    const bool ok = source_->raw.read(out.tokens.data() + i * static_cast<std::size_t>(seq_),
                                      count * row_bytes, source_->x_offset + rows[i] * row_bytes) &&
                    source_->raw.read(source_->labels.data() + i, count, source_->y_offset + rows[i]);
    if (!ok) {
      throw UserError(options_.path + " /" + options_.split + ": reading rows " + std::to_string(rows[i]) +
                      " to " + std::to_string(rows[end - 1]) + " failed (" +
                      (errno != 0 ? std::strerror(errno) : "the file ends before them") + ")");
    }
    i = end;
  }
}

void BatchReader::read_rows_with_hdf5(Batch& out) {
  const std::vector<hsize_t>& rows = source_->rows;
  const auto count = static_cast<int64_t>(rows.size());
  const DamagedFileGuard guard(options_.path);
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  const hsize_t columns = static_cast<hsize_t>(seq_);
  for (const hid_t space : {source_->x_space.get(), source_->y_space.get()}) {
    H5S_seloper_t operation = H5S_SELECT_SET;
    for (size_t i = 0; i < rows.size();) {
      size_t end = i + 1;
      while (end < rows.size() && rows[end] == rows[end - 1] + 1) ++end;
      const hsize_t start[2] = {rows[i], 0};
      const hsize_t block[2] = {static_cast<hsize_t>(end - i), columns};
      const hsize_t one[2] = {1, 1};
      check_h5(H5Sselect_hyperslab(space, operation, start, nullptr, one, block), "H5Sselect_hyperslab");
      operation = H5S_SELECT_OR;
      i = end;
    }
  }
  const hsize_t memory_dims[2] = {static_cast<hsize_t>(count), columns};
  Hid x_memory(check_h5_id(H5Screate_simple(2, memory_dims, nullptr), "H5Screate_simple"),
               Hid::Kind::kDataspace);
  Hid y_memory(check_h5_id(H5Screate_simple(1, memory_dims, nullptr), "H5Screate_simple"),
               Hid::Kind::kDataspace);
  const std::string where = options_.path + " /" + options_.split;
  check_h5(H5Dread(source_->x.get(), H5T_NATIVE_INT32, x_memory.get(), source_->x_space.get(), H5P_DEFAULT,
                   out.tokens.data()),
           ("H5Dread " + where + "/x").c_str());
  check_h5(H5Dread(source_->y.get(), H5T_NATIVE_UINT8, y_memory.get(), source_->y_space.get(), H5P_DEFAULT,
                   source_->labels.data()),
           ("H5Dread " + where + "/y").c_str());
}

}  // namespace ddp::io
