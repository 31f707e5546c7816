// Reads one rank's shard of a split in batches, on a background thread.
//
// Memory is bounded by the prefetch depth, not by the dataset: the reader never loads its shard. Each epoch's
// order is a pseudo-random permutation of the whole shard, computed on the fly (IndexPermutation, O(1)
// memory), so the shuffle draws from every row of the shard while only `prefetch` batches are in memory. A
// batch's rows are read with one HDF5 hyperslab selection (the union of its rows, in file order).
//
// Threads: the reader owns one prefetch thread, started in the constructor and joined in the destructor.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <exception>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "io/dataset.h"

namespace ddp::io {

// A bijection of [0, n) chosen by the seed: a Feistel network over the next power of four, cycle-walking
// back into [0, n). Same seed, same permutation on every rank and every run.
class IndexPermutation {
 public:
  IndexPermutation(uint64_t n, uint64_t seed);
  uint64_t operator()(uint64_t i) const;
  uint64_t size() const { return n_; }

 private:
  uint64_t round_function(uint64_t half, int round) const;
  uint64_t n_;
  int half_bits_ = 1;
  uint64_t half_mask_ = 1;
  uint64_t keys_[4] = {};
};

struct Batch {
  int64_t index = 0;  // position in the epoch, 0-based
  int batch_size = 0;
  int seq = 0;
  std::vector<int32_t> tokens;  // [batch_size, seq] row-major
  std::vector<float> labels;    // [batch_size]
};

struct BatchReaderOptions {
  std::string path;
  std::string split = "train";  // "train", "test" or "val"
  Shard shard;
  int batch_size = 32;
  bool shuffle = true;       // false: rows in file order
  uint64_t seed = 0;         // shared by all ranks
  int64_t epoch = 0;         // the permutation of epoch e uses seed and e
  bool drop_last = true;     // training: only full batches; evaluation: the last one may be short
  int64_t first_batch = 0;   // resume in the middle of an epoch
  int64_t max_batches = -1;  // stop after this many (-1: the whole shard)
  int prefetch = 4;          // batches read ahead
  // The prefetch thread's track in the timeline: readers that may run at once (the next epoch's training
  // batches during an evaluation, which may read /train's last rows) need tracks of their own.
  std::string timeline_track = "prefetch";
  // The data file as the run first read it (DatasetInfo::stamp): a reader that finds another file at the
  // path, or this one rewritten, refuses it rather than train or score on other data. Empty: not checked.
  FileStamp expected_stamp;
};

class BatchReader {
 public:
  explicit BatchReader(const BatchReaderOptions& options);
  ~BatchReader();
  BatchReader(const BatchReader&) = delete;
  BatchReader& operator=(const BatchReader&) = delete;

  // Number of batches this reader will yield (counting from first_batch).
  int64_t num_batches() const { return num_batches_; }
  // Batches an epoch of this shard has (before first_batch and max_batches are applied).
  static int64_t batches_per_epoch(int64_t shard_size, int batch_size, bool drop_last);

  // The next batch, or nullptr after the last one. The pointer stays valid until the next call.
  // Rethrows on the caller's thread an error the prefetch thread met.
  const Batch* next();

  // Seconds the caller spent blocked in next() waiting for the disk.
  double wait_seconds() const { return wait_seconds_; }
  // Whether batches are read from the file directly (its datasets lie there as in memory: contiguous, of
  // the memory type) rather than through HDF5; the same rows either way.
  bool reads_rows_directly() const;

 private:
  void prefetch_loop();
  void read_batch(int64_t batch_index, Batch& out);
  // Under HDF5's lock, at construction: reads batches with pread where the datasets allow (batch_reader.cpp).
  void open_raw_reads(int64_t rows);
  // The batch's rows (source_->rows, sorted) into out.tokens and the raw labels.
  void read_rows_raw(Batch& out);
  void read_rows_with_hdf5(Batch& out);

  struct Source;  // the open file and datasets, kept for the reader's lifetime (batch_reader.cpp)

  BatchReaderOptions options_;
  IndexPermutation permutation_;
  int64_t num_batches_ = 0;
  int seq_ = 0;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::vector<Batch> ring_;  // prefetch + 1 slots
  int64_t produced_ = 0;     // batches written into the ring
  int64_t consumed_ = 0;     // batches handed to the caller
  bool stop_ = false;
  std::exception_ptr error_;
  double wait_seconds_ = 0;
  std::unique_ptr<Source> source_;
  std::thread thread_;
};

}  // namespace ddp::io
