// NumPy's .npy arrays: format versions 1.0, 2.0 and 3.0; the header dict (descr, fortran_order, shape);
// little-endian integer arrays (bool, int8..int64, uint8..uint64) and object arrays ('|O'), whose pickle
// io/pickle.h reads. Elements may be ints or lists of ints.
// Malformed input of any kind is a UserError "FILE: MEMBER: what is wrong", on one line.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

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

}  // namespace ddp::io
