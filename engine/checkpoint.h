// Checkpoints: one HDF5 file holding everything needed to continue a run exactly.
//
//   /params                 float32 [P]  the canonical flat layout (models/param_layout.h)
//   /optimizer/<buffer>     float32 [P]  e.g. m and v for Adam; attributes name, iterations
//   root attributes         format ("ddptrain-checkpoint-1"), vocab_size, embedding_dim, hidden, layers,
//                           cell ("lstm", "gru"), bidirectional, classes, mask_padding (the four absent in
//                           checkpoints of before: an LSTM, one direction, two classes, no masking),
//                           epoch, step_in_epoch, global_step, seed, world_size, batch_size,
//                           best_val_loss, best_epoch, loss_sum, correct, count (the interrupted epoch's
//                           running sums), config (the effective INI text), run_id, data_path,
//                           data_fingerprint (io/dataset_fingerprint.h), data_plan (io/data_plan.h), maxlen;
//                           where ranks scaled the loss (fp16): loss_scale, loss_scale_clean_steps,
//                           skipped_steps (models/loss_scale.h)
//   /vocab                  optional UTF-8 strings, copied from the dataset: /vocab[i] is the word of id i,
//                           so predict needs only the checkpoint
//   /classes                optional UTF-8 strings, the dataset's class names
//   /replica_rng/<rank>     optional uint8 [n]: each training rank's replica random state that the step keys
//                           do not determine (models::Replica::rng_state, cuDNN's dropout state); the
//                           group's attribute ranks counts the ranks, and ranks without one have no dataset
//
// The data order is a pure function of (seed, epoch, step), so those attributes are the whole RNG state.
// Files are written atomically: a temporary file in the same directory, fsync, then rename over the old one,
// so a crash or preemption never leaves a half-written last.h5.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/optimizer/optimizer.h"
#include "models/loss_scale.h"
#include "models/param_layout.h"

namespace ddp::engine {

struct TrainingProgress {
  int64_t epoch = 0;          // epochs completed
  int64_t step_in_epoch = 0;  // steps done in the epoch being trained (0 at an epoch boundary)
  int64_t global_step = 0;
  uint64_t seed = 0;
  int64_t world_size = 1;
  int64_t batch_size = 0;    // per rank
  double best_val_loss = 0;  // meaningful once epoch > 0
  int64_t best_epoch = 0;    // the epoch best.h5 holds (0: none yet; checkpoints of before: their epoch)
  double loss_sum = 0;       // running sums of the interrupted epoch, over all ranks
  double correct = 0;
  double count = 0;
  // fp16's loss scaling as the ranks that scale hold it; none where no rank scaled (and in checkpoints of
  // before it was kept, whose resumed runs start from the initial scale).
  std::optional<models::LossScale::State> loss_scaling;
  // Not saved, for the logs: steps the interrupted epoch trained beyond step_in_epoch, where a lowered
  // train.max_steps_per_epoch (or a larger batch) left it fewer steps than it had had; and on rank 0 its
  // steps as the checkpoint counts them, before another batch size or number of ranks converts them.
  int64_t steps_beyond = 0;
  int64_t checkpoint_step_in_epoch = 0;
};

// Which run wrote the checkpoint, and on what data.
struct RunRecord {
  std::string run_id;
  std::string data_path;
  std::string data_fingerprint;
  std::string data_plan;                 // io::DataPlan::describe(): which rows train, validate and test
  int maxlen = 0;                        // 0 in checkpoints written before it was recorded
  std::vector<std::string> vocabulary;   // empty when the dataset had none
  std::vector<std::string> class_names;  // empty when the dataset had none
  bool mask_padding = false;             // the model ran with model.mask_padding: predict must too
  std::string tokenizer;                 // io::DatasetInfo::tokenizer of the data: "" when not recorded
};

struct Checkpoint {
  models::ModelShape shape;
  RunRecord run;  // run.vocabulary stays empty when read: read it with io::read_vocabulary(path)
  bool has_vocabulary = false;
  std::vector<float> params;
  OptimizerState optimizer;
  std::string optimizer_name;
  TrainingProgress progress;
  std::string config_ini;
  // By training rank (as many as the writing run had), empty where a rank had none; none at all when the
  // checkpoint holds no /replica_rng. Read with CheckpointParts::kAll only.
  std::vector<std::string> replica_rng_states;
};

// Writes a checkpoint in pieces, so that the optimizer's state need never be whole in memory at once: the
// constructor writes the parameters and the progress to PATH.tmp, add_optimizer_buffer() each buffer of the
// state as it comes (the colocated parameter server gathers one buffer at a time), commit() moves the file
// over PATH (flushed, then renamed: a reader sees the old checkpoint or the new one, never half of one).
// Destroyed without commit(), it removes PATH.tmp and leaves PATH alone. Throws UserError naming the file.
class CheckpointWriter {
 public:
  CheckpointWriter(const std::string& path, const models::ModelShape& shape, std::span<const float> params,
                   const std::string& optimizer_name, int64_t optimizer_iterations,
                   const TrainingProgress& progress, const std::string& config_ini,
                   const RunRecord& run = {});
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  void add_optimizer_buffer(const std::string& name, std::span<const float> values);
  // Every training rank's replica random state, in rank order; nothing is written when all are empty.
  void add_replica_rng_states(const std::vector<std::string>& states);
  void commit();

 private:
  struct Files;
  // Runs `write`, an HDF5 failure (a full disk) becoming a UserError naming the file, the file abandoned.
  template <typename Write>
  void writing(Write&& write);
  // Closes the unfinished file without warnings (whatever failed was reported) and removes it.
  void abandon();
  std::unique_ptr<Files> files_;  // null once committed
};

// The whole checkpoint at once.
// Copies the checkpoint `from` over `to` the way commit() writes one (through TO.tmp, renamed into place), so
// that a failed copy (a full disk, a file the run may not replace) leaves `to` as it was. Throws UserError.
void copy_checkpoint(const std::string& from, const std::string& to);

void write_checkpoint(const std::string& path, const models::ModelShape& shape, std::span<const float> params,
                      const std::string& optimizer_name, const OptimizerState& optimizer_state,
                      const TrainingProgress& progress, const std::string& config_ini,
                      const RunRecord& run = {});

// What to read: everything, or all but the optimizer's buffers (for a model to predict or score with; the
// name and update count are read, the buffers left empty), which are as large as the parameters again.
enum class CheckpointParts { kAll, kModel };

// Throws UserError naming the file for a missing, foreign or damaged checkpoint.
Checkpoint read_checkpoint(const std::string& path, CheckpointParts parts = CheckpointParts::kAll);

// The id of the run that wrote the checkpoint at `path` ("" for checkpoints of before run ids). Throws
// UserError as read_checkpoint() does for a file that is no checkpoint.
// What model.cpu_kernels = auto measured of the core's FMA units when the run wrote `path`
// (models/fma_rate.h); nothing where the checkpoint does not say, is absent or cannot be read.
std::optional<bool> read_checkpoint_fma_verdict(const std::string& path);
std::string read_checkpoint_run_id(const std::string& path);

}  // namespace ddp::engine
