#include "engine/test_score.h"

#include <cstdio>
#include <span>
#include <vector>

#include "engine/checkpoint.h"
#include "engine/metrics.h"

namespace ddp::engine {

bool test_score_missing(const TrainingRanks& ranks, const RunFiles& files, const std::string& run_id) {
  std::vector<double> tested{ranks.is_root() && holds_test_score(files.metrics(), run_id) ? 1.0 : 0.0};
  ranks.comm.broadcast(std::span<double>(tested), 0);
  return tested[0] == 0.0;
}

void score_best_on_test(const TrainingRanks& ranks, const RunFiles& files, const std::string& run_id,
                        models::Replica& replica, Evaluator& evaluator, const io::RowSet& test,
                        int64_t global_step) {
  ranks.watchdog.enter("scoring best.h5 on the test split");
  std::vector<float> params(replica.layout().total_size());
  std::vector<double> best_epoch{0.0};
  const std::size_t bytes = params.size() * sizeof(float);
  ranks.wait_for_root_files("reading best.h5", bytes);
  ranks.on_root_or_abort(
      files,
      [&] {
        const Checkpoint best = read_checkpoint(files.best(), CheckpointParts::kModel);
        params = best.params;
        best_epoch[0] = static_cast<double>(best.progress.epoch);
      },
      bytes);
  ranks.comm.broadcast(std::span<float>(params), 0);
  ranks.comm.broadcast(std::span<double>(best_epoch), 0);
  replica.copy_params_from_host(params);
  const models::BatchStats scores = evaluator.evaluate(test, global_step);
  ranks.on_root_or_abort(files, [&] {
    TestMetrics m;
    m.run_id = run_id;
    m.time = utc_timestamp();
    m.best_epoch = static_cast<int64_t>(best_epoch[0]);
    m.test_loss = scores.loss_sum / static_cast<double>(scores.count);
    m.test_acc = static_cast<double>(scores.correct) / static_cast<double>(scores.count);
    m.test_macro_f1 = macro_f1(scores, replica.layout().shape().classes);
    m.samples = scores.count;
    std::printf("%s\n", format_test_line(m).c_str());
    std::fflush(stdout);
    append_line(files.metrics(), to_json(m));
  });
}

}  // namespace ddp::engine
