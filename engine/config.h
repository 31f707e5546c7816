// The run's configuration: an INI file (--config) with sections [data] [model] [train] [comm] [checkpoint]
// [log], and every key also on the command line as --section.key value. The command line wins over the file,
// the file over the defaults. Unknown keys and bad values are UserErrors naming the key (and the file).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/param_layout.h"
#include "models/replica.h"

namespace ddp::engine {

struct Config {
  std::string config_file;      // --config, may be empty
  std::string device = "auto";  // cpu | cuda | auto
  std::string resume = "no";    // no | last | auto  (--resume alone means last)

  struct Data {
    std::string path;
    int prefetch = 4;
    bool validate = true;
    std::string validation = "auto";  // auto | val | split | test: which rows the epochs are judged on
    double validation_split = 0.1;    // split (and auto without /val): the last fraction of /train
  } data;

  struct Model {
    int embedding_dim = 128;
    int hidden = 128;
    int layers = 1;
    std::string cell = "lstm";   // lstm | gru
    bool bidirectional = false;  // both directions' last states into the dense layer (needs mask_padding)
    bool mask_padding = false;   // leading padding tokens leave the state unchanged
    double dropout = 0;          // between stacked layers, training only
    double embedding_dropout = 0;
    std::string cudnn_rnn_algo = "auto";  // auto | standard | persist_small_h | persist_static (GPU only)
    std::string cpu_kernels = "auto";     // auto | builtin | onednn | onednn_gemm | packed (CPU RNN)
    std::string precision = "fp32";       // fp32 | tf32 | bf16 | fp16: a GPU's recurrent math (CPUs: float32)
  } model;

  struct Train {
    int batch_size = 32;  // per rank
    int epochs = 15;
    double learning_rate = 0.001;
    std::string optimizer = "adam";          // adam | sgd
    double momentum = 0.0;                   // sgd only
    std::string embedding_update = "dense";  // dense (Keras) | lazy (only rows in the batch)
    double beta1 = 0.9;
    double beta2 = 0.999;
    double epsilon = 1e-7;
    uint64_t seed = 1;
    int threads = 0;                  // compute threads per rank; 0: the node's cores / the node's ranks
    int64_t max_steps_per_epoch = 0;  // 0: the whole shard
    int64_t stop_after_steps = 0;     // stop (with last.h5 written) after this many steps in all; 0: never
    double straggle_ms = 0;           // testing: the last worker sleeps this long after each step
    std::string lr_schedule = "constant";  // constant | step | cosine
    int64_t warmup_steps = 0;              // linear warm-up of the learning rate
    int64_t lr_decay_steps = 0;            // step: decay every this many steps
    double lr_decay_rate = 0.1;            // step: by this factor
    double weight_decay = 0;               // decoupled (AdamW)
    double clip_norm = 0;                  // clip the averaged gradient's global norm; 0: never
    std::string cuda_graph = "auto";       // auto | off: a GPU rank's step replayed from a CUDA graph
    int early_stopping_patience = 0;       // epochs without a better val_loss before stopping; 0: never
  } train;

  struct Comm {
    std::string backend = "auto";      // auto | mpi | nccl | ps
    bool sparse_embedding = true;      // exchange only the embedding rows some rank touched
    std::string compression = "none";  // gradients on the wire: none | fp16 (NCCL) | bf16
    std::string overlap = "none";      // none | delayed: step k's averaged gradient applied at step k + 1
    std::string hierarchy = "off";     // mpi, colocated ps across nodes: off | auto
    int ps_servers =
        0;  // ps: the last K ranks serve; 0: every rank trains and serves (colocated) where it can
    std::string ps_mode = "sync";  // ps: sync | async
    int max_staleness = 4;         // ps async: how many pushes a worker may run ahead of the slowest
    double timeout_s = 120;        // ps: the longest silence accepted from a rank before the job ends
    bool selfcheck = true;         // GPU ranks check their replica (and NCCL) before the first step
  } comm;

  struct Checkpoint {
    std::string dir = "runs/latest";
    int64_t every_steps = 0;         // also write last.h5 every N steps (0: at the end of each epoch only)
    bool overwrite = false;          // a new run may replace another run's files in dir
    bool allow_data_change = false;  // --resume may continue on data other than the checkpoint's
  } checkpoint;

  struct Log {
    std::string progress = "auto";  // auto (bar on a terminal) | bar | lines
    int64_t interval = 0;           // steps between plain progress lines (0: about every 10 s)
    std::string
        timeline;  // Chrome trace file (engine/base/timeline.h), relative to checkpoint.dir; empty: off
  } log;

  // The effective configuration as an INI text that --config can read back.
  std::string to_ini() const;
};

// The settings every rank of a job must share, as "key = value" lines in the order of --help: every key but
// those a node may set for itself (device, data.path and data.prefetch, data.validate, model.cpu_kernels,
// model.cudnn_rnn_algo, train.threads, train.cuda_graph, train.straggle_ms, comm.timeout_s) and those rank 0
// alone acts on (checkpoint.dir, checkpoint.overwrite, checkpoint.allow_data_change, log.progress,
// log.interval). Keys that decide whether a rank takes part in a collective (comm.selfcheck: the NCCL average
// check; log.timeline: the timeline's barrier and gather) are job-wide.
std::vector<std::string> job_wide_settings(const Config& c);

// What the command line asked for.
enum class ConfigAction { kRun, kHelp, kVersion };

struct ParsedConfig {
  ConfigAction action = ConfigAction::kRun;
  Config config;
  std::string help;  // the option list with defaults, for --help
};

// Parses argv (without the program name and subcommand). Throws UserError.
ParsedConfig parse_config(const std::vector<std::string>& args);

// Every config key as the command line spells it ("device", "data.path", ...), in the order of --help.
std::vector<std::string> config_key_names();

// The reference of every key (type, default, allowed values, meaning) as Markdown tables, one per section,
// from the key table itself: `ddptrain config-reference` prints it, and launch/CONFIG.md holds it from the
// line kConfigReferenceMarker to its end, below a hand-written introduction (tests/cli/config_reference.sh
// fails when the two differ).
inline constexpr const char* kConfigReferenceMarker =
    "<!-- Generated by `ddptrain config-reference` from engine/config.cpp's key table: edit the code, not "
    "this. -->";
std::string config_reference_markdown();

// The settings of the training's arithmetic (dropout, the optimizer's and the schedule's keys, clipping,
// early stopping, gradient compression, the parameter server's mode) that differ between the effective
// config `earlier_ini` of an earlier run (Config::to_ini(), as a checkpoint keeps it) and `now`, as
// "train.learning_rate = 0.1 (was 0.001)", in the order of --help.
std::vector<std::string> changed_training_settings(const std::string& earlier_ini, const Config& now);

// The model the config names, for a dataset of `vocab_size` tokens and `classes` classes, and what it does
// beside its parameters (masking, dropout).
models::ModelShape model_shape(const Config& c, int vocab_size, int classes);
// Throws UserError naming the model's keys when `shape` (with the data's vocabulary) has more parameters than
// a rank can hold.
void require_model_fits(const Config& c, const models::ModelShape& shape, int ranks_on_node);
models::ModelOptions model_options(const Config& c);

}  // namespace ddp::engine
