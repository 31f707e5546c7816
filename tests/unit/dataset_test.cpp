// The dataset file's schema checks and their messages, label counts, and sharding (io/dataset.h).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/file.h>

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "io/dataset.h"
#include "io/hdf5_util.h"
#include "tests/dataset_files.h"
#include "tests/test_util.h"

namespace ddp::io {
namespace {

using ddp::testing::expect_user_error;
using ddp::testing::FileSpec;
using ddp::testing::TempDir;
using ddp::testing::write_file;

// ---------------------------------------------------------------------------------------------------------
// shard_of

TEST(ShardOf, TrainingShardsAreEqualAndDropTheRemainder) {
  const std::vector<std::pair<int64_t, int64_t>> expected{{0, 3}, {3, 6}, {6, 9}};
  for (int rank = 0; rank < 3; ++rank) {
    const Shard shard = shard_of(10, rank, 3, false);
    EXPECT_EQ(shard.begin, expected[rank].first);
    EXPECT_EQ(shard.end, expected[rank].second);
  }
  EXPECT_EQ(shard_of(7, 0, 1, false).size(), 7);
}

TEST(ShardOf, EvaluationShardsCoverEveryRowOnce) {
  for (const int64_t n : {0, 1, 2, 10, 11, 1000}) {
    for (const int world : {1, 2, 3, 4, 7}) {
      int64_t next = 0;
      for (int rank = 0; rank < world; ++rank) {
        const Shard shard = shard_of(n, rank, world, true);
        EXPECT_EQ(shard.begin, next) << n << " " << world;
        EXPECT_GE(shard.size(), n / world);
        EXPECT_LE(shard.size(), n / world + 1);
        next = shard.end;
      }
      EXPECT_EQ(next, n);
    }
  }
  EXPECT_THROW(shard_of(10, 3, 3, true), std::invalid_argument);
  EXPECT_THROW(shard_of(10, 0, 0, false), std::invalid_argument);
}

// ---------------------------------------------------------------------------------------------------------
// inspect_dataset and validate_rows

class InspectTest : public ::testing::Test {
 protected:
  std::string write(const FileSpec& spec) {
    write_file(path_, spec);
    return path_;
  }
  TempDir dir_;
  std::string path_ = dir_.file("data.h5");
};

TEST_F(InspectTest, AcceptsAWellFormedFile) {
  FileSpec spec;
  spec.vocab_size = 5000;
  const DatasetInfo info = inspect_dataset(write(spec));
  EXPECT_EQ(info.path, path_);
  EXPECT_EQ(info.train_size, 20);
  EXPECT_EQ(info.test_size, 8);
  EXPECT_EQ(info.vocab_size, 5000);
  EXPECT_EQ(info.maxlen, 4);
  EXPECT_FALSE(info.has_vocab);
  EXPECT_NO_THROW(validate_rows(info, "train", 0, 20));
  EXPECT_NO_THROW(validate_rows(info, "test", 0, 8));
}

// evaluate and predict read /test alone: a file holding only /test and the attributes serves them, and a
// broken /train does not stop them; training still needs it.
TEST_F(InspectTest, ScoringNeedsOnlyTheTestSplit) {
  write(FileSpec{});
  {
    Hid file(H5Fopen(path_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), Hid::Kind::kFile);
    ASSERT_GE(H5Ldelete(file.get(), "/train/y", H5P_DEFAULT), 0);
  }
  const DatasetInfo info = inspect_dataset(path_, SplitsNeeded::kTestOnly);
  EXPECT_EQ(info.test_size, 8);
  EXPECT_EQ(info.train_size, 0);
  EXPECT_EQ(info.maxlen, 4);
  EXPECT_NO_THROW(validate_rows(info, "test", 0, 8));
  expect_user_error([&] { inspect_dataset(path_); }, {path_, "/train/y is missing"});
}

TEST_F(InspectTest, MissingFile) {
  expect_user_error([&] { inspect_dataset(path_); }, {path_, "no such file"});
}

TEST_F(InspectTest, NotAnHdf5File) {
  std::ofstream(path_) << "vocab_size = 20000\nthis is a text file\n";
  expect_user_error([&] { inspect_dataset(path_); }, {path_, "not an HDF5 file (no HDF5 signature in it)"});
}

// Why a file that is there could not be opened, in the user's words rather than HDF5's stack.
TEST_F(InspectTest, AnUnopenableFileSaysWhy) {
  write(FileSpec{});
  const auto size = static_cast<std::size_t>(std::filesystem::file_size(path_));
  std::string bytes(size, '\0');
  std::ifstream(path_, std::ios::binary).read(bytes.data(), static_cast<std::streamsize>(size));
  {
    // Another process writing it holds HDF5's lock: flock() locks conflict across open file descriptions.
    const int writer = ::open(path_.c_str(), O_RDWR);
    ASSERT_GE(writer, 0);
    ASSERT_EQ(::flock(writer, LOCK_EX), 0);
    expect_user_error([&] { inspect_dataset(path_); }, {path_, "is open for writing in another process"});
    ::close(writer);
  }
  std::ofstream(path_, std::ios::binary | std::ios::trunc)
      .write(bytes.data(), static_cast<std::streamsize>(size / 2));
  expect_user_error([&] { inspect_dataset(path_); },
                    {path_, "is truncated: it has " + std::to_string(size / 2) + " of the " +
                                std::to_string(size) + " bytes its header promises"});
  std::ofstream(path_, std::ios::binary | std::ios::trunc) << "\x89HDF\r\n\x1a\n" << std::string(200, 'x');
  expect_user_error([&] { inspect_dataset(path_); },
                    {path_, "a damaged HDF5 file (bad superblock version number)"});
}

TEST_F(InspectTest, MissingDataset) {
  FileSpec spec;
  spec.write_test_y = false;
  expect_user_error([&] { inspect_dataset(write(spec)); }, {path_, "dataset /test/y is missing"});
}

TEST_F(InspectTest, FloatTokens) {
  FileSpec spec;
  spec.x_type = H5T_IEEE_F32LE;
  expect_user_error([&] { inspect_dataset(write(spec)); },
                    {path_, "dataset /train/x must be int32 [N, maxlen], found float32 [20, 4]"});
}

TEST_F(InspectTest, WrongIntegerWidth) {
  FileSpec spec;
  spec.x_type = H5T_STD_I64LE;
  expect_user_error([&] { inspect_dataset(write(spec)); }, {path_, "/train/x", "found int64 [20, 4]"});
}

TEST_F(InspectTest, TokensOfRankOne) {
  FileSpec spec;
  spec.x_rank_1 = true;
  expect_user_error([&] { inspect_dataset(write(spec)); }, {path_, "/train/x", "found int32 [80]"});
}

TEST_F(InspectTest, LengthMismatch) {
  FileSpec spec;
  spec.train_y_rows = 19;
  expect_user_error([&] { inspect_dataset(write(spec)); },
                    {path_, "/train/x has 20 rows but /train/y has 19"});
}

TEST_F(InspectTest, MissingVocabSize) {
  FileSpec spec;
  spec.write_vocab_size = false;
  expect_user_error([&] { inspect_dataset(write(spec)); }, {path_, "attribute vocab_size is missing"});
}

TEST_F(InspectTest, NonPositiveVocabSize) {
  FileSpec spec;
  spec.vocab_size = 0;
  expect_user_error([&] { inspect_dataset(write(spec)); }, {path_, "vocab_size must be positive, found 0"});
  // Past any real corpus: a damaged attribute, refused before the embedding is sized by it.
  spec.vocab_size = kMaxVocabulary + 1;
  expect_user_error([&] { inspect_dataset(write(spec)); },
                    {path_, "vocab_size = 10000001 is more than 10000000"});
}

// /vocab names the word of each id: a list of another length is refused, naming both numbers.
TEST_F(InspectTest, VocabOfAnotherLengthThanVocabSize) {
  FileSpec spec;
  spec.vocab_size = 50;
  for (const int words : {13, 51, 50}) {
    write(spec);
    {
      std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
      Hid file(check_h5_id(H5Fopen(path_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), "H5Fopen"), Hid::Kind::kFile);
      std::vector<std::string> list(static_cast<size_t>(words));
      for (int i = 0; i < words; ++i) list[static_cast<size_t>(i)] = std::to_string(i) + "w";
      write_string_list(file.get(), "vocab", list);
    }
    if (words == 50) {
      EXPECT_TRUE(inspect_dataset(path_).has_vocab);
    } else {
      expect_user_error([&] { inspect_dataset(path_); },
                        {path_, "/vocab holds " + std::to_string(words) + " words", "vocab_size = 50"});
    }
  }
}

// Two classes of one name could not be told apart in a report: refused, naming both.
TEST_F(InspectTest, ClassesNamedAlike) {
  write(FileSpec{});
  {
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    Hid file(check_h5_id(H5Fopen(path_.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), "H5Fopen"), Hid::Kind::kFile);
    write_int_attribute(file.get(), "num_classes", 3);
    write_string_list(file.get(), "classes", {"pos", "neg", "pos"});
  }
  expect_user_error([&] { inspect_dataset(path_); },
                    {path_, "/classes names classes 0 and 2 alike (\"pos\")"});
}

TEST_F(InspectTest, MaxlenDisagreesWithColumns) {
  FileSpec spec;
  spec.maxlen_attribute = 5;
  expect_user_error([&] { inspect_dataset(write(spec)); },
                    {path_, "dataset /train/x has 4 columns but attribute maxlen = 5"});
  spec.maxlen_attribute = kMaxSequenceLength + 1;
  expect_user_error([&] { inspect_dataset(write(spec)); }, {path_, "maxlen = 100001 is more than 100000"});
}

TEST_F(InspectTest, TokenNotBelowVocabSize) {
  FileSpec spec;
  spec.vocab_size = 1000;
  spec.edit = [](const std::string& split, std::vector<int32_t>& x, std::vector<uint8_t>&) {
    if (split == "train") x[5 * 4 + 2] = 1000;
  };
  const DatasetInfo info = inspect_dataset(write(spec));
  expect_user_error([&] { validate_rows(info, "train", 0, 20); },
                    {path_, "/train/x[5, 2] = 1000 is outside [0, vocab_size=1000)"});
  EXPECT_NO_THROW(validate_rows(info, "train", 6, 20));  // only the requested rows are read
}

TEST_F(InspectTest, NegativeToken) {
  FileSpec spec;
  spec.edit = [](const std::string& split, std::vector<int32_t>& x, std::vector<uint8_t>&) {
    if (split == "test") x[3 * 4 + 1] = -7;
  };
  const DatasetInfo info = inspect_dataset(write(spec));
  EXPECT_NO_THROW(validate_rows(info, "train", 0, 20));
  expect_user_error([&] { validate_rows(info, "test", 0, 8); },
                    {path_, "/test/x[3, 1] = -7 is outside [0, "});
}

TEST_F(InspectTest, LabelOutsideZeroOne) {
  FileSpec spec;
  spec.edit = [](const std::string& split, std::vector<int32_t>&, std::vector<uint8_t>& y) {
    if (split == "train") y[7] = 2;
  };
  const DatasetInfo info = inspect_dataset(write(spec));
  expect_user_error([&] { validate_rows(info, "train", 0, 20); }, {path_, "/train/y[7] = 2"});
}

TEST_F(InspectTest, BadRowPastTheFirstChunk) {
  // 4096 rows per read: the row number in the message must count from the start of the dataset.
  FileSpec spec;
  spec.train_rows = 5000;
  spec.maxlen = 2;
  spec.edit = [](const std::string& split, std::vector<int32_t>& x, std::vector<uint8_t>&) {
    if (split == "train") x[4500 * 2 + 1] = -1;
  };
  const DatasetInfo info = inspect_dataset(write(spec));
  EXPECT_NO_THROW(validate_rows(info, "train", 0, 4500));
  expect_user_error([&] { validate_rows(info, "train", 0, 5000); }, {path_, "/train/x[4500, 1] = -1"});
}

TEST_F(InspectTest, ValGroupIsOptionalAndCheckedWhenPresent) {
  FileSpec spec;
  EXPECT_EQ(inspect_dataset(write(spec)).val_size, 0);
  spec.val_rows = 5;
  const DatasetInfo info = inspect_dataset(write(spec));
  EXPECT_EQ(info.train_size, 20);
  EXPECT_EQ(info.val_size, 5);
  EXPECT_NO_THROW(validate_rows(info, "val", 0, 5));
  EXPECT_THROW(validate_rows(info, "val", 0, 6), std::invalid_argument);
  EXPECT_THROW(validate_rows(info, "valid", 0, 1), std::invalid_argument);

  // /val with the wrong schema: the same messages as for /train, naming /val.
  FileSpec float_tokens = spec;
  float_tokens.val_x_type = H5T_IEEE_F32LE;
  expect_user_error([&] { inspect_dataset(write(float_tokens)); },
                    {path_, "dataset /val/x must be int32 [N, maxlen], found float32 [5, 4]"});
  FileSpec short_labels = spec;
  short_labels.val_y_rows = 4;
  expect_user_error([&] { inspect_dataset(write(short_labels)); },
                    {path_, "/val/x has 5 rows but /val/y has 4"});
  FileSpec no_labels = spec;
  no_labels.write_val_y = false;
  expect_user_error([&] { inspect_dataset(write(no_labels)); }, {path_, "dataset /val/y is missing"});
  FileSpec wide = spec;
  wide.val_columns = 3;
  expect_user_error([&] { inspect_dataset(write(wide)); },
                    {path_, "dataset /val/x has 3 columns but attribute maxlen = 4"});
}

TEST_F(InspectTest, BadTokenInVal) {
  FileSpec spec;
  spec.val_rows = 5;
  spec.vocab_size = 1000;
  spec.edit = [](const std::string& split, std::vector<int32_t>& x, std::vector<uint8_t>&) {
    if (split == "val") x[2 * 4 + 1] = -3;
  };
  const DatasetInfo info = inspect_dataset(write(spec));
  EXPECT_NO_THROW(validate_rows(info, "train", 0, 20));
  expect_user_error([&] { validate_rows(info, "val", 0, 5); }, {path_, "/val/x[2, 1] = -3 is outside [0, "});
}

// ---------------------------------------------------------------------------------------------------------
// label_counts and class_balance_text

TEST_F(InspectTest, LabelCountsCountRowsOfEachLabel) {
  FileSpec spec;
  spec.val_rows = 7;
  spec.edit = [](const std::string& split, std::vector<int32_t>&, std::vector<uint8_t>& y) {
    if (split == "val") y = {1, 1, 1, 0, 1, 1, 1};
  };
  const DatasetInfo info = inspect_dataset(write(spec));
  // Labels are row % 2 in /train and /test.
  EXPECT_EQ(label_counts(info, "train", 0, 20), (std::vector<int64_t>{10, 10}));
  EXPECT_EQ(label_counts(info, "train", 3, 8), (std::vector<int64_t>{2, 3}));  // rows 3..7: 1 0 1 0 1
  EXPECT_EQ(label_counts(info, "test", 5, 6), (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(label_counts(info, "val", 0, 7), (std::vector<int64_t>{1, 6}));
  EXPECT_EQ(label_counts(info, "val", 4, 4), (std::vector<int64_t>{0, 0}));  // no rows: still both labels
  EXPECT_THROW(label_counts(info, "train", 0, 21), std::invalid_argument);
  EXPECT_THROW(label_counts(info, "dev", 0, 1), std::invalid_argument);
}

TEST_F(InspectTest, LabelCountsReadInChunksAndSizeToTheLargestLabel) {
  // More rows than one read (2^20): the counts must add up across chunks. A label 3 grows the vector.
  constexpr int64_t kRows = (int64_t{1} << 20) + 10;
  FileSpec spec;
  spec.train_rows = kRows;
  spec.maxlen = 1;
  spec.edit = [](const std::string& split, std::vector<int32_t>&, std::vector<uint8_t>& y) {
    if (split != "train") return;
    for (size_t i = 0; i < y.size(); ++i) y[i] = i % 4 == 0 ? 1 : 0;
    y[static_cast<size_t>(kRows - 3)] = 3;
  };
  const DatasetInfo info = inspect_dataset(write(spec));
  // Rows i % 4 == 0 below kRows: (kRows + 3) / 4 of them; row kRows - 3 (= 2^20 + 7, i % 4 == 3) holds the 3.
  const int64_t ones = (kRows + 3) / 4;
  EXPECT_EQ(label_counts(info, "train", 0, kRows), (std::vector<int64_t>{kRows - ones - 1, ones, 0, 1}));
  // Rows 2^20 - 2 .. 2^20 + 6: the ones are 2^20 and 2^20 + 4.
  EXPECT_EQ(label_counts(info, "train", (int64_t{1} << 20) - 2, kRows - 3), (std::vector<int64_t>{7, 2}));
}

TEST(ClassBalanceText, SharesOfEachLabelInOrder) {
  EXPECT_EQ(class_balance_text({5, 11}), "31.2% 0, 68.8% 1");
  EXPECT_EQ(class_balance_text({1, 1}), "50.0% 0, 50.0% 1");
  EXPECT_EQ(class_balance_text({0, 7}), "0.0% 0, 100.0% 1");
  EXPECT_EQ(class_balance_text({3, 0, 0, 1}), "75.0% 0, 0.0% 1, 0.0% 2, 25.0% 3");
  EXPECT_EQ(class_balance_text({1, 3, 0}, {"neg", "neutral", "pos"}), "25.0% neg, 75.0% neutral, 0.0% pos");
  EXPECT_EQ(class_balance_text({0, 0}), "no rows");
  EXPECT_EQ(class_balance_text({}), "no rows");
}

}  // namespace
}  // namespace ddp::io
