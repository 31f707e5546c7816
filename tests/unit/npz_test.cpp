// .npz files (io/npz.h): a zip archive's .npy members read by array name.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/npz.h"
#include "tests/numpy_files.h"
#include "tests/test_util.h"

namespace ddp::io {
namespace {

using ddp::testing::expect_user_error;
using ddp::testing::kLists;
using ddp::testing::kListsRead;
using ddp::testing::make_zip;
using ddp::testing::numeric_npy;
using ddp::testing::NumpyPickle;
using ddp::testing::object_npy;
using ddp::testing::TempDir;
using ddp::testing::write_file;

TEST(Npz, ReadsArraysByNameAndNamesMissingOnes) {
  TempDir dir;
  const std::string path = dir.file("t.npz");
  write_file(
      path,
      make_zip({{"x_train.npy",
                 object_npy(NumpyPickle(NumpyPickle::Style::kProtocol3).object_array(kLists), "(3,)"), 0},
                {"y_train.npy", numeric_npy({0, 1, 1}), 8}}));
  const NpzFile npz(path);
  EXPECT_EQ(npz.array_names(), (std::vector<std::string>{"x_train", "y_train"}));
  EXPECT_EQ(npz.array("x_train").lists, kListsRead);
  EXPECT_EQ(npz.array("y_train").integers, (std::vector<int64_t>{0, 1, 1}));
  expect_user_error([&] { npz.array("x_test"); },
                    {path + ": missing array 'x_test' (the file has: x_train, y_train)"});
}

}  // namespace
}  // namespace ddp::io
