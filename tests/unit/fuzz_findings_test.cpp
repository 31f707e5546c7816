// Inputs the fuzzers of tests/fuzz found mishandled, each now a UserError of one line (the fuzzers' own
// inputs are replayed from tests/fuzz/regressions by the fuzz build; these tests hold the same cases in
// every build).
#include <gtest/gtest.h>
#include <hdf5.h>

#include <climits>
#include <fstream>
#include <iterator>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/base/errors.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "io/batch_reader.h"
#include "io/dataset.h"
#include "io/synthetic.h"
#include "io/tokenizer.h"
#include "models/param_layout.h"
#include "tests/test_util.h"

namespace ddp {
namespace {

using testing::expect_user_error;
using testing::TempDir;

TEST(FuzzFindings, UserErrorIsAlwaysOneLine) {
  EXPECT_STREQ(UserError("a\nb\tc\x7f").what(), "a\\nb\\x09c\\x7f");
  EXPECT_STREQ(UserError(std::string("caf\xc3\xa9")).what(), "caf\xc3\xa9");  // UTF-8 stays as it is
}

// A value holding one of Boost's placeholders made its error message substitute forever.
TEST(FuzzFindings, PlaceholderInAValueDoesNotHang) {
  expect_user_error(
      [] {
        engine::parse_config({"--data.prefetch=%value%", "--data.path", "x.h5"});
      },
      {"data.prefetch", "\\x25value\\x25"});
  expect_user_error(
      [] {
        engine::parse_config({"--train.epochs", "%option%%canonical_option%"});
      },
      {"train.epochs"});
}

// A line break in a value printed the error over two lines.
TEST(FuzzFindings, LineBreakInABadValueStaysOnOneLine) {
  expect_user_error(
      [] {
        engine::parse_config({"--log.interval=1\n2", "--data.path", "x.h5"});
      },
      {"log.interval", "1\\n2"});
}

// A value the effective config.ini could not hold: it read back as something else (or as another key).
TEST(FuzzFindings, ValuesAnIniFileCannotHoldAreRefused) {
  for (const std::string& value :
       std::vector<std::string>{"a\nb", "run#1.h5", " x.h5", "x.h5 ", std::string("a\0b", 3)}) {
    expect_user_error([&] { engine::parse_config({"--data.path", value}); }, {"data.path", "INI"});
  }
  const engine::ParsedConfig parsed = engine::parse_config({"--data.path", "data/my reviews %d.h5"});
  EXPECT_EQ(parsed.config.data.path, "data/my reviews %d.h5");
}

// A checkpoint whose number attribute was a string: HDF5's failed conversion escaped as std::runtime_error.
TEST(FuzzFindings, CheckpointNumberAttributeOfAnotherType) {
  TempDir dir;
  const models::ModelShape shape{10, 2, 2, 1};
  const models::ParamLayout layout(shape);
  const std::vector<float> params(layout.total_size(), 0.5f);
  const std::string path = dir.file("last.h5");
  engine::write_checkpoint(path, shape, params, "sgd", {}, {}, "");
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  H5Adelete(file, "header_checksum");  // an edit behind the header's checksum
  ASSERT_GE(H5Adelete(file, "loss_sum"), 0);
  const hid_t type = H5Tcopy(H5T_C_S1);
  H5Tset_size(type, 4);
  const hid_t space = H5Screate(H5S_SCALAR);
  const hid_t attr = H5Acreate2(file, "loss_sum", type, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attr, type, "abc");
  H5Aclose(attr);
  H5Sclose(space);
  H5Tclose(type);
  H5Fclose(file);
  expect_user_error([&] { engine::read_checkpoint(path); }, {path, "loss_sum", "single number"});
}

// A checkpoint whose model dimensions are absurd: the parameter layout of 2^31 - 1 hidden units in both
// directions overflowed int, and 2^31 - 1 layers would have been laid out one by one before the parameters'
// size was compared.
TEST(FuzzFindings, CheckpointWithAbsurdDimensionsIsRefusedBeforeItsLayout) {
  TempDir dir;
  const models::ModelShape shape{10, 2, 2, 1};
  const std::vector<float> params(models::ParamLayout(shape).total_size(), 0.5f);
  // 2^32 + 5 would have wrapped to a vocabulary of 5.
  const std::vector<std::tuple<std::string, int64_t, std::string>> cases{
      {"hidden", INT32_MAX, "params"},
      {"layers", INT32_MAX, "params"},
      {"vocab_size", INT32_MAX, "vocab_size = 2147483647 is more than 10000000"},
      {"hidden", 65536, "params"},
      {"vocab_size", (int64_t{1} << 32) + 5, "vocab_size = 4294967301"}};
  for (const auto& [name, value, expected] : cases) {
    const std::string path = dir.file("last.h5");
    engine::write_checkpoint(path, shape, params, "sgd", {}, {}, "");
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    for (const auto& [attribute, v] :
         {std::pair{name.c_str(), value}, std::pair{"bidirectional", int64_t{1}}}) {
      H5Adelete(file, "header_checksum");  // an edit behind the header's checksum
      H5Adelete(file, attribute);
      const hid_t space = H5Screate(H5S_SCALAR);
      const hid_t attr = H5Acreate2(file, attribute, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
      H5Awrite(attr, H5T_NATIVE_INT64, &v);
      H5Aclose(attr);
      H5Sclose(space);
    }
    H5Fclose(file);
    expect_user_error([&] { engine::read_checkpoint(path); }, {path, expected});
  }
}

// A checkpoint whose header and params dataset agree on a model larger than any machine's memory (10^7 rows
// of 2^25 floats; the dataset's storage is never allocated in the file): std::bad_alloc escaped from
// read_checkpoint, and where the kernel overcommits, the process was killed once the pages were touched.
// Refused against the node's memory before anything is allocated.
TEST(FuzzFindings, CheckpointOfAModelLargerThanMemoryIsAUserError) {
  TempDir dir;
  const models::ModelShape small{10, 2, 2, 1};
  const std::string path = dir.file("last.h5");
  engine::write_checkpoint(path, small, std::vector<float>(models::ParamLayout(small).total_size(), 0.5f),
                           "sgd", {}, {}, "");
  models::ModelShape huge = small;
  huge.vocab_size = io::kMaxVocabulary;
  huge.embedding_dim = 1 << 25;
  const hsize_t size = models::ParamLayout(huge).total_size();
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  ASSERT_GE(file, 0);
  for (const auto& [attribute, value] : {std::pair{"vocab_size", int64_t{huge.vocab_size}},
                                         std::pair{"embedding_dim", int64_t{huge.embedding_dim}}}) {
    H5Adelete(file, "header_checksum");  // an edit behind the header's checksum
    ASSERT_GE(H5Adelete(file, attribute), 0);
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attr = H5Acreate2(file, attribute, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    ASSERT_GE(H5Awrite(attr, H5T_NATIVE_INT64, &value), 0);
    H5Aclose(attr);
    H5Sclose(space);
  }
  ASSERT_GE(H5Ldelete(file, "params", H5P_DEFAULT), 0);
  const hid_t space = H5Screate_simple(1, &size, nullptr);
  const hid_t params =
      H5Dcreate2(file, "params", H5T_IEEE_F32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(params, 0);
  H5Dclose(params);
  H5Sclose(space);
  H5Fclose(file);
  expect_user_error([&] { engine::read_checkpoint(path); }, {path, "params", "more than this node's"});
}

// Overwrites every occurrence of `from` in the file with `to` (as long), as a disk or a copy might.
void damage(const std::string& path, const std::string& from, const std::string& to) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  int replaced = 0;
  for (size_t at = bytes.find(from); at != std::string::npos; at = bytes.find(from, at + 1), ++replaced) {
    bytes.replace(at, to.size(), to);
  }
  ASSERT_GT(replaced, 0);
  std::ofstream(path, std::ios::binary | std::ios::trunc) << bytes;
}

// A damaged HDF5 file (here its groups' symbol table nodes): an HDF5 call failing on it escaped as
// std::runtime_error from inspect_dataset and every other reader.
TEST(FuzzFindings, DamagedHdf5FileIsAUserErrorNamingIt) {
  TempDir dir;
  io::SyntheticOptions options;
  options.output = dir.file("data.h5");
  options.train = 6;
  options.test = 4;
  options.vocab = 30;
  options.maxlen = 8;
  io::write_synthetic(options);
  const io::DatasetInfo info = io::inspect_dataset(options.output);
  damage(options.output, "SNOD", "XXXX");
  expect_user_error([&] { io::inspect_dataset(options.output); },
                    {options.output, "damaged or unreadable HDF5 file", "symbol table"});
  expect_user_error([&] { io::validate_rows(info, "train", 0, info.train_size); },
                    {options.output, "damaged or unreadable HDF5 file"});
  expect_user_error([&] { io::read_labels(info, "test", 0, info.test_size); },
                    {options.output, "damaged or unreadable HDF5 file"});
  expect_user_error([&] { io::read_vocabulary(options.output); }, {options.output});
  expect_user_error(
      [&] {
        io::BatchReaderOptions reader_options;
        reader_options.path = options.output;
        reader_options.shard = {0, info.train_size};
        reader_options.batch_size = 2;
        io::BatchReader reader(reader_options);
        while (reader.next() != nullptr) {
        }
      },
      {options.output, "damaged or unreadable HDF5 file"});

  const models::ModelShape shape{10, 2, 2, 1};
  const std::vector<float> params(models::ParamLayout(shape).total_size(), 0.5f);
  const std::string checkpoint = dir.file("last.h5");
  engine::write_checkpoint(checkpoint, shape, params, "sgd", {}, {}, "");
  damage(checkpoint, "SNOD", "XXXX");
  expect_user_error([&] { engine::read_checkpoint(checkpoint); },
                    {checkpoint, "damaged or unreadable HDF5 file"});
}

}  // namespace
}  // namespace ddp
