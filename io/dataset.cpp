#include "io/dataset.h"

#include <sys/stat.h>

#include <fmt/format.h>
#include <algorithm>
#include <climits>
#include <cstdio>
#include <functional>
#include <span>
#include <stdexcept>
#include <vector>

#include "engine/base/errors.h"
#include "io/damaged_file_guard.h"
#include "io/hdf5_util.h"

namespace ddp::io {

namespace {

// Rows per validation read: at most 4096, fewer for very long rows so the buffer stays near 16 MiB.
constexpr int64_t kMaxValidateRows = 4096;
constexpr int64_t kMaxValidateElements = int64_t{1} << 22;
// Labels per read in label_counts: 1 MiB.
constexpr int64_t kLabelChunkRows = int64_t{1} << 20;

// "int32", "uint8", "float64", "string", ... for messages about a wrong element type.
std::string describe_type(hid_t type) {
  const H5T_class_t type_class = H5Tget_class(type);
  const size_t bits = H5Tget_size(type) * 8;
  switch (type_class) {
    case H5T_INTEGER: {
      const H5T_sign_t sign = H5Tget_sign(type);
      if (sign == H5T_SGN_ERROR) check_h5(-1, "H5Tget_sign");
      return (sign == H5T_SGN_NONE ? "uint" : "int") + std::to_string(bits);
    }
    case H5T_FLOAT:
      return "float" + std::to_string(bits);
    case H5T_STRING:
      return "string";
    case H5T_COMPOUND:
      return "compound";
    case H5T_ENUM: {
      // h5py stores numpy's bool as an enum of FALSE and TRUE.
      char* first = H5Tget_nmembers(type) == 2 ? H5Tget_member_name(type, 0) : nullptr;
      const bool is_bool = first != nullptr && std::string(first) == "FALSE";
      if (first != nullptr) H5free_memory(first);
      return is_bool ? "bool" : "enum";
    }
    case H5T_ARRAY:
      return "array";
    case H5T_VLEN:
      return "vlen";
    case H5T_NO_CLASS:
      check_h5(-1, "H5Tget_class");
      break;
    default:
      break;
  }
  return "type class " + std::to_string(static_cast<int>(type_class));
}

std::string describe_shape(const std::vector<int64_t>& dims) {
  if (dims.empty()) return "scalar";
  std::string text = "[";
  for (size_t i = 0; i < dims.size(); ++i) text += (i > 0 ? ", " : "") + std::to_string(dims[i]);
  return text + "]";
}

struct Element {
  H5T_class_t type_class = H5T_NO_CLASS;
  size_t size = 0;
  H5T_sign_t sign = H5T_SGN_ERROR;
  std::string description;  // "int32 [25000, 80]"
};

Element element_of(hid_t dataset, const std::vector<int64_t>& dims) {
  Hid type(check_h5_id(H5Dget_type(dataset), "H5Dget_type"), Hid::Kind::kDatatype);
  Element e;
  e.type_class = H5Tget_class(type.get());
  e.size = H5Tget_size(type.get());
  e.sign = e.type_class == H5T_INTEGER ? H5Tget_sign(type.get()) : H5T_SGN_NONE;
  if (e.type_class == H5T_NO_CLASS || e.size == 0 || e.sign == H5T_SGN_ERROR) {
    check_h5(-1, "H5Tget_class/size/sign");
  }
  e.description = describe_type(type.get()) + " " + describe_shape(dims);
  return e;
}

// A dataset compressed with a filter this HDF5 library lacks (h5py's LZF, a plugin's Blosc or Zstandard)
// cannot be read; say which filter and what to write instead, not "damaged file" at the first read.
void require_available_filters(hid_t dataset, const std::string& path, const std::string& name) {
  Hid plist(check_h5_id(H5Dget_create_plist(dataset), "H5Dget_create_plist"), Hid::Kind::kPropertyList);
  const int filters = H5Pget_nfilters(plist.get());
  check_h5(filters < 0 ? -1 : 0, "H5Pget_nfilters");
  for (int i = 0; i < filters; ++i) {
    unsigned flags = 0;
    size_t values = 0;
    char filter_name[128] = {};
    unsigned config = 0;
    const H5Z_filter_t id = H5Pget_filter2(plist.get(), static_cast<unsigned>(i), &flags, &values, nullptr,
                                           sizeof(filter_name), filter_name, &config);
    check_h5(id < 0 ? -1 : 0, "H5Pget_filter2");
    const htri_t available = H5Zfilter_avail(id);
    check_h5(available < 0 ? -1 : 0, "H5Zfilter_avail");
    // Even an optional filter (h5py marks LZF so) was applied to every chunk it could compress.
    if (available > 0) continue;
    const std::string known = id == 32000 ? "lzf" : id == 32001 ? "blosc" : id == 32015 ? "zstd" : "";
    const std::string shown = !known.empty() ? known : filter_name[0] != '\0' ? one_line(filter_name) : "";
    throw UserError(path + ": dataset " + name + " is stored with the filter " +
                    (shown.empty() ? "" : "'" + shown + "' ") + "(id " + std::to_string(id) +
                    "), which this HDF5 library does not have: write it uncompressed or with "
                    "compression='gzip'");
  }
}

struct SplitShape {
  int64_t rows = 0;
  int64_t columns = 0;
};

SplitShape check_split(hid_t file, const std::string& path, const std::string& split) {
  const std::string x_name = "/" + split + "/x";
  const std::string y_name = "/" + split + "/y";
  Hid x = open_dataset(file, path, x_name);
  Hid y = open_dataset(file, path, y_name);
  const std::vector<int64_t> x_dims = dataset_dims(x.get());
  const std::vector<int64_t> y_dims = dataset_dims(y.get());
  const Element xe = element_of(x.get(), x_dims);
  const Element ye = element_of(y.get(), y_dims);
  if (x_dims.size() != 2 || xe.type_class != H5T_INTEGER || xe.size != 4 || xe.sign != H5T_SGN_2) {
    throw UserError(path + ": dataset " + x_name + " must be int32 [N, maxlen], found " + xe.description +
                    (x_dims.size() == 2 ? " (with numpy: x.astype(np.int32))" : ""));
  }
  // Any one-byte unsigned integer: h5py's uint8 and an enum-free bool-like u1 both qualify.
  if (y_dims.size() != 1 || ye.type_class != H5T_INTEGER || ye.size != 1 || ye.sign != H5T_SGN_NONE) {
    throw UserError(path + ": dataset " + y_name + " must be uint8 [N], found " + ye.description +
                    (y_dims.size() == 1 ? " (with numpy: y.astype(np.uint8))" : ""));
  }
  require_available_filters(x.get(), path, x_name);
  require_available_filters(y.get(), path, y_name);
  if (x_dims[0] != y_dims[0]) {
    throw UserError(path + ": " + x_name + " has " + std::to_string(x_dims[0]) + " rows but " + y_name +
                    " has " + std::to_string(y_dims[0]));
  }
  return {x_dims[0], x_dims[1]};
}

int positive_int_attribute(hid_t file, const std::string& path, const std::string& name, int most) {
  const int64_t value = read_int_attribute(file, path, name);
  if (value <= 0) {
    throw UserError(path + ": attribute " + name + " must be positive, found " + std::to_string(value));
  }
  if (value > most) {
    throw UserError(path + ": attribute " + name + " = " + std::to_string(value) + " is more than " +
                    std::to_string(most));
  }
  return static_cast<int>(value);
}

// Selects rows [first, first + count) of a rank-1 or rank-2 dataspace.
void select_rows(hid_t space, int64_t first, int64_t count, int64_t columns) {
  const hsize_t start[2] = {static_cast<hsize_t>(first), 0};
  const hsize_t block[2] = {static_cast<hsize_t>(count), static_cast<hsize_t>(columns)};
  const hsize_t one[2] = {1, 1};
  check_h5(H5Sselect_hyperslab(space, H5S_SELECT_SET, start, nullptr, one, block), "H5Sselect_hyperslab");
}

// The rows of `split` in `info`; std::invalid_argument for an unknown split or rows outside it (a caller's
// bug: the rows come from shard_of over the sizes inspect_dataset reported).
int64_t checked_rows(const char* function, const DatasetInfo& info, const std::string& split, int64_t begin,
                     int64_t end) {
  if (split != "train" && split != "test" && split != "val") {
    throw std::invalid_argument(std::string(function) + ": unknown split " + split);
  }
  const int64_t rows = split == "train" ? info.train_size : split == "test" ? info.test_size : info.val_size;
  if (begin < 0 || begin > end || end > rows) {
    throw std::invalid_argument(std::string(function) + ": rows [" + std::to_string(begin) + ", " +
                                std::to_string(end) + ") outside " + split + " of " + std::to_string(rows) +
                                " rows");
  }
  return rows;
}

}  // namespace

FileStamp file_stamp(const std::string& path) {
  struct stat status {};
  if (stat(path.c_str(), &status) != 0) return {};
  return {static_cast<uint64_t>(status.st_dev), static_cast<uint64_t>(status.st_ino),
          static_cast<int64_t>(status.st_size),
          static_cast<int64_t>(status.st_mtim.tv_sec) * 1'000'000'000 + status.st_mtim.tv_nsec};
}

DatasetInfo inspect_dataset(const std::string& path, SplitsNeeded needed) try {
  const DamagedFileGuard guard(path);
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  Hid file = open_file_readonly(path);
  const bool reads_train = needed == SplitsNeeded::kTraining;
  // Presence of all first, so a file missing several names the first in schema order.
  for (const char* name : {"/train/x", "/train/y", "/test/x", "/test/y"}) {
    if (reads_train || std::string_view(name).starts_with("/test")) open_dataset(file.get(), path, name);
  }
  SplitShape train = reads_train ? check_split(file.get(), path, "train") : SplitShape{};
  const SplitShape test = check_split(file.get(), path, "test");
  if (!reads_train) train.columns = test.columns;
  // /val is optional, but once there it must have the schema of /train.
  const bool has_val = link_exists(file.get(), "/val");
  const SplitShape val = has_val ? check_split(file.get(), path, "val") : SplitShape{0, train.columns};

  DatasetInfo info;
  info.path = path;
  // Stamped once open, so that a file swapped in before the open stamps as the one read.
  info.stamp = file_stamp(path);
  info.train_size = train.rows;
  info.test_size = test.rows;
  info.val_size = val.rows;
  info.has_val = has_val;
  info.vocab_size = positive_int_attribute(file.get(), path, "vocab_size", kMaxVocabulary);
  info.maxlen = positive_int_attribute(file.get(), path, "maxlen", kMaxSequenceLength);
  for (const auto& [name, shape] :
       {std::pair{"/train/x", train}, std::pair{"/test/x", test}, std::pair{"/val/x", val}}) {
    if (shape.columns != info.maxlen) {
      throw UserError(path + ": dataset " + name + " has " + std::to_string(shape.columns) +
                      " columns but attribute maxlen = " + std::to_string(info.maxlen));
    }
  }
  info.has_vocab = link_exists(file.get(), "/vocab");
  if (info.has_vocab) {
    // A list of another length would give some ids no word, or words no id, without a word said.
    const std::vector<int64_t> dims = dataset_dims(open_dataset(file.get(), path, "/vocab").get());
    if (dims.size() != 1 || dims[0] != info.vocab_size) {
      throw UserError(
          fmt::format("{}: /vocab holds {} words but attribute vocab_size = {} (it names the word of "
                      "each token id, 0 to vocab_size - 1)",
                      path, dims.size() == 1 ? std::to_string(dims[0]) : "not a list of", info.vocab_size));
    }
  }
  info.tokenizer = read_string_attribute(file.get(), "tokenizer");
  if (has_attribute(file.get(), "num_classes")) {
    const int64_t classes = read_int_attribute(file.get(), path, "num_classes");
    // Labels are uint8: at most 256 classes.
    if (classes < 2 || classes > 256) {
      throw UserError(path + ": attribute num_classes = " + std::to_string(classes) +
                      " must be 2 to 256 (a classifier needs two classes; labels are uint8)");
    }
    info.num_classes = static_cast<int>(classes);
  }
  if (link_exists(file.get(), "/classes")) {
    info.class_names =
        read_string_list(file.get(), path, "/classes", static_cast<std::size_t>(info.num_classes) + 1);
    if (info.class_names.size() != static_cast<std::size_t>(info.num_classes)) {
      throw UserError(path + ": /classes names " + std::to_string(info.class_names.size()) +
                      " classes but num_classes = " + std::to_string(info.num_classes));
    }
    // Reports, predictions and the class balance name classes by these: two alike could not be told apart.
    for (std::size_t k = 0; k < info.class_names.size(); ++k) {
      for (std::size_t j = 0; j < k; ++j) {
        if (info.class_names[j] != info.class_names[k]) continue;
        throw UserError(
            fmt::format("{}: /classes names classes {} and {} alike (\"{}\"): give each class a name "
                        "of its own",
                        path, j, k, one_line(info.class_names[k])));
      }
    }
  }
  return info;
} catch (const Hdf5Error& e) {
  throw_unreadable_file(path, e);
}

std::string rows_without_tokens_note(const DatasetInfo& info, const std::string& split, int64_t count,
                                     int64_t rows) {
  return "note: " + std::to_string(count) + " of the " + std::to_string(rows) + " rows of " + info.path +
         " /" + split +
         " hold no token (every id 0): empty documents, or rows a writer reserved and never filled, which "
         "HDF5 reads as zeros with label 0";
}

std::string class_name(const DatasetInfo& info, int k) {
  if (k >= 0 && static_cast<std::size_t>(k) < info.class_names.size())
    return info.class_names[static_cast<std::size_t>(k)];
  return std::to_string(k);
}

int64_t validate_rows(const DatasetInfo& info, const std::string& split, int64_t begin, int64_t end,
                      const std::function<void()>& progress) try {
  checked_rows("validate_rows", info, split, begin, end);
  const std::string x_name = "/" + split + "/x";
  const std::string y_name = "/" + split + "/y";
  const int64_t columns = info.maxlen;
  if (columns <= 0) {
    throw std::invalid_argument("validate_rows: DatasetInfo has no maxlen (use inspect_dataset)");
  }
  const int64_t chunk_rows = std::clamp<int64_t>(kMaxValidateElements / columns, 1, kMaxValidateRows);

  const DamagedFileGuard guard(info.path);
  Hid file;
  Hid x;
  Hid y;
  Hid x_space;
  Hid y_space;
  {
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    file = open_file_readonly(info.path);
    x = open_dataset(file.get(), info.path, x_name);
    y = open_dataset(file.get(), info.path, y_name);
    x_space = Hid(check_h5_id(H5Dget_space(x.get()), "H5Dget_space"), Hid::Kind::kDataspace);
    y_space = Hid(check_h5_id(H5Dget_space(y.get()), "H5Dget_space"), Hid::Kind::kDataspace);
  }
  std::vector<int32_t> tokens(static_cast<size_t>(chunk_rows * columns));
  std::vector<uint8_t> labels(static_cast<size_t>(chunk_rows));
  int64_t rows_without_tokens = 0;
  for (int64_t first = begin; first < end; first += chunk_rows) {
    const int64_t count = std::min(chunk_rows, end - first);
    {
      // Lock per chunk, not per call: the prefetch thread of a reader may be waiting for HDF5 too.
      std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
      const hsize_t memory_dims[2] = {static_cast<hsize_t>(count), static_cast<hsize_t>(columns)};
      Hid x_memory(check_h5_id(H5Screate_simple(2, memory_dims, nullptr), "H5Screate_simple"),
                   Hid::Kind::kDataspace);
      Hid y_memory(check_h5_id(H5Screate_simple(1, memory_dims, nullptr), "H5Screate_simple"),
                   Hid::Kind::kDataspace);
      select_rows(x_space.get(), first, count, columns);
      select_rows(y_space.get(), first, count, 1);
      check_h5(H5Dread(x.get(), H5T_NATIVE_INT32, x_memory.get(), x_space.get(), H5P_DEFAULT, tokens.data()),
               ("H5Dread " + x_name).c_str());
      check_h5(H5Dread(y.get(), H5T_NATIVE_UINT8, y_memory.get(), y_space.get(), H5P_DEFAULT, labels.data()),
               ("H5Dread " + y_name).c_str());
    }
    for (int64_t r = 0; r < count; ++r) {
      const int32_t* row = tokens.data() + r * columns;
      if (std::all_of(row, row + columns, [](int32_t id) { return id == 0; })) ++rows_without_tokens;
      for (int64_t c = 0; c < columns; ++c) {
        if (row[c] < 0 || row[c] >= info.vocab_size) {
          throw UserError(info.path + ": " + x_name + "[" + std::to_string(first + r) + ", " +
                          std::to_string(c) + "] = " + std::to_string(row[c]) +
                          " is outside [0, vocab_size=" + std::to_string(info.vocab_size) + ")");
        }
      }
      if (labels[r] >= info.num_classes) {
        throw UserError(info.path + ": " + y_name + "[" + std::to_string(first + r) +
                        "] = " + std::to_string(labels[r]) + " is not a label (" +
                        (info.num_classes == 2
                             ? std::string("must be 0 or 1")
                             : "num_classes = " + std::to_string(info.num_classes) + ": must be 0 to " +
                                   std::to_string(info.num_classes - 1)) +
                        ")");
      }
    }
    if (progress) progress();
  }
  return rows_without_tokens;
} catch (const Hdf5Error& e) {
  throw_unreadable_file(info.path, e);
}

namespace {

// Calls visit(labels of rows [first, first + count)) chunk by chunk over rows [begin, end) of split.
template <typename Visit>
void for_each_label_chunk(const char* function, const DatasetInfo& info, const std::string& split,
                          int64_t begin, int64_t end, Visit&& visit) try {
  checked_rows(function, info, split, begin, end);
  if (begin == end) return;
  const std::string y_name = "/" + split + "/y";
  const DamagedFileGuard guard(info.path);
  Hid file;
  Hid y;
  Hid y_space;
  {
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    file = open_file_readonly(info.path);
    y = open_dataset(file.get(), info.path, y_name);
    y_space = Hid(check_h5_id(H5Dget_space(y.get()), "H5Dget_space"), Hid::Kind::kDataspace);
  }
  std::vector<uint8_t> labels(static_cast<size_t>(std::min(kLabelChunkRows, end - begin)));
  for (int64_t first = begin; first < end; first += kLabelChunkRows) {
    const int64_t count = std::min(kLabelChunkRows, end - first);
    {
      // Per chunk, as in validate_rows: a reader's prefetch thread may be waiting for HDF5.
      std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
      const hsize_t memory_dims[1] = {static_cast<hsize_t>(count)};
      Hid y_memory(check_h5_id(H5Screate_simple(1, memory_dims, nullptr), "H5Screate_simple"),
                   Hid::Kind::kDataspace);
      select_rows(y_space.get(), first, count, 1);
      check_h5(H5Dread(y.get(), H5T_NATIVE_UINT8, y_memory.get(), y_space.get(), H5P_DEFAULT, labels.data()),
               ("H5Dread " + info.path + " " + y_name).c_str());
    }
    visit(std::span<const uint8_t>(labels.data(), static_cast<size_t>(count)));
  }
} catch (const Hdf5Error& e) {
  throw_unreadable_file(info.path, e);
}

}  // namespace

std::vector<int64_t> label_counts(const DatasetInfo& info, const std::string& split, int64_t begin,
                                  int64_t end) {
  std::vector<int64_t> counts(2, 0);
  for_each_label_chunk("label_counts", info, split, begin, end, [&](std::span<const uint8_t> labels) {
    for (const uint8_t label : labels) {
      if (label >= counts.size()) counts.resize(size_t{label} + 1, 0);
      ++counts[label];
    }
  });
  return counts;
}

std::vector<uint8_t> read_labels(const DatasetInfo& info, const std::string& split, int64_t begin,
                                 int64_t end) {
  std::vector<uint8_t> all;
  all.reserve(static_cast<size_t>(end - begin));
  for_each_label_chunk("read_labels", info, split, begin, end, [&](std::span<const uint8_t> labels) {
    all.insert(all.end(), labels.begin(), labels.end());
  });
  return all;
}

std::string class_balance_text(const std::vector<int64_t>& counts, const std::vector<std::string>& names) {
  int64_t total = 0;
  for (const int64_t n : counts) total += n;
  if (total == 0) return "no rows";
  std::string text;
  for (size_t label = 0; label < counts.size(); ++label) {
    text += fmt::format("{}{:.1f}% {}", label > 0 ? ", " : "",
                        100.0 * static_cast<double>(counts[label]) / static_cast<double>(total),
                        label < names.size() ? one_line(names[label]) : std::to_string(label));
  }
  return text;
}

Shard shard_of(int64_t n, int rank, int world, bool cover_all) {
  if (n < 0 || world < 1 || rank < 0 || rank >= world) {
    throw std::invalid_argument("shard_of: bad arguments n=" + std::to_string(n) +
                                " rank=" + std::to_string(rank) + " world=" + std::to_string(world));
  }
  const int64_t each = n / world;
  if (!cover_all) return {rank * each, (rank + 1) * each};
  // The first n % world ranks take one extra row each; shards stay contiguous and in rank order.
  const int64_t extra = n % world;
  const int64_t begin = rank * each + std::min<int64_t>(rank, extra);
  return {begin, begin + each + (rank < extra ? 1 : 0)};
}

}  // namespace ddp::io
