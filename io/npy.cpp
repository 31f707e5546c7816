#include "io/npy.h"

#include <cstring>
#include <string_view>
#include <utility>

#include "engine/base/memory_limit.h"
#include "io/binary_fields.h"
#include "io/pickle.h"

namespace ddp::io {
namespace {

using binary::fail;
using binary::fits;
using binary::le16;
using binary::le32;
using binary::printable;

// .npy header: a Python dict literal such as {'descr': '<i8', 'fortran_order': False, 'shape': (3,), }

struct NpyHeader {
  std::string descr;
  bool fortran_order = false;
  std::vector<int64_t> shape;
};

class HeaderParser {
 public:
  HeaderParser(std::string_view text, std::string where) : text_(text), where_(std::move(where)) {}

  NpyHeader parse() {
    NpyHeader header;
    bool has_descr = false, has_fortran = false, has_shape = false;
    expect('{');
    for (;;) {
      skip_spaces();
      if (peek() == '}') break;
      const std::string key = string_literal();
      expect(':');
      skip_spaces();
      if (key == "descr") {
        if (peek() != '\'' && peek() != '"')
          fail(where_, "unsupported dtype: structured arrays are not supported");
        header.descr = string_literal();
        has_descr = true;
      } else if (key == "fortran_order") {
        header.fortran_order = boolean();
        has_fortran = true;
      } else if (key == "shape") {
        header.shape = shape();
        has_shape = true;
      } else {
        error("unexpected key '" + printable(key) + "'");
      }
      skip_spaces();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != '}') {
        error("expected ',' or '}'");
      }
    }
    ++pos_;
    skip_spaces();
    if (pos_ != text_.size()) error("text after the dict");
    if (!has_descr || !has_fortran || !has_shape) error("descr, fortran_order or shape missing");
    return header;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    std::string_view shown = text_;
    while (!shown.empty() && (shown.back() == ' ' || shown.back() == '\n')) shown.remove_suffix(1);
    fail(where_, "malformed header (" + what + "): " + printable(shown));
  }
  char peek() const { return pos_ < text_.size() ? text_[pos_] : '\0'; }
  void skip_spaces() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\n' || text_[pos_] == '\t')) ++pos_;
  }
  void expect(char c) {
    skip_spaces();
    if (peek() != c) error(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string string_literal() {
    skip_spaces();
    const char quote = peek();
    if (quote != '\'' && quote != '"') error("expected a string");
    const size_t end = text_.find(quote, pos_ + 1);
    if (end == std::string_view::npos) error("unterminated string");
    std::string value(text_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return value;
  }
  bool boolean() {
    if (text_.substr(pos_, 4) == "True") {
      pos_ += 4;
      return true;
    }
    if (text_.substr(pos_, 5) == "False") {
      pos_ += 5;
      return false;
    }
    error("fortran_order is neither True nor False");
  }
  std::vector<int64_t> shape() {
    std::vector<int64_t> dims;
    if (peek() != '(') error("shape is not a tuple");
    ++pos_;
    for (;;) {
      skip_spaces();
      if (peek() == ')') break;
      if (peek() < '0' || peek() > '9') error("shape holds something other than sizes");
      int64_t value = 0;
      while (peek() >= '0' && peek() <= '9') {
        if (value > (INT64_MAX - 9) / 10) error("a dimension is too large");
        value = value * 10 + (peek() - '0');
        ++pos_;
      }
      if (peek() == 'L') ++pos_;  // Python 2 long
      dims.push_back(value);
      skip_spaces();
      if (peek() == ',') {
        ++pos_;
      } else if (peek() != ')') {
        error("expected ',' or ')' in shape");
      }
    }
    ++pos_;
    return dims;
  }

  std::string_view text_;
  std::string where_;
  size_t pos_ = 0;
};

struct NumericType {
  int bytes = 0;
  bool is_signed = false;
};

// Little-endian integers and bool: '<' or, for one byte, '|'.
bool numeric_type(const std::string& descr, NumericType& type) {
  if (descr.size() != 3 || (descr[0] != '<' && descr[0] != '|')) return false;
  const char kind = descr[1];
  const int bytes = descr[2] - '0';
  if (kind == 'b' && bytes == 1) {
    type = {1, false};
    return true;
  }
  if ((kind != 'i' && kind != 'u') || (bytes != 1 && bytes != 2 && bytes != 4 && bytes != 8)) return false;
  if (bytes > 1 && descr[0] != '<') return false;
  type = {bytes, kind == 'i'};
  return true;
}

}  // namespace

int64_t NpyArray::size() const {
  int64_t count = 1;
  for (int64_t dim : shape) count *= dim;
  return count;
}

NpyArray parse_npy(std::span<const uint8_t> bytes, const std::string& where) {
  static constexpr uint8_t kMagic[6] = {0x93, 'N', 'U', 'M', 'P', 'Y'};
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, sizeof kMagic) != 0) {
    fail(where, "not a .npy array (bad magic)");
  }
  const uint8_t major = bytes[6];
  const uint8_t minor = bytes[7];
  if (major < 1 || major > 3 || minor != 0) {
    fail(where, "unsupported .npy format version " + std::to_string(major) + "." + std::to_string(minor));
  }
  size_t header_start = 10;
  size_t header_length = le16(bytes.data() + 8);
  if (major >= 2) {
    if (bytes.size() < 12) fail(where, "truncated .npy header");
    header_start = 12;
    header_length = le32(bytes.data() + 8);
  }
  if (!fits(header_start, header_length, bytes.size())) fail(where, "truncated .npy header");
  const std::string_view header_text(reinterpret_cast<const char*>(bytes.data() + header_start),
                                     header_length);
  NpyHeader header = HeaderParser(header_text, where).parse();

  NpyArray array;
  array.descr = header.descr;
  array.shape = header.shape;
  array.fortran_order = header.fortran_order;
  int64_t count = 1;
  for (int64_t dim : array.shape) {
    if (dim != 0 && count > INT64_MAX / 8 / dim) fail(where, "the shape is too large");
    count *= dim;
  }
  if (array.fortran_order && array.shape.size() > 1) {
    fail(where, "fortran_order True is not supported for arrays of 2 or more dimensions");
  }
  const std::span<const uint8_t> payload = bytes.subspan(header_start + header_length);
  if (array.is_object()) {
    ObjectArrayElements elements = unpickle_object_array(payload, array.shape, where);
    array.integers = std::move(elements.integers);
    array.lists = std::move(elements.lists);
    return array;
  }
  NumericType type;
  if (!numeric_type(array.descr, type)) {
    fail(where, "unsupported dtype '" + printable(array.descr) +
                    "' (supported: little-endian integers, bool, and object arrays)");
  }
  const auto needed = static_cast<uint64_t>(count) * static_cast<uint64_t>(type.bytes);
  if (payload.size() < needed) {
    fail(where, "truncated data: " + std::to_string(needed) + " bytes expected, " +
                    std::to_string(payload.size()) + " found");
  }
  require_node_memory(static_cast<double>(count) * sizeof(int64_t), where + " as 64-bit integers");
  array.integers.resize(static_cast<size_t>(count));
  const uint8_t* p = payload.data();
  for (size_t i = 0; i < array.integers.size(); ++i, p += type.bytes) {
    uint64_t raw = 0;
    for (int b = 0; b < type.bytes; ++b) raw |= static_cast<uint64_t>(p[b]) << (8 * b);
    const int bits = 8 * type.bytes;
    if (type.is_signed && bits < 64 && (raw >> (bits - 1)) & 1) raw |= ~uint64_t{0} << bits;
    if (!type.is_signed && bits == 64 && raw > static_cast<uint64_t>(INT64_MAX)) {
      fail(where, "element " + std::to_string(i) + " is too large (" + std::to_string(raw) + ")");
    }
    array.integers[i] = static_cast<int64_t>(raw);
  }
  return array;
}

}  // namespace ddp::io
