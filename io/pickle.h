// A restricted unpickler for numpy's object arrays (np.save with allow_pickle stores them as a pickle of the
// ndarray): a stack machine that knows only the opcodes of such pickles (protocols 2 to 4, also as Python 2
// wrote them) and resolves only numpy's ndarray and dtype reconstruction names. A file can never run code:
// any other opcode or name is an error.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ddp::io {

// The elements of a pickled object array, in C order: ints, or lists of ints (one of the two is empty).
struct ObjectArrayElements {
  std::vector<int64_t> integers;
  std::vector<std::vector<int64_t>> lists;
};

// Unpickles an object array whose header gave `shape`. `where` ("FILE: MEMBER") starts every message;
// malformed input, another shape, or elements other than ints or lists of ints are a UserError.
ObjectArrayElements unpickle_object_array(std::span<const uint8_t> pickle, const std::vector<int64_t>& shape,
                                          const std::string& where);

}  // namespace ddp::io
