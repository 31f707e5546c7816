#include "io/data_plan.h"

#include <fmt/format.h>
#include <cmath>
#include <cstdio>

#include "engine/base/errors.h"

namespace ddp::io {
namespace {

RowSet rows_of(std::string name, std::string split, int64_t first, int64_t total, int rank, int world) {
  RowSet set{std::move(name), std::move(split), first, total,
             shard_of(total, rank, world, /*cover_all=*/true)};
  set.shard.begin += first;
  set.shard.end += first;
  return set;
}

}  // namespace

DataPlan plan_data(const DatasetInfo& info, const std::string& validation, double validation_fraction,
                   int rank, int world) {
  if (info.train_size == 0) throw UserError(info.path + ": /train has no rows to train on");
  std::string mode = validation;
  if (mode == "auto") mode = info.val_size > 0 ? "val" : "split";
  DataPlan plan;
  plan.train_rows = info.train_size;
  plan.passed_over_empty_val = validation == "auto" && info.has_val && info.val_size == 0;
  if (mode == "val") {
    if (info.val_size == 0) {
      throw UserError("data.validation = val: " + info.path +
                      (info.has_val ? ": /val has no rows" : " has no /val") +
                      " (make one with `ddptrain prepare ... --val-fraction F`, or set "
                      "data.validation = split)");
    }
    plan.validation = rows_of("val", "val", 0, info.val_size, rank, world);
  } else if (mode == "split") {
    const auto held_out =
        static_cast<int64_t>(std::llround(validation_fraction * static_cast<double>(info.train_size)));
    if (held_out < 1 || held_out >= info.train_size) {
      throw UserError("data.validation_split = " + fmt::format("{}", validation_fraction) + ": holds out " +
                      std::to_string(held_out) + " of the " + std::to_string(info.train_size) + " rows of " +
                      info.path + " /train; at least one row must be held out and one left to train on");
    }
    plan.train_rows = info.train_size - held_out;
    plan.validation = rows_of("val", "train", plan.train_rows, held_out, rank, world);
  } else if (mode == "test") {
    plan.validation = rows_of("test", "test", 0, info.test_size, rank, world);
  } else {
    throw UserError("data.validation = " + validation + ": expected auto, val, split or test");
  }
  if (plan.validation.total == 0) {
    throw UserError(info.path + ": /" + plan.validation.split + " is empty: no rows to validate on");
  }
  if (mode != "test" && info.test_size > 0)
    plan.test = rows_of("test", "test", 0, info.test_size, rank, world);
  plan.train = shard_of(plan.train_rows, rank, world, /*cover_all=*/false);
  return plan;
}

std::string DataPlan::describe() const {
  std::string text =
      "train " + std::to_string(train_rows) + ", " + validation.name + " " + std::to_string(validation.total);
  if (validation.split == "train") {
    text += " (the last rows of /train)";
  } else if (validation.split == "test") {
    text += " (/test: data.validation = test, no separate test score)";
  } else {
    text += " (/val)";
  }
  if (test) text += ", test " + std::to_string(test->total) + " (scored once, at the end)";
  return text;
}

std::string DataPlan::notes() const {
  std::string text = test || validation.split == "test" ? "" : ", no test score (/test has no rows)";
  if (passed_over_empty_val) text += ", /val is empty (so data.validation = auto took /train's last rows)";
  return text;
}

}  // namespace ddp::io
