#include "io/hdf5_util.h"

#include <algorithm>
#include <bit>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <stdexcept>
#include <system_error>

#include "engine/base/errors.h"
#include "engine/base/file_kind.h"
#include "engine/base/memory_limit.h"
#include "io/damaged_file_guard.h"

namespace ddp::io {

namespace {

// The attribute of a string list (write_string_list) that holds string_list_checksum() of its strings.
constexpr const char* kStringListChecksum = "checksum";

// The most specific message on HDF5's error stack (the innermost function that failed), e.g. "file signature
// not found". Must be called right after the failing call, before another HDF5 call clears the stack.
std::string hdf5_error_detail() {
  std::string detail;
  const auto take_innermost = [](unsigned n, const H5E_error2_t* error, void* out) -> herr_t {
    if (n == 0 && error->desc != nullptr) *static_cast<std::string*>(out) = error->desc;
    return 0;
  };
  if (H5Ewalk2(H5E_DEFAULT, H5E_WALK_UPWARD, take_innermost, &detail) < 0 || detail.empty()) {
    return "no detail from HDF5";
  }
  // A failed read or write of the file ("file write failed: time = ..., filename = ..., errno = 27, error
  // message = 'File too large', buf = ...") is the system's reason, on one line.
  const std::string marker = "error message = '";
  const std::size_t begin = detail.find(marker);
  if (begin != std::string::npos) {
    const std::size_t end = detail.find('\'', begin + marker.size());
    if (end != std::string::npos) return detail.substr(begin + marker.size(), end - begin - marker.size());
  }
  return detail;
}

// Every description on HDF5's error stack, outermost first, joined by " / ".
std::string hdf5_error_stack() {
  std::vector<std::string> descriptions;
  const auto take = [](unsigned, const H5E_error2_t* error, void* out) -> herr_t {
    if (error->desc != nullptr) static_cast<std::vector<std::string>*>(out)->push_back(error->desc);
    return 0;
  };
  H5Ewalk2(H5E_DEFAULT, H5E_WALK_DOWNWARD, take, &descriptions);
  std::string text;
  for (const std::string& description : descriptions) text += (text.empty() ? "" : " / ") + description;
  return text;
}

// Whether the file holds HDF5's signature where the format puts it: at 0, 512, 1024, 2048 ... (after a
// user block).
bool has_hdf5_signature(const std::string& path) {
  static constexpr char kSignature[8] = {'\x89', 'H', 'D', 'F', '\r', '\n', '\x1a', '\n'};
  std::ifstream in(path, std::ios::binary);
  for (std::streamoff offset = 0; in; offset = offset == 0 ? 512 : offset * 2) {
    char bytes[8] = {};
    in.seekg(offset);
    if (!in.read(bytes, sizeof(bytes))) return false;
    if (std::equal(bytes, bytes + 8, kSignature)) return true;
  }
  return false;
}

// The reason H5Fopen refused `path`, for the user: `stack` is HDF5's error stack (hdf5_error_stack()).
std::string why_open_failed(const std::string& path, const std::string& stack) {
  const auto number_after = [&](const std::string& key) -> std::string {
    const std::size_t at = stack.find(key);
    if (at == std::string::npos) return "";
    const std::size_t begin = at + key.size();
    return stack.substr(begin, stack.find_first_not_of("0123456789", begin) - begin);
  };
  if (stack.find("unable to lock file") != std::string::npos ||
      stack.find("Resource temporarily unavailable") != std::string::npos) {
    return "is open for writing in another process, whose HDF5 file lock keeps readers out: close it there "
           "first (an h5py.File opened with 'w' or 'a', a prepare still running)";
  }
  if (stack.find("already open for write") != std::string::npos) {
    return "is marked as open for writing: a writer still has it open, or one ended without closing it "
           "(then `h5clear -s " +
           path + "` clears the mark)";
  }
  // A stored end far past what any disk holds is a damaged header, not a copy cut short.
  if (const std::string eof = number_after("eof = "), stored = number_after("stored_eof = ");
      stack.find("truncated file") != std::string::npos && !eof.empty() && !stored.empty() &&
      stored.size() <= 15) {
    return "is truncated: it has " + eof + " of the " + stored +
           " bytes its header promises (a copy or download that did not finish?)";
  }
  if (!has_hdf5_signature(path)) return "not an HDF5 file (no HDF5 signature in it)";
  const std::size_t innermost = stack.rfind(" / ");
  return "a damaged HDF5 file (" + (innermost == std::string::npos ? stack : stack.substr(innermost + 3)) +
         ")";
}

herr_t close_by_kind(hid_t id, Hid::Kind kind) {
  switch (kind) {
    case Hid::Kind::kFile:
      return H5Fclose(id);
    case Hid::Kind::kGroup:
      return H5Gclose(id);
    case Hid::Kind::kDataset:
      return H5Dclose(id);
    case Hid::Kind::kDataspace:
      return H5Sclose(id);
    case Hid::Kind::kDatatype:
      return H5Tclose(id);
    case Hid::Kind::kAttribute:
      return H5Aclose(id);
    case Hid::Kind::kPropertyList:
      return H5Pclose(id);
  }
  return -1;
}

// The name of the file that `loc` belongs to, for messages about attributes (whose readers get no path).
std::string file_name_of(hid_t loc) {
  const ssize_t length = H5Fget_name(loc, nullptr, 0);
  if (length <= 0) return "<unknown HDF5 file>";
  std::string name(static_cast<size_t>(length) + 1, '\0');
  if (H5Fget_name(loc, name.data(), name.size()) < 0) return "<unknown HDF5 file>";
  name.resize(static_cast<size_t>(length));
  return name;
}

// " of /group" for an attribute on something other than the root group, "" on the root.
std::string object_suffix(hid_t loc) {
  char name[512] = {};
  const ssize_t length = H5Iget_name(loc, name, sizeof(name));
  if (length <= 0 || std::string(name) == "/") return "";
  return std::string(" of ") + name;
}

// One attribute value: a scalar or a single-element array (h5py writes either, depending on the caller).
hssize_t attribute_points(hid_t attr) {
  Hid space(check_h5_id(H5Aget_space(attr), "H5Aget_space"), Hid::Kind::kDataspace);
  const hssize_t points = H5Sget_simple_extent_npoints(space.get());
  if (points < 0) throw Hdf5Error("H5Sget_simple_extent_npoints failed: " + hdf5_error_detail());
  return points;
}

void delete_attribute_if_present(hid_t loc, const std::string& name) {
  const htri_t exists = H5Aexists(loc, name.c_str());
  if (exists < 0) throw Hdf5Error("H5Aexists " + name + " failed: " + hdf5_error_detail());
  if (exists > 0) check_h5(H5Adelete(loc, name.c_str()), ("H5Adelete " + name).c_str());
}

}  // namespace

std::recursive_mutex& hdf5_mutex() {
  static std::recursive_mutex mutex;
  return mutex;
}

void skip_hdf5_cleanup_at_exit() {
  // Fails only when called after the library started; then its cleanup runs as usual.
  static_cast<void>(H5dont_atexit());
}

void quiet_hdf5_errors() {
  // A flag under the HDF5 lock rather than std::call_once: callers often hold the lock already, and a
  // once-flag taken inside it could deadlock against a thread that takes them in the other order.
  // Per thread: Debian builds HDF5 thread-safe, and then the error stack and its printing are per thread.
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  thread_local bool quiet = false;
  if (quiet) return;
  check_h5(H5Eset_auto2(H5E_DEFAULT, nullptr, nullptr), "H5Eset_auto2");
  quiet = true;
}

Hid& Hid::operator=(Hid&& o) noexcept {
  if (this != &o) {
    reset();
    id_ = o.id_;
    kind_ = o.kind_;
    o.id_ = H5I_INVALID_HID;
  }
  return *this;
}

void Hid::discard() {
  close(/*report_failure=*/false);
}

void Hid::reset() {
  close(/*report_failure=*/true);
}

void Hid::close_checked(const char* what) {
  if (id_ < 0) return;
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  const herr_t status = close_by_kind(id_, kind_);
  id_ = H5I_INVALID_HID;
  if (status < 0) throw Hdf5Error(std::string(what) + " failed: " + hdf5_error_detail());
}

void Hid::close(bool report_failure) {
  if (id_ < 0) return;
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  // Runs in destructors, so it cannot throw: a failed close is reported, not hidden. Writers flush (checked)
  // before closing, so data errors surface there.
  if (close_by_kind(id_, kind_) < 0 && report_failure) {
    std::fprintf(stderr, "ddptrain: warning: closing an HDF5 object failed (%s)\n",
                 hdf5_error_detail().c_str());
  }
  id_ = H5I_INVALID_HID;
}

void throw_unreadable_file(const std::string& path, const Hdf5Error& error) {
  throw UserError(path + ": damaged or unreadable HDF5 file (" + error.what() + ")");
}

void check_h5(herr_t status, const char* what) {
  if (status < 0) throw Hdf5Error(std::string(what) + " failed: " + hdf5_error_detail());
}

hid_t check_h5_id(hid_t id, const char* what) {
  if (id < 0) throw Hdf5Error(std::string(what) + " failed: " + hdf5_error_detail());
  return id;
}

Hid open_file_readonly(const std::string& path) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  quiet_hdf5_errors();
  std::error_code error;
  const bool exists = std::filesystem::exists(path, error);
  if (error || !exists) throw UserError(path + ": no such file");
  // A named pipe would block the open below until a writer came.
  if (const std::string kind = special_file_kind(path, /*follow_links=*/true); !kind.empty()) {
    throw UserError(path + ": is " + kind + ", not an HDF5 file");
  }
  if (!std::ifstream(path, std::ios::binary).is_open()) {
    throw UserError(path + ": cannot be read (permission denied?)");
  }
  // Lock where the file system can, but do not fail where it cannot (NFS, Lustre): every rank opens the file.
  Hid access(check_h5_id(H5Pcreate(H5P_FILE_ACCESS), "H5Pcreate"), Hid::Kind::kPropertyList);
  check_h5(H5Pset_file_locking(access.get(), true, true), "H5Pset_file_locking");
  const DamagedFileGuard guard(path);
  const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDONLY, access.get());
  if (file < 0) throw UserError(path + ": " + why_open_failed(path, hdf5_error_stack()));
  return Hid(file, Hid::Kind::kFile);
}

bool link_exists(hid_t loc, const std::string& path) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  // H5Lexists on a/b/c fails (instead of answering false) when a or a/b is missing, so walk the components.
  std::string prefix = path.starts_with('/') ? "/" : "";
  size_t begin = 0;
  while (begin < path.size()) {
    size_t end = path.find('/', begin);
    if (end == std::string::npos) end = path.size();
    if (end > begin) {
      if (!prefix.empty() && prefix.back() != '/') prefix += '/';
      prefix += path.substr(begin, end - begin);
      const htri_t link = H5Lexists(loc, prefix.c_str(), H5P_DEFAULT);
      if (link < 0) throw Hdf5Error("H5Lexists " + prefix + " failed: " + hdf5_error_detail());
      if (link == 0) return false;
      // A dangling soft link exists as a link but not as an object.
      const htri_t object = H5Oexists_by_name(loc, prefix.c_str(), H5P_DEFAULT);
      if (object < 0) {
        throw Hdf5Error("H5Oexists_by_name " + prefix + " failed: " + hdf5_error_detail());
      }
      if (object == 0) return false;
      const bool last = path.find_first_not_of('/', end) == std::string::npos;
      if (!last) {
        // Only a group can have members; a dataset named like a parent makes the path absent, not an error.
        H5O_info_t info;
        check_h5(H5Oget_info_by_name(loc, prefix.c_str(), &info, H5P_DEFAULT), "H5Oget_info_by_name");
        if (info.type != H5O_TYPE_GROUP) return false;
      }
    }
    begin = end + 1;
  }
  return true;
}

Hid open_dataset(hid_t file, const std::string& file_path, const std::string& name) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  quiet_hdf5_errors();
  if (!link_exists(file, name)) throw UserError(file_path + ": dataset " + name + " is missing");
  const hid_t dataset = H5Dopen2(file, name.c_str(), H5P_DEFAULT);
  if (dataset < 0) {
    const std::string detail = hdf5_error_detail();
    throw UserError(file_path + ": " + name + " is not a dataset" +
                    (detail.find("not a dataset") == std::string::npos ? " (" + detail + ")" : ""));
  }
  return Hid(dataset, Hid::Kind::kDataset);
}

std::vector<int64_t> dataset_dims(hid_t dataset) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  Hid space(check_h5_id(H5Dget_space(dataset), "H5Dget_space"), Hid::Kind::kDataspace);
  const int rank = H5Sget_simple_extent_ndims(space.get());
  if (rank < 0) throw Hdf5Error("H5Sget_simple_extent_ndims failed: " + hdf5_error_detail());
  std::vector<hsize_t> dims(static_cast<size_t>(rank));
  if (rank > 0) {
    check_h5(H5Sget_simple_extent_dims(space.get(), dims.data(), nullptr), "H5Sget_simple_extent_dims");
  }
  return std::vector<int64_t>(dims.begin(), dims.end());
}

int64_t read_int_attribute(hid_t file, const std::string& file_path, const std::string& name) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  quiet_hdf5_errors();
  const std::string what = "attribute " + name + object_suffix(file);
  const htri_t exists = H5Aexists(file, name.c_str());
  if (exists < 0) throw Hdf5Error("H5Aexists " + name + " failed: " + hdf5_error_detail());
  if (exists == 0) throw UserError(file_path + ": " + what + " is missing");
  Hid attr(check_h5_id(H5Aopen(file, name.c_str(), H5P_DEFAULT), "H5Aopen"), Hid::Kind::kAttribute);
  Hid type(check_h5_id(H5Aget_type(attr.get()), "H5Aget_type"), Hid::Kind::kDatatype);
  const H5T_class_t type_class = H5Tget_class(type.get());
  if (type_class == H5T_NO_CLASS) throw Hdf5Error("H5Tget_class failed: " + hdf5_error_detail());
  if (type_class != H5T_INTEGER) throw UserError(file_path + ": " + what + " must be an integer");
  if (attribute_points(attr.get()) != 1) {
    throw UserError(file_path + ": " + what + " must be a single integer");
  }
  int64_t value = 0;
  check_h5(H5Aread(attr.get(), H5T_NATIVE_INT64, &value), ("H5Aread " + name).c_str());
  return value;
}

void write_int_attribute(hid_t loc, const std::string& name, int64_t value) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  delete_attribute_if_present(loc, name);
  Hid space(check_h5_id(H5Screate(H5S_SCALAR), "H5Screate"), Hid::Kind::kDataspace);
  Hid attr(check_h5_id(H5Acreate2(loc, name.c_str(), H5T_STD_I64LE, space.get(), H5P_DEFAULT, H5P_DEFAULT),
                       ("H5Acreate2 " + name).c_str()),
           Hid::Kind::kAttribute);
  check_h5(H5Awrite(attr.get(), H5T_NATIVE_INT64, &value), ("H5Awrite " + name).c_str());
}

void write_string_attribute(hid_t loc, const std::string& name, const std::string& value) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  delete_attribute_if_present(loc, name);
  // Fixed-length, NUL-terminated: readable by h5py, h5dump and plain C alike. +1 keeps "" a valid size.
  Hid type(check_h5_id(H5Tcopy(H5T_C_S1), "H5Tcopy"), Hid::Kind::kDatatype);
  check_h5(H5Tset_size(type.get(), value.size() + 1), "H5Tset_size");
  check_h5(H5Tset_strpad(type.get(), H5T_STR_NULLTERM), "H5Tset_strpad");
  check_h5(H5Tset_cset(type.get(), H5T_CSET_UTF8), "H5Tset_cset");
  Hid space(check_h5_id(H5Screate(H5S_SCALAR), "H5Screate"), Hid::Kind::kDataspace);
  Hid attr(check_h5_id(H5Acreate2(loc, name.c_str(), type.get(), space.get(), H5P_DEFAULT, H5P_DEFAULT),
                       ("H5Acreate2 " + name).c_str()),
           Hid::Kind::kAttribute);
  check_h5(H5Awrite(attr.get(), type.get(), value.c_str()), ("H5Awrite " + name).c_str());
}

uint64_t string_list_checksum(const std::vector<std::string>& strings) {
  // FNV-1a over the strings' bytes, each followed by a NUL (which no string holds), so that moving bytes
  // from one string to the next changes it too.
  constexpr uint64_t kPrime = 0x100000001b3ull;
  uint64_t hash = 0xcbf29ce484222325ull;
  for (const std::string& text : strings) {
    for (const char c : text) hash = (hash ^ static_cast<unsigned char>(c)) * kPrime;
    hash *= kPrime;  // the NUL: hash ^ 0
  }
  return hash;
}

void write_string_list(hid_t loc, const std::string& name, const std::vector<std::string>& strings) {
  std::vector<const char*> pointers;
  pointers.reserve(strings.size());
  for (const std::string& s : strings) pointers.push_back(s.c_str());
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  Hid type(check_h5_id(H5Tcopy(H5T_C_S1), "H5Tcopy"), Hid::Kind::kDatatype);
  check_h5(H5Tset_size(type.get(), H5T_VARIABLE), "H5Tset_size");
  check_h5(H5Tset_cset(type.get(), H5T_CSET_UTF8), "H5Tset_cset");
  const hsize_t dims[1] = {static_cast<hsize_t>(strings.size())};
  Hid space(check_h5_id(H5Screate_simple(1, dims, nullptr), "H5Screate_simple"), Hid::Kind::kDataspace);
  // No object timestamps: the same input then gives a byte-identical file.
  Hid dcpl(check_h5_id(H5Pcreate(H5P_DATASET_CREATE), "H5Pcreate"), Hid::Kind::kPropertyList);
  check_h5(H5Pset_obj_track_times(dcpl.get(), false), "H5Pset_obj_track_times");
  const std::string what = "H5Dcreate2 /" + name;
  Hid list(check_h5_id(
               H5Dcreate2(loc, name.c_str(), type.get(), space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT),
               what.c_str()),
           Hid::Kind::kDataset);
  if (!strings.empty()) {
    check_h5(H5Dwrite(list.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, pointers.data()),
             ("H5Dwrite /" + name).c_str());
  }
  write_int_attribute(list.get(), kStringListChecksum, std::bit_cast<int64_t>(string_list_checksum(strings)));
  list.close_checked(("H5Dclose /" + name).c_str());  // where buffered values meet a full disk
}

std::string read_string_attribute(hid_t loc, const std::string& name) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  quiet_hdf5_errors();
  const htri_t exists = H5Aexists(loc, name.c_str());
  if (exists < 0) throw Hdf5Error("H5Aexists " + name + " failed: " + hdf5_error_detail());
  if (exists == 0) return "";
  Hid attr(check_h5_id(H5Aopen(loc, name.c_str(), H5P_DEFAULT), "H5Aopen"), Hid::Kind::kAttribute);
  Hid file_type(check_h5_id(H5Aget_type(attr.get()), "H5Aget_type"), Hid::Kind::kDatatype);
  const std::string what = "attribute " + name + object_suffix(loc);
  if (H5Tget_class(file_type.get()) != H5T_STRING || attribute_points(attr.get()) != 1) {
    throw UserError(file_name_of(loc) + ": " + what + " must be a single string");
  }
  const htri_t variable = H5Tis_variable_str(file_type.get());
  if (variable < 0) throw Hdf5Error("H5Tis_variable_str failed: " + hdf5_error_detail());
  Hid memory_type(check_h5_id(H5Tcopy(H5T_C_S1), "H5Tcopy"), Hid::Kind::kDatatype);
  const H5T_cset_t cset = H5Tget_cset(file_type.get());
  if (cset < 0) throw Hdf5Error("H5Tget_cset failed: " + hdf5_error_detail());
  check_h5(H5Tset_cset(memory_type.get(), cset), "H5Tset_cset");
  if (variable > 0) {
    // Variable-length (what h5py writes for a Python str): HDF5 allocates the buffer, we free it.
    check_h5(H5Tset_size(memory_type.get(), H5T_VARIABLE), "H5Tset_size");
    char* text = nullptr;
    check_h5(H5Aread(attr.get(), memory_type.get(), &text), ("H5Aread " + name).c_str());
    std::string value = text != nullptr ? text : "";
    check_h5(H5free_memory(text), "H5free_memory");
    return value;
  }
  const size_t size = H5Tget_size(file_type.get());
  if (size == 0) throw Hdf5Error("H5Tget_size failed: " + hdf5_error_detail());
  // One byte more than the stored size so that a NULLPAD/SPACEPAD string still ends in NUL.
  check_h5(H5Tset_size(memory_type.get(), size + 1), "H5Tset_size");
  check_h5(H5Tset_strpad(memory_type.get(), H5T_STR_NULLTERM), "H5Tset_strpad");
  std::string buffer(size + 1, '\0');
  check_h5(H5Aread(attr.get(), memory_type.get(), buffer.data()), ("H5Aread " + name).c_str());
  buffer.resize(buffer.find('\0') == std::string::npos ? buffer.size() : buffer.find('\0'));
  return buffer;
}

bool has_attribute(hid_t loc, const std::string& name) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  const htri_t exists = H5Aexists(loc, name.c_str());
  if (exists < 0) throw Hdf5Error("H5Aexists " + name + " failed: " + hdf5_error_detail());
  return exists > 0;
}

std::vector<std::string> read_string_list(hid_t file, const std::string& file_path, const std::string& name,
                                          std::size_t max_count) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  quiet_hdf5_errors();
  Hid dataset = open_dataset(file, file_path, name);
  Hid file_type(check_h5_id(H5Dget_type(dataset.get()), ("H5Dget_type " + name).c_str()),
                Hid::Kind::kDatatype);
  const std::vector<int64_t> dims = dataset_dims(dataset.get());
  if (H5Tget_class(file_type.get()) != H5T_STRING || dims.size() != 1) {
    throw UserError(file_path + ": " + name + " must be a list of strings");
  }
  // A list written with its checksum is read whole and checked: a damaged byte must not rename a class or
  // move a word to another id unseen.
  const bool checked = has_attribute(dataset.get(), kStringListChecksum);
  const auto count =
      static_cast<hsize_t>(checked ? dims[0] : std::min<int64_t>(dims[0], static_cast<int64_t>(max_count)));
  std::vector<std::string> strings;
  if (count == 0) return strings;
  // A damaged length (2.8e14 strings) is refused before HDF5 allocates for it: a pointer and a short string
  // each at the least.
  require_node_memory(static_cast<double>(count) * 48.0,
                      file_path + ": " + name + " of " + std::to_string(count) + " strings");
  Hid file_space(check_h5_id(H5Dget_space(dataset.get()), "H5Dget_space"), Hid::Kind::kDataspace);
  const hsize_t start = 0;
  check_h5(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, &start, nullptr, &count, nullptr),
           ("H5Sselect_hyperslab " + name).c_str());
  Hid memory_space(check_h5_id(H5Screate_simple(1, &count, nullptr), "H5Screate_simple"),
                   Hid::Kind::kDataspace);
  const htri_t variable = H5Tis_variable_str(file_type.get());
  check_h5(variable < 0 ? -1 : 0, ("H5Tis_variable_str " + name).c_str());
  strings.reserve(count);
  const std::string read_what = "H5Dread " + file_path + " " + name;
  if (variable > 0) {
    // What h5py and DatasetWriter write: HDF5 allocates each string, H5Dvlen_reclaim frees them.
    Hid memory_type(check_h5_id(H5Tcopy(H5T_C_S1), "H5Tcopy"), Hid::Kind::kDatatype);
    check_h5(H5Tset_size(memory_type.get(), H5T_VARIABLE), "H5Tset_size");
    check_h5(H5Tset_cset(memory_type.get(), H5Tget_cset(file_type.get())), "H5Tset_cset");
    std::vector<char*> pointers(count, nullptr);
    check_h5(H5Dread(dataset.get(), memory_type.get(), memory_space.get(), file_space.get(), H5P_DEFAULT,
                     pointers.data()),
             read_what.c_str());
    for (const char* p : pointers) strings.emplace_back(p != nullptr ? p : "");
    check_h5(H5Dvlen_reclaim(memory_type.get(), memory_space.get(), H5P_DEFAULT, pointers.data()),
             ("H5Dvlen_reclaim " + name).c_str());
  } else {
    // Fixed-length strings: read as stored, cut at the padding.
    const size_t width = H5Tget_size(file_type.get());
    check_h5(width == 0 ? -1 : 0, ("H5Tget_size " + name).c_str());
    const H5T_str_t padding = H5Tget_strpad(file_type.get());
    Hid memory_type(check_h5_id(H5Tcopy(file_type.get()), "H5Tcopy"), Hid::Kind::kDatatype);
    std::string buffer(count * width, '\0');
    check_h5(H5Dread(dataset.get(), memory_type.get(), memory_space.get(), file_space.get(), H5P_DEFAULT,
                     buffer.data()),
             read_what.c_str());
    for (size_t i = 0; i < count; ++i) {
      std::string text = buffer.substr(i * width, width);
      text.resize(std::min(text.size(), text.find('\0')));
      if (padding == H5T_STR_SPACEPAD) text.erase(text.find_last_not_of(' ') + 1);
      strings.push_back(std::move(text));
    }
  }
  if (checked) {
    const int64_t stored = read_int_attribute(dataset.get(), file_path, kStringListChecksum);
    if (std::bit_cast<uint64_t>(stored) != string_list_checksum(strings)) {
      throw UserError(
          file_path + ": " + name +
          " does not match its checksum: the file is damaged (or the list was edited in place; to "
          "keep such an edit, delete the dataset's checksum attribute)");
    }
    if (strings.size() > max_count) strings.resize(max_count);
  }
  return strings;
}

}  // namespace ddp::io
