// Writes a dataset file in the schema of dataset.h. Every preparer (synthetic, imdb-npz, text) goes through
// it, so the files they make differ only in their contents.
//
// Validation rows: constructed with val_rows > 0, the writer puts the last val_rows of the training rows into
// /val instead of /train. A preparer writes its training rows in its (random) order as rows
// [0, training_rows) of "train", and the writer routes each row, so every kind carves /val the same way.
//
// The file is written atomically: everything goes to PATH.tmp, and commit() renames it over PATH, so a
// reader never sees half a file and a failed prepare leaves the old file in place. Destroyed without
// commit(), the writer removes the temporary file.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "io/hdf5_util.h"

namespace ddp::io {

// The temporary file a DatasetWriter is filling ("" when none), for a signal handler to remove before the
// process dies (a killed `prepare` would otherwise leave PATH.tmp, gigabytes of it, behind). Reading it is
// async-signal-safe: a fixed buffer, set before the file is created and cleared once it is renamed or
// removed.
const char* dataset_file_in_progress();

// The finished file replaces what `path` names, so that may be an earlier dataset only (commit() says so on
// stdout once it has), never a checkpoint, a metrics file or a user's notes: throws UserError naming
// `command` for a file that is no dataset. Called before a preparer's long work; other kinds of node are the
// writer's to refuse.
void check_output_replaceable(const std::string& path, const std::string& command);

class DatasetWriter {
 public:
  // Creates PATH.tmp (and PATH's directory) with /train [training_rows - val_rows], /test [test_rows] and,
  // when val_rows > 0, /val [val_rows]. Throws UserError when the file cannot be created (permissions, a
  // full disk).
  DatasetWriter(std::string path, int vocab_size, int maxlen, int64_t training_rows, int64_t test_rows,
                int64_t val_rows = 0);
  DatasetWriter(const DatasetWriter&) = delete;
  DatasetWriter& operator=(const DatasetWriter&) = delete;
  ~DatasetWriter();

  // Rows [first, first + labels.size()) of `split` ("train" or "test"): tokens row-major [rows, maxlen].
  // Training rows from training_rows - val_rows on go to /val (row first + i to /val[first + i - that]).
  void write_rows(const std::string& split, int64_t first, std::span<const int32_t> tokens,
                  std::span<const uint8_t> labels);
  // /vocab: words[i] is the word of token id i (ids 0..2 are "<pad>", "<start>", "<oov>").
  void write_vocab(const std::vector<std::string>& words);
  // More than two classes: the num_classes attribute and, if `names` is not empty, /classes (one name per
  // class). Two classes write nothing, as the files of before.
  void write_classes(int num_classes, const std::vector<std::string>& names);
  // A string attribute on the root group, e.g. where the data came from.
  void write_attribute(const std::string& name, const std::string& value);
  // Flushes and moves the file into place.
  void commit();

 private:
  // Runs `write`, an HDF5 failure (a full disk, a file-size limit) becoming a UserError naming the file,
  // which is then abandoned.
  template <typename Write>
  void writing(Write&& write);
  // Closes the unfinished file without warnings (whatever failed was reported) and removes it.
  void abandon();
  // Clears dataset_file_in_progress() if this writer set it.
  void release_progress_slot();
  std::string path_;
  std::string tmp_path_;
  void write_group_rows(const std::string& group, int64_t first, const int32_t* tokens, const uint8_t* labels,
                        int64_t rows);

  int maxlen_ = 0;
  int64_t train_rows_ = 0;  // rows of /train: the training rows before the first that goes to /val
  Hid file_;
  Hid train_x_, train_y_, test_x_, test_y_, val_x_, val_y_;
  bool committed_ = false;
  bool holds_progress_slot_ = false;
};

// Checks --val-fraction before any work: F in [0, 1). Throws UserError "COMMAND: --val-fraction ...".
void check_val_fraction(const std::string& command, double val_fraction);
// The rows of a split of `training_rows` that go to /val: round(val_fraction * training_rows). Throws
// UserError naming --val-fraction when that leaves /train empty, or gives no /val row for F > 0.
int64_t val_rows_of(const std::string& command, double val_fraction, int64_t training_rows);

}  // namespace ddp::io
