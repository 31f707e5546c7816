// Writes a dataset file in the schema of dataset.h. Every preparer (synthetic, imdb-npz, text) goes through
// it, so the files they make differ only in their contents.
//
// The file is written atomically: everything goes to PATH.tmp, and commit() renames it over PATH, so a
// reader never sees half a file and a failed prepare leaves the old file in place. Destroyed without
// commit(), the writer removes the temporary file.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "io/hdf5_util.h"

namespace ddp::io {

class DatasetWriter {
 public:
  // Creates PATH.tmp (and PATH's directory) with /train and /test sized for the given rows. Throws UserError
  // when the file cannot be created (permissions, a full disk).
  DatasetWriter(std::string path, int vocab_size, int maxlen, int64_t train_rows, int64_t test_rows);
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;
  ~DatasetWriter();

  // Rows [first, first + labels.size()) of `split` ("train" or "test"): tokens row-major [rows, maxlen].
  void write_rows(const std::string& split, int64_t first, std::span<const int32_t> tokens,
                  std::span<const uint8_t> labels);
  // /vocab: words[i] is the word of token id i (ids 0..2 are "<pad>", "<start>", "<oov>").
  void write_vocab(const std::vector<std::string>& words);
  // A string attribute on the root group, e.g. where the data came from.
  void write_attribute(const std::string& name, const std::string& value);
  // Flushes and moves the file into place.
  void commit();

 private:
  std::string path_;
  std::string tmp_path_;
  int maxlen_ = 0;
  Hid file_;
  Hid train_x_, train_y_, test_x_, test_y_;
  bool committed_ = false;
};

}  // namespace ddp::io
