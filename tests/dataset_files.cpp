#include "tests/dataset_files.h"

#include <algorithm>
#include <mutex>

#include "io/hdf5_util.h"

namespace ddp::testing {
namespace {

using io::check_h5;
using io::check_h5_id;
using io::dataset_dims;
using io::hdf5_mutex;
using io::Hid;
using io::open_dataset;
using io::open_file_readonly;
using io::quiet_hdf5_errors;
using io::write_int_attribute;

void write_dataset(hid_t group, const char* name, hid_t file_type, hid_t memory_type,
                   std::vector<hsize_t> dims, const void* data, const std::string& external = "",
                   bool chunked = false) {
  Hid space(
      check_h5_id(H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr), "H5Screate_simple"),
      Hid::Kind::kDataspace);
  Hid dcpl(check_h5_id(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate"), Hid::Kind::kPropertyList);
  if (!external.empty()) {
    check_h5(H5Pset_external(dcpl.get(), external.c_str(), 0, H5F_UNLIMITED), "H5Pset_external");
  }
  if (chunked && dims.front() > 0) {
    std::vector<hsize_t> chunk = dims;
    chunk.front() = std::min<hsize_t>(7, dims.front());
    check_h5(H5Pset_chunk(dcpl.get(), static_cast<int>(chunk.size()), chunk.data()), "H5Pset_chunk");
    check_h5(H5Pset_deflate(dcpl.get(), 4), "H5Pset_deflate");
  }
  Hid set(check_h5_id(H5Dcreate2(group, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
                      name),
          Hid::Kind::kDataset);
  check_h5(H5Dwrite(set.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), name);
}

}  // namespace

void write_file(const std::string& path, const FileSpec& spec) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  quiet_hdf5_errors();
  Hid create(check_h5_id(H5Pcreate(H5P_FILE_CREATE), "H5Pcreate"), Hid::Kind::kPropertyList);
  if (spec.user_block > 0) check_h5(H5Pset_userblock(create.get(), spec.user_block), "H5Pset_userblock");
  Hid file(check_h5_id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, create.get(), H5P_DEFAULT), "H5Fcreate"),
           Hid::Kind::kFile);
  if (spec.write_vocab_size) write_int_attribute(file.get(), "vocab_size", spec.vocab_size);
  write_int_attribute(file.get(), "maxlen", spec.maxlen_attribute >= 0 ? spec.maxlen_attribute : spec.maxlen);
  for (const std::string split : {"train", "test", "val"}) {
    const bool train = split == "train";
    const bool val = split == "val";
    if (val && spec.val_rows < 0) continue;
    const int64_t rows = train ? spec.train_rows : val ? spec.val_rows : spec.test_rows;
    int64_t y_rows = train && spec.train_y_rows >= 0 ? spec.train_y_rows : rows;
    if (val && spec.val_y_rows >= 0) y_rows = spec.val_y_rows;
    const int columns = val && spec.val_columns >= 0 ? spec.val_columns : spec.maxlen;
    std::vector<int32_t> x(static_cast<size_t>(rows * columns));
    for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<int32_t>(i);
    std::vector<uint8_t> y(static_cast<size_t>(y_rows));
    for (size_t i = 0; i < y.size(); ++i) y[i] = static_cast<uint8_t>(i % 2);
    if (spec.edit) spec.edit(split, x, y);
    Hid group(
        check_h5_id(H5Gcreate2(file.get(), split.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT), "group"),
        Hid::Kind::kGroup);
    if (train || val || spec.write_test_x) {
      std::vector<hsize_t> dims{static_cast<hsize_t>(rows), static_cast<hsize_t>(columns)};
      if (spec.x_rank_1) dims = {static_cast<hsize_t>(x.size())};
      write_dataset(group.get(), "x", val ? spec.val_x_type : spec.x_type, H5T_NATIVE_INT32, dims, x.data(),
                    "", spec.chunked);
    }
    if (train || (val ? spec.write_val_y : spec.write_test_y)) {
      write_dataset(group.get(), "y", H5T_STD_U8LE, H5T_NATIVE_UINT8, {static_cast<hsize_t>(y_rows)},
                    y.data(), train ? spec.train_y_external : "", spec.chunked);
    }
  }
}

std::vector<int32_t> read_all(const std::string& path, const std::string& name, std::vector<int64_t>* dims) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  Hid file = open_file_readonly(path);
  Hid set = open_dataset(file.get(), path, name);
  const std::vector<int64_t> shape = dataset_dims(set.get());
  int64_t size = 1;
  for (const int64_t d : shape) size *= d;
  std::vector<int32_t> data(static_cast<size_t>(size));
  check_h5(H5Dread(set.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), "H5Dread");
  if (dims != nullptr) *dims = shape;
  return data;
}

}  // namespace ddp::testing
