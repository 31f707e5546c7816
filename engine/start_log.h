// What a run says before its first step: every rank's line (host, device, binding, training rows), the
// backend, the data and the model, and whether it starts, resumes or has nothing left to train; and the
// training rows' class balance. The trainer gathers the facts; these functions only word and print them.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "comm/host_group.h"
#include "io/data_plan.h"
#include "io/dataset.h"

namespace ddp::engine {

// One rank's line: "rank 1/2 on node3 (local rank 1/2): cuda:1 NVIDIA H100 (PCI ...), ... [why], train rows
// [a, b)".
struct RankStartFacts {
  int rank = 0, ranks = 1, local_rank = 0, local_ranks = 1;
  std::string host;
  std::string device;  // with the GPU's name and bus id, the LSTM kernels and the self-check's summary
  std::string device_reason;
  io::Shard train_rows;
};
std::string rank_start_line(const RankStartFacts& facts);

// The run's start log as rank 0 prints it: the backend, every rank's line (`rank_lines`, in rank order), the
// data, the model, and where the run starts.
struct RunStartFacts {
  std::string backend_reason;
  std::string data_path;
  int vocab_size = 0;
  int maxlen = 0;
  std::string data_plan;  // io::DataPlan::describe()
  int embedding_dim = 0, layers = 0, hidden = 0;
  std::string rnn = "LSTM";  // "GRU", "bidirectional LSTM", ...
  std::string model_extras;  // ", masked, dropout 0.2, 3 classes": what differs from the Keras model
  std::size_t parameters = 0;
  std::string optimizer;
  double learning_rate = 0;
  int batch_size = 0;
  int trainers = 1;
  std::string trainers_name;  // "ranks", "workers", "rank"
  int64_t steps_per_epoch = 0;
  // Where the run starts.
  enum class Start { kFresh, kResumed, kAlreadyFinished } start = Start::kFresh;
  std::string run_id;
  std::string run_dir;
  std::string checkpoint;  // last.h5 when resumed
  int64_t epochs_done = 0;
  int64_t steps_done = 0;  // in the unfinished epoch
  int epochs = 0;          // train.epochs
};
std::vector<std::string> start_log_lines(const RunStartFacts& facts,
                                         const std::vector<std::string>& rank_lines);

// True when a shard's classes (`shard`, rows per class) differ from the whole training rows' (`all`) in some
// class by more than 5 points and by more than a random draw of the shard's rows would (4 standard errors of
// a share over that many rows): the mark of a file whose rows follow their labels, not of a small shard.
bool shard_classes_skewed(std::span<const int64_t> shard, std::span<const double> all);

// Collective over `trainers` (the training ranks): the training rows' classes summed over the ranks, on rank
// 0's stdout, with a note naming each rank whose shard is skewed (shard_classes_skewed).
void log_class_balance(comm::HostGroup& trainers, const io::DatasetInfo& data, const io::Shard& train_rows);

}  // namespace ddp::engine
