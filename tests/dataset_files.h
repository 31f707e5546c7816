// Small HDF5 dataset files for the io tests, with the defects a test plants, and whole datasets read back.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "io/dataset.h"

namespace ddp::testing {

// A file of `prepare`'s layout: /train, /test and optionally /val, each with x (rows x maxlen tokens) and y.
struct FileSpec {
  int64_t train_rows = 20;
  int64_t test_rows = 8;
  int maxlen = 4;
  int64_t maxlen_attribute = -1;  // -1: same as maxlen
  int64_t vocab_size = io::kMaxVocabulary;
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

void write_file(const std::string& path, const FileSpec& spec);

// A whole dataset as int32 (HDF5 converts uint8 labels).
std::vector<int32_t> read_all(const std::string& path, const std::string& name,
                              std::vector<int64_t>* dims = nullptr);

}  // namespace ddp::testing
