#include "engine/training_setup.h"

#include <filesystem>

#include "engine/base/errors.h"

namespace ddp::engine {

std::string TrainingRanks::name() const {
  return std::string(job_size == comm.size() ? "rank" : "worker") + (comm.size() == 1 ? "" : "s");
}

void TrainingRanks::wait_for_root_files(const std::string& what, std::size_t bytes) const {
  if (is_root()) return;
  watchdog.enter("waiting for rank 0 " + what);
  expect_file_work(watchdog, "rank 0 " + what, bytes);
}

void TrainingRanks::on_root_or_abort(const RunFiles& files, const std::function<void()>& work,
                                     std::size_t bytes) const {
  if (!is_root()) return;
  watchdog.enter("writing to checkpoint.dir " + files.dir.string());
  expect_file_work(watchdog, "its files", bytes);
  try {
    work();
  } catch (const UserError& e) {
    if (job_size == 1) throw;
    end_job_with_user_error(e.what());
  } catch (const std::filesystem::filesystem_error& e) {
    if (job_size == 1) throw UserError(e.what());
    end_job_with_user_error(e.what());
  }
  enter_training();
}

}  // namespace ddp::engine
