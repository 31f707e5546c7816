// Inputs the fuzzers of tests/fuzz found mishandled, each now a UserError of one line (the fuzzers' own
// inputs are replayed from tests/fuzz/regressions by the fuzz build; these tests hold the same cases in
// every build).
#include <gtest/gtest.h>
#include <hdf5.h>

#include <string>
#include <vector>

#include "engine/base/errors.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
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

}  // namespace
}  // namespace ddp
