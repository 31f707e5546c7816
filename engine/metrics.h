// What a run reports: the per-epoch line on rank 0's stdout (Keras-like), metrics.jsonl in the run
// directory, and the progress shown during an epoch (a live bar on a terminal, plain lines otherwise).
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ddp::engine {

struct EpochMetrics {
  std::string run_id;  // run_directory.h
  std::string time;    // UTC, ISO 8601, when the epoch ended
  int64_t epoch = 0;   // 1-based
  int64_t epochs = 0;
  int64_t steps = 0;
  int64_t steps_run = 0;  // fewer than steps when the epoch was resumed in the middle
  // What val_loss and val_acc were measured on: "val" (held-out rows: /val or part of /train), or "test"
  // when data.validation = test (then they are named test_loss and test_acc).
  std::string held_out = "val";
  double loss = 0;
  double acc = 0;
  double val_loss = 0;
  double val_acc = 0;
  double val_macro_f1 = -1;  // more than two classes: the held-out rows' macro-F1; -1 when not counted
  double epoch_time_s = 0;   // training and evaluation
  double train_time_s = 0;
  double eval_time_s = 0;
  double step_time_ms = 0;   // training time / steps
  double samples_per_s = 0;  // training samples of all ranks per second
  double data_wait_s = 0;    // rank 0's time blocked on its prefetcher
  // The process's first epoch: from the process's start (its exec) to the start of its first step, on rank
  // 0 (MPI, the data, the model, the self-check, a resume: everything before training); -1 otherwise.
  double start_to_first_step_s = -1;
  int world_size = 1;  // ranks of the job
  int workers = 1;     // ranks that train: all of them, or the parameter server's workers
  std::string backend;
  std::string device;
  // GPU ranks through NVML (engine/gpu_monitor.h), averaged over the ranks that report; -1 when none does.
  double gpu_util = -1;     // mean utilization over the epoch, %
  double gpu_mem_mib = -1;  // peak memory used during the epoch
  // model.precision = fp16 on GPU ranks: the loss scale at the epoch's end and the steps skipped so far for
  // a gradient that overflowed (models/loss_scale.h), the same on every such rank; -1 elsewhere.
  double loss_scale = -1;
  int64_t skipped_steps = -1;
  // parameters_checksum() of the parameters at the epoch's end, the same on every training rank (checked).
  std::string parameters_checksum;
};

// 16 hex digits of FNV-1a over the parameters' bytes: equal parameters, equal checksums, whatever machine.
std::string parameters_checksum(std::span<const float> params);
// The first rank whose checksum differs from rank 0's (the first entry), if any.
std::optional<std::size_t> first_other_checksum(const std::vector<std::string>& checksums);

// "Epoch 3/15 - 782 steps - 18.2s - 0.73ms/step - loss: 0.2127 - acc: 0.9186 - val_loss: ... - val_acc: ..."
std::string format_epoch_line(const EpochMetrics& m);
// One JSON object on one line.
std::string to_json(const EpochMetrics& m);

// The test split's score at the end of a run, of the model in best.h5.
struct TestMetrics {
  std::string run_id;
  std::string time;
  int64_t best_epoch = 0;  // the epoch best.h5 holds
  double test_loss = 0;
  double test_acc = 0;
  double test_macro_f1 = -1;  // as EpochMetrics::val_macro_f1
  int64_t samples = 0;
};
// "Test (best.h5, epoch 4): test_loss: 0.3571 - test_acc: 0.8468 (25000 samples)"
std::string format_test_line(const TestMetrics& m);
// One JSON object on one line, with "event": "test" (and no "epoch", so curves skip it).
std::string to_json(const TestMetrics& m);
// A resumed run's first line: the epochs and steps its checkpoint holds. Lines of the run for later epochs
// before it were written by a job stopped before their checkpoint landed; those epochs are trained again.
struct ResumeEvent {
  std::string run_id;
  std::string time;
  int64_t epochs_done = 0;
  int64_t steps_done = 0;  // in the interrupted epoch
};
// One JSON object on one line, with "event": "resume" (and no "epoch", so curves read it as an event).
std::string to_json(const ResumeEvent& e);
// Appends `line` and a newline to `path`, creating it if needed. Throws UserError if it cannot.
void append_line(const std::string& path, const std::string& line);
// Whether the metrics.jsonl at `path` holds the test line (event "test") of run `run_id`: a run stopped while
// scoring its test split has none, and its resume scores it. Lines that do not parse are passed over.
bool holds_test_score(const std::string& path, const std::string& run_id);
// The first run id of a line of metrics.jsonl at `path` other than `run_id` ("" if none, or no file): a
// checkpoint of another run put in the directory would otherwise add its lines to this one's.
std::string other_run_in_metrics(const std::string& path, const std::string& run_id);

// Whether stdout reaches a person's terminal. Open MPI hands every rank a pseudo-terminal even when mpirun's
// own output goes to a file, so under Open MPI the answer comes from the launcher's stdout (the parent
// process of a rank started by mpirun on the same node); a rank started elsewhere counts as not a terminal.
bool stdout_is_terminal();

// A diverged loss is NaN, often with its sign bit set, which printf writes as "-nan": the NaN without its
// sign, written "nan" as Keras does.
double nan_unsigned(double value);

// Whether log.progress ("auto", "bar" or "lines") asks for the live line: "auto" where stdout is a terminal.
bool live_progress(const std::string& log_progress);

// Progress within an epoch. Live mode redraws one line with \r at most 10 times a second; line mode prints
// a plain line every `interval` steps, or with interval 0 about every 10 seconds.
class Progress {
 public:
  Progress(bool live, int64_t interval, int64_t epoch, int64_t epochs, int64_t total_steps);
  // Whether update() would show something at this step (so callers gather the numbers only then).
  bool due(int64_t step) const;
  // Running mean loss and accuracy of this rank's steps so far.
  void update(int64_t step, double loss, double acc);
  // Clears the live line before the epoch line is printed.
  void finish();

 private:
  bool live_;
  int64_t interval_;
  int64_t epoch_;
  int64_t epochs_;
  int64_t total_;
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_;
  bool drawn_ = false;
};

}  // namespace ddp::engine
