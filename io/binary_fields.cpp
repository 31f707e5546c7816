#include "io/binary_fields.h"

#include <fmt/format.h>

#include "engine/base/errors.h"

namespace ddp::io::binary {

void fail(const std::string& where, const std::string& what) {
  throw UserError(where + ": " + what);
}

std::string printable(std::string_view text, size_t limit) {
  std::string out;
  for (size_t i = 0; i < text.size() && i < limit; ++i) {
    const auto c = static_cast<unsigned char>(text[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      out += fmt::format("\\x{:02x}", c);
    }
  }
  if (text.size() > limit) out += "...";
  return out;
}

}  // namespace ddp::io::binary
