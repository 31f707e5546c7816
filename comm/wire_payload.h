// Payloads whose values travel in 16 bits (comm.compression = bf16 | fp16 on the parameter server's messages
// and the colocated layout's collectives): the first `words` 32-bit words of a payload stay as they are (a
// row-sparse payload's row count and row ids, row_sparse.h); the float values after them go as bfloat16, or
// as fp16 after one 16-bit word holding the exponent of the power of two they were scaled by (the one that
// puts their largest magnitude in [2^14, 2^15), wire_cast.h), rounded to nearest even either way, and come
// back as floats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace ddp::comm {

enum class WireFormat { kFloat, kBfloat16, kHalf };

// comm.compression's value: none, bf16 or fp16 (anything else: float).
WireFormat wire_format(const std::string& compression);

// The exponent k of the power of two 2^k that scales `values` for fp16 (0 where they are all zero, or one
// is not finite: a NaN or an infinity passes as it is).
int16_t half_wire_exponent(std::span<const float> values);

// Writes `values` in `format` (bfloat16, or fp16 with its exponent word first where there are values) at
// `out`, wire_payload_bytes(values.size(), 0, format) bytes; `out` may be the values' own storage (written
// front to back, each value read before its bytes are written over, the exponent last). Returns the bytes.
std::size_t encode_values(std::span<const float> values, unsigned char* out, WireFormat format);

// Reads `n` values in `format` from `in` (as encode_values wrote them) into `out`.
void decode_values(const unsigned char* in, std::size_t n, WireFormat format, float* out);

// Narrows `payload`'s values (all but its first `words` words) to `format` (bfloat16 or fp16) in place.
// Returns the payload's bytes.
std::size_t narrow_values(std::span<float> payload, std::size_t words, WireFormat format);

// The other way: `bytes` of payload with `words` 32-bit words first, into `out`. Returns the floats written,
// or 0 with `error` set where the bytes do not make such a payload of at most out.size() floats.
std::size_t widen_values(const unsigned char* payload, std::size_t bytes, std::size_t words,
                         std::span<float> out, WireFormat format, std::string& error);

// A row-sparse payload's 32-bit words before its values: the row count and the row ids. Returns 0 with
// `error` set where `bytes` cannot hold them.
std::size_t row_sparse_words(const unsigned char* payload, std::size_t bytes, std::string& error);

// The bytes of a payload of `floats` floats whose first `words` are 32-bit, the rest in `format` (16 bits;
// fp16's exponent word only where there are values).
inline std::size_t wire_payload_bytes(std::size_t floats, std::size_t words, WireFormat format) {
  const std::size_t header = format == WireFormat::kHalf && floats > words ? 1 : 0;
  return words * sizeof(float) + (header + floats - words) * sizeof(uint16_t);
}

}  // namespace ddp::comm
