// Reading NumPy's .npz files (np.savez: a zip archive with one .npy file per array), so that files made for
// Keras load here exactly as they load there. The archive is io/zip_archive.h's; the arrays are parsed here:
//  - .npy: format versions 1.0, 2.0 and 3.0; the header dict (descr, fortran_order, shape); little-endian
//    integer arrays (bool, int8..int64, uint8..uint64) and object arrays ('|O').
//  - object arrays are stored as a pickle of the ndarray (np.save with allow_pickle). A restricted unpickler
//    reads them: a stack machine that knows only the opcodes of such pickles (protocols 2 to 4, also as
//    Python 2 wrote them) and resolves only numpy's ndarray and dtype reconstruction names. A file can never
//    run code: any other opcode or name is an error. Elements may be ints or lists of ints.
// Malformed input of any kind is a UserError "FILE: MEMBER: what is wrong", on one line.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "io/zip_archive.h"

namespace ddp::io {

// One .npy array, its integers widened to int64.
struct NpyArray {
  std::string descr;  // as in the header: "<i8", "|u1", "|O", ...
  std::vector<int64_t> shape;
  bool fortran_order = false;
  // Numeric arrays, and object arrays whose elements are ints: every element, in C order.
  std::vector<int64_t> integers;
  // Object arrays whose elements are lists of ints: one list per element.
  std::vector<std::vector<int64_t>> lists;

  bool is_object() const { return descr == "|O"; }
  bool holds_lists() const { return is_object() && !lists.empty(); }
  int64_t size() const;  // the number of elements: the product of shape
};

// Parses a .npy file. `where` ("FILE: MEMBER") starts every message.
NpyArray parse_npy(std::span<const uint8_t> bytes, const std::string& where);

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
