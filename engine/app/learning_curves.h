// Learning curves a person can look at: the run directory's metrics.jsonl drawn as an SVG (one file, no
// scripts, opens in any browser) with two panels, loss and accuracy, each with the training curve (solid)
// and the validation curve (dashed) over the epochs. The trainer redraws it after every epoch.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::engine {

// One epoch's numbers; NaN where the line lacks a value (or training diverged).
struct EpochCurvePoint {
  int64_t epoch = 0;
  double loss = 0;
  double acc = 0;
  double val_loss = 0;
  double val_acc = 0;
};

// The epochs of a metrics.jsonl in increasing order. A resumed run may write an epoch twice: its resume line
// ({"event": "resume", "epochs_done": N}) drops the run's epochs after N written before it, and the last
// line for an epoch wins. Only the last run's lines count (by "run_id"; a line of another run starts afresh).
// Held-out numbers are val_loss/val_acc, or test_loss/test_acc in a run validated on its test split; a
// value written as null for a diverged run (engine/base/json.h) reads as NaN or infinity. Lines that are
// not a JSON object with an integer "epoch" (a half-written last line, the test line) are skipped. Throws
// UserError naming the file when it cannot be read.
std::vector<EpochCurvePoint> read_learning_curves(const std::string& metrics_jsonl);

// Axis ticks for [lo, hi] (lo < hi): 4 to 6 "nice" values (1, 2, 5, 2.5 ... times a power of ten) inside
// the range, fewer only when `integers` leaves no choice (a range of 2 epochs has 3 integer ticks at most).
std::vector<double> nice_ticks(double lo, double hi, bool integers);

// Draws `metrics_jsonl` into `svg_path`, written to svg_path + ".tmp" and renamed over it, so that a browser
// never sees half a file. The title names the run directory (the directory of metrics_jsonl). Throws
// UserError naming the file that cannot be read or written.
void write_learning_curves(const std::string& metrics_jsonl, const std::string& svg_path);

}  // namespace ddp::engine
