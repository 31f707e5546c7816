#include "io/dataset_writer.h"

#include <fmt/format.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <mutex>
#include <stdexcept>
#include <system_error>

#include "engine/base/errors.h"
#include "engine/base/file_kind.h"
#include "engine/base/progress.h"

namespace ddp::io {
namespace {

Hid create_property_list(hid_t property_class) {
  Hid list(check_h5_id(H5Pcreate(property_class), "H5Pcreate"), Hid::Kind::kPropertyList);
  // No object timestamps: the same input then gives a byte-identical file.
  check_h5(H5Pset_obj_track_times(list.get(), false), "H5Pset_obj_track_times");
  return list;
}

Hid create_dataset(hid_t group, const char* name, hid_t file_type, int rank, const hsize_t* dims) {
  Hid space(check_h5_id(H5Screate_simple(rank, dims, nullptr), "H5Screate_simple"), Hid::Kind::kDataspace);
  Hid dcpl = create_property_list(H5P_DATASET_CREATE);
  // Every element is written, so skip writing fill values first.
  check_h5(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
  check_h5(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), "H5Pset_layout");
  return Hid(check_h5_id(
                 H5Dcreate2(group, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), name),
             Hid::Kind::kDataset);
}

void write_block(hid_t dataset, int rank, int64_t first, int64_t rows, int64_t columns, hid_t memory_type,
                 const void* data, const std::string& what) {
  const hsize_t start[2] = {static_cast<hsize_t>(first), 0};
  const hsize_t block[2] = {static_cast<hsize_t>(rows), static_cast<hsize_t>(columns)};
  const hsize_t one[2] = {1, 1};
  Hid file_space(check_h5_id(H5Dget_space(dataset), "H5Dget_space"), Hid::Kind::kDataspace);
  check_h5(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, one, block),
           "H5Sselect_hyperslab");
  Hid memory_space(check_h5_id(H5Screate_simple(rank, block, nullptr), "H5Screate_simple"),
                   Hid::Kind::kDataspace);
  check_h5(H5Dwrite(dataset, memory_type, memory_space.get(), file_space.get(), H5P_DEFAULT, data),
           what.c_str());
}

// 0.1 as "0.1", not "0.100000".
std::string format_fraction(double value) {
  return fmt::format("{:g}", value);
}

// One writer at a time is what prepare runs; a second one (tests) leaves the slot to the first.
char g_file_in_progress[4096];
std::atomic<bool> g_slot_taken{false};

}  // namespace

const char* dataset_file_in_progress() {
  return g_file_in_progress;
}

void check_output_replaceable(const std::string& path, const std::string& command) {
  std::error_code error;
  if (!std::filesystem::is_regular_file(path, error)) return;
  try {
    inspect_dataset(path, SplitsNeeded::kTestOnly);
  } catch (const UserError& e) {
    throw UserError(command + ": --output " + path +
                    " is a file but no dataset, which writing one would replace (" + e.what() +
                    "): give --output another name");
  }
}

void DatasetWriter::release_progress_slot() {
  if (!holds_progress_slot_) return;
  g_file_in_progress[0] = '\0';
  g_slot_taken.store(false);
  holds_progress_slot_ = false;
}

template <typename Write>
void DatasetWriter::writing(Write&& write) {
  write_or_abandon(tmp_path_, write, [this] { abandon(); });
}

void DatasetWriter::abandon() {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  for (Hid* id : {&train_x_, &train_y_, &test_x_, &test_y_, &val_x_, &val_y_, &file_}) id->discard();
  std::error_code ignored;
  std::filesystem::remove(tmp_path_, ignored);
  release_progress_slot();
}

DatasetWriter::DatasetWriter(std::string path, int vocab_size, int maxlen, int64_t training_rows,
                             int64_t test_rows, int64_t val_rows)
    : path_(std::move(path)),
      tmp_path_(path_ + ".tmp"),
      maxlen_(maxlen),
      train_rows_(training_rows - val_rows) {
  DDP_CHECK(val_rows >= 0 && train_rows_ >= 0 && test_rows >= 0);
  namespace fs = std::filesystem;
  // The finished file is renamed over PATH: that must not replace a device (/dev/null) or a named pipe.
  for (const std::string& file : {path_, tmp_path_}) {
    if (const std::string kind = special_file_kind(file, /*follow_links=*/false); !kind.empty()) {
      throw UserError(file + ": not a plain file (" + kind +
                      "), which writing the dataset would replace: give --output a file's name");
    }
  }
  const fs::path output(path_);
  std::error_code error;
  if (output.has_parent_path()) {
    fs::create_directories(output.parent_path(), error);
    if (error) {
      throw UserError(output.parent_path().string() + ": cannot create directory (" + error.message() + ")");
    }
  }
  // The datasets are contiguous, so the file's size is known now: a file that cannot fit is refused before
  // hours of writing, not when the disk is full.
  const double bytes = static_cast<double>(training_rows + test_rows) * (4.0 * maxlen + 1.0);
  const fs::space_info space =
      fs::space(output.has_parent_path() ? output.parent_path() : fs::path("."), error);
  if (!error && bytes > static_cast<double>(space.available)) {
    throw UserError(
        fmt::format("{}: the dataset needs {} ({} rows of {} tokens) and its file system has {} free", path_,
                    progress::bytes_text(bytes), training_rows + test_rows, maxlen,
                    progress::bytes_text(static_cast<double>(space.available))));
  }
  if (tmp_path_.size() < sizeof(g_file_in_progress) && !g_slot_taken.exchange(true)) {
    tmp_path_.copy(g_file_in_progress, tmp_path_.size());
    g_file_in_progress[tmp_path_.size()] = '\0';
    holds_progress_slot_ = true;
  }
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  quiet_hdf5_errors();
  try {
    file_ =
        Hid(check_h5_id(H5Fcreate(tmp_path_.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "H5Fcreate"),
            Hid::Kind::kFile);
  } catch (const std::runtime_error& e) {
    // Usually permissions or a full disk: the user's to fix, so a UserError with HDF5's reason. A lock that
    // another process holds (EAGAIN) is a second prepare of the same --output.
    release_progress_slot();
    const bool locked = std::string(e.what()).find("temporarily unavailable") != std::string::npos;
    throw UserError(
        path_ + ": cannot create the dataset file (" + e.what() + ")" +
        (locked ? ": another process is writing " + tmp_path_ + " (a second prepare of this --output?)"
                : ""));
  }
  writing([&] {
    write_int_attribute(file_.get(), "vocab_size", vocab_size);
    write_int_attribute(file_.get(), "maxlen", maxlen);
    struct Group {
      const char* name;
      int64_t rows;
      Hid* x;
      Hid* y;
    };
    for (const Group& g :
         {Group{"train", train_rows_, &train_x_, &train_y_}, Group{"test", test_rows, &test_x_, &test_y_},
          Group{"val", val_rows, &val_x_, &val_y_}}) {
      if (g.x == &val_x_ && val_rows == 0) continue;  // a /val group means validation rows
      Hid gcpl = create_property_list(H5P_GROUP_CREATE);
      Hid group(check_h5_id(H5Gcreate2(file_.get(), g.name, H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), g.name),
                Hid::Kind::kGroup);
      const hsize_t dims[2] = {static_cast<hsize_t>(g.rows), static_cast<hsize_t>(maxlen)};
      *g.x = create_dataset(group.get(), "x", H5T_STD_I32LE, 2, dims);
      *g.y = create_dataset(group.get(), "y", H5T_STD_U8LE, 1, dims);
    }
  });
}

DatasetWriter::~DatasetWriter() {
  if (committed_) return;
  abandon();
}

void DatasetWriter::write_rows(const std::string& split, int64_t first, std::span<const int32_t> tokens,
                               std::span<const uint8_t> labels) {
  DDP_CHECK(split == "train" || split == "test");
  DDP_CHECK(tokens.size() == labels.size() * static_cast<size_t>(maxlen_));
  const auto rows = static_cast<int64_t>(labels.size());
  if (split == "test") {
    write_group_rows("test", first, tokens.data(), labels.data(), rows);
    return;
  }
  // A block may straddle the end of /train: its head goes there, its tail to /val.
  const int64_t to_train = std::clamp<int64_t>(train_rows_ - first, 0, rows);
  write_group_rows("train", first, tokens.data(), labels.data(), to_train);
  write_group_rows("val", first + to_train - train_rows_, tokens.data() + to_train * maxlen_,
                   labels.data() + to_train, rows - to_train);
}

void DatasetWriter::write_group_rows(const std::string& group, int64_t first, const int32_t* tokens,
                                     const uint8_t* labels, int64_t rows) {
  if (rows == 0) return;
  const Hid& x = group == "train" ? train_x_ : group == "test" ? test_x_ : val_x_;
  const Hid& y = group == "train" ? train_y_ : group == "test" ? test_y_ : val_y_;
  DDP_CHECK(x.get() >= 0 && first >= 0);
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  writing([&] {
    write_block(x.get(), 2, first, rows, maxlen_, H5T_NATIVE_INT32, tokens, "H5Dwrite /" + group + "/x");
    write_block(y.get(), 1, first, rows, 1, H5T_NATIVE_UINT8, labels, "H5Dwrite /" + group + "/y");
  });
}

void DatasetWriter::write_vocab(const std::vector<std::string>& words) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  writing([&] { write_string_list(file_.get(), "vocab", words); });
}

void DatasetWriter::write_classes(int num_classes, const std::vector<std::string>& names) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  writing([&] {
    if (num_classes != 2) write_int_attribute(file_.get(), "num_classes", num_classes);
    if (!names.empty()) write_string_list(file_.get(), "classes", names);
  });
}

void DatasetWriter::write_attribute(const std::string& name, const std::string& value) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  writing([&] { write_string_attribute(file_.get(), name, value); });
}

void DatasetWriter::commit() {
  {
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    // Checked here: the close in Hid's destructor cannot report a failed final write, and a file whose flush
    // or close failed is abandoned, never renamed into place.
    writing([&] {
      check_h5(H5Fflush(file_.get(), H5F_SCOPE_GLOBAL), "H5Fflush");
      for (Hid* set : {&train_x_, &train_y_, &test_x_, &test_y_, &val_x_, &val_y_})
        set->close_checked("H5Dclose");
      file_.close_checked("H5Fclose");
    });
  }
  std::error_code error;
  // Said once done (check_output_replaceable let only an earlier dataset be replaced): a run that fails
  // before leaves it as it was.
  const bool replaces = std::filesystem::is_regular_file(path_, error);
  std::filesystem::rename(tmp_path_, path_, error);
  if (error) throw UserError(path_ + ": cannot move " + tmp_path_ + " into place (" + error.message() + ")");
  committed_ = true;
  if (replaces) std::printf("note: replaced the dataset %s held before\n", path_.c_str());
  release_progress_slot();
}

void check_val_fraction(const std::string& command, double val_fraction) {
  // Written so that NaN fails too.
  if (!(val_fraction >= 0 && val_fraction < 1)) {
    throw UserError(command + ": --val-fraction must be in [0, 1), got " + format_fraction(val_fraction));
  }
}

int64_t val_rows_of(const std::string& command, double val_fraction, int64_t training_rows) {
  check_val_fraction(command, val_fraction);
  const int64_t val_rows = std::llround(val_fraction * static_cast<double>(training_rows));
  const std::string of = command + ": --val-fraction " + format_fraction(val_fraction) + " of " +
                         std::to_string(training_rows) + " training rows";
  if (val_rows >= training_rows) throw UserError(of + " leaves no row in /train");
  if (val_fraction > 0 && val_rows == 0) throw UserError(of + " gives no row to /val");
  return val_rows;
}

}  // namespace ddp::io
