// `prepare imdb-npz` end to end (io/imdb_npz.h): Keras' conventions and bad input.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <mutex>
#include <string>
#include <vector>

#include "engine/base/errors.h"
#include "io/hdf5_util.h"
#include "io/imdb_npz.h"
#include "tests/numpy_files.h"
#include "tests/test_util.h"

namespace ddp::io {
namespace {

using ddp::testing::Bytes;
using ddp::testing::Element;
using ddp::testing::expect_user_error;
using ddp::testing::header_dict;
using ddp::testing::int_of;
using ddp::testing::list_of;
using ddp::testing::make_npy;
using ddp::testing::make_zip;
using ddp::testing::numeric_npy;
using ddp::testing::numeric_payload;
using ddp::testing::NumpyPickle;
using ddp::testing::object_npy;
using ddp::testing::shape_1d;
using ddp::testing::TempDir;
using ddp::testing::write_file;
using ddp::testing::ZipMember;

struct ImdbArrays {
  std::vector<Element> x_train = {list_of({5}), list_of({0, 1, 2, 3, 4, 30}), list_of({})};
  Bytes y_train = numeric_npy({1, 0, 1});
  std::vector<Element> x_test = {list_of({7, 8}), list_of({6})};
  Bytes y_test = numeric_npy({0, 1}, "|u1");
  bool with_y_test = true;
};

std::string write_imdb(const TempDir& dir, const ImdbArrays& arrays) {
  const std::string path = dir.file("imdb.npz");
  auto x = [](const std::vector<Element>& elements) {
    return object_npy(NumpyPickle(NumpyPickle::Style::kProtocol3).object_array(elements),
                      shape_1d(elements.size()));
  };
  std::vector<ZipMember> members = {{"x_test.npy", x(arrays.x_test), 8},
                                    {"x_train.npy", x(arrays.x_train), 0},
                                    {"y_train.npy", arrays.y_train, 0}};
  if (arrays.with_y_test) members.push_back({"y_test.npy", arrays.y_test, 8});
  write_file(path, make_zip(members));
  return path;
}

std::vector<int32_t> read_ints(const std::string& path, const std::string& name) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  Hid file = open_file_readonly(path);
  Hid set = open_dataset(file.get(), path, name);
  int64_t size = 1;
  for (int64_t d : dataset_dims(set.get())) size *= d;
  std::vector<int32_t> data(static_cast<size_t>(size));
  check_h5(H5Dread(set.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), "H5Dread");
  return data;
}

TEST(PrepareImdbNpz, FollowsKerasConventions) {
  TempDir dir;
  ImdbNpzOptions options;
  options.input = write_imdb(dir, {});
  options.output = dir.file("out.h5");
  options.vocab = 10;
  options.maxlen = 4;
  const std::string summary = prepare_imdb_npz(options);
  EXPECT_NE(summary.find("3 train and 2 test samples, vocab 10, maxlen 4"), std::string::npos) << summary;
  // Rows, in file order, after [1] + [w + 3 ...] (ids >= 10 become 2) and pad/truncate 'pre' to 4:
  //   [5]                -> [1, 8]                   -> 0 0 1 8
  //   [0, 1, 2, 3, 4, 30] -> [1, 3, 4, 5, 6, 7, 2]   -> 5 6 7 2 (the start id is cut off)
  //   []                 -> [1]                      -> 0 0 0 1
  // test: [7, 8] -> [1, 2, 2] -> 0 1 2 2;  [6] -> [1, 9] -> 0 0 1 9
  // RandomState(113) orders train [2, 0, 1] and then test [1, 0] (numpy, as in the test above).
  EXPECT_EQ(read_ints(options.output, "/train/x"),
            (std::vector<int32_t>{0, 0, 0, 1, 0, 0, 1, 8, 5, 6, 7, 2}));
  EXPECT_EQ(read_ints(options.output, "/train/y"), (std::vector<int32_t>{1, 1, 0}));
  EXPECT_EQ(read_ints(options.output, "/test/x"), (std::vector<int32_t>{0, 0, 1, 9, 0, 1, 2, 2}));
  EXPECT_EQ(read_ints(options.output, "/test/y"), (std::vector<int32_t>{1, 0}));
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  Hid file = open_file_readonly(options.output);
  EXPECT_EQ(read_int_attribute(file.get(), options.output, "vocab_size"), 10);
  EXPECT_EQ(read_int_attribute(file.get(), options.output, "maxlen"), 4);
  EXPECT_EQ(read_string_attribute(file.get(), "source"),
            "keras imdb.npz imdb.npz num_words=10 maxlen=4 seed=113");
  EXPECT_FALSE(link_exists(file.get(), "vocab"));
}

TEST(PrepareImdbNpz, ValFractionHoldsOutTheLastRowsOfLoadDatasOrder) {
  TempDir dir;
  ImdbNpzOptions options;
  options.input = write_imdb(dir, {});
  options.output = dir.file("out.h5");
  options.vocab = 10;
  options.maxlen = 4;
  options.val_fraction = 0.34;  // round(1.02) = 1 of 3 rows
  const std::string summary = prepare_imdb_npz(options);
  EXPECT_NE(summary.find("2 train, 1 val and 2 test samples"), std::string::npos) << summary;
  // load_data's order as in FollowsKerasConventions, not reshuffled: its last row goes to /val.
  EXPECT_EQ(read_ints(options.output, "/train/x"), (std::vector<int32_t>{0, 0, 0, 1, 0, 0, 1, 8}));
  EXPECT_EQ(read_ints(options.output, "/train/y"), (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(read_ints(options.output, "/val/x"), (std::vector<int32_t>{5, 6, 7, 2}));
  EXPECT_EQ(read_ints(options.output, "/val/y"), (std::vector<int32_t>{0}));
  EXPECT_EQ(read_ints(options.output, "/test/x"), (std::vector<int32_t>{0, 0, 1, 9, 0, 1, 2, 2}));

  options.val_fraction = 0.9;  // round(2.7) = 3 of 3
  expect_user_error([&] { prepare_imdb_npz(options); },
                    {"prepare imdb-npz: --val-fraction 0.9 of 3 training rows leaves no row in /train"});
  options.val_fraction = -1;
  expect_user_error([&] { prepare_imdb_npz(options); },
                    {"prepare imdb-npz: --val-fraction must be in [0, 1), got -1"});
}

TEST(PrepareImdbNpz, BadInputIsAUserErrorAndWritesNothing) {
  TempDir dir;
  ImdbNpzOptions options;
  options.output = dir.file("out.h5");
  auto expect_error = [&](const ImdbArrays& arrays, const std::vector<std::string>& parts) {
    options.input = write_imdb(dir, arrays);
    expect_user_error([&] { prepare_imdb_npz(options); }, parts);
    EXPECT_FALSE(std::filesystem::exists(options.output));
    EXPECT_FALSE(std::filesystem::exists(options.output + ".tmp"));
  };
  ImdbArrays bad_label;
  bad_label.y_train = numeric_npy({1, 2, 0});
  expect_error(bad_label, {"imdb.npz: y_train: the label of sample 1 is 2, expected 0 or 1"});
  ImdbArrays negative;
  negative.x_test = {list_of({1}), list_of({4, -3})};
  expect_error(negative, {"imdb.npz: x_test: sample 1 has a negative word id (-3)"});
  ImdbArrays mismatch;
  mismatch.y_train = numeric_npy({1, 0});
  expect_error(mismatch, {"imdb.npz: x_train has 3 samples but y_train has 2"});
  ImdbArrays missing;
  missing.with_y_test = false;
  expect_error(missing, {"imdb.npz: missing array 'y_test'"});
  ImdbArrays ints_as_x;
  ints_as_x.x_train = {int_of(1), int_of(2), int_of(3)};
  expect_error(ints_as_x, {"imdb.npz: x_train: its elements are ints"});
  ImdbArrays float_labels;
  float_labels.y_test = make_npy(header_dict("<f8", "(2,)"), numeric_payload({0, 0}, 8));
  expect_error(float_labels, {"imdb.npz: y_test.npy: unsupported dtype '<f8'"});

  options.input = write_imdb(dir, {});
  options.vocab = 2;
  expect_user_error([&] { prepare_imdb_npz(options); }, {"--vocab must be at least 3"});
  options.vocab = 100;
  options.seed = uint64_t{1} << 32;
  expect_user_error([&] { prepare_imdb_npz(options); }, {"--seed must be at most 4294967295"});
}

}  // namespace
}  // namespace ddp::io
