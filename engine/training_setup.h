// A training run's parts as the epoch loop (trainer.h) and its helpers (start-up, the start log, the epoch's
// record, evaluation and the test score) see them: the ranks that train, and what they train.
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "comm/host_group.h"
#include "engine/config.h"
#include "engine/preemption.h"
#include "engine/run_directory.h"
#include "engine/topology.h"
#include "engine/updater.h"
#include "engine/watchdog.h"
#include "io/data_plan.h"
#include "io/dataset.h"
#include "models/replica.h"

namespace ddp::engine {

struct TrainingRanks {
  // Data shards, metrics, evaluation, errors agreed on, the start log. The training ranks are the job's
  // first ranks; the dedicated parameter servers, which only the updater talks to, come after them.
  comm::HostGroup& comm;
  int job_size;              // the training ranks and the dedicated parameter servers
  const Topology& topology;  // this rank's
  // Told each phase, beaten at every step and evaluation batch.
  ProgressWatchdog& watchdog;
  StopAgreement& stop_signal;  // over the ranks of `comm`

  bool is_root() const { return comm.rank() == 0; }
  // What the training ranks are called in messages: "rank", "ranks", "worker" or "workers".
  std::string name() const;
  // The phase the watchdog names while the ranks train (every step and evaluation batch beats it).
  void enter_training() const { watchdog.enter("training"); }

  // Rank 0 writes to the run directory (`work`; the other ranks return at once). A problem writing after
  // training started ends the job (exit 2) rather than leave the other ranks waiting in the next collective;
  // a job of one rank leaves through main() as any user error does. A write that hangs (a frozen file
  // system) ends it through the watchdog, which then names the write.
  // `bytes`: what the work reads or writes, for the time it may take (expect_file_work).
  void on_root_or_abort(const RunFiles& files, const std::function<void()>& work,
                        std::size_t bytes = 0) const;
  // The other ranks, about to wait in a collective for rank 0's file work of `bytes` (`what`: "writing
  // last.h5"): the phase, and the watchdog's patience for it.
  void wait_for_root_files(const std::string& what, std::size_t bytes) const;
};

// What the training ranks train: this rank's replica and updater on its rows of the data.
struct TrainingSetup {
  const Config& config;
  TrainingRanks ranks;
  const io::DatasetInfo& data;
  const io::DataPlan& plan;  // this rank's training, validation and test rows
  int64_t steps_per_epoch;   // of each training rank
  models::Replica& replica;
  Updater& updater;  // refers to the replica

  // Where the exchange has deadlines of its own (Updater::exchange_has_deadlines) the watchdog pauses until
  // told the next phase: the exchange then names the rank it waits for.
  void pause_watchdog_where_the_exchange_has_deadlines() const {
    if (updater.exchange_has_deadlines()) ranks.watchdog.pause();
  }
};

}  // namespace ddp::engine
