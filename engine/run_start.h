// Where a run starts. Rank 0 claims the run directory (run_directory.h) and writes the effective config
// there, then reads last.h5 (a resumed run) or initializes the parameters from the seed, checking that the
// checkpoint fits the config and the data; the progress is broadcast to every training rank, so that ranks
// need not share a file system. The parameters and optimizer state travel afterwards, with the updater's
// distribute_start().
#pragma once

#include <atomic>
#include <cstdint>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/host_group.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/optimizer/optimizer.h"
#include "engine/run_directory.h"
#include "engine/watchdog.h"
#include "io/data_plan.h"
#include "io/dataset.h"
#include "models/param_layout.h"

namespace ddp::engine {

struct RunStart {
  bool resumed = false;   // continues last.h5
  bool finished = false;  // resumed with every epoch of train.epochs already trained
  // Epochs and steps done, the seed of the data order; for the next checkpoint: the training ranks and
  // the batch size of this run. The running sums of an interrupted epoch are rank 0's alone (they are
  // global), so that the next sum over the ranks adds them once.
  TrainingProgress progress;
  RunRecord record;  // rank 0: what the checkpoints record about the run and its data
  // Rank 0: the effective configuration, as config.ini and the checkpoints hold it: a resumed run's
  // train.seed is the checkpoint's, since its data order continues with that seed.
  std::string config_ini;
  std::vector<float> params;  // rank 0: the starting parameters (the others': zeros, to be overwritten)
  // Rank 0 of a resumed run: the checkpoint's optimizer state (checked against the config), else none: a
  // fresh run starts from the optimizer's zero state.
  std::optional<OptimizerState> optimizer;
  // A resumed run: this rank's replica random state from the checkpoint (models::Replica::rng_state), empty
  // where it saved none or the checkpoint was written by another number of training ranks.
  std::string replica_rng_state;
  // Rank 0: the run directory's lock, to be held until the run ends.
  std::shared_ptr<RunDirectoryLock> directory_lock;
};

// A fresh run's initial parameters (models::initialize_keras from train.seed), drawn in a thread of their
// own from construction on, so that the draw runs beside the device's preparation (the GPU self-check's CPU
// side): at a large hidden size both take seconds, and a rank's start-up takes the longer of the two instead
// of their sum. Every training rank draws them, so that each beats its watchdog (proceed) while rank 0 draws
// the ones it distributes, instead of waiting for them in silence. A resumed run drops them.
class InitialParameters {
 public:
  // `parallel`: how many orthogonal matrices at once (models::initialize_keras): rank 0's draw is the one
  // distributed, the others' only keep their watchdogs told, so they take one at a time and less memory.
  InitialParameters(const models::ParamLayout& layout, uint64_t seed, ProgressWatchdog& watchdog,
                    int parallel);
  ~InitialParameters();  // drops the draw and waits for its thread
  InitialParameters(const InitialParameters&) = delete;
  InitialParameters& operator=(const InitialParameters&) = delete;

  // Waits for the parameters (rethrowing the draw's failure); once. The other ranks draw the same ones, about
  // as long, and the collective that follows waits for the slowest: take() allows the watchdog twice this
  // rank's draw of silence for it (rank 0's draw, with more matrices at once, or any rank's on a busier core,
  // may end seconds after this one's), so that known work is not called a hang.
  std::vector<float> take();
  // How long this rank's draw took, once take() has returned.
  double draw_seconds() const { return draw_seconds_; }
  // Ends the draw at its next block of work; take() then throws.
  void drop();

 private:
  struct Dropped {};
  const std::size_t size_;
  ProgressWatchdog& watchdog_;
  double draw_seconds_ = 0;  // written by the draw's thread before its result
  std::atomic<bool> dropped_{false};
  std::future<std::vector<float>> draw_;
};

// Collective over the training ranks: errors agreed on there, the progress broadcast; `watchdog` is told each
// phase; `initial` gives a fresh run's parameters. Throws UserError, the same on every rank, when the
// directory holds another run's results, the checkpoint was trained on other data (unless
// checkpoint.allow_data_change) or for another model or optimizer.
RunStart start_run(const Config& config, const RunFiles& files, const io::DatasetInfo& data,
                   const io::DataPlan& plan, const models::ParamLayout& layout,
                   const optim::OptimizerSettings& optimizer, int64_t steps_per_epoch,
                   comm::HostGroup& trainers, ProgressWatchdog& watchdog, InitialParameters& initial);

}  // namespace ddp::engine
