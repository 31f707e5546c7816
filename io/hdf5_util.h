// Small RAII wrappers over the HDF5 C API. Every call's return code is checked: a failure on a file the user
// gave becomes a UserError naming the file and object; HDF5's own error stack printing is turned off so the
// user sees one line.
#pragma once

#include <hdf5.h>

#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "engine/base/errors.h"

namespace ddp::io {

// HDF5 calls from different threads (the prefetch thread, the checkpoint writer) take this lock: Debian's
// serial HDF5 is not guaranteed thread-safe.
std::recursive_mutex& hdf5_mutex();

// Silences HDF5's automatic error printing for the calling thread (HDF5 keeps that setting per thread).
void quiet_hdf5_errors();

// Called first in main, before any other HDF5 call: the library does not close what is still open at exit.
// Every file ddptrain writes is flushed and closed before it is renamed into place, so only an error path
// leaves one open, and HDF5 1.10 crashes when it closes a file whose write failed (a full disk).
void skip_hdf5_cleanup_at_exit();

// Owns one hid_t and closes it with the matching H5?close.
class Hid {
 public:
  enum class Kind { kFile, kGroup, kDataset, kDataspace, kDatatype, kAttribute, kPropertyList };
  Hid() = default;
  Hid(hid_t id, Kind kind) : id_(id), kind_(kind) {}
  Hid(const Hid&) = delete;
  Hid& operator=(const Hid&) = delete;
  Hid(Hid&& o) noexcept : id_(o.id_), kind_(o.kind_) { o.id_ = H5I_INVALID_HID; }
  Hid& operator=(Hid&& o) noexcept;
  ~Hid() { reset(); }

  hid_t get() const { return id_; }
  bool valid() const { return id_ >= 0; }
  void reset();
  // Closes without a warning: for a file being abandoned after an error that was already reported.
  void discard();
  // Closes and throws Hdf5Error naming `what` if that fails: for a file being written, whose close may be
  // its last write (a full disk there leaves a damaged file that must not be renamed into place).
  void close_checked(const char* what);

 private:
  void close(bool report_failure);
  hid_t id_ = H5I_INVALID_HID;
  Kind kind_ = Kind::kFile;
};

Hid open_file_readonly(const std::string& path);       // UserError if missing or not HDF5
bool link_exists(hid_t loc, const std::string& path);  // checks every component of a/b/c
Hid open_dataset(hid_t file, const std::string& file_path, const std::string& name);  // UserError if missing

// Shape of a dataset (one entry per dimension).
std::vector<int64_t> dataset_dims(hid_t dataset);

// Reads a scalar integer attribute of the root group; UserError naming file and attribute if absent.
int64_t read_int_attribute(hid_t file, const std::string& file_path, const std::string& name);
void write_int_attribute(hid_t loc, const std::string& name, int64_t value);
void write_string_attribute(hid_t loc, const std::string& name, const std::string& value);
std::string read_string_attribute(hid_t loc, const std::string& name);  // "" if absent
// A 1-D dataset of variable-length UTF-8 strings (what h5py writes for a list of str), e.g. /vocab, with an
// integer attribute "checksum": string_list_checksum() of the strings.
void write_string_list(hid_t loc, const std::string& name, const std::vector<std::string>& strings);
uint64_t string_list_checksum(const std::vector<std::string>& strings);
// Reads the first `max_count` (or all, if fewer) strings of such a dataset, variable-length or fixed-length
// (numpy's 'S' arrays); UserError naming file and dataset unless it is a 1-D dataset of strings, or when its
// checksum attribute (absent in lists written by other tools or before it) does not match.
std::vector<std::string> read_string_list(hid_t file, const std::string& file_path, const std::string& name,
                                          std::size_t max_count);
bool has_attribute(hid_t loc, const std::string& name);

// What the helpers here throw when an HDF5 call fails.
class Hdf5Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// For the readers of a file the user gave (their entry points catch Hdf5Error): an HDF5 call that fails on it
// means the file is damaged or cannot be read, a UserError "PATH: damaged or unreadable HDF5 file (what)".
[[noreturn]] void throw_unreadable_file(const std::string& path, const Hdf5Error& error);

// For the writers of a temporary file: runs `write`; an HDF5 failure (a full disk, a file-size limit) runs
// `abandon` (close the file quietly, remove it) and becomes a UserError "TMP: cannot write (why)AFTER".
template <typename Write, typename Abandon>
void write_or_abandon(const std::string& tmp, Write&& write, Abandon&& abandon, const char* after = "") {
  try {
    write();
  } catch (const Hdf5Error& e) {
    abandon();
    throw UserError(tmp + ": cannot write (" + e.what() + ")" + after);
  }
}

// Throws Hdf5Error with `what` when status < 0.
void check_h5(herr_t status, const char* what);
hid_t check_h5_id(hid_t id, const char* what);

}  // namespace ddp::io
