#include "engine/start_log.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>

namespace ddp::engine {
namespace {

// " and 12 steps of the next": the part of an epoch a run lowered below its epochs had trained.
std::string steps_of_the_next(int64_t steps) {
  return steps > 0 ? fmt::format(" and {} step{} of the next", steps, steps == 1 ? "" : "s") : "";
}

}  // namespace

std::string rank_start_line(const RankStartFacts& f) {
  return fmt::format("rank {}/{} on {} (local rank {}/{}): {} [{}], train rows [{}, {})", f.rank, f.ranks,
                     f.host, f.local_rank, f.local_ranks, f.device, f.device_reason, f.train_rows.begin,
                     f.train_rows.end);
}

std::vector<std::string> start_log_lines(const RunStartFacts& f, const std::vector<std::string>& rank_lines) {
  std::vector<std::string> lines{fmt::format("backend {}", f.backend_reason)};
  lines.insert(lines.end(), rank_lines.begin(), rank_lines.end());
  lines.insert(
      lines.end(),
      {fmt::format("data {}: vocab {}, maxlen {}; {}", f.data_path, f.vocab_size, f.maxlen, f.data_plan),
       fmt::format(
           "model: embedding {}, {} {} x {}{}, {} parameters; {} lr {}; batch {} per rank x {} {}; {} step{} "
           "per epoch",
           f.embedding_dim, f.rnn, f.layers, f.hidden, f.model_extras, f.parameters, f.optimizer,
           f.learning_rate, f.batch_size, f.trainers, f.trainers_name, f.steps_per_epoch,
           f.steps_per_epoch == 1 ? "" : "s")});
  switch (f.start) {
    case RunStartFacts::Start::kAlreadyFinished:
      // train.epochs lowered below what the run trained: it has more than its epochs, perhaps part of one.
      lines.push_back(
          fmt::format("{}: run {} already {} {} epochs{} (train.epochs = {}): nothing to train; "
                      "raise train.epochs to train further",
                      f.checkpoint, f.run_id, f.epochs_done == f.epochs ? "finished its" : "trained",
                      f.epochs_done, steps_of_the_next(f.steps_done), f.epochs));
      break;
    case RunStartFacts::Start::kResumed:
      lines.push_back(fmt::format("resumed from {} (run {}): {} epoch{} and {} step{} done", f.checkpoint,
                                  f.run_id, f.epochs_done, f.epochs_done == 1 ? "" : "s", f.steps_done,
                                  f.steps_done == 1 ? "" : "s"));
      break;
    case RunStartFacts::Start::kFresh:
      lines.push_back(fmt::format("run {} in {}", f.run_id, f.run_dir));
      break;
  }
  return lines;
}

bool shard_classes_skewed(std::span<const int64_t> shard, std::span<const double> all) {
  constexpr double kPoints = 0.05;
  constexpr double kStandardErrors = 4;
  const double rows = static_cast<double>(std::accumulate(shard.begin(), shard.end(), int64_t{0}));
  const double total = std::accumulate(all.begin(), all.end(), 0.0);
  if (rows <= 0 || total <= 0) return false;
  for (std::size_t label = 0; label < shard.size() && label < all.size(); ++label) {
    const double share = all[label] / total;
    const double chance = kStandardErrors * std::sqrt(share * (1 - share) / rows);
    if (std::abs(static_cast<double>(shard[label]) / rows - share) > std::max(kPoints, chance)) return true;
  }
  return false;
}

void log_class_balance(comm::HostGroup& trainers, const io::DatasetInfo& data, const io::Shard& train_rows) {
  std::vector<int64_t> mine = io::label_counts(data, "train", train_rows.begin, train_rows.end);
  std::vector<double> all(256, 0.0);  // labels are uint8
  for (std::size_t label = 0; label < mine.size() && label < all.size(); ++label)
    all[label] = static_cast<double>(mine[label]);
  trainers.sum(all);
  const std::string line = shard_classes_skewed(mine, all)
                               ? fmt::format("rank {}'s shard: {}", trainers.rank(),
                                             io::class_balance_text(mine, data.class_names))
                               : "";
  const std::vector<std::string> lines = trainers.gather(line, 0);
  if (trainers.rank() != 0) return;
  // Every class of the model, those without a training row too.
  std::size_t labels = static_cast<std::size_t>(std::max(2, data.num_classes));
  for (std::size_t label = 0; label < all.size(); ++label) {
    if (all[label] > 0) labels = std::max(labels, label + 1);
  }
  const std::vector<int64_t> counts(all.begin(), all.begin() + static_cast<std::ptrdiff_t>(labels));
  std::fputs(
      fmt::format("classes of the training rows: {}\n", io::class_balance_text(counts, data.class_names))
          .c_str(),
      stdout);
  std::vector<std::string> unseen;
  for (std::size_t label = 0; label < labels; ++label) {
    if (counts[label] == 0) unseen.push_back(one_line(io::class_name(data, static_cast<int>(label))));
  }
  if (!unseen.empty()) {
    std::fputs(
        fmt::format("warning: no training row has class {} (of the data's {} classes): the model cannot "
                    "learn to predict {}\n",
                    fmt::join(unseen, ", "), labels, unseen.size() == 1 ? "it" : "them")
            .c_str(),
        stdout);
  }
  int differing = 0;
  for (const std::string& l : lines) {
    if (l.empty()) continue;
    if (differing++ == 0)
      std::fputs(
          "note: some shards' classes differ from the training rows' by more than 5 points, more than random "
          "rows would (a file in label order? `ddptrain prepare` writes rows in random order):\n",
          stdout);
    std::fputs(fmt::format("  {}\n", l).c_str(), stdout);
  }
  std::fflush(stdout);
}

}  // namespace ddp::engine
