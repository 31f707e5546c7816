// Payloads whose values travel as bfloat16 (comm.compression = bf16 on the parameter server's messages and
// the colocated layout's collectives): the first `words` 32-bit words of a payload stay as they are (a
// row-sparse payload's row count and row ids, row_sparse.h), the float values after them go as bfloat16,
// rounded to nearest even (wire_cast.h), and come back as floats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace ddp::comm {

// Narrows `payload`'s values (all but its first `words` words) to bfloat16 in place, front to back (each
// value is read before its bytes are written over). Returns the payload's bytes.
std::size_t narrow_values(std::span<float> payload, std::size_t words);

// The other way: `bytes` of payload with `words` 32-bit words first, into `out`. Returns the floats written,
// or 0 with `error` set where the bytes do not make such a payload of at most out.size() floats.
std::size_t widen_values(const unsigned char* payload, std::size_t bytes, std::size_t words,
                         std::span<float> out, std::string& error);

// A row-sparse payload's 32-bit words before its values: the row count and the row ids. Returns 0 with
// `error` set where `bytes` cannot hold them.
std::size_t row_sparse_words(const unsigned char* payload, std::size_t bytes, std::string& error);

// The bytes of a payload of `floats` floats whose first `words` are 32-bit, the rest bfloat16.
inline std::size_t bfloat16_payload_bytes(std::size_t floats, std::size_t words) {
  return words * sizeof(float) + (floats - words) * sizeof(uint16_t);
}

}  // namespace ddp::comm
