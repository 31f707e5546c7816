// Per-class precision, recall and F1, macro-F1, and the confusion matrix as text, from the confusion counts
// an evaluation gathers (models::BatchStats::confusion): for `evaluate` and for the macro-F1 of each
// epoch's held-out rows in metrics.jsonl.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ddp::engine {

struct ClassReport {
  int classes = 0;
  std::vector<double> precision, recall, f1;  // per class; 0 where a class was never predicted (precision),
                                              // never present (recall), or both are 0 (F1), as scikit-learn
  std::vector<int64_t> support;               // rows whose true class it is
  // Unweighted means over the classes that occur among the true labels or the predictions (scikit-learn's
  // default labels): a class the data never holds and the model never predicts does not count as F1 0.
  double macro_precision = 0, macro_recall = 0, macro_f1 = 0;
  double accuracy = 0;
  int64_t total = 0;
};

// `confusion` holds classes x classes counts, row the true class, column the predicted one.
ClassReport classification_report(std::span<const int64_t> confusion, int classes);

// The table of precision, recall, F1 and support per class (named by `names`, or by number where it has no
// entry) with the macro average, then the confusion matrix with true classes as rows.
std::string format_classification_report(const ClassReport& report, std::span<const int64_t> confusion,
                                         const std::vector<std::string>& names);

}  // namespace ddp::engine
