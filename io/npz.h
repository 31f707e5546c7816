// Reading NumPy's .npz files (np.savez: a zip archive with one .npy file per array), so that files made for
// Keras load here exactly as they load there. The archive is io/zip_archive.h's, each array io/npy.h's.
// Malformed input of any kind is a UserError "FILE: MEMBER: what is wrong", on one line.
#pragma once

#include <string>
#include <vector>

#include "io/npy.h"
#include "io/zip_archive.h"

namespace ddp::io {

// The arrays of an .npz file: array("x_train") reads member "x_train.npy".
class NpzFile {
 public:
  explicit NpzFile(const std::string& path);
  const std::string& path() const { return zip_.name(); }
  std::vector<std::string> array_names() const;
  // UserError "FILE: missing array 'NAME' (the file has: ...)" when absent.
  NpyArray array(const std::string& name) const;

 private:
  ZipArchive zip_;
};

}  // namespace ddp::io
