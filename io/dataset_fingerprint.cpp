#include "io/dataset_fingerprint.h"

#include <fmt/format.h>
#include <mutex>
#include <vector>

#include "io/damaged_file_guard.h"
#include "io/hdf5_util.h"
#include "io/mix.h"

namespace ddp::io {
namespace {

constexpr int64_t kSampledRows = 64;

uint64_t combine(uint64_t hash, uint64_t value) {
  return mix64(hash ^ mix64(value + 0x9E3779B97F4A7C15ULL));
}

// Reads row `row` of a 1-D or 2-D dataset (`columns` elements) as `memory_type`.
void read_row(hid_t dataset, const std::string& what, int64_t row, int64_t columns, hid_t memory_type,
              void* out) {
  Hid file_space(check_h5_id(H5Dget_space(dataset), "H5Dget_space"), Hid::Kind::kDataspace);
  const int rank = H5Sget_simple_extent_ndims(file_space.get());
  check_h5(rank, "H5Sget_simple_extent_ndims");
  const hsize_t start[2] = {static_cast<hsize_t>(row), 0};
  const hsize_t count[2] = {1, static_cast<hsize_t>(columns)};
  check_h5(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, count, nullptr),
           "H5Sselect_hyperslab");
  const hsize_t elements = static_cast<hsize_t>(columns);
  Hid memory_space(check_h5_id(H5Screate_simple(1, &elements, nullptr), "H5Screate_simple"),
                   Hid::Kind::kDataspace);
  check_h5(H5Dread(dataset, memory_type, memory_space.get(), file_space.get(), H5P_DEFAULT, out),
           what.c_str());
}

uint64_t hash_split(hid_t file, const DatasetInfo& info, const std::string& split, int64_t rows) {
  uint64_t hash = combine(0, static_cast<uint64_t>(rows));
  if (rows == 0) return hash;
  Hid x = open_dataset(file, info.path, "/" + split + "/x");
  Hid y = open_dataset(file, info.path, "/" + split + "/y");
  std::vector<int32_t> tokens(static_cast<size_t>(info.maxlen));
  const int64_t samples = std::min(rows, kSampledRows);
  for (int64_t i = 0; i < samples; ++i) {
    const int64_t row = samples == 1 ? 0 : i * (rows - 1) / (samples - 1);
    read_row(x.get(), "H5Dread " + info.path + " /" + split + "/x", row, info.maxlen, H5T_NATIVE_INT32,
             tokens.data());
    int32_t label = 0;
    read_row(y.get(), "H5Dread " + info.path + " /" + split + "/y", row, 1, H5T_NATIVE_INT32, &label);
    for (const int32_t token : tokens) hash = combine(hash, static_cast<uint32_t>(token));
    hash = combine(hash, static_cast<uint32_t>(label));
  }
  return hash;
}

}  // namespace

std::string dataset_fingerprint(const DatasetInfo& info) try {
  const DamagedFileGuard guard(info.path);
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  quiet_hdf5_errors();
  Hid file = open_file_readonly(info.path);
  uint64_t content = 0;
  for (const auto& [split, rows] : {std::pair{"train", info.train_size}, std::pair{"test", info.test_size}}) {
    content = combine(content, hash_split(file.get(), info, split, rows));
  }
  return fmt::format("train {}, test {}, vocab {}, maxlen {}, content {:016x}", info.train_size,
                     info.test_size, info.vocab_size, info.maxlen, content);
} catch (const Hdf5Error& e) {
  throw_unreadable_file(info.path, e);
}

}  // namespace ddp::io
