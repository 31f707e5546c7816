// Which rows of a dataset file a training rank reads, and for what: its shard of the training rows, its
// share of the held-out rows that judge each epoch (and choose best.h5), and its share of the test rows,
// scored once at the end. The same on every run with the same file and settings; the held-out rows do not
// depend on the rank count.
//
// The held-out rows (`validation`):
//   val    the file's /val group (`ddptrain prepare --val-fraction`)
//   split  the last round(fraction x N) rows of /train, as Keras's validation_split takes the last samples;
//          `ddptrain prepare` writes rows in a seeded random order, so they are a random sample
//   test   /test itself, as Keras's imdb_lstm example validates; then there is no separate test score
//   auto   val when the file has /val, else split
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "io/dataset.h"

namespace ddp::io {

// Some rows of one group of the file.
struct RowSet {
  std::string name;   // what metrics call them: "val" or "test"
  std::string split;  // the group they are read from: "train", "val" or "test"
  int64_t first = 0;  // the first row of the group that belongs to the set
  int64_t total = 0;  // rows in the set, over all ranks
  Shard shard;        // this rank's rows, in the group's numbering (every row read by exactly one rank)
};

struct DataPlan {
  int64_t train_rows = 0;  // rows of /train that are trained on (all ranks)
  Shard train;             // this rank's training rows (floor(train_rows / world) each)
  RowSet validation;
  std::optional<RowSet> test;  // absent when validation is the test split, or /test has no rows
  bool passed_over_empty_val =
      false;                     // data.validation = auto held out /train rows: the file's /val is empty
  std::string describe() const;  // "train 22500, val 2500 (last 10% of /train), test 25000"
  // What the plan lacks or passed over: ", no test score (/test has no rows)" where the run ends without one
  // for want of test rows, ", /val is empty (...)" where auto validates on /train's rows for want of /val
  // rows; else "". Apart from describe(), whose text checkpoints keep and a resume compares.
  std::string notes() const;
};

// Throws UserError naming data.validation or data.validation_split (and the file) when the file cannot give
// what is asked: no /val for val, no held-out row left, no training row left.
DataPlan plan_data(const DatasetInfo& info, const std::string& validation, double validation_fraction,
                   int rank, int world);

}  // namespace ddp::io
