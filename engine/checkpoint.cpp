#include "engine/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <new>
#include <optional>
#include <sstream>
#include <string>
#include <vector>

#include "engine/base/errors.h"
#include "engine/base/memory_limit.h"
#include "io/damaged_file_guard.h"
#include "io/dataset.h"
#include "io/hdf5_util.h"
#include "models/fma_rate.h"

namespace ddp::engine {
namespace {

constexpr const char* kFormat = "ddptrain-checkpoint-1";

using io::check_h5;
using io::check_h5_id;
using io::Hid;

void write_double_attribute(hid_t loc, const char* name, double value) {
  Hid space(check_h5_id(H5Screate(H5S_SCALAR), "H5Screate"), Hid::Kind::kDataspace);
  Hid attr(check_h5_id(H5Acreate2(loc, name, H5T_NATIVE_DOUBLE, space.get(), H5P_DEFAULT, H5P_DEFAULT), name),
           Hid::Kind::kAttribute);
  check_h5(H5Awrite(attr.get(), H5T_NATIVE_DOUBLE, &value), name);
}

double read_double_attribute(hid_t loc, const std::string& file, const char* name) {
  if (H5Aexists(loc, name) <= 0) throw UserError(file + ": checkpoint attribute '" + name + "' is missing");
  Hid attr(check_h5_id(H5Aopen(loc, name, H5P_DEFAULT), name), Hid::Kind::kAttribute);
  // HDF5 converts any number to a double, but fails on a string or a compound: the file's fault, not ours.
  Hid type(check_h5_id(H5Aget_type(attr.get()), name), Hid::Kind::kDatatype);
  Hid space(check_h5_id(H5Aget_space(attr.get()), name), Hid::Kind::kDataspace);
  const H5T_class_t type_class = H5Tget_class(type.get());
  if ((type_class != H5T_FLOAT && type_class != H5T_INTEGER) ||
      H5Sget_simple_extent_npoints(space.get()) != 1) {
    throw UserError(file + ": checkpoint attribute '" + name + "' must be a single number");
  }
  double value = 0;
  check_h5(H5Aread(attr.get(), H5T_NATIVE_DOUBLE, &value), name);
  return value;
}

int64_t read_int(hid_t loc, const std::string& file, const char* name) {
  return io::read_int_attribute(loc, file, name);
}

// An int attribute in [low, high]: a larger value would wrap in the model's int fields, or (below INT_MAX)
// lie past any real dataset.
int read_int_in_range(hid_t loc, const std::string& file, const char* name, int64_t low,
                      int64_t high = INT_MAX) {
  const int64_t value = read_int(loc, file, name);
  if (value > high) {
    throw UserError(file + ": checkpoint attribute " + name + " = " + std::to_string(value) +
                    " is more than " + std::to_string(high));
  }
  if (value < low) {
    throw UserError(file + ": checkpoint attribute " + name + " = " + std::to_string(value) + " is not " +
                    std::to_string(low) + " to " + std::to_string(high));
  }
  return static_cast<int>(value);
}

// A counter (steps, epochs, ranks) of at least `low` and below 2^53, past any run and exact in the doubles
// that carry progress between ranks: a damaged or edited file must not resume from step -3, or from a step
// whose next one wraps.
int64_t read_count(hid_t loc, const std::string& file, const char* name, int64_t low) {
  constexpr int64_t kEnd = int64_t{1} << 53;
  const int64_t value = read_int(loc, file, name);
  if (value < low || value >= kEnd) {
    throw UserError(file + ": checkpoint attribute " + name + " = " + std::to_string(value) + " is not " +
                    std::to_string(low) + " to 2^53");
  }
  return value;
}

// A 0/1 attribute, false where absent (the checkpoints of before).
bool read_flag(hid_t loc, const std::string& file, const char* name) {
  if (!io::has_attribute(loc, name)) return false;
  const int64_t value = read_int(loc, file, name);
  if (value != 0 && value != 1) {
    throw UserError(file + ": checkpoint attribute " + name + " = " + std::to_string(value) +
                    " is not 0 or 1");
  }
  return value == 1;
}

// The interrupted epoch's running sums: whole counts, at most `count` correct, a loss sum of at least 0.
void check_epoch_sums(const std::string& file, const TrainingProgress& p) {
  const auto whole = [](double x) { return std::isfinite(x) && x >= 0 && x == std::floor(x); };
  if (!whole(p.count) || !whole(p.correct) || p.correct > p.count || !std::isfinite(p.loss_sum) ||
      p.loss_sum < 0) {
    throw UserError(fmt::format(
        "{}: checkpoint attributes loss_sum = {}, correct = {}, count = {} are not the sums of an epoch "
        "(whole counts, correct at most count, a finite loss of at least 0)",
        file, p.loss_sum, p.correct, p.count));
  }
}

// FNV-1a over the values' bit patterns, two floats to a 64-bit word: not a defence against tampering, but any
// changed value changes it (each word's step is a bijection of the hash), at gigabytes a second. Stored
// beside each float dataset, it tells a damaged file (a torn copy, a bad disk) from a checkpoint that would
// resume as NaN.
uint64_t checksum_of(std::span<const float> values) {
  constexpr uint64_t kPrime = 0x100000001b3ull;
  uint64_t hash = 0xcbf29ce484222325ull;
  std::size_t i = 0;
  for (; i + 2 <= values.size(); i += 2) {
    const uint64_t word = std::bit_cast<uint32_t>(values[i]) |
                          (static_cast<uint64_t>(std::bit_cast<uint32_t>(values[i + 1])) << 32);
    hash = (hash ^ word) * kPrime;
  }
  if (i < values.size()) hash = (hash ^ std::bit_cast<uint32_t>(values[i])) * kPrime;
  return hash;
}
constexpr const char* kChecksum = "checksum";
constexpr const char* kHeaderChecksum = "header_checksum";
constexpr const char* kAvx512FmaWide = "avx512_fma_wide";

// Every attribute of the root but the checksum itself, name, kind and value, in name order: a flipped bit in
// a counter or a model dimension, which no range check can tell from a real value, changes it.
uint64_t header_checksum(hid_t root, const std::string& file) {
  std::vector<std::string> names;
  const auto collect = [](hid_t, const char* name, const H5A_info_t*, void* out) -> herr_t {
    static_cast<std::vector<std::string>*>(out)->emplace_back(name);
    return 0;
  };
  hsize_t index = 0;
  check_h5(H5Aiterate2(root, H5_INDEX_NAME, H5_ITER_INC, &index, collect, &names), "H5Aiterate2");
  std::vector<std::string> entries;
  for (const std::string& name : names) {
    if (name == kHeaderChecksum) continue;
    Hid attr(check_h5_id(H5Aopen(root, name.c_str(), H5P_DEFAULT), "H5Aopen"), Hid::Kind::kAttribute);
    Hid type(check_h5_id(H5Aget_type(attr.get()), "H5Aget_type"), Hid::Kind::kDatatype);
    std::string entry = name + '\0';
    switch (H5Tget_class(type.get())) {
      case H5T_INTEGER: {
        const int64_t value = read_int(root, file, name.c_str());
        entry += 'i' + std::string(reinterpret_cast<const char*>(&value), sizeof(value));
        break;
      }
      case H5T_FLOAT: {
        const double value = read_double_attribute(root, file, name.c_str());
        entry += 'f' + std::string(reinterpret_cast<const char*>(&value), sizeof(value));
        break;
      }
      case H5T_STRING:
        entry += 's' + io::read_string_attribute(root, name);
        break;
      default:
        entry += 'o';
        break;
    }
    entries.push_back(std::move(entry));
  }
  return io::string_list_checksum(entries);
}

// A one-dimensional dataset of `count` values of `type` (a native HDF5 type) from `data`.
Hid write_vector(hid_t loc, const std::string& name, hid_t type, const void* data, std::size_t count) {
  const hsize_t dims[1] = {count};
  Hid space(check_h5_id(H5Screate_simple(1, dims, nullptr), "H5Screate_simple"), Hid::Kind::kDataspace);
  Hid set(check_h5_id(H5Dcreate2(loc, name.c_str(), type, space.get(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                      name.c_str()),
          Hid::Kind::kDataset);
  check_h5(H5Dwrite(set.get(), type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), ("H5Dwrite " + name).c_str());
  return set;
}

// Each dataset is closed checked: HDF5 keeps a small dataset's values in its sieve buffer until the close,
// where a full disk shows up.
void write_floats(hid_t loc, const std::string& name, std::span<const float> data) {
  Hid set = write_vector(loc, name, H5T_NATIVE_FLOAT, data.data(), data.size());
  io::write_int_attribute(set.get(), kChecksum, std::bit_cast<int64_t>(checksum_of(data)));
  set.close_checked(("H5Dclose " + name).c_str());
}

std::vector<float> read_floats(hid_t loc, const std::string& file, const std::string& name,
                               std::size_t expected) {
  Hid set = io::open_dataset(loc, file, name);
  const std::vector<int64_t> dims = io::dataset_dims(set.get());
  if (dims.size() != 1 || static_cast<std::size_t>(dims[0]) != expected) {
    throw UserError(file + ": checkpoint dataset " + name + " has the wrong size for this model");
  }
  // The dimensions were checked against each other, not against this machine: a header may describe a model
  // (and a dataset, unallocated) larger than its memory.
  require_node_memory(static_cast<double>(expected) * sizeof(float),
                      file + ": checkpoint dataset " + name + " of " + std::to_string(expected) + " floats");
  std::vector<float> data;
  try {
    data.resize(expected);
  } catch (const std::bad_alloc&) {
    throw UserError(file + ": checkpoint dataset " + name + " holds " + std::to_string(expected) +
                    " floats, more than this machine can allocate");
  }
  check_h5(H5Dread(set.get(), H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), name.c_str());
  // Checkpoints written before the checksum have none: theirs must at least be numbers.
  if (H5Aexists(set.get(), kChecksum) > 0) {
    if (std::bit_cast<uint64_t>(read_int(set.get(), file, kChecksum)) != checksum_of(data)) {
      throw UserError(file + ": checkpoint dataset " + name +
                      " is damaged (its values do not match the checksum written with them): use another "
                      "checkpoint (a run directory holds last.h5 and best.h5)");
    }
  } else if (!std::all_of(data.begin(), data.end(), [](float x) { return std::isfinite(x); })) {
    throw UserError(file + ": checkpoint dataset " + name +
                    " holds values that are not finite and has no checksum to say they were written so");
  }
  return data;
}

void write_bytes(hid_t loc, const std::string& name, const std::string& bytes) {
  Hid set = write_vector(loc, name, H5T_NATIVE_UINT8, bytes.data(), bytes.size());
  set.close_checked(("H5Dclose " + name).c_str());
}

// The replicas' random states: a state is small (cuDNN's are a few MB), so a larger one is damage.
constexpr int64_t kMaxRngStateBytes = int64_t{1} << 28;
constexpr int64_t kMaxRanks = int64_t{1} << 20;

std::vector<std::string> read_replica_rng_states(hid_t root, const std::string& file) {
  if (!io::link_exists(root, "replica_rng")) return {};
  Hid group(H5Gopen2(root, "replica_rng", H5P_DEFAULT), Hid::Kind::kGroup);
  if (!group.valid()) throw UserError(file + ": checkpoint group /replica_rng cannot be opened");
  const int64_t ranks = read_int(group.get(), file, "ranks");
  if (ranks < 1 || ranks > kMaxRanks) {
    throw UserError(file + ": checkpoint attribute /replica_rng ranks = " + std::to_string(ranks) +
                    " is not 1 to " + std::to_string(kMaxRanks));
  }
  std::vector<std::string> states(static_cast<std::size_t>(ranks));
  for (int64_t rank = 0; rank < ranks; ++rank) {
    const std::string name = std::to_string(rank);
    if (!io::link_exists(group.get(), name)) continue;
    Hid set = io::open_dataset(group.get(), file, name);
    const std::vector<int64_t> dims = io::dataset_dims(set.get());
    if (dims.size() != 1 || dims[0] < 0 || dims[0] > kMaxRngStateBytes) {
      throw UserError(file + ": checkpoint dataset /replica_rng/" + name +
                      " is not a byte string of at most " + std::to_string(kMaxRngStateBytes) + " bytes");
    }
    std::string& state = states[static_cast<std::size_t>(rank)];
    state.resize(static_cast<std::size_t>(dims[0]));
    check_h5(H5Dread(set.get(), H5T_NATIVE_UINT8, H5S_ALL, H5S_ALL, H5P_DEFAULT, state.data()), name.c_str());
  }
  return states;
}

// Copies the file `from` to a new file `to`: "" when it succeeded, else why not (with errno's words: the
// standard library's copy_file can report a full disk as "Success").
std::string copy_bytes(const std::string& from, const std::string& to) {
  const int in = ::open(from.c_str(), O_RDONLY);
  if (in < 0) return std::string("cannot open it: ") + std::strerror(errno);
  const int out = ::open(to.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644);
  if (out < 0) {
    const std::string why = std::strerror(errno);
    ::close(in);
    return why;
  }
  std::string why;
  std::vector<char> buffer(1 << 20);
  for (;;) {
    const ssize_t got = ::read(in, buffer.data(), buffer.size());
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      if (got < 0) why = std::string("reading: ") + std::strerror(errno);
      break;
    }
    for (ssize_t done = 0; done < got && why.empty();) {
      const ssize_t put = ::write(out, buffer.data() + done, static_cast<std::size_t>(got - done));
      if (put < 0 && errno == EINTR) continue;
      if (put <= 0) why = put < 0 ? std::strerror(errno) : "a write wrote nothing";
      if (put > 0) done += put;
    }
    if (!why.empty()) break;
  }
  ::close(in);
  if (::close(out) != 0 && why.empty()) why = std::strerror(errno);
  return why;
}

// fsync of `path`: "" when it succeeded, else why not.
std::string fsync_path(const std::string& path, int flags) {
  const int fd = ::open(path.c_str(), flags);
  if (fd < 0) return std::strerror(errno);
  const int status = ::fsync(fd);
  const std::string why = status != 0 ? std::strerror(errno) : "";
  ::close(fd);
  return why;
}

// Flushes `tmp` to disk and renames it over `path` (a link at `path` is replaced, never followed), so that a
// reader sees the old file or the new one; on failure (a full disk found at the flush, a rename refused)
// removes `tmp` and leaves `path` alone.
void move_into_place(const std::string& tmp, const std::string& path) {
  if (const std::string why = fsync_path(tmp, O_RDONLY); !why.empty()) {
    std::remove(tmp.c_str());
    throw UserError(tmp + ": cannot flush the new checkpoint to disk (" + why + "); " + path +
                    " is unchanged");
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    throw UserError(path + ": cannot move the new checkpoint into place (" + why + ")");
  }
  const std::filesystem::path final_path(path);
  const std::string dir = final_path.has_parent_path() ? final_path.parent_path().string() : ".";
  fsync_path(dir, O_RDONLY | O_DIRECTORY);  // best effort: some file systems refuse a directory's fsync
}

}  // namespace

struct CheckpointWriter::Files {
  std::string path;
  std::string tmp;
  Hid file;
  Hid optimizer;  // the /optimizer group
  std::string buffer_names;
};

template <typename Write>
void CheckpointWriter::writing(Write&& write) {
  const std::string tmp = files_->tmp;  // abandon() drops files_
  const std::string unchanged = "; " + files_->path + " is unchanged";
  io::write_or_abandon(
      tmp, write, [this] { abandon(); }, unchanged.c_str());
}

void CheckpointWriter::abandon() {
  if (!files_) return;
  std::lock_guard<std::recursive_mutex> lock(io::hdf5_mutex());
  files_->optimizer.discard();
  files_->file.discard();
  std::remove(files_->tmp.c_str());
  files_.reset();
}

CheckpointWriter::CheckpointWriter(const std::string& path, const models::ModelShape& shape,
                                   std::span<const float> params, const std::string& optimizer_name,
                                   int64_t optimizer_iterations, const TrainingProgress& progress,
                                   const std::string& config_ini, const RunRecord& run) {
  std::lock_guard<std::recursive_mutex> lock(io::hdf5_mutex());
  io::quiet_hdf5_errors();
  const std::string tmp = path + ".tmp";
  std::error_code ec;
  std::filesystem::remove(tmp, ec);  // a stale PATH.tmp (a link would otherwise be followed)
  const hid_t raw = H5Fcreate(tmp.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  if (raw < 0) throw UserError(tmp + ": cannot create the checkpoint file (check checkpoint.dir)");
  files_ = std::make_unique<Files>(Files{path, tmp, Hid(raw, Hid::Kind::kFile), Hid(), ""});
  writing([&] {
    const hid_t root = files_->file.get();
    io::write_string_attribute(root, "format", kFormat);
    io::write_int_attribute(root, "vocab_size", shape.vocab_size);
    io::write_int_attribute(root, "embedding_dim", shape.embedding_dim);
    io::write_int_attribute(root, "hidden", shape.hidden);
    io::write_int_attribute(root, "layers", shape.layers);
    io::write_string_attribute(root, "cell", models::cell_name(shape.cell));
    io::write_int_attribute(root, "bidirectional", shape.bidirectional ? 1 : 0);
    io::write_int_attribute(root, "classes", shape.classes);
    io::write_int_attribute(root, "mask_padding", run.mask_padding ? 1 : 0);
    io::write_int_attribute(root, "epoch", progress.epoch);
    io::write_int_attribute(root, "step_in_epoch", progress.step_in_epoch);
    io::write_int_attribute(root, "global_step", progress.global_step);
    io::write_int_attribute(root, "seed", static_cast<int64_t>(progress.seed));
    io::write_int_attribute(root, "world_size", progress.world_size);
    io::write_int_attribute(root, "batch_size", progress.batch_size);
    write_double_attribute(root, "best_val_loss", progress.best_val_loss);
    io::write_int_attribute(root, "best_epoch", progress.best_epoch);
    write_double_attribute(root, "loss_sum", progress.loss_sum);
    write_double_attribute(root, "correct", progress.correct);
    write_double_attribute(root, "count", progress.count);
    if (progress.loss_scaling) {
      write_double_attribute(root, "loss_scale", progress.loss_scaling->scale);
      io::write_int_attribute(root, "loss_scale_clean_steps", progress.loss_scaling->clean_steps);
      io::write_int_attribute(root, "skipped_steps", progress.loss_scaling->skipped);
    }
    io::write_string_attribute(root, "config", config_ini);
    io::write_string_attribute(root, "run_id", run.run_id);
    io::write_string_attribute(root, "data_path", run.data_path);
    io::write_string_attribute(root, "data_fingerprint", run.data_fingerprint);
    io::write_string_attribute(root, "data_plan", run.data_plan);
    io::write_int_attribute(root, "maxlen", run.maxlen);
    if (!run.tokenizer.empty()) io::write_string_attribute(root, "tokenizer", run.tokenizer);
    // What model.cpu_kernels = auto measured of the core's FMA units: a resume chooses the same kernels.
    if (const std::optional<bool> wide = models::known_avx512_fma_verdict())
      io::write_int_attribute(root, kAvx512FmaWide, *wide ? 1 : 0);
    // Last of the root's attributes: it covers all of them.
    io::write_int_attribute(root, kHeaderChecksum, std::bit_cast<int64_t>(header_checksum(root, tmp)));
    if (!run.vocabulary.empty()) io::write_string_list(root, "vocab", run.vocabulary);
    if (!run.class_names.empty()) io::write_string_list(root, "classes", run.class_names);
    write_floats(root, "params", params);
    files_->optimizer =
        Hid(check_h5_id(H5Gcreate2(root, "optimizer", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "optimizer"),
            Hid::Kind::kGroup);
    io::write_string_attribute(files_->optimizer.get(), "name", optimizer_name);
    io::write_int_attribute(files_->optimizer.get(), "iterations", optimizer_iterations);
  });
}

CheckpointWriter::~CheckpointWriter() {
  abandon();
}

void CheckpointWriter::add_optimizer_buffer(const std::string& name, std::span<const float> values) {
  DDP_CHECK(files_ != nullptr);
  std::lock_guard<std::recursive_mutex> lock(io::hdf5_mutex());
  writing([&] { write_floats(files_->optimizer.get(), name, values); });
  files_->buffer_names += (files_->buffer_names.empty() ? "" : ",") + name;
}

void CheckpointWriter::add_replica_rng_states(const std::vector<std::string>& states) {
  DDP_CHECK(files_ != nullptr);
  if (std::all_of(states.begin(), states.end(), [](const std::string& s) { return s.empty(); })) return;
  std::lock_guard<std::recursive_mutex> lock(io::hdf5_mutex());
  writing([&] {
    Hid group(
        check_h5_id(H5Gcreate2(files_->file.get(), "replica_rng", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT),
                    "replica_rng"),
        Hid::Kind::kGroup);
    io::write_int_attribute(group.get(), "ranks", static_cast<int64_t>(states.size()));
    for (std::size_t rank = 0; rank < states.size(); ++rank) {
      if (!states[rank].empty()) write_bytes(group.get(), std::to_string(rank), states[rank]);
    }
  });
}

void CheckpointWriter::commit() {
  DDP_CHECK(files_ != nullptr);
  const std::unique_ptr<Files> files = [&] {
    std::lock_guard<std::recursive_mutex> lock(io::hdf5_mutex());
    // The close is checked as the flush is: it may be the file's last write, and a file whose close failed
    // (a full disk) is removed, never renamed over the last good checkpoint.
    writing([&] {
      io::write_string_attribute(files_->optimizer.get(), "buffers", files_->buffer_names);
      check_h5(H5Fflush(files_->file.get(), H5F_SCOPE_GLOBAL), "H5Fflush");
      files_->optimizer.close_checked("H5Gclose /optimizer");
      files_->file.close_checked("H5Fclose");
    });
    return std::move(files_);
  }();
  move_into_place(files->tmp, files->path);
}

void copy_checkpoint(const std::string& from, const std::string& to) {
  const std::string tmp = to + ".tmp";
  std::error_code ec;
  std::filesystem::remove(tmp, ec);  // a stale TO.tmp (a link would otherwise be followed)
  if (const std::string why = copy_bytes(from, tmp); !why.empty()) {
    std::filesystem::remove(tmp, ec);
    throw UserError(tmp + ": cannot copy " + from + " here (" + why + "); " + to + " is unchanged");
  }
  move_into_place(tmp, to);
}

void write_checkpoint(const std::string& path, const models::ModelShape& shape, std::span<const float> params,
                      const std::string& optimizer_name, const OptimizerState& optimizer_state,
                      const TrainingProgress& progress, const std::string& config_ini, const RunRecord& run) {
  CheckpointWriter writer(path, shape, params, optimizer_name, optimizer_state.iterations, progress,
                          config_ini, run);
  for (const auto& [name, buffer] : optimizer_state.buffers) writer.add_optimizer_buffer(name, buffer);
  writer.commit();
}

std::string read_checkpoint_run_id(const std::string& path) try {
  const io::DamagedFileGuard guard(path);
  std::lock_guard<std::recursive_mutex> lock(io::hdf5_mutex());
  io::quiet_hdf5_errors();
  Hid file = io::open_file_readonly(path);
  if (io::read_string_attribute(file.get(), "format") != kFormat) {
    throw UserError(path + ": not a ddptrain checkpoint (attribute format != " + kFormat + ")");
  }
  return io::read_string_attribute(file.get(), "run_id");
} catch (const io::Hdf5Error& e) {
  io::throw_unreadable_file(path, e);
}

std::optional<bool> read_checkpoint_fma_verdict(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  try {
    const io::DamagedFileGuard guard(path);
    std::lock_guard<std::recursive_mutex> lock(io::hdf5_mutex());
    io::quiet_hdf5_errors();
    Hid file = io::open_file_readonly(path);
    if (!io::has_attribute(file.get(), kAvx512FmaWide)) return std::nullopt;
    return io::read_int_attribute(file.get(), path, kAvx512FmaWide) == 1;
  } catch (const std::exception&) {
    return std::nullopt;  // reading the whole checkpoint later says what is wrong with it
  }
}

Checkpoint read_checkpoint(const std::string& path, CheckpointParts parts) try {
  const io::DamagedFileGuard guard(path);
  std::lock_guard<std::recursive_mutex> lock(io::hdf5_mutex());
  io::quiet_hdf5_errors();
  Hid file = io::open_file_readonly(path);
  const hid_t root = file.get();
  if (io::read_string_attribute(root, "format") != kFormat) {
    throw UserError(path + ": not a ddptrain checkpoint (attribute format != " + kFormat + ")");
  }
  // Checkpoints written before the header checksum have none.
  if (io::has_attribute(root, kHeaderChecksum) &&
      std::bit_cast<uint64_t>(read_int(root, path, kHeaderChecksum)) != header_checksum(root, path)) {
    throw UserError(
        path +
        ": the checkpoint's attributes (model dimensions, progress, run) do not match the checksum "
        "written with them: the file is damaged (or was edited; to keep an edit, delete its "
        "header_checksum attribute): use another checkpoint (a run directory holds last.h5 and "
        "best.h5)");
  }
  Checkpoint c;
  c.shape.vocab_size = read_int_in_range(root, path, "vocab_size", 1, io::kMaxVocabulary);
  c.shape.embedding_dim = read_int_in_range(root, path, "embedding_dim", 1);
  c.shape.hidden = read_int_in_range(root, path, "hidden", 1);
  c.shape.layers = read_int_in_range(root, path, "layers", 1);
  if (c.shape.vocab_size <= 0 || c.shape.embedding_dim <= 0 || c.shape.hidden <= 0 || c.shape.layers <= 0) {
    throw UserError(path + ": checkpoint has a non-positive model dimension");
  }
  // The variant: absent in the checkpoints of before, which hold the two-class unidirectional LSTM.
  const std::string cell = io::read_string_attribute(root, "cell");
  if (cell == "gru") {
    c.shape.cell = models::Cell::kGru;
  } else if (!cell.empty() && cell != "lstm") {
    throw UserError(path + ": checkpoint attribute cell = " + cell + " is not lstm or gru");
  }
  c.shape.bidirectional = read_flag(root, path, "bidirectional");
  if (io::has_attribute(root, "classes")) {
    const int64_t classes = read_int(root, path, "classes");
    if (classes < 2 || classes > 256) {
      throw UserError(path + ": checkpoint attribute classes = " + std::to_string(classes) +
                      " is not 2 to 256");
    }
    c.shape.classes = static_cast<int>(classes);
  }
  c.run.mask_padding = read_flag(root, path, "mask_padding");
  if (io::link_exists(root, "classes")) {
    c.run.class_names =
        io::read_string_list(root, path, "/classes", static_cast<std::size_t>(c.shape.classes) + 1);
    if (c.run.class_names.size() != static_cast<std::size_t>(c.shape.classes)) {
      throw UserError(path + ": checkpoint dataset /classes names " +
                      (c.run.class_names.size() > static_cast<std::size_t>(c.shape.classes)
                           ? "more"
                           : std::to_string(c.run.class_names.size())) +
                      " classes, not the model's " + std::to_string(c.shape.classes));
    }
  }
  {
    const std::vector<int64_t> dims = io::dataset_dims(io::open_dataset(root, path, "params").get());
    if (dims.size() != 1 || static_cast<long double>(dims[0]) != models::parameter_count(c.shape)) {
      throw UserError(path + ": checkpoint dataset params has the wrong size for this model (" +
                      models::describe(c.shape) + ", vocab_size " + std::to_string(c.shape.vocab_size) +
                      ", embedding_dim " + std::to_string(c.shape.embedding_dim) + ", hidden " +
                      std::to_string(c.shape.hidden) + ")");
    }
  }
  const models::ParamLayout layout(c.shape);
  c.params = read_floats(root, path, "params", layout.total_size());
  TrainingProgress& p = c.progress;
  p.epoch = read_count(root, path, "epoch", 0);
  p.step_in_epoch = read_count(root, path, "step_in_epoch", 0);
  p.global_step = read_count(root, path, "global_step", 0);
  p.seed = static_cast<uint64_t>(read_int(root, path, "seed"));
  p.world_size = read_count(root, path, "world_size", 1);
  p.batch_size = read_count(root, path, "batch_size", 0);
  p.best_val_loss = read_double_attribute(root, path, "best_val_loss");
  // Absent in checkpoints of before: early stopping counts from the checkpoint's epoch.
  p.best_epoch = io::has_attribute(root, "best_epoch") ? read_count(root, path, "best_epoch", 0) : p.epoch;
  if (p.best_epoch > p.epoch) {
    throw UserError(fmt::format("{}: checkpoint attribute best_epoch = {} is after its epoch = {}", path,
                                p.best_epoch, p.epoch));
  }
  p.loss_sum = read_double_attribute(root, path, "loss_sum");
  p.correct = read_double_attribute(root, path, "correct");
  p.count = read_double_attribute(root, path, "count");
  check_epoch_sums(path, p);
  if (io::has_attribute(root, "loss_scale")) {
    using models::LossScale;
    const double scale = read_double_attribute(root, path, "loss_scale");
    // In range before it becomes a float, which cannot hold every double.
    if (!(scale >= LossScale::kSmallest && scale <= LossScale::kLargest)) {
      throw UserError(
          fmt::format("{}: checkpoint attribute loss_scale = {} is not a power of two in [{}, {}]", path,
                      scale, LossScale::kSmallest, LossScale::kLargest));
    }
    LossScale::State scaling;
    scaling.scale = static_cast<float>(scale);
    scaling.clean_steps = read_count(root, path, "loss_scale_clean_steps", 0);
    scaling.skipped = read_count(root, path, "skipped_steps", 0);
    if (const std::string why = LossScale::invalid(scaling); !why.empty())
      throw UserError(path + ": checkpoint attributes loss_scale and loss_scale_clean_steps: " + why);
    p.loss_scaling = scaling;
  }
  c.config_ini = io::read_string_attribute(root, "config");
  c.run.run_id = io::read_string_attribute(root, "run_id");
  c.run.data_path = io::read_string_attribute(root, "data_path");
  c.run.data_fingerprint = io::read_string_attribute(root, "data_fingerprint");
  c.run.data_plan = io::read_string_attribute(root, "data_plan");
  c.run.maxlen =
      H5Aexists(root, "maxlen") > 0 ? read_int_in_range(root, path, "maxlen", 0, io::kMaxSequenceLength) : 0;
  c.has_vocabulary = io::link_exists(root, "vocab");
  c.run.tokenizer = io::read_string_attribute(root, "tokenizer");

  Hid group(H5Gopen2(root, "optimizer", H5P_DEFAULT), Hid::Kind::kGroup);
  if (!group.valid()) throw UserError(path + ": checkpoint group /optimizer is missing");
  c.optimizer_name = io::read_string_attribute(group.get(), "name");
  c.optimizer.iterations = read_count(group.get(), path, "iterations", 0);
  // The optimizer names its own buffers ("m,v" for Adam); the checkpoint only stores them.
  std::stringstream names(io::read_string_attribute(group.get(), "buffers"));
  if (parts == CheckpointParts::kModel) return c;
  for (std::string name; std::getline(names, name, ',');) {
    c.optimizer.buffers.emplace_back(name, read_floats(group.get(), path, name, layout.total_size()));
  }
  c.replica_rng_states = read_replica_rng_states(root, path);
  return c;
} catch (const io::Hdf5Error& e) {
  io::throw_unreadable_file(path, e);
}

}  // namespace ddp::engine
