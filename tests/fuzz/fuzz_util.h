// Shared by the libFuzzer targets of tests/fuzz: the contract every reader of outside data keeps (a bad input
// ends in one ddp::UserError with a one-line message; anything else is a finding), a private scratch folder,
// and small builders that write HDF5 files shaped by the fuzz input.
#pragma once

#include <fuzzer/FuzzedDataProvider.h>
#include <hdf5.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include "engine/base/errors.h"

namespace ddp::fuzz {

// Runs `body`; a UserError is the expected end of a bad input, and must say what is wrong on one line (the
// command prints it as one line and exits 2). Every other exception escapes and libFuzzer reports it.
template <typename Body>
bool expect_user_error(Body&& body) {
  try {
    body();
    return true;
  } catch (const UserError& e) {
    const std::string what = e.what();
    if (what.empty() || what.find('\n') != std::string::npos) {
      std::fprintf(stderr, "UserError without a one-line message: [%s]\n", what.c_str());
      std::abort();
    }
    return false;
  }
}

// A folder of this process's own, removed at exit: in /dev/shm where there is one (the readers under test
// fsync what they write, which on a disk would cost more than the rest of an execution).
inline const std::filesystem::path& scratch_dir() {
  static const std::filesystem::path dir = [] {
    std::error_code error;
    const std::filesystem::path base = std::filesystem::is_directory("/dev/shm", error)
                                           ? std::filesystem::path("/dev/shm")
                                           : std::filesystem::temp_directory_path();
    std::filesystem::path d = base / ("ddptrain-fuzz-" + std::to_string(::getpid()));
    std::filesystem::remove_all(d);
    std::filesystem::create_directories(d);
    std::atexit([] { std::filesystem::remove_all(scratch_dir()); });
    return d;
  }();
  return dir;
}

inline void write_bytes(const std::filesystem::path& path, std::span<const uint8_t> bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A value the builders write: mostly small in [0, small_max], sometimes the edges of int64 and int32. Every
// choice of the builders gives the schema's answer when the input has run out, so an empty input is a valid
// file and inputs near it are files near the schema.
inline int64_t pick_int(FuzzedDataProvider& in, int64_t small_max) {
  switch (in.ConsumeIntegralInRange<int>(0, 7)) {
    case 6:
      return in.PickValueInArray<int64_t>(
          {-1, 0, INT32_MAX, int64_t{INT32_MAX} + 1, INT32_MIN, INT64_MAX, INT64_MIN, 255, 256, 257, 65536});
    case 7:
      return in.ConsumeIntegral<int64_t>();
    default:
      return (in.ConsumeIntegralInRange<int64_t>(0, small_max) + 1) % (small_max + 1);
  }
}

// An HDF5 file under construction; every call checks its status, as a broken builder is the harness's bug.
class H5Builder {
 public:
  enum Mode { kCreate, kOpen };
  explicit H5Builder(const std::filesystem::path& path, Mode mode = kCreate)
      : file_(mode == kCreate ? H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT)
                              : H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT)) {
    must(file_, "H5Fcreate/H5Fopen");
  }
  ~H5Builder() { H5Fclose(file_); }
  H5Builder(const H5Builder&) = delete;
  H5Builder& operator=(const H5Builder&) = delete;

  hid_t root() const { return file_; }

  static void must(int64_t status, const char* what) {
    if (status < 0) {
      std::fprintf(stderr, "fuzz harness: %s failed\n", what);
      std::abort();
    }
  }

  // Creates every missing group of `path` ("/a/b/name" makes /a and /a/b); false where a non-group is in
  // the way (then nothing is written).
  bool parents(const std::string& path) {
    for (size_t slash = path.find('/', 1); slash != std::string::npos; slash = path.find('/', slash + 1)) {
      const std::string group = path.substr(0, slash);
      if (H5Lexists(file_, group.c_str(), H5P_DEFAULT) > 0) {
        H5O_info_t info;
        if (H5Oget_info_by_name(file_, group.c_str(), &info, H5P_DEFAULT) < 0 || info.type != H5O_TYPE_GROUP)
          return false;
        continue;
      }
      const hid_t g = H5Gcreate2(file_, group.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      must(g, "H5Gcreate2");
      H5Gclose(g);
    }
    return H5Lexists(file_, path.c_str(), H5P_DEFAULT) == 0;
  }

  // A numeric dataset at `path` of `dims`, element type picked by the input among `types` (the first is the
  // schema's), stored contiguous, chunked, deflated or compact, or left unwritten (fill values), holding
  // `values` (converted by HDF5, cycled or cut to the element count).
  void numeric(FuzzedDataProvider& in, const std::string& path, std::vector<hsize_t> dims,
               std::span<const hid_t> types, const std::vector<int64_t>& values) {
    if (!parents(path)) return;
    const hid_t type = types[in.ConsumeIntegralInRange<size_t>(0, types.size() - 1)];
    const hid_t space = dims.empty() ? H5Screate(H5S_SCALAR)
                                     : H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
    must(space, "H5Screate");
    hsize_t count = 1;
    for (const hsize_t d : dims) count *= d;
    const hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
    const int layout = in.ConsumeIntegralInRange<int>(0, 3);
    if (layout >= 1 && !dims.empty() && count > 0) {
      std::vector<hsize_t> chunk(dims);
      for (hsize_t& c : chunk)
        c = std::max<hsize_t>(1, std::min<hsize_t>(c, in.ConsumeIntegralInRange(1, 4)));
      must(H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data()), "H5Pset_chunk");
      if (layout == 2) must(H5Pset_deflate(dcpl, 1), "H5Pset_deflate");
      if (layout == 3) must(H5Pset_shuffle(dcpl), "H5Pset_shuffle");
    }
    const hid_t set = H5Dcreate2(file_, path.c_str(), type, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
    must(set, "H5Dcreate2");
    if (count > 0 && !values.empty() && in.ConsumeIntegralInRange<int>(0, 9) != 9) {
      std::vector<int64_t> data(count);
      for (hsize_t i = 0; i < count; ++i) data[i] = values[i % values.size()];
      // Conversion of out-of-range values clamps (HDF5's default); float types get the integer's value.
      must(H5Dwrite(set, H5T_NATIVE_INT64, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), "H5Dwrite");
    }
    H5Dclose(set);
    H5Pclose(dcpl);
    H5Sclose(space);
  }

  // A 1-D list of strings at `path`: variable-length UTF-8 (h5py's), fixed-length padded, or an integer
  // dataset in its place.
  void strings(FuzzedDataProvider& in, const std::string& path, const std::vector<std::string>& items) {
    if (!parents(path)) return;
    const hsize_t dims[1] = {items.size()};
    const hid_t space = H5Screate_simple(1, dims, nullptr);
    const int kind = in.ConsumeIntegralInRange<int>(0, 4);
    if (kind == 4) {
      const hid_t set =
          H5Dcreate2(file_, path.c_str(), H5T_STD_I32LE, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      must(set, "H5Dcreate2");
      H5Dclose(set);
      H5Sclose(space);
      return;
    }
    const hid_t type = H5Tcopy(H5T_C_S1);
    const bool variable = kind <= 1;
    size_t width = 1;
    for (const std::string& s : items) width = std::max(width, s.size());
    if (!variable) width = in.ConsumeIntegralInRange<size_t>(1, width + 1);
    must(H5Tset_size(type, variable ? H5T_VARIABLE : width), "H5Tset_size");
    must(H5Tset_cset(type, kind == 1 ? H5T_CSET_ASCII : H5T_CSET_UTF8), "H5Tset_cset");
    if (kind == 3) must(H5Tset_strpad(type, H5T_STR_SPACEPAD), "H5Tset_strpad");
    const hid_t set = H5Dcreate2(file_, path.c_str(), type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
    must(set, "H5Dcreate2");
    if (!items.empty()) {
      if (variable) {
        std::vector<const char*> pointers;
        for (const std::string& s : items) pointers.push_back(s.c_str());
        must(H5Dwrite(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, pointers.data()), "H5Dwrite");
      } else {
        std::string buffer(items.size() * width, kind == 3 ? ' ' : '\0');
        for (size_t i = 0; i < items.size(); ++i)
          buffer.replace(i * width, std::min(width, items[i].size()), items[i].substr(0, width));
        must(H5Dwrite(set, type, H5S_ALL, H5S_ALL, H5P_DEFAULT, buffer.data()), "H5Dwrite");
      }
    }
    H5Dclose(set);
    H5Tclose(type);
    H5Sclose(space);
  }

  // An attribute `name` on `loc`: an int64 scalar (the schema's), an int64 pair, a one-element int8 array, a
  // double, or a string; value from the input.
  void int_attribute(FuzzedDataProvider& in, hid_t loc, const std::string& name, int64_t value) {
    const int kind = in.ConsumeIntegralInRange<int>(0, 9);
    if (kind <= 5) {
      scalar_attribute(loc, name, H5T_STD_I64LE, H5T_NATIVE_INT64, &value);
    } else if (kind == 6) {
      const hsize_t two[1] = {2};
      const int64_t values[2] = {value, value};
      attribute(loc, name, H5T_STD_I64LE, H5Screate_simple(1, two, nullptr), H5T_NATIVE_INT64, values);
    } else if (kind == 7) {
      const hsize_t one[1] = {1};
      attribute(loc, name, H5T_STD_U8LE, H5Screate_simple(1, one, nullptr), H5T_NATIVE_INT64, &value);
    } else if (kind == 8) {
      const double d = static_cast<double>(value) + 0.5;
      scalar_attribute(loc, name, H5T_IEEE_F64LE, H5T_NATIVE_DOUBLE, &d);
    } else {
      string_attribute(loc, name, std::to_string(value), in.ConsumeBool());
    }
  }

  void scalar_attribute(hid_t loc, const std::string& name, hid_t file_type, hid_t memory_type,
                        const void* value) {
    attribute(loc, name, file_type, H5Screate(H5S_SCALAR), memory_type, value);
  }

  void string_attribute(hid_t loc, const std::string& name, const std::string& value, bool variable) {
    const hid_t type = H5Tcopy(H5T_C_S1);
    must(H5Tset_size(type, variable ? H5T_VARIABLE : value.size() + 1), "H5Tset_size");
    const char* pointer = value.c_str();
    attribute(loc, name, type, H5Screate(H5S_SCALAR), type,
              variable ? static_cast<const void*>(&pointer) : static_cast<const void*>(pointer));
    H5Tclose(type);
  }

 private:
  void attribute(hid_t loc, const std::string& name, hid_t file_type, hid_t space, hid_t memory_type,
                 const void* value) {
    must(space, "H5Screate");
    if (H5Aexists(loc, name.c_str()) > 0) H5Adelete(loc, name.c_str());
    const hid_t attr = H5Acreate2(loc, name.c_str(), file_type, space, H5P_DEFAULT, H5P_DEFAULT);
    must(attr, "H5Acreate2");
    must(H5Awrite(attr, memory_type, value), "H5Awrite");
    H5Aclose(attr);
    H5Sclose(space);
  }

  hid_t file_;
};

// Short strings for /vocab and /classes: words, empties, non-UTF-8 bytes.
inline std::vector<std::string> pick_strings(FuzzedDataProvider& in, size_t count) {
  std::vector<std::string> items;
  for (size_t i = 0; i < count; ++i) items.push_back(in.ConsumeRandomLengthString(12));
  return items;
}

}  // namespace ddp::fuzz
