// The prefetching batch reader and its shuffled order (io/batch_reader.h).
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "engine/base/errors.h"
#include "io/batch_reader.h"
#include "io/dataset.h"
#include "tests/dataset_files.h"
#include "tests/test_util.h"

namespace ddp::io {
namespace {

using ddp::testing::expect_user_error;
using ddp::testing::FileSpec;
using ddp::testing::TempDir;
using ddp::testing::write_file;

TEST(IndexPermutation, IsABijectionOfEverySize) {
  for (const uint64_t n : {0ULL, 1ULL, 2ULL, 3ULL, 7ULL, 64ULL, 1000ULL, 12345ULL}) {
    for (const uint64_t seed : {0ULL, 1ULL, 0xDEADBEEFULL}) {
      const IndexPermutation permutation(n, seed);
      ASSERT_EQ(permutation.size(), n);
      std::vector<bool> seen(n, false);
      for (uint64_t i = 0; i < n; ++i) {
        const uint64_t value = permutation(i);
        ASSERT_LT(value, n) << "n=" << n << " seed=" << seed;
        ASSERT_FALSE(seen[value]) << "n=" << n << " seed=" << seed << " repeats " << value;
        seen[value] = true;
      }
    }
  }
  EXPECT_THROW(IndexPermutation(0, 1)(0), std::out_of_range);
  EXPECT_THROW(IndexPermutation(5, 1)(5), std::out_of_range);
}

TEST(IndexPermutation, TheSeedChoosesTheOrder) {
  const auto order = [](uint64_t n, uint64_t seed) {
    const IndexPermutation permutation(n, seed);
    std::vector<uint64_t> values;
    for (uint64_t i = 0; i < n; ++i) values.push_back(permutation(i));
    return values;
  };
  for (const uint64_t n : {64ULL, 1000ULL, 12345ULL}) {
    EXPECT_EQ(order(n, 7), order(n, 7));
    const std::vector<uint64_t> a = order(n, 7);
    const std::vector<uint64_t> b = order(n, 8);
    int64_t same_place = 0;
    int64_t fixed_points = 0;
    for (uint64_t i = 0; i < n; ++i) {
      same_place += a[i] == b[i];
      fixed_points += a[i] == i;
    }
    // A random pair of permutations agrees in about one place; allow a margin, not a near-copy.
    EXPECT_LT(same_place, 8) << "n=" << n;
    EXPECT_LT(fixed_points, 8) << "n=" << n;
  }
}

class BatchReaderTest : public ::testing::Test {
 protected:
  void SetUp() override {
    FileSpec spec;
    spec.train_rows = kRows;
    spec.test_rows = 250;
    spec.val_rows = 50;
    spec.maxlen = kSeq;
    write_file(path_, spec);
  }

  BatchReaderOptions base(Shard shard, int batch_size = 32) const {
    BatchReaderOptions o;
    o.path = path_;
    o.shard = shard;
    o.batch_size = batch_size;
    o.seed = 11;
    o.drop_last = false;
    o.prefetch = 3;
    return o;
  }

  // The row numbers of every batch, checking that tokens and labels belong to the row.
  static std::vector<std::vector<int64_t>> read_rows(const BatchReaderOptions& o) {
    BatchReader reader(o);
    std::vector<std::vector<int64_t>> batches;
    while (const Batch* batch = reader.next()) {
      EXPECT_EQ(batch->index, o.first_batch + static_cast<int64_t>(batches.size()));
      EXPECT_EQ(batch->seq, kSeq);
      EXPECT_EQ(batch->tokens.size(), static_cast<size_t>(batch->batch_size * kSeq));
      EXPECT_EQ(batch->labels.size(), static_cast<size_t>(batch->batch_size));
      std::vector<int64_t> rows;
      for (int j = 0; j < batch->batch_size; ++j) {
        const int64_t row = batch->tokens[j * kSeq] / kSeq;
        for (int c = 0; c < kSeq; ++c) EXPECT_EQ(batch->tokens[j * kSeq + c], row * kSeq + c);
        EXPECT_EQ(batch->labels[j], static_cast<float>(row % 2));
        rows.push_back(row);
      }
      EXPECT_TRUE(std::is_sorted(rows.begin(), rows.end()));
      batches.push_back(rows);
    }
    EXPECT_EQ(static_cast<int64_t>(batches.size()), reader.num_batches());
    EXPECT_EQ(reader.next(), nullptr);  // stays at the end
    EXPECT_GE(reader.wait_seconds(), 0.0);
    return batches;
  }

  static std::vector<int64_t> flatten(const std::vector<std::vector<int64_t>>& batches) {
    std::vector<int64_t> rows;
    for (const auto& batch : batches) rows.insert(rows.end(), batch.begin(), batch.end());
    return rows;
  }

  static constexpr int64_t kRows = 1000;
  static constexpr int kSeq = 3;
  TempDir dir_;
  std::string path_ = dir_.file("rows.h5");
};

TEST_F(BatchReaderTest, AnEpochReadsEachRowOfTheShardOnce) {
  std::vector<int64_t> all;
  for (int rank = 0; rank < 3; ++rank) {
    const Shard shard = shard_of(kRows, rank, 3, true);
    const auto batches = read_rows(base(shard));
    EXPECT_EQ(static_cast<int64_t>(batches.size()), BatchReader::batches_per_epoch(shard.size(), 32, false));
    for (size_t b = 0; b + 1 < batches.size(); ++b) EXPECT_EQ(batches[b].size(), 32u);
    std::vector<int64_t> rows = flatten(batches);
    std::sort(rows.begin(), rows.end());
    std::vector<int64_t> expected(static_cast<size_t>(shard.size()));
    for (int64_t i = 0; i < shard.size(); ++i) expected[i] = shard.begin + i;
    EXPECT_EQ(rows, expected) << "rank " << rank;
    all.insert(all.end(), rows.begin(), rows.end());
  }
  std::sort(all.begin(), all.end());
  EXPECT_EQ(std::adjacent_find(all.begin(), all.end()), all.end());
  EXPECT_EQ(static_cast<int64_t>(all.size()), kRows);
}

TEST_F(BatchReaderTest, TrainingShardsAreDisjointAndInRange) {
  std::set<int64_t> seen;
  for (int rank = 0; rank < 3; ++rank) {
    BatchReaderOptions o = base(shard_of(kRows, rank, 3, false));
    o.drop_last = true;
    const auto batches = read_rows(o);
    EXPECT_EQ(batches.size(), 333u / 32u);
    for (const int64_t row : flatten(batches)) {
      EXPECT_GE(row, o.shard.begin);
      EXPECT_LT(row, o.shard.end);
      EXPECT_TRUE(seen.insert(row).second) << "row " << row << " read twice";
    }
  }
}

TEST_F(BatchReaderTest, TheOrderDependsOnSeedAndEpochOnly) {
  BatchReaderOptions o = base({0, kRows});
  const auto epoch0 = read_rows(o);
  EXPECT_EQ(read_rows(o), epoch0);  // same seed, same epoch: same batches
  std::vector<int64_t> identity(kRows);
  for (int64_t i = 0; i < kRows; ++i) identity[i] = i;
  EXPECT_NE(flatten(epoch0), identity);
  o.epoch = 1;
  const auto epoch1 = read_rows(o);
  EXPECT_NE(epoch1, epoch0);
  EXPECT_NE(epoch1.front(), epoch0.front());
  o.epoch = 0;
  o.seed = 12;
  EXPECT_NE(read_rows(o).front(), epoch0.front());
}

TEST_F(BatchReaderTest, WithoutShuffleRowsComeInFileOrder) {
  BatchReaderOptions o = base({100, 200});
  o.shuffle = false;
  const std::vector<int64_t> rows = flatten(read_rows(o));
  ASSERT_EQ(rows.size(), 100u);
  for (int64_t i = 0; i < 100; ++i) EXPECT_EQ(rows[i], 100 + i);
  EXPECT_EQ(read_rows(o).back().size(), 4u);  // 100 = 3 * 32 + 4
}

TEST_F(BatchReaderTest, DropLastKeepsOnlyFullBatches) {
  BatchReaderOptions o = base({0, 100});
  o.drop_last = true;
  const auto batches = read_rows(o);
  ASSERT_EQ(batches.size(), 3u);
  for (const auto& batch : batches) EXPECT_EQ(batch.size(), 32u);
  EXPECT_EQ(BatchReader::batches_per_epoch(100, 32, true), 3);
  EXPECT_EQ(BatchReader::batches_per_epoch(100, 32, false), 4);
  EXPECT_EQ(BatchReader::batches_per_epoch(0, 32, false), 0);
}

TEST_F(BatchReaderTest, FirstBatchResumesAndMaxBatchesStops) {
  BatchReaderOptions o = base({0, kRows}, 16);
  const auto whole = read_rows(o);
  o.first_batch = 5;
  const auto resumed = read_rows(o);
  EXPECT_EQ(resumed, std::vector<std::vector<int64_t>>(whole.begin() + 5, whole.end()));
  o.max_batches = 3;
  EXPECT_EQ(read_rows(o), std::vector<std::vector<int64_t>>(whole.begin() + 5, whole.begin() + 8));
  o.max_batches = 0;
  EXPECT_TRUE(read_rows(o).empty());
  o.max_batches = -1;
  o.first_batch = static_cast<int64_t>(whole.size());
  EXPECT_TRUE(read_rows(o).empty());
}

TEST_F(BatchReaderTest, TestSplitAndEmptyShard) {
  BatchReaderOptions o = base(shard_of(250, 1, 2, true), 50);
  o.split = "test";
  o.shuffle = false;
  const std::vector<int64_t> rows = flatten(read_rows(o));
  ASSERT_EQ(rows.size(), 125u);
  EXPECT_EQ(rows.front(), 125);
  EXPECT_TRUE(read_rows(base({10, 10})).empty());
}

TEST_F(BatchReaderTest, ValSplit) {
  BatchReaderOptions o = base({0, 50}, 16);
  o.split = "val";
  o.shuffle = false;
  const std::vector<int64_t> rows = flatten(read_rows(o));  // checks tokens and labels of each row
  ASSERT_EQ(rows.size(), 50u);
  for (int64_t i = 0; i < 50; ++i) EXPECT_EQ(rows[i], i);
  o.shard = {40, 51};
  expect_user_error([&] { BatchReader reader(o); }, {path_, "shard [40, 51) is outside /val/x of 50 rows"});
  o.split = "dev";
  EXPECT_THROW(BatchReader reader(o), std::invalid_argument);
}

TEST_F(BatchReaderTest, AHeldBatchIsNotOverwrittenByPrefetch) {
  BatchReaderOptions o = base({0, kRows}, 8);
  o.prefetch = 1;
  BatchReader reader(o);
  for (int i = 0; i < 5; ++i) {
    const Batch* batch = reader.next();
    ASSERT_NE(batch, nullptr);
    const std::vector<int32_t> copy = batch->tokens;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // let the thread fill the ring
    EXPECT_EQ(batch->tokens, copy);
  }
}

TEST_F(BatchReaderTest, StoppingEarlyDoesNotHang) {
  BatchReaderOptions o = base({0, kRows}, 1);
  o.prefetch = 1;
  {  // a hang here is ended by the test's timeout
    BatchReader reader(o);
    ASSERT_NE(reader.next(), nullptr);
  }
  { BatchReader never_read(o); }
}

TEST_F(BatchReaderTest, MissingDatasetIsAUserError) {
  const std::string path = dir_.file("no-test-x.h5");
  FileSpec spec;
  spec.write_test_x = false;
  write_file(path, spec);
  BatchReaderOptions o = base({0, 8});
  o.path = path;
  o.split = "test";
  expect_user_error(
      [&] {
        BatchReader reader(o);
        while (reader.next() != nullptr) {
        }
      },
      {path, "/test/x"});
  o.path = dir_.file("absent.h5");
  expect_user_error([&] { BatchReader reader(o); }, {o.path, "no such file"});
}

// A reader given the stamp of the file as the run first read it refuses the file at that path once it is
// another one (a new file renamed over it, as `prepare --output` replaces a dataset) or the same one
// rewritten, instead of training on other rows.
TEST_F(BatchReaderTest, AFileChangedSinceItWasStampedIsRefused) {
  BatchReaderOptions o = base({0, 64});
  o.expected_stamp = file_stamp(path_);
  ASSERT_FALSE(o.expected_stamp.empty());
  EXPECT_EQ(read_rows(o).size(), 2u);

  FileSpec other;
  other.train_rows = kRows;
  other.maxlen = kSeq;
  const std::string replacement = dir_.file("replacement.h5");
  write_file(replacement, other);
  std::filesystem::rename(replacement, path_);
  expect_user_error([&] { BatchReader reader(o); }, {path_, "changed during the run"});

  o.expected_stamp = file_stamp(path_);
  EXPECT_EQ(read_rows(o).size(), 2u);
  write_file(path_, other);  // rewritten in place: the same file, written anew
  std::filesystem::last_write_time(path_, std::filesystem::last_write_time(path_) + std::chrono::seconds(1));
  expect_user_error([&] { BatchReader reader(o); }, {path_, "changed during the run"});
  o.expected_stamp = {};  // not checked
  EXPECT_EQ(read_rows(o).size(), 2u);
}

// Batches are read past HDF5 where the datasets lie in the file as in memory, through HDF5 otherwise
// (compressed chunks, another integer type or byte order, a user block before the HDF5 data): the same rows,
// tokens and labels either way.
TEST_F(BatchReaderTest, EveryStorageLayoutGivesTheSameBatches) {
  BatchReaderOptions o = base({100, 900}, 16);
  BatchReader contiguous(o);
  EXPECT_TRUE(contiguous.reads_rows_directly());
  const std::vector<std::vector<int64_t>> expected = read_rows(o);
  struct Variant {
    const char* name;
    std::function<void(FileSpec&)> set;
  };
  const std::vector<Variant> variants{
      {"chunked", [](FileSpec& s) { s.chunked = true; }},
      {"int16", [](FileSpec& s) { s.x_type = H5T_STD_I16LE; }},
      {"big-endian", [](FileSpec& s) { s.x_type = H5T_STD_I32BE; }},
      {"user block", [](FileSpec& s) { s.user_block = 512; }},
  };
  for (const Variant& v : variants) {
    FileSpec spec;
    spec.train_rows = kRows;
    spec.test_rows = 250;
    spec.maxlen = kSeq;
    v.set(spec);
    o.path = dir_.file(std::string(v.name) + ".h5");
    write_file(o.path, spec);
    BatchReader reader(o);
    EXPECT_FALSE(reader.reads_rows_directly()) << v.name;
    EXPECT_EQ(read_rows(o), expected) << v.name;
  }
}

TEST_F(BatchReaderTest, AReadErrorReachesTheCaller) {
  // The labels live in a raw side file; once it is gone, opening works but reading fails in the thread.
  const std::string path = dir_.file("external.h5");
  FileSpec spec;
  spec.train_y_external = dir_.file("labels.raw");
  write_file(path, spec);
  std::filesystem::remove(spec.train_y_external);
  BatchReaderOptions o = base({0, 20}, 4);
  o.path = path;
  ::testing::internal::CaptureStderr();
  {
    BatchReader reader(o);
    try {
      reader.next();
      ADD_FAILURE() << "no error from next()";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find(path + " /train/y"), std::string::npos) << e.what();
    }
    EXPECT_THROW(reader.next(), std::runtime_error);  // and again, not a silent end of the epoch
  }
  // HDF5's own error printing is off in the prefetch thread too (thread-safe builds keep it per thread).
  EXPECT_EQ(::testing::internal::GetCapturedStderr(), "");
}

}  // namespace
}  // namespace ddp::io
