// What the readers of zip archives, pickles and .npy files share: little-endian fields, bounds checks that
// cannot overflow, and one-line messages that quote bytes from the file safely.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace ddp::io::binary {

// Malformed input: UserError "WHERE: WHAT".
[[noreturn]] void fail(const std::string& where, const std::string& what);

// Text taken from the file, made safe for a one-line message: non-printable bytes as \xNN, long text cut.
std::string printable(std::string_view text, size_t limit = 80);

inline uint16_t le16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | p[1] << 8);
}
inline uint32_t le32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}
inline uint64_t le64(const uint8_t* p) {
  return le32(p) | static_cast<uint64_t>(le32(p + 4)) << 32;
}

// Whether `length` bytes from `offset` lie within `total`, written so that no sum can wrap.
inline bool fits(size_t offset, uint64_t length, size_t total) {
  return offset <= total && length <= total - offset;
}

}  // namespace ddp::io::binary
