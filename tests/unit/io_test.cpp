// The HDF5 data layer: schema checks and their messages, the synthetic generator, sharding, and the
// prefetching batch reader.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <map>
#include <set>
#include <thread>
#include <vector>

#include "engine/base/errors.h"
#include "io/batch_reader.h"
#include "io/damaged_file_guard.h"
#include "io/data_plan.h"
#include "io/dataset.h"
#include "io/hdf5_util.h"
#include "io/synthetic.h"
#include "tests/test_util.h"

namespace ddp::io {
namespace {

using ddp::testing::expect_user_error;
using ddp::testing::TempDir;

// ---------------------------------------------------------------------------------------------------------
// Helpers: write a small dataset file with optional defects, read whole datasets back.

struct FileSpec {
  int64_t train_rows = 20;
  int64_t test_rows = 8;
  int maxlen = 4;
  int64_t maxlen_attribute = -1;  // -1: same as maxlen
  int64_t vocab_size = kMaxVocabulary;
  bool write_vocab_size = true;
  hid_t x_type = H5T_STD_I32LE;
  bool x_rank_1 = false;
  int64_t train_y_rows = -1;  // -1: same as train_rows
  bool write_test_x = true;
  bool write_test_y = true;
  int64_t val_rows = -1;    // -1: no /val group
  int64_t val_y_rows = -1;  // -1: same as val_rows
  hid_t val_x_type = H5T_STD_I32LE;
  int val_columns = -1;  // -1: maxlen
  bool write_val_y = true;
  // Non-empty: /train/y's data lives in this raw file, which a test deletes to make reads fail.
  std::string train_y_external;
  bool chunked = false;    // every dataset in compressed chunks of 7 rows
  hsize_t user_block = 0;  // bytes before the HDF5 data (a multiple of 512)
  // x[i, c] = i * maxlen + c identifies row and column; y[i] = i % 2. `edit` may plant bad values.
  std::function<void(const std::string& split, std::vector<int32_t>& x, std::vector<uint8_t>& y)> edit;
};

void write_dataset(hid_t group, const char* name, hid_t file_type, hid_t memory_type,
                   std::vector<hsize_t> dims, const void* data, const std::string& external = "",
                   bool chunked = false) {
  Hid space(
      check_h5_id(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "H5Screate_simple"),
      Hid::Kind::kDataspace);
  Hid dcpl(check_h5_id(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate"), Hid::Kind::kPropertyList);
  if (!external.empty()) {
    check_h5(H5Pset_external(dcpl.get(), external.c_str(), 0, H5F_UNLIMITED), "H5Pset_external");
  }
  if (chunked && dims.front() > 0) {
    std::vector<hsize_t> chunk = dims;
    chunk.front() = std::min<hsize_t>(7, dims.front());
    check_h5(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), "H5Pset_chunk");
    check_h5(H5Pset_deflate(dcpl.get(), 4), "H5Pset_deflate");
  }
  Hid set(check_h5_id(H5Dcreate2(group, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                      name),
          Hid::Kind::kDataset);
  check_h5(H5Dwrite(set.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), name);
}

void write_file(const std::string& path, const FileSpec& spec) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  quiet_hdf5_errors();
  Hid create(check_h5_id(H5Pcreate(H5P_FILE_CREATE), "H5Pcreate"), Hid::Kind::kPropertyList);
  if (spec.user_block > 0) check_h5(H5Pset_userblock(create.get(), spec.user_block), "H5Pset_userblock");
  Hid file(check_h5_id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, create.get(), H5P_DEFAULT), "H5Fcreate"),
           Hid::Kind::kFile);
  if (spec.write_vocab_size) write_int_attribute(file.get(), "vocab_size", spec.vocab_size);
  write_int_attribute(file.get(), "maxlen", spec.maxlen_attribute >= 0 ? spec.maxlen_attribute : spec.maxlen);
  for (const std::string split : {"train", "test", "val"}) {
    const bool train = split == "train";
    const bool val = split == "val";
    if (val && spec.val_rows < 0) continue;
    const int64_t rows = train ? spec.train_rows : val ? spec.val_rows : spec.test_rows;
    int64_t y_rows = train && spec.train_y_rows >= 0 ? spec.train_y_rows : rows;
    if (val && spec.val_y_rows >= 0) y_rows = spec.val_y_rows;
    const int columns = val && spec.val_columns >= 0 ? spec.val_columns : spec.maxlen;
    std::vector<int32_t> x(static_cast<size_t>(rows * columns));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<int32_t>(i);
    std::vector<uint8_t> y(static_cast<size_t>(y_rows));
    for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<uint8_t>(i % 2);
    if (spec.edit) spec.edit(split, x, y);
    Hid group(
        check_h5_id(H5Gcreate2(file.get(), split.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "group"),
        Hid::Kind::kGroup);
    if (train || val || spec.write_test_x) {
      std::vector<hsize_t> dims{static_cast<hsize_t>(rows), static_cast<hsize_t>(columns)};
      if (spec.x_rank_1) dims = {static_cast<hsize_t>(x.size())};
      write_dataset(group.get(), "x", val ? spec.val_x_type : spec.x_type, H5T_NATIVE_INT32, dims, x.data(),
                    "", spec.chunked);
    }
    if (train || (val ? spec.write_val_y : spec.write_test_y)) {
      write_dataset(group.get(), "y", H5T_STD_U8LE, H5T_NATIVE_UINT8, {static_cast<hsize_t>(y_rows)},
                    y.data(), train ? spec.train_y_external : "", spec.chunked);
    }
  }
}

// A whole dataset as int32 (HDF5 converts uint8 labels).
std::vector<int32_t> read_all(const std::string& path, const std::string& name,
                              std::vector<int64_t>* dims = nullptr) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  Hid file = open_file_readonly(path);
  Hid set = open_dataset(file.get(), path, name);
  const std::vector<int64_t> shape = dataset_dims(set.get());
  int64_t size = 1;
  for (const int64_t d : shape) size *= d;
  std::vector<int32_t> data(static_cast<size_t>(size));
  check_h5(H5Dread(set.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), "H5Dread");
  if (dims != nullptr) *dims = shape;
  return data;
}

// A fault inside a guarded read (libhdf5 reading out of bounds in a damaged file) is a bad input: one line
// naming the innermost guard's file, exit status 2. Outside any guard, or once the guards are gone, a fault
// reaches the handler that was there before.
TEST(DamagedFileGuard, AFaultWhileReadingNamesTheFileAndExitsAsBadInput) {
  EXPECT_EXIT(
      {
        const DamagedFileGuard outer("/data/outer.h5");
        { const DamagedFileGuard inner("/data/inner.h5"); }
        std::raise(SIGSEGV);
      },
      ::testing::ExitedWithCode(kExitUserError),
      "^ddptrain: error: /data/outer.h5: the HDF5 library crashed reading this file \\(SIGSEGV\\): the file "
      "is "
      "damaged; h5dump /data/outer.h5 shows where \\((rank .* on )?host .*\\)\n$");
  EXPECT_EXIT(
      {
        const DamagedFileGuard outer("/data/outer.h5");
        const DamagedFileGuard inner("/data/inner\nline.h5");
        std::raise(SIGBUS);
      },
      ::testing::ExitedWithCode(kExitUserError), "^ddptrain: error: /data/inner\\\\nline.h5: .*\\(SIGBUS\\)");
  EXPECT_EXIT(
      {
        { const DamagedFileGuard done("/data/done.h5"); }
        std::raise(SIGSEGV);
      },
      // Killed by the signal; under a sanitizer its own report and exit status.
      [](int status) { return !WIFEXITED(status) || WEXITSTATUS(status) != kExitUserError; }, "");
}

// A stall's message says which file a thread has been reading, and for how long: the outermost guard of each
// thread, while it lives.
TEST(DamagedFileGuard, TheReadsUnderWayAreNamedForAStall) {
  using Clock = std::chrono::steady_clock;
  EXPECT_EQ(guarded_reads_note(Clock::now()), "");
  std::string note;
  {
    const DamagedFileGuard outer("/data/frozen.h5");
    const DamagedFileGuard inner("/data/inner.h5");
    note = guarded_reads_note(Clock::now() + std::chrono::seconds(30));
  }
  EXPECT_EQ(note.find("this rank has been inside the HDF5 library reading /data/frozen.h5 for 30.0 s"), 0u)
      << note;
  EXPECT_NE(note.find("(h5dump /data/frozen.h5 tells which)"), std::string::npos) << note;
  EXPECT_EQ(note.find("inner.h5"), std::string::npos) << note;
  EXPECT_EQ(guarded_reads_note(Clock::now()), "");
  // Another thread's read is named too.
  std::string other_thread;
  std::thread reader([&] {
    const DamagedFileGuard guard("/data/prefetched.h5");
    other_thread = guarded_reads_note(Clock::now());
  });
  reader.join();
  EXPECT_NE(other_thread.find("reading /data/prefetched.h5"), std::string::npos) << other_thread;
}

// ---------------------------------------------------------------------------------------------------------
// IndexPermutation

// A string list carries its checksum: a byte changed in place (a damaged disk, an edit) is an error naming
// the file and the list, not a renamed class or a word moved to another id; a list without one (h5py's,
// files of before) reads as it is.
TEST(StringList, ItsChecksumCatchesAChangedString) {
  TempDir dir;
  const std::string path = dir.file("lists.h5");
  const std::vector<std::string> words{"<pad>", "<start>", "<oov>", "word1x", "café"};
  {
    Hid file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), Hid::Kind::kFile);
    write_string_list(file.get(), "vocab", words);
    write_string_list(file.get(), "plain", words);
    ASSERT_GE(H5Adelete_by_name(file.get(), "plain", "checksum", H5P_DEFAULT), 0);
  }
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), Hid::Kind::kFile);
  EXPECT_EQ(read_string_list(file.get(), path, "/vocab", 100), words);
  EXPECT_EQ(read_string_list(file.get(), path, "/vocab", 4),
            (std::vector<std::string>{"<pad>", "<start>", "<oov>", "word1x"}));
  // "word1x" becomes "xord1x" in place, the checksum attribute kept.
  for (const char* name : {"/vocab", "/plain"}) {
    Hid dataset(H5Dopen2(file.get(), name, H5P_DEFAULT), Hid::Kind::kDataset);
    Hid type(H5Tcopy(H5T_C_S1), Hid::Kind::kDatatype);
    H5Tset_size(type.get(), H5T_VARIABLE);
    H5Tset_cset(type.get(), H5T_CSET_UTF8);
    std::vector<const char*> changed{"<pad>", "<start>", "<oov>", "xord1x", "café"};
    ASSERT_GE(H5Dwrite(dataset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, changed.data()), 0);
  }
  expect_user_error([&] { read_string_list(file.get(), path, "/vocab", 4); },
                    {path, "/vocab does not match its checksum"});
  EXPECT_EQ(read_string_list(file.get(), path, "/plain", 100)[3], "xord1x");
}

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

// ---------------------------------------------------------------------------------------------------------
// shard_of

TEST(DataPlan, DescriptionSaysWhereTheTestScoreComesFrom) {
  DatasetInfo info;
  info.train_size = 1000;
  info.test_size = 300;
  EXPECT_NE(plan_data(info, "split", 0.1, 0, 2).describe().find("test 300 (scored once, at the end)"),
            std::string::npos);
  EXPECT_NE(plan_data(info, "test", 0.1, 0, 2).describe().find("no separate test score"), std::string::npos);
  EXPECT_EQ(plan_data(info, "split", 0.1, 0, 2).notes(), "");
  EXPECT_EQ(plan_data(info, "test", 0.1, 0, 2).notes(), "");
  info.test_size = 0;
  EXPECT_EQ(plan_data(info, "split", 0.1, 0, 2).notes(), ", no test score (/test has no rows)");
  EXPECT_EQ(plan_data(info, "split", 0.1, 0, 2).describe().find("test"), std::string::npos);
  // An empty /val: auto holds out /train's last rows, and says why; val refuses it.
  info.test_size = 300;
  info.has_val = true;
  const DataPlan passed_over = plan_data(info, "auto", 0.1, 0, 2);
  EXPECT_EQ(passed_over.validation.split, "train");
  EXPECT_EQ(passed_over.notes(), ", /val is empty (so data.validation = auto took /train's last rows)");
  EXPECT_EQ(plan_data(info, "split", 0.1, 0, 2).notes(), "");
  expect_user_error([&] { plan_data(info, "val", 0.1, 0, 2); }, {"/val has no rows"});
}

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

// ---------------------------------------------------------------------------------------------------------
// write_synthetic

class SyntheticTest : public ::testing::Test {
 protected:
  SyntheticOptions options(const std::string& name, uint64_t seed = 7) const {
    SyntheticOptions o;
    o.output = dir_.file(name);
    o.train = 3000;
    o.test = 500;
    o.vocab = 200;  // P = 4 words per polarity: ids 4-7 positive, 8-11 negative, 12-199 filler
    o.maxlen = 40;
    o.seed = seed;
    return o;
  }
  TempDir dir_;
};

constexpr int32_t kNegation = 3;
bool is_positive(int32_t token) {
  return token >= 4 && token < 8;
}
bool is_negative(int32_t token) {
  return token >= 8 && token < 12;
}

TEST_F(SyntheticTest, SameSeedSameFile) {
  const SyntheticOptions a = options("a.h5");
  const SyntheticOptions b = options("b.h5");
  const SyntheticOptions c = options("c.h5", 8);
  write_synthetic(a);
  write_synthetic(b);
  write_synthetic(c);
  for (const char* name : {"/train/x", "/train/y", "/test/x", "/test/y"}) {
    EXPECT_EQ(read_all(a.output, name), read_all(b.output, name)) << name;
    EXPECT_NE(read_all(a.output, name), read_all(c.output, name)) << name;
  }
  // No timestamps in the file, so it is byte-identical too (a checksum identifies a dataset).
  const auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes(a.output), bytes(b.output));
  // Train and test come from different streams.
  const std::vector<int32_t> train = read_all(a.output, "/train/x");
  const std::vector<int32_t> test = read_all(a.output, "/test/x");
  EXPECT_FALSE(std::equal(test.begin(), test.end(), train.begin()));
}

TEST_F(SyntheticTest, SchemaAndAttributes) {
  const SyntheticOptions o = options("nested/dir/data.h5");
  write_synthetic(o);
  EXPECT_TRUE(std::filesystem::exists(o.output));
  EXPECT_FALSE(std::filesystem::exists(o.output + ".tmp"));
  const DatasetInfo info = inspect_dataset(o.output);
  EXPECT_EQ(info.train_size, 3000);
  EXPECT_EQ(info.test_size, 500);
  EXPECT_EQ(info.vocab_size, 200);
  EXPECT_EQ(info.maxlen, 40);
  EXPECT_NO_THROW(validate_rows(info, "train", 0, info.train_size));
  EXPECT_NO_THROW(validate_rows(info, "test", 0, info.test_size));
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  Hid file = open_file_readonly(o.output);
  EXPECT_EQ(read_string_attribute(file.get(), "generator"), "synthetic-v2 seed=7");
  EXPECT_EQ(read_string_attribute(file.get(), "no such attribute"), "");
}

TEST_F(SyntheticTest, ReviewsFollowTheGrammar) {
  const SyntheticOptions o = options("data.h5");
  write_synthetic(o);
  std::vector<int64_t> dims;
  const std::vector<int32_t> x = read_all(o.output, "/train/x", &dims);
  const std::vector<int32_t> y = read_all(o.output, "/train/y");
  ASSERT_EQ(dims, (std::vector<int64_t>{3000, 40}));
  const int maxlen = 40;

  int64_t positives = 0;
  int64_t rows_with_negated_word = 0;
  int64_t rows_with_distractor = 0;
  // Key: the multiset of non-filler tokens. A bag of words sees only this (and fillers, which carry nothing).
  std::map<std::multiset<int32_t>, std::set<int32_t>> labels_by_bag;
  for (int64_t r = 0; r < dims[0]; ++r) {
    const int32_t* row = x.data() + r * maxlen;
    int start = 0;
    while (start < maxlen && row[start] == 0) ++start;
    ASSERT_LT(start, maxlen);
    ASSERT_EQ(row[start], 1) << "row " << r;
    ASSERT_GE(maxlen - start, maxlen / 2) << "row " << r;
    int sentiment_words = 0;
    int polarity_sum = 0;
    bool negated_word = false;
    bool distractor = false;
    std::multiset<int32_t> bag;
    for (int p = start + 1; p < maxlen; ++p) {
      ASSERT_GE(row[p], 3) << "row " << r << " position " << p;  // no padding, start or OOV in the body
      ASSERT_LT(row[p], 200);
      const bool sentiment = is_positive(row[p]) || is_negative(row[p]);
      if (row[p] == kNegation || sentiment) bag.insert(row[p]);
      if (row[p] == kNegation && (p + 1 == maxlen || !(is_positive(row[p + 1]) || is_negative(row[p + 1])))) {
        distractor = true;
      }
      if (!sentiment) continue;
      ++sentiment_words;
      const bool negated = row[p - 1] == kNegation;
      negated_word = negated_word || negated;
      polarity_sum += is_positive(row[p]) != negated ? 1 : -1;
    }
    ASSERT_TRUE(sentiment_words == 1 || sentiment_words == 3) << "row " << r;
    // The rule the data promises: a negation right before a sentiment word flips it.
    ASSERT_EQ(y[r], polarity_sum > 0 ? 1 : 0) << "row " << r;
    positives += y[r];
    rows_with_negated_word += negated_word;
    rows_with_distractor += distractor;
    labels_by_bag[bag].insert(y[r]);
  }
  EXPECT_GT(positives, 3000 * 30 / 100);
  EXPECT_LT(positives, 3000 * 70 / 100);
  EXPECT_GT(rows_with_negated_word, 3000 / 10);
  EXPECT_GT(rows_with_distractor, 3000 / 10);
  // Order matters: some bags of words occur with both labels.
  int64_t ambiguous_bags = 0;
  for (const auto& [bag, labels] : labels_by_bag) ambiguous_bags += labels.size() > 1;
  EXPECT_GE(ambiguous_bags, 5);
}

TEST_F(SyntheticTest, FillerWordsFollowZipfsLaw) {
  // Fillers are ids 12-199, the id's rank among them r = id - 11: drawn with probability proportional to 1/r.
  const SyntheticOptions o = options("data.h5");
  write_synthetic(o);
  std::map<int32_t, int64_t> count;
  int64_t fillers = 0;
  for (const int32_t token : read_all(o.output, "/train/x")) {
    if (token < 12) continue;
    ++count[token];
    ++fillers;
  }
  double harmonic = 0;
  for (int r = 1; r <= 188; ++r) harmonic += 1.0 / r;
  for (const int rank : {1, 2, 10, 100}) {
    const double expected = static_cast<double>(fillers) / (rank * harmonic);
    EXPECT_NEAR(static_cast<double>(count[11 + rank]), expected, 5 * std::sqrt(expected)) << "rank " << rank;
  }
}

TEST_F(SyntheticTest, RejectsImpossibleOptions) {
  SyntheticOptions o = options("bad.h5");
  o.vocab = 10;
  expect_user_error([&] { write_synthetic(o); }, {"--vocab 10 is too small: need at least 28"});
  o.vocab = 27;
  expect_user_error([&] { write_synthetic(o); }, {"--vocab 27"});
  o.vocab = 10'000'001;
  expect_user_error([&] { write_synthetic(o); }, {"--vocab 10000001 is too large: at most 10000000"});
  o.vocab = 28;
  o.maxlen = 5;
  expect_user_error([&] { write_synthetic(o); }, {"--maxlen 5 is too small: need at least 8"});
  o.maxlen = 8;
  o.train = 0;
  expect_user_error([&] { write_synthetic(o); }, {"--train 0"});
  EXPECT_FALSE(std::filesystem::exists(o.output));
  o.train = 100;
  EXPECT_NO_THROW(write_synthetic(o));  // the smallest vocabulary and length that are allowed
  EXPECT_NO_THROW(validate_rows(inspect_dataset(o.output), "train", 0, 100));
}

TEST_F(SyntheticTest, ValFractionTakesTheLastTrainingRows) {
  const SyntheticOptions whole = options("whole.h5");
  SyntheticOptions held = options("held.h5");
  held.val_fraction = 0.1;
  write_synthetic(whole);
  write_synthetic(held);
  const DatasetInfo info = inspect_dataset(held.output);
  EXPECT_EQ(info.train_size, 2700);
  EXPECT_EQ(info.val_size, 300);
  EXPECT_EQ(info.test_size, 500);
  EXPECT_NO_THROW(validate_rows(info, "val", 0, 300));
  // The same stream of training rows, its last 300 in /val; the test split is untouched.
  for (const char* name : {"x", "y"}) {
    std::vector<int32_t> rows = read_all(held.output, std::string("/train/") + name);
    const std::vector<int32_t> val = read_all(held.output, std::string("/val/") + name);
    rows.insert(rows.end(), val.begin(), val.end());
    EXPECT_EQ(rows, read_all(whole.output, std::string("/train/") + name)) << name;
    EXPECT_EQ(read_all(held.output, std::string("/test/") + name),
              read_all(whole.output, std::string("/test/") + name))
        << name;
  }
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  Hid file = open_file_readonly(held.output);
  EXPECT_EQ(read_string_attribute(file.get(), "generator"), "synthetic-v2 seed=7 val_rows=300");
}

TEST_F(SyntheticTest, BadValFractionNamesTheOption) {
  SyntheticOptions o = options("bad.h5");
  o.train = 10;
  o.val_fraction = -0.1;
  expect_user_error([&] { write_synthetic(o); },
                    {"prepare synthetic: --val-fraction must be in [0, 1), got -0.1"});
  o.val_fraction = 1;
  expect_user_error([&] { write_synthetic(o); },
                    {"prepare synthetic: --val-fraction must be in [0, 1), got 1"});
  o.val_fraction = 0.96;  // round(9.6) = 10 of 10 rows
  expect_user_error([&] { write_synthetic(o); },
                    {"prepare synthetic: --val-fraction 0.96 of 10 training rows leaves no row in /train"});
  o.val_fraction = 0.04;  // round(0.4) = 0
  expect_user_error([&] { write_synthetic(o); },
                    {"--val-fraction 0.04 of 10 training rows gives no row to /val"});
  EXPECT_FALSE(std::filesystem::exists(o.output));
  o.val_fraction = 0.94;  // 9 of 10 rows to /val
  write_synthetic(o);
  EXPECT_EQ(inspect_dataset(o.output).train_size, 1);
}

TEST_F(SyntheticTest, FailedWriteLeavesNoTemporaryFile) {
  SyntheticOptions o = options("occupied");
  std::filesystem::create_directories(std::filesystem::path(o.output) / "child");  // rename onto it fails
  expect_user_error([&] { write_synthetic(o); }, {o.output});
  EXPECT_FALSE(std::filesystem::exists(o.output + ".tmp"));
}

// ---------------------------------------------------------------------------------------------------------
// BatchReader

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
