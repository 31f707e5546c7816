#include "engine/config.h"

#include <fmt/format.h>
#include <algorithm>
#include <boost/program_options.hpp>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <set>
#include <sstream>

#include "engine/base/errors.h"
#include "engine/base/file_kind.h"
#include "engine/base/memory_limit.h"
#include "engine/command_line.h"
#include "models/cuda_replica.h"
#include "models/replica.h"

namespace po = boost::program_options;

namespace ddp::engine {
namespace {

// Bounds far past any sensible run that turn a typo (an extra zero or three) into one line naming the key,
// not an allocation that fails, or succeeds and swaps, minutes later.
constexpr int kMaxPrefetch = 1024;  // batches read ahead
constexpr int kMaxThreads = 1024;   // compute threads per rank
constexpr int kMaxWidth = 65536;    // model.embedding_dim, model.hidden
constexpr int kMaxLayers = 64;

// The allowed values of a key, as the reference (launch/CONFIG.md) lists them: an integer range, or the
// words a key takes. check_values() below enforces them: change both together.
std::string between(int low, int high) {
  return std::to_string(low) + " to " + std::to_string(high);
}

std::string one_of(const std::string& words) {
  std::string text;
  std::istringstream list(words);
  for (std::string word; std::getline(list >> std::ws, word, ',');)
    text += (text.empty() ? "`" : ", `") + word + "`";
  return text;
}

// Every config key, in one place: building the option list, --help, the effective config and the reference
// (`ddptrain config-reference`, committed as launch/CONFIG.md) all walk it. Each key names its section, its
// name, its field (whose type and initial value are the key's type and default), the values it allows and
// what it means.
template <typename C, typename Visitor>
void visit_keys(C& c, Visitor&& key) {
  key("", "device", c.device, one_of("cpu, cuda, auto"), "compute device: cpu, cuda or auto");
  key("data", "path", c.data.path, "an HDF5 file (required)",
      "HDF5 dataset (schema in io/README.md); `ddptrain prepare` makes one");
  key("data", "prefetch", c.data.prefetch, between(1, kMaxPrefetch),
      "batches each rank reads ahead on its prefetch thread");
  key("data", "validate", c.data.validate, "true, false",
      "check token ids and labels of each rank's shard before training");
  key("data", "validation", c.data.validation, one_of("auto, val, split, test"),
      "rows that judge each epoch and choose best.h5: auto (the file's /val if it has one, else split), "
      "val (the file's /val), split (the last data.validation_split of /train) or test (/test, as Keras's "
      "imdb_lstm example; then no separate test score)");
  key("data", "validation_split", c.data.validation_split, "(0, 1)",
      "with validation split (or auto and no /val): the fraction of /train held out, its last rows");
  key("model", "embedding_dim", c.model.embedding_dim, between(1, kMaxWidth), "embedding width E");
  key("model", "hidden", c.model.hidden, between(1, kMaxWidth), "recurrent hidden size H (per direction)");
  key("model", "layers", c.model.layers, between(1, kMaxLayers), "stacked recurrent layers");
  key("model", "cell", c.model.cell, one_of("lstm, gru"),
      "recurrent cell: lstm or gru (cuDNN's and PyTorch's GRU: the reset gate applied after the recurrent "
      "product)");
  key("model", "bidirectional", c.model.bidirectional, "true (needs model.mask_padding = true), false",
      "also run each layer backwards in time; the dense layer reads both directions' last states (needs "
      "model.mask_padding = true)");
  key("model", "mask_padding", c.model.mask_padding, "true, false",
      "leading padding tokens (0) leave the state unchanged, so padding does not change a prediction; false "
      "keeps Keras's imdb_lstm model, which reads them");
  key("model", "dropout", c.model.dropout, "[0, 1)",
      "dropout rate on each stacked layer's output but the top's "
      "(training only)");
  key("model", "embedding_dropout", c.model.embedding_dropout, "[0, 1)",
      "dropout rate on the embedding's output (training only)");
  key("model", "cpu_kernels", c.model.cpu_kernels,
      one_of("auto, builtin, onednn, onednn_gemm, packed") +
          " (onednn and onednn_gemm in a build with oneDNN; packed on x86-64 with AVX2 and FMA)",
      "a CPU replica's recurrent layers: builtin (its own cells over the BLAS), onednn (oneDNN's LSTM and "
      "GRU primitives, in a build with libdnnl-dev), onednn_gemm (its own cells over oneDNN's sgemm), "
      "packed (its own cells, each time step's products on its own AVX-512 or AVX2 tiles, x86-64 with AVX2 "
      "and FMA) or auto (packed where oneDNN and the tiles run, but oneDNN's primitives for one thread per "
      "rank on cores with two 512-bit FMA units; else onednn, onednn_gemm or builtin)");
  key("model", "cudnn_rnn_algo", c.model.cudnn_rnn_algo,
      one_of("auto, standard, persist_small_h, persist_static"),
      "GPU: cuDNN's LSTM algorithm: auto (persistent small-hidden kernels where cuDNN has them, else "
      "standard), standard, persist_small_h or persist_static");
  key("model", "precision", c.model.precision, one_of("fp32, tf32, bf16, fp16"),
      "GPU: the recurrent layers' arithmetic: fp32 (float32 products, the CPU replica's), tf32 (tensor cores "
      "on sm_80 and newer, inputs rounded to 10 mantissa bits, sums in float32; as PyTorch's allow_tf32), "
      "bf16 (bfloat16 data and weights in cuDNN 9.13 and newer on sm_80 and newer, float32 sums) or fp16 "
      "(IEEE half on sm_70 and newer, float32 sums, dynamic loss scaling: a step that overflows is skipped "
      "on every rank; all-reduce backends only). Parameters, gradients and the optimizer stay float32; CPU "
      "ranks compute in float32");
  key("train", "batch_size", c.train.batch_size, "1 or more",
      "samples per step on each rank (global batch = ranks x this)");
  key("train", "epochs", c.train.epochs, "1 or more", "passes over the training split");
  key("train", "learning_rate", c.train.learning_rate, "greater than 0", "optimizer step size");
  key("train", "optimizer", c.train.optimizer, one_of("adam, sgd"), "adam or sgd (with train.momentum)");
  key("train", "momentum", c.train.momentum, "[0, 1) as a float (at most 0.99999994)", "momentum of sgd");
  key("train", "embedding_update", c.train.embedding_update,
      one_of("dense, lazy") + " (lazy needs comm.sparse_embedding = true)",
      "dense (Keras: every embedding row's moments decay each step) or lazy (only the rows in the batch)");
  key("train", "beta1", c.train.beta1, "[0, 1) as a float (at most 0.99999994)", "Adam's first-moment decay");
  key("train", "beta2", c.train.beta2, "[0, 1) as a float (at most 0.99999994)",
      "Adam's second-moment decay");
  key("train", "epsilon", c.train.epsilon, "greater than 0", "Adam's epsilon (Keras's default 1e-7)");
  key("train", "seed", c.train.seed, "0 to 2^64 - 1",
      "seed of the initial parameters and of the data order, shared by all ranks");
  key("train", "threads", c.train.threads, "0 (auto) to " + std::to_string(kMaxThreads),
      "compute threads per rank, one pool for the whole step (the recurrent kernels, the BLAS and the "
      "optimizer); 0: the cores the launcher bound the rank to, else the node's cores divided by its ranks "
      "(mpirun binds a lone rank to one core: --bind-to none)");
  key("train", "max_steps_per_epoch", c.train.max_steps_per_epoch, "0 (no cap) or more",
      "cap on steps per epoch; 0: the whole shard");
  key("train", "stop_after_steps", c.train.stop_after_steps, "0 (never) or more",
      "stop after this many steps in all, writing last.h5 (continue with --resume); 0: never");
  key("train", "lr_schedule", c.train.lr_schedule, one_of("constant, step, cosine"),
      "learning rate over the run's steps: constant, step (times train.lr_decay_rate every "
      "train.lr_decay_steps) or cosine (to 0 at the last step), after train.warmup_steps");
  key("train", "warmup_steps", c.train.warmup_steps, "0 or more",
      "steps over which the learning rate rises linearly to train.learning_rate; 0: none");
  key("train", "lr_decay_steps", c.train.lr_decay_steps, "0 or more; 1 or more with train.lr_schedule = step",
      "lr_schedule step: steps between decays");
  key("train", "lr_decay_rate", c.train.lr_decay_rate, "(0, 1]",
      "lr_schedule step: the factor of each decay");
  key("train", "weight_decay", c.train.weight_decay, "[0, 1)",
      "decoupled weight decay (AdamW; sgd alike): each step p -= learning rate x this x p; 0: none");
  key("train", "clip_norm", c.train.clip_norm, "0 (never) or more",
      "clip the averaged gradient to this global L2 norm before the update; 0: never");
  key("train", "cuda_graph", c.train.cuda_graph, one_of("auto, off"),
      "GPU ranks: auto (each batch shape's whole step, from the embedding to the optimizer with NCCL's "
      "all-reduce, captured once into a CUDA graph and replayed, one launch per step; the start log says "
      "where a model, backend or option keeps the step eager) or off (every kernel launched by the host)");
  key("train", "early_stopping_patience", c.train.early_stopping_patience, "0 (never) or more",
      "stop after this many epochs without a lower val_loss (best.h5 keeps the best); 0: never");
  key("train", "straggle_ms", c.train.straggle_ms, "0 to 3600000 (an hour)",
      "sleep this long after each step on the last worker, to test stragglers; 0: never");
  key("comm", "backend", c.comm.backend, one_of("auto, mpi, nccl, ps"),
      "how replicas combine gradients: auto (nccl when every rank has a GPU; else ps, or mpi on one rank), "
      "mpi (all-reduce), nccl (all-reduce on GPUs) or ps (parameter server)");
  key("comm", "sparse_embedding", c.comm.sparse_embedding, "true, false",
      "move only the embedding rows batches use: all-reduce averages the rows some rank touched, the "
      "parameter server takes pushes of them and, colocated, sends rows as batches read them (same result, "
      "less traffic)");
  key("comm", "compression", c.comm.compression, one_of("none, fp16, bf16"),
      "gradients on the wire: none, fp16 or bf16 (bf16 keeps fp32's range; fp16 is scaled by a power of "
      "two, per bucket on NCCL, per chunk on the MPI all-reduce, per message on the parameter server, "
      "which sends its gradients and sync updates so and its parameter pulls and fetched rows in float)");
  key("comm", "overlap", c.comm.overlap, one_of("none, delayed"),
      "none, or delayed: each step's averaged gradient is applied at the next step, so that the exchange "
      "overlaps a whole step (pipelined SGD: every update one step late, its gradient computed at the "
      "parameters plus the last update to make up for it); CPU ranks with the all-reduce");
  key("comm", "hierarchy", c.comm.hierarchy, one_of("off, auto"),
      "mpi and the colocated ps (sync) across nodes: off (one exchange over every rank; the default: where "
      "measured, mpi's hierarchy was not faster, the colocated ps's only on slow links) or auto (where a "
      "node has several ranks: mpi sums each gradient bucket inside the node, across one leader per node "
      "(on the comm.compression wire) and broadcasts it back inside it; the colocated ps sums each node "
      "rank's slice inside the node and exchanges it across the nodes among the ranks holding that slice "
      "(nodes of equal rank counts); so that each node sends the links one copy)");
  key("comm", "ps_servers", c.comm.ps_servers, "0 or more",
      "ps: 0 (colocated): every rank trains and serves a shard of the parameters and their optimizer state, "
      "where every rank is on a CPU (async: on a server thread, with MPI_THREAD_MULTIPLE), else one "
      "dedicated server; K: the last K ranks are servers, each owning a shard, and the others are workers");
  key("comm", "ps_mode", c.comm.ps_mode, one_of("sync, async"),
      "ps: sync (gradients of all workers averaged each step, as all-reduce) or async (each gradient "
      "applied as it arrives, bounded by comm.max_staleness)");
  key("comm", "max_staleness", c.comm.max_staleness, "0 or more",
      "ps async: steps a worker may run ahead of the slowest worker");
  key("comm", "timeout_s", c.comm.timeout_s, "1 or more",
      "seconds a rank may go without progress (start-up, a step, an evaluation batch) before the job ends, "
      "naming what it waited for: a hung rank ends the job instead of freezing it");
  key("comm", "selfcheck", c.comm.selfcheck, "true, false (on, off)",
      "GPU ranks check, before the first step, their cuDNN replica against the CPU replica (loss, every "
      "gradient, outputs, the parameter mapping, an optimizer step) and NCCL's averages against their "
      "closed form; a failure ends the job naming the rank, GPU and check (true or false; on and off read "
      "too)");
  key("checkpoint", "dir", c.checkpoint.dir, "a directory (not empty)",
      "run directory: config.ini, metrics.jsonl, curves.svg, last.h5, best.h5");
  key("checkpoint", "every_steps", c.checkpoint.every_steps, "0 or more",
      "also write last.h5 every N steps; 0: per epoch");
  key("checkpoint", "overwrite", c.checkpoint.overwrite, "true, false",
      "a new run may replace the results of another run in checkpoint.dir (otherwise it refuses)");
  key("checkpoint", "allow_data_change", c.checkpoint.allow_data_change, "true, false",
      "--resume may continue on a dataset other than the checkpoint's (fine-tuning on new data)");
  key("log", "progress", c.log.progress, one_of("auto, bar, lines"),
      "auto (a live bar on a terminal, plain lines otherwise), bar or lines");
  key("log", "interval", c.log.interval, "0 or more",
      "with plain lines: a progress line every N steps; 0: one about every 10 seconds");
  key("log", "timeline", c.log.timeline, "a file name; empty: off",
      "write a Chrome/Perfetto trace of every rank's steps to this file, relative to checkpoint.dir (empty: "
      "off)");
}

std::string full_name(const char* section, const char* name) {
  return section[0] ? std::string(section) + "." + name : std::string(name);
}

template <typename T>
std::string value_text(const T& v) {
  if constexpr (std::is_same_v<T, bool>) {
    return v ? "true" : "false";
  } else if constexpr (std::is_arithmetic_v<T>) {
    // The shortest text that reads back to the same value: 0.9 and 1e-07, not 0.90000000000000002.
    char text[64];
    const std::to_chars_result end = std::to_chars(text, text + sizeof(text), v);
    return std::string(text, end.ptr);
  } else {
    std::ostringstream out;
    out << v;
    return out.str();
  }
}

po::options_description config_keys(Config& config) {
  po::options_description keys("Configuration (INI key `section.key` as `[section] key = value`)");
  visit_keys(
      config, [&](const char* section, const char* name, auto& field, const std::string&, const char* help) {
        using T = std::decay_t<decltype(field)>;
        const std::string key = full_name(section, name);
        keys.add_options()(key.c_str(), po::value<T>(&field)->default_value(field, value_text(field)), help);
      });
  return keys;
}

void require(bool ok, const std::string& key, const std::string& value, const std::string& expected) {
  if (!ok) throw UserError(key + " = " + value + ": " + expected);
}

void require_between(int value, const std::string& key, int low, int high) {
  require(value >= low && value <= high, key, value_text(value),
          "must be from " + std::to_string(low) + " to " + std::to_string(high));
}

// Whether `value` survives to_ini() and --config (the run's config.ini and the checkpoint's copy are read
// back): Boost's INI parser ends a line at '#' and trims spaces, and a line break would start a new key.
bool ini_safe(const std::string& value) {
  for (const char ch : value) {
    const auto byte = static_cast<unsigned char>(ch);
    if (byte < 0x20 || byte == 0x7f || ch == '#') return false;
  }
  return value.empty() || (value.front() != ' ' && value.back() != ' ');
}

// An INI file reads '#' as the start of a comment wherever it stands, so "dir = runs/exp#3" would train in
// runs/exp without a word (and a second config "exp#4" would continue the same run). A '#' right after
// another character of a value is refused; "value  # a comment" (a blank before it) stays a comment.
void refuse_cut_values(std::istream& file, const std::string& path) {
  int number = 0;
  std::string in_section;
  for (std::string line; std::getline(file, line);) {
    ++number;
    const std::size_t start = line.find_first_not_of(" \t");
    if (start == std::string::npos || line[start] == '#' || line[start] == ';') continue;
    if (line[start] == '[') {
      const std::size_t end = line.find(']', start);
      in_section = end == std::string::npos ? "" : line.substr(start + 1, end - start - 1) + ".";
      continue;
    }
    const std::size_t equals = line.find('=');
    if (equals == std::string::npos) continue;
    for (std::size_t at = line.find('#', equals); at != std::string::npos; at = line.find('#', at + 1)) {
      const char before = line[at - 1];
      if (before == ' ' || before == '\t' || before == '=') break;  // a comment, or an empty value's
      std::string key = line.substr(start, equals - start);
      key.erase(key.find_last_not_of(" \t") + 1);
      // Not a key (a binary file's bytes): the parser names the line as it is.
      const auto key_byte = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; };
      if (key.empty() || !std::all_of(key.begin(), key.end(), key_byte)) break;
      key = in_section + key;
      throw UserError(fmt::format(
          "{}: line {}: {} = {}: an INI file reads '#' as the start of a comment, so the value would end "
          "before it; ddptrain's paths and values cannot hold '#' (rename the file or folder)",
          path, number, printable_value(key),
          printable_value(line.substr(line.find_first_not_of(" \t", equals + 1)))));
    }
  }
}

void check_values(const Config& c) {
  visit_keys(c, [](const char* section, const char* name, const auto& field, const std::string&,
                   const char*) {
    if constexpr (std::is_same_v<std::decay_t<decltype(field)>, std::string>) {
      require(ini_safe(field), full_name(section, name), field,
              "cannot hold '#', a control character or a leading or trailing space (an INI file could not "
              "hold it)");
    }
    // Every real-valued key ends up in a float somewhere: inf, or a value that a float holds as inf or 0
    // (epsilon = 1e-50 would divide by zero), is a typo.
    if constexpr (std::is_floating_point_v<std::decay_t<decltype(field)>>) {
      const double magnitude = std::abs(static_cast<double>(field));
      require(std::isfinite(field) && magnitude <= std::numeric_limits<float>::max() &&
                  (magnitude == 0 || magnitude >= std::numeric_limits<float>::min()),
              full_name(section, name), value_text(field),
              "is no number a float holds (finite, of magnitude 1.2e-38 to 3.4e+38, or 0)");
    }
  });
  const std::set<std::string> devices{"cpu", "cuda", "auto"};
  require(devices.count(c.device), "device", c.device, "expected cpu, cuda or auto");
  require(c.data.validation == "auto" || c.data.validation == "val" || c.data.validation == "split" ||
              c.data.validation == "test",
          "data.validation", c.data.validation, "expected auto, val, split or test");
  require(c.data.validation_split > 0 && c.data.validation_split < 1, "data.validation_split",
          value_text(c.data.validation_split), "must be in (0, 1)");
  require_between(c.data.prefetch, "data.prefetch", 1, kMaxPrefetch);
  require_between(c.model.embedding_dim, "model.embedding_dim", 1, kMaxWidth);
  require_between(c.model.hidden, "model.hidden", 1, kMaxWidth);
  require_between(c.model.layers, "model.layers", 1, kMaxLayers);
  require(c.model.cell == "lstm" || c.model.cell == "gru", "model.cell", c.model.cell,
          "expected lstm or gru");
  require(!c.model.bidirectional || c.model.mask_padding, "model.bidirectional", "true",
          "needs model.mask_padding = true (the reverse direction would start on the left padding)");
  require(c.model.dropout >= 0 && c.model.dropout < 1, "model.dropout", value_text(c.model.dropout),
          "must be in [0, 1)");
  require(c.model.embedding_dropout >= 0 && c.model.embedding_dropout < 1, "model.embedding_dropout",
          value_text(c.model.embedding_dropout), "must be in [0, 1)");
  models::parse_rnn_algorithm(c.model.cudnn_rnn_algo);  // throws the UserError naming the key
  models::parse_precision(c.model.precision);           // the same
  models::parse_cpu_kernels(c.model.cpu_kernels, model_shape(c, 1, 2), model_options(c));  // the same
  require(c.train.batch_size >= 1, "train.batch_size", value_text(c.train.batch_size), "must be positive");
  require(c.train.epochs >= 1, "train.epochs", value_text(c.train.epochs), "must be positive");
  require(c.train.learning_rate > 0, "train.learning_rate", value_text(c.train.learning_rate),
          "must be positive");
  require(c.train.optimizer == "adam" || c.train.optimizer == "sgd", "train.optimizer", c.train.optimizer,
          "expected adam or sgd");
  require(c.train.embedding_update == "dense" || c.train.embedding_update == "lazy", "train.embedding_update",
          c.train.embedding_update, "expected dense or lazy");
  require(c.comm.sparse_embedding || c.train.embedding_update == "dense", "train.embedding_update",
          c.train.embedding_update,
          "lazy needs comm.sparse_embedding = true (the rows come from the exchange)");
  require(c.train.momentum >= 0 && static_cast<float>(c.train.momentum) < 1, "train.momentum",
          value_text(c.train.momentum), "must be in [0, 1) as a float (at most 0.99999994)");
  // Checked as the float the optimizer computes with: 0.99999999 is 1.0 there, and Adam would not move.
  require(c.train.beta1 >= 0 && static_cast<float>(c.train.beta1) < 1, "train.beta1",
          value_text(c.train.beta1), "must be in [0, 1) as a float (at most 0.99999994)");
  require(c.train.beta2 >= 0 && static_cast<float>(c.train.beta2) < 1, "train.beta2",
          value_text(c.train.beta2), "must be in [0, 1) as a float (at most 0.99999994)");
  require(c.train.epsilon > 0, "train.epsilon", value_text(c.train.epsilon), "must be positive");
  require(c.train.threads >= 0 && c.train.threads <= kMaxThreads, "train.threads",
          value_text(c.train.threads), "must be 0 (auto) or at most " + std::to_string(kMaxThreads));
  require(c.train.max_steps_per_epoch >= 0, "train.max_steps_per_epoch",
          value_text(c.train.max_steps_per_epoch), "must be 0 (no cap) or more");
  require(c.train.stop_after_steps >= 0, "train.stop_after_steps", value_text(c.train.stop_after_steps),
          "must be 0 (never) or more");
  // An hour at most: far past any straggler worth simulating, and within what a sleep can be given.
  require(c.train.straggle_ms >= 0 && c.train.straggle_ms <= 3.6e6, "train.straggle_ms",
          value_text(c.train.straggle_ms), "must be 0 (never) to 3600000 (an hour)");
  require(
      c.train.lr_schedule == "constant" || c.train.lr_schedule == "step" || c.train.lr_schedule == "cosine",
      "train.lr_schedule", c.train.lr_schedule, "expected constant, step or cosine");
  require(c.train.warmup_steps >= 0, "train.warmup_steps", value_text(c.train.warmup_steps),
          "must be 0 (none) or more");
  require(c.train.lr_schedule != "step" || c.train.lr_decay_steps > 0, "train.lr_decay_steps",
          value_text(c.train.lr_decay_steps), "must be positive with train.lr_schedule = step");
  require(c.train.lr_decay_steps >= 0, "train.lr_decay_steps", value_text(c.train.lr_decay_steps),
          "must be 0 or more");
  require(c.train.lr_decay_rate > 0 && c.train.lr_decay_rate <= 1, "train.lr_decay_rate",
          value_text(c.train.lr_decay_rate), "must be in (0, 1]");
  require(c.train.weight_decay >= 0 && c.train.weight_decay < 1, "train.weight_decay",
          value_text(c.train.weight_decay), "must be in [0, 1)");
  require(c.train.clip_norm >= 0, "train.clip_norm", value_text(c.train.clip_norm),
          "must be 0 (never) or more");
  require(c.train.early_stopping_patience >= 0, "train.early_stopping_patience",
          value_text(c.train.early_stopping_patience), "must be 0 (never) or more");
  require(!c.checkpoint.dir.empty(), "checkpoint.dir", "\"\"", "must name a directory");
  require(c.checkpoint.every_steps >= 0, "checkpoint.every_steps", value_text(c.checkpoint.every_steps),
          "must be 0 or more");
  require(c.comm.backend == "auto" || c.comm.backend == "mpi" || c.comm.backend == "nccl" ||
              c.comm.backend == "ps",
          "comm.backend", c.comm.backend, "unknown backend (expected auto, mpi, nccl or ps)");
  require(c.comm.ps_servers >= 0, "comm.ps_servers", value_text(c.comm.ps_servers),
          "must be 0 (every rank serves a shard) or the number of dedicated servers");
  require(c.comm.ps_mode == "sync" || c.comm.ps_mode == "async", "comm.ps_mode", c.comm.ps_mode,
          "expected sync or async");
  require(c.comm.max_staleness >= 0, "comm.max_staleness", value_text(c.comm.max_staleness),
          "must be 0 or more");
  // Below a second no rank can start (MPI, the data, the first step): the watchdog would call it hung.
  require(c.comm.timeout_s >= 1, "comm.timeout_s", value_text(c.comm.timeout_s),
          "must be at least 1 (second)");
  require(c.comm.compression == "none" || c.comm.compression == "fp16" || c.comm.compression == "bf16",
          "comm.compression", c.comm.compression, "expected none, fp16 or bf16");
  require(c.comm.overlap == "none" || c.comm.overlap == "delayed", "comm.overlap", c.comm.overlap,
          "expected none or delayed");
  require(c.comm.hierarchy == "auto" || c.comm.hierarchy == "off", "comm.hierarchy", c.comm.hierarchy,
          "expected auto or off");
  require(c.train.cuda_graph == "auto" || c.train.cuda_graph == "off", "train.cuda_graph", c.train.cuda_graph,
          "expected auto or off");
  require(c.log.progress == "auto" || c.log.progress == "bar" || c.log.progress == "lines", "log.progress",
          c.log.progress, "expected auto, bar or lines");
  require(c.log.interval >= 0, "log.interval", value_text(c.log.interval), "must be 0 or more");
  require(c.resume == "no" || c.resume == "last" || c.resume == "auto", "--resume", c.resume,
          "expected last (the default when given alone), auto or no");
  if (c.data.path.empty())
    throw UserError("data.path is not set: give it in the config file or as --data.path FILE");
}

}  // namespace

std::vector<std::string> config_key_names() {
  std::vector<std::string> names;
  const Config defaults;
  visit_keys(defaults, [&](const char* section, const char* name, const auto&, const std::string&,
                           const char*) { names.push_back(full_name(section, name)); });
  return names;
}

template <typename T>
const char* type_name() {
  if constexpr (std::is_same_v<T, bool>) return "boolean";
  if constexpr (std::is_same_v<T, std::string>) return "string";
  if constexpr (std::is_floating_point_v<T>) return "real";
  if constexpr (std::is_unsigned_v<T>) return "unsigned integer";
  return "integer";
}

std::string config_reference_markdown() {
  std::ostringstream out;
  out << kConfigReferenceMarker << "\n\n"
      << "Every string value must survive an INI file: no `#`, no control character, no leading or trailing "
         "space. Every real value must be finite and a float must hold it (magnitude 1.2e-38 to 3.4e+38, or "
         "0). A value outside what a key allows stops the run before anything starts, with one line naming "
         "the key (exit 2).\n";
  std::string current = "-";
  const Config defaults;
  visit_keys(defaults, [&](const char* section, const char* name, const auto& field,
                           const std::string& allowed, const char* help) {
    if (current != section) {
      current = section;
      out << "\n### " << (section[0] ? "[" + current + "]" : std::string("Top level (before any section)"))
          << "\n\n| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
    }
    const std::string value = value_text(field);
    std::string meaning = help;
    for (std::size_t bar = meaning.find('|'); bar != std::string::npos; bar = meaning.find('|', bar + 2))
      meaning.replace(bar, 1, "\\|");
    out << "| `" << full_name(section, name) << "` | " << type_name<std::decay_t<decltype(field)>>() << " | "
        << (value.empty() ? std::string("(empty)") : "`" + value + "`") << " | " << allowed << " | "
        << meaning << " |\n";
  });
  return out.str();
}

std::string Config::to_ini() const {
  std::ostringstream out;
  std::string current = "";
  out << "# Effective configuration of this run (ddptrain " << DDPTRAIN_VERSION << ")\n";
  visit_keys(*this,
             [&](const char* section, const char* name, const auto& field, const std::string&, const char*) {
               if (current != section) {
                 current = section;
                 out << "\n[" << section << "]\n";
               }
               out << name << " = " << value_text(field) << "\n";
             });
  return out.str();
}

std::vector<std::string> job_wide_settings(const Config& c) {
  static const std::set<std::string> kPerNode{"device",
                                              "data.path",
                                              "data.prefetch",
                                              "data.validate",
                                              "model.cpu_kernels",
                                              "model.cudnn_rnn_algo",
                                              "train.threads",
                                              "train.cuda_graph",
                                              "train.straggle_ms",
                                              "comm.timeout_s",
                                              "checkpoint.dir",
                                              "checkpoint.overwrite",
                                              "checkpoint.allow_data_change",
                                              "log.progress",
                                              "log.interval"};
  std::vector<std::string> lines;
  visit_keys(c,
             [&](const char* section, const char* name, const auto& field, const std::string&, const char*) {
               const std::string key = full_name(section, name);
               if (!kPerNode.contains(key)) lines.push_back(key + " = " + value_text(field));
             });
  return lines;
}

std::vector<std::string> changed_training_settings(const std::string& earlier_ini, const Config& now) {
  // The keys that change what a step computes without changing the model's shape (the shape is checked
  // apart; train.seed and train.batch_size have messages of their own).
  static const std::set<std::string> kSettings{"model.dropout",
                                               "model.embedding_dropout",
                                               "train.learning_rate",
                                               "train.momentum",
                                               "train.embedding_update",
                                               "train.beta1",
                                               "train.beta2",
                                               "train.epsilon",
                                               "train.max_steps_per_epoch",
                                               "train.lr_schedule",
                                               "train.warmup_steps",
                                               "train.lr_decay_steps",
                                               "train.lr_decay_rate",
                                               "train.weight_decay",
                                               "train.clip_norm",
                                               "train.early_stopping_patience",
                                               "comm.compression",
                                               "comm.overlap",
                                               "comm.ps_mode",
                                               "comm.max_staleness"};
  // to_ini()'s own lines: "[section]" and "name = value".
  std::map<std::string, std::string> earlier;
  std::istringstream lines(earlier_ini);
  std::string in_section;
  for (std::string line; std::getline(lines, line);) {
    if (line.size() > 2 && line.front() == '[' && line.back() == ']') {
      in_section = line.substr(1, line.size() - 2);
    } else if (const std::size_t eq = line.find(" = "); eq != std::string::npos && !in_section.empty()) {
      earlier[in_section + "." + line.substr(0, eq)] = line.substr(eq + 3);
    }
  }
  std::vector<std::string> changed;
  visit_keys(now,
             [&](const char* section, const char* name, const auto& field, const std::string&, const char*) {
               const std::string key = std::string(section) + "." + name;
               const auto was = earlier.find(key);
               // A key the earlier run did not record (an older ddptrain) cannot be compared.
               if (kSettings.count(key) == 0 || was == earlier.end()) return;
               if (const std::string value = value_text(field); value != was->second)
                 changed.push_back(fmt::format("{} = {} (was {})", key, value, was->second));
             });
  // More (or fewer) epochs is how a run goes on, but a cosine schedule spans them all: its curve changes.
  if (const auto was = earlier.find("train.epochs"); now.train.lr_schedule == "cosine" &&
                                                     was != earlier.end() &&
                                                     std::to_string(now.train.epochs) != was->second) {
    changed.push_back(fmt::format("train.epochs = {} (was {}), over which the cosine learning rate falls",
                                  now.train.epochs, was->second));
  }
  return changed;
}

ParsedConfig parse_config(const std::vector<std::string>& args) {
  ParsedConfig parsed;
  Config& config = parsed.config;

  po::options_description general("General");
  general.add_options()("help,h", "print this help and exit")("version", "print the version and exit")(
      "config,c", po::value<std::string>(&config.config_file), "INI file with the keys below")(
      "resume", po::value<std::string>(&config.resume)->implicit_value("last")->default_value("no"),
      "continue from checkpoint.dir/last.h5: last (fails if absent), auto (if present), no");
  po::options_description keys = config_keys(config);
  po::options_description all;
  all.add(general).add(keys);

  std::ostringstream help;
  help << "Usage: ddptrain [train] --config FILE [--section.key VALUE ...]\n"
       << "       ddptrain prepare synthetic|imdb-npz|text ...   (ddptrain prepare --help)\n"
       << "       ddptrain predict --checkpoint FILE (--text TEXT | --input FILE) ...\n"
       << "       ddptrain evaluate --checkpoint FILE --data FILE ...\n"
       << "       ddptrain check-env [--device cuda|cpu|auto]\n"
       << "       ddptrain config-reference                      (every key: launch/CONFIG.md)\n\n"
       << all;
  parsed.help = help.str();

  po::variables_map vm;
  // Stored first, so the command line wins over the file.
  store_command_line(args, all, vm, "command line");
  if (vm.count("help")) {
    parsed.action = ConfigAction::kHelp;
    return parsed;
  }
  if (vm.count("version")) {
    parsed.action = ConfigAction::kVersion;
    return parsed;
  }
  if (vm.count("config")) {
    const std::string path = vm["config"].as<std::string>();
    std::error_code ignored;  // a path that cannot be examined is "not found" below
    if (const std::string kind = special_file_kind(path, /*follow_links=*/true); !kind.empty())
      throw UserError(path + ": is " + kind + ", not a config file");
    if (!std::filesystem::is_regular_file(path, ignored)) throw UserError(path + ": config file not found");
    std::ifstream file(path);
    if (!file) throw UserError(path + ": cannot read the config file");
    // A UTF-8 byte order mark (as some Windows editors save) would hide in the first line's name.
    char bom[3] = {};
    if (!file.read(bom, 3) || std::string(bom, 3) != "\xEF\xBB\xBF") {
      file.clear();
      file.seekg(0);
    }
    // Lines that start with ';' are comments in most INI dialects (Python's configparser, Windows'), not in
    // the parser's: blanked, so that line numbers stay.
    std::string text;
    for (std::string line; std::getline(file, line);) {
      const std::size_t start = line.find_first_not_of(" \t");
      text += (start != std::string::npos && line[start] == ';' ? "" : line) + "\n";
    }
    std::istringstream lines(text);
    refuse_cut_values(lines, path);
    lines.clear();
    lines.seekg(0);
    try {
      const po::parsed_options parsed_file = po::parse_config_file(lines, keys, /*allow_unregistered=*/false);
      refuse_misread_values(parsed_file, keys, path + ": ", "");
      po::store(parsed_file, vm);
    } catch (const po::error& e) {
      throw UserError(option_error_text(e, path + ": ") + did_you_mean(e, keys, ""));
    }
  }
  try {
    po::notify(vm);
  } catch (const po::error& e) {
    throw UserError(option_error_text(e, "config: "));
  }
  check_values(config);
  return parsed;
}

models::ModelShape model_shape(const Config& c, int vocab_size, int classes) {
  models::ModelShape shape{vocab_size, c.model.embedding_dim, c.model.hidden, c.model.layers};
  shape.cell = models::parse_cell(c.model.cell);
  shape.bidirectional = c.model.bidirectional;
  shape.classes = classes;
  return shape;
}

void require_model_fits(const Config& c, const models::ModelShape& shape, int ranks_on_node) {
  // The flat buffer, its gradient and Adam's two moments: 16 bytes a parameter before any activation.
  constexpr long double kMaxParameters = 2147483648.0L;
  const long double parameters = models::parameter_count(shape);
  if (parameters > kMaxParameters) {
    throw UserError(fmt::format(
        "model.embedding_dim = {}, model.hidden = {}, model.layers = {} with the data's vocabulary of {}: "
        "{:.3g} parameters, more than the {:.3g} a rank can hold",
        c.model.embedding_dim, c.model.hidden, c.model.layers, shape.vocab_size,
        static_cast<double>(parameters), static_cast<double>(kMaxParameters)));
  }
  // Every rank on the node must hold them before anything is allocated: Linux grants more than it has and
  // ends the process without a word when the pages are touched. The bytes per parameter follow the peak
  // resident memory of a run with checkpoints (benchmarks/RESULTS.md, "Peak memory against model size"):
  // weights, gradient, the exchange's buffer, the checkpoint's snapshot and the best model's copy make the
  // fixed part; the optimizer's state, held and snapshotted, counts one and a half times.
  const double state_bytes = c.train.optimizer == "adam" ? 8.0 : c.train.momentum > 0 ? 4.0 : 0.0;
  const double bytes_per_parameter = 25.0 + 1.5 * state_bytes;
  const double needed = static_cast<double>(parameters) * bytes_per_parameter * std::max(ranks_on_node, 1);
  const double available = available_memory_bytes();
  if (available > 0 && needed > available) {
    throw UserError(fmt::format(
        "model.embedding_dim = {}, model.hidden = {}, model.layers = {} with the data's vocabulary of {}: "
        "{:.3g} parameters need about {:.1f} GB on this node ({:.0f} bytes each with train.optimizer = {}: "
        "weights, gradient, optimizer state, checkpoint and best-model copies; {} rank(s) on the node), more "
        "than the {:.1f} GB it has available",
        c.model.embedding_dim, c.model.hidden, c.model.layers, shape.vocab_size,
        static_cast<double>(parameters), needed / 1e9, bytes_per_parameter, c.train.optimizer,
        std::max(ranks_on_node, 1), available / 1e9));
  }
}

models::ModelOptions model_options(const Config& c) {
  return {c.model.mask_padding, c.model.dropout, c.model.embedding_dropout,
          models::parse_precision(c.model.precision)};
}

}  // namespace ddp::engine
