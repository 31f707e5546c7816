// Zip archives, .npy files and numpy's pickles of object arrays, built byte by byte for the tests of their
// readers (io/zip_archive.h, io/npy.h, io/pickle.h, io/npz.h, io/imdb_npz.h).
#pragma once

#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <fstream>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "io/npy.h"
#include "tests/test_util.h"

namespace ddp::testing {

using Bytes = std::vector<uint8_t>;

inline void put(Bytes& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}
inline void put(Bytes& out, std::string_view text) {
  out.insert(out.end(), text.begin(), text.end());
}

inline Bytes from_hex(std::string_view hex) {
  Bytes out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<uint8_t>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

inline Bytes deflate_raw(const Bytes& data) {
  z_stream stream{};
  EXPECT_EQ(deflateInit2(&stream, 9, Z_DEFLATED, -MAX_WBITS, 8, Z_DEFAULT_STRATEGY), Z_OK);
  Bytes out(deflateBound(&stream, static_cast<uLong>(data.size())));
  stream.next_in = const_cast<Bytef*>(data.data());
  stream.avail_in = static_cast<uInt>(data.size());
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  EXPECT_EQ(deflate(&stream, Z_FINISH), Z_STREAM_END);
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

inline uint32_t crc_of(const Bytes& data) {
  return static_cast<uint32_t>(crc32(0L, data.data(), static_cast<uInt>(data.size())));
}

struct ZipMember {
  std::string name;
  Bytes data;
  uint16_t method = 0;                // 0 stored, 8 deflate
  bool local_sizes_in_zip64 = false;  // local header sizes 0xFFFFFFFF (numpy while streaming)
  bool central_zip64 = false;         // central directory sizes and offset 0xFFFFFFFF, values in the extra
  uint32_t crc_xor = 0;               // non-zero: a wrong CRC
  int64_t compressed_size_delta = 0;  // recorded compressed size off by this much
  int64_t size_delta = 0;             // recorded size off by this much
};

// A zip archive as Python's zipfile writes it for np.savez (force_zip64: every local header has a ZIP64
// extra field with both sizes), optionally with the ZIP64 end records.
inline Bytes make_zip(const std::vector<ZipMember>& members, bool zip64_end = false) {
  Bytes out, directory;
  for (const ZipMember& m : members) {
    const Bytes stored = m.method == 8 ? deflate_raw(m.data) : m.data;
    const uint32_t crc = crc_of(m.data) ^ m.crc_xor;
    const uint64_t offset = out.size();
    const auto compressed =
        static_cast<uint64_t>(static_cast<int64_t>(stored.size()) + m.compressed_size_delta);
    const auto size = static_cast<uint64_t>(static_cast<int64_t>(m.data.size()) + m.size_delta);
    put(out, 0x04034b50, 4);
    put(out, 45, 2);  // version needed: ZIP64
    put(out, 0, 2);
    put(out, m.method, 2);
    put(out, 0, 2);
    put(out, 0x21, 2);
    put(out, crc, 4);
    put(out, m.local_sizes_in_zip64 ? 0xFFFFFFFF : compressed, 4);
    put(out, m.local_sizes_in_zip64 ? 0xFFFFFFFF : size, 4);
    put(out, m.name.size(), 2);
    put(out, 20, 2);
    put(out, m.name);
    put(out, 0x0001, 2);
    put(out, 16, 2);
    put(out, size, 8);
    put(out, compressed, 8);
    out.insert(out.end(), stored.begin(), stored.end());

    put(directory, 0x02014b50, 4);
    put(directory, 45, 2);
    put(directory, 45, 2);
    put(directory, 0, 2);
    put(directory, m.method, 2);
    put(directory, 0, 2);
    put(directory, 0x21, 2);
    put(directory, crc, 4);
    put(directory, m.central_zip64 ? 0xFFFFFFFF : compressed, 4);
    put(directory, m.central_zip64 ? 0xFFFFFFFF : size, 4);
    put(directory, m.name.size(), 2);
    put(directory, m.central_zip64 ? 4 + 24 : 0, 2);
    put(directory, 0, 2);
    put(directory, 0, 2);
    put(directory, 0, 2);
    put(directory, 0, 4);
    put(directory, m.central_zip64 ? 0xFFFFFFFF : offset, 4);
    put(directory, m.name);
    if (m.central_zip64) {
      put(directory, 0x0001, 2);
      put(directory, 24, 2);
      put(directory, size, 8);  // the order the format fixes: size, compressed size, offset
      put(directory, compressed, 8);
      put(directory, offset, 8);
    }
  }
  const uint64_t directory_offset = out.size();
  out.insert(out.end(), directory.begin(), directory.end());
  if (zip64_end) {
    const uint64_t record = out.size();
    put(out, 0x06064b50, 4);
    put(out, 44, 8);
    put(out, 45, 2);
    put(out, 45, 2);
    put(out, 0, 4);
    put(out, 0, 4);
    put(out, members.size(), 8);
    put(out, members.size(), 8);
    put(out, directory.size(), 8);
    put(out, directory_offset, 8);
    put(out, 0x07064b50, 4);
    put(out, 0, 4);
    put(out, record, 8);
    put(out, 1, 4);
  }
  put(out, 0x06054b50, 4);
  put(out, 0, 2);
  put(out, 0, 2);
  put(out, zip64_end ? 0xFFFF : members.size(), 2);
  put(out, zip64_end ? 0xFFFF : members.size(), 2);
  put(out, zip64_end ? 0xFFFFFFFF : directory.size(), 4);
  put(out, zip64_end ? 0xFFFFFFFF : directory_offset, 4);
  put(out, 0, 2);
  return out;
}

inline std::string header_dict(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

// A .npy file: magic, version, header padded with spaces to a multiple of 64 and ended by '\n', payload.
inline Bytes make_npy(const std::string& dict, const Bytes& payload, int major = 1) {
  const size_t prefix = major == 1 ? 10 : 12;
  std::string header = dict;
  while ((prefix + header.size() + 1) % 64 != 0) header += ' ';
  header += '\n';
  Bytes out = {0x93, 'N', 'U', 'M', 'P', 'Y', static_cast<uint8_t>(major), 0};
  put(out, header.size(), major == 1 ? 2 : 4);
  put(out, header);
  out.insert(out.end(), payload.begin(), payload.end());
  return out;
}

inline Bytes numeric_payload(const std::vector<int64_t>& values, int bytes) {
  Bytes out;
  for (int64_t v : values) put(out, static_cast<uint64_t>(v), bytes);
  return out;
}

// The shape of a 1-D array, "(N,)", built by appending: GCC 12 at -O3 warns falsely (-Wrestrict) on
// "(" + std::to_string(n) + ",)" where it inlines it.
inline std::string shape_1d(size_t n) {
  std::string shape = "(";
  shape += std::to_string(n);
  shape += ",)";
  return shape;
}

inline Bytes numeric_npy(const std::vector<int64_t>& values, const std::string& descr = "<i8") {
  return make_npy(header_dict(descr, shape_1d(values.size())), numeric_payload(values, descr[2] - '0'));
}

// One element of a pickled object array.
struct Element {
  enum class Kind { kList, kInt, kNone, kText, kRaw } kind = Kind::kList;
  std::vector<int64_t> list;
  int64_t number = 0;
  Bytes raw;  // kRaw: pickle code that leaves one value on the stack
};
inline Element list_of(std::vector<int64_t> list) {
  return {Element::Kind::kList, std::move(list), 0, {}};
}
inline Element int_of(int64_t number) {
  return {Element::Kind::kInt, {}, number, {}};
}
inline Element raw_of(Bytes raw) {
  return {Element::Kind::kRaw, {}, 0, std::move(raw)};
}

// numpy's pickle of a 1-D object ndarray, as np.save writes it: protocol 3 (numpy 1.x), protocol 4 (FRAME,
// STACK_GLOBAL, MEMOIZE), or protocol 2 as Python 2 wrote it (str as SHORT_BINSTRING).
class NumpyPickle {
 public:
  enum class Style { kPython2, kProtocol3, kProtocol4 };
  explicit NumpyPickle(Style style, std::string module = "numpy.core.multiarray")
      : style_(style), module_(std::move(module)) {}

  Bytes object_array(const std::vector<Element>& elements, int64_t pickled_size = -1,
                     const std::string& dtype = "O8") {
    out_ = {0x80, static_cast<uint8_t>(style_ == Style::kPython2 ? 2 : style_ == Style::kProtocol3 ? 3 : 4)};
    size_t frame_at = 0;
    if (style_ == Style::kProtocol4) {
      out_.push_back(0x95);
      frame_at = out_.size();
      put(out_, 0, 8);
    }
    global(module_, "_reconstruct");
    global("numpy", "ndarray");
    integer(0);
    op(0x85);
    memo();
    text_or_bytes("b", style_ != Style::kPython2);
    op(0x87);
    memo();
    op('R');
    memo();
    op('(');
    integer(1);
    integer(pickled_size >= 0 ? pickled_size : static_cast<int64_t>(elements.size()));
    op(0x85);
    memo();
    global("numpy", "dtype");
    text_or_bytes(dtype, false);
    op(0x89);
    op(0x88);
    op(0x87);
    memo();
    op('R');
    memo();
    op('(');
    integer(3);
    text_or_bytes("|", false);
    op('N');
    op('N');
    op('N');
    integer(-1);
    integer(-1);
    integer(63);
    op('t');
    memo();
    op('b');
    op(0x89);
    op(']');
    memo();
    if (!elements.empty()) {
      op('(');
      for (const Element& e : elements) element(e);
      op('e');
    }
    op('t');
    memo();
    op('b');
    op('.');
    if (frame_at != 0) {
      const Bytes length = numeric_payload({static_cast<int64_t>(out_.size() - frame_at - 8)}, 8);
      std::copy(length.begin(), length.end(), out_.begin() + static_cast<std::ptrdiff_t>(frame_at));
    }
    return out_;
  }

 private:
  void op(uint8_t code) { out_.push_back(code); }
  void memo() {
    if (style_ == Style::kProtocol4) {
      op(0x94);
    } else if (next_memo_ < 256) {
      op('q');
      put(out_, next_memo_++, 1);
    } else {
      op('r');
      put(out_, next_memo_++, 4);
    }
  }
  void text_or_bytes(const std::string& s, bool as_bytes) {
    if (as_bytes) {
      op('C');
      put(out_, s.size(), 1);
    } else if (style_ == Style::kPython2) {
      op('U');
      put(out_, s.size(), 1);
    } else if (style_ == Style::kProtocol4) {
      op(0x8c);
      put(out_, s.size(), 1);
    } else {
      op('X');
      put(out_, s.size(), 4);
    }
    put(out_, s);
    memo();
  }
  void global(const std::string& module, const std::string& name) {
    if (style_ == Style::kProtocol4) {
      text_or_bytes(module, false);
      text_or_bytes(name, false);
      op(0x93);
    } else {
      op('c');
      put(out_, module + "\n" + name + "\n");
    }
    memo();
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      op('K');
      put(out_, static_cast<uint64_t>(v), 1);
    } else if (v >= 0 && v < 65536) {
      op('M');
      put(out_, static_cast<uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      op('J');
      put(out_, static_cast<uint64_t>(v), 4);
    } else {  // LONG1: the shortest little-endian two's complement
      int bytes = 1;
      while (bytes < 8 && !(v >= -(int64_t{1} << (8 * bytes - 1)) && v < (int64_t{1} << (8 * bytes - 1))))
        ++bytes;
      op(0x8a);
      put(out_, static_cast<uint64_t>(bytes), 1);
      put(out_, static_cast<uint64_t>(v), bytes);
    }
  }
  void element(const Element& e) {
    switch (e.kind) {
      case Element::Kind::kInt:
        integer(e.number);
        break;
      case Element::Kind::kNone:
        op('N');
        break;
      case Element::Kind::kText:
        text_or_bytes("word", false);
        break;
      case Element::Kind::kRaw:
        out_.insert(out_.end(), e.raw.begin(), e.raw.end());
        break;
      case Element::Kind::kList:
        op(']');
        memo();
        if (e.list.size() == 1) {
          integer(e.list[0]);
          op('a');
        } else if (!e.list.empty()) {
          op('(');
          for (int64_t v : e.list) integer(v);
          op('e');
        }
        break;
    }
  }

  Style style_;
  std::string module_;
  Bytes out_;
  uint64_t next_memo_ = 0;
};

inline Bytes object_npy(const Bytes& pickle, const std::string& shape) {
  return make_npy(header_dict("|O", shape), pickle);
}

inline Bytes to_bytes(const std::string& s) {
  return Bytes(s.begin(), s.end());
}

inline void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline io::NpyArray parse(const Bytes& npy) {
  return io::parse_npy(npy, "f.npz: a.npy");
}
inline void expect_npy_error(const Bytes& npy, const std::vector<std::string>& parts) {
  std::vector<std::string> all = {"f.npz: a.npy: "};
  all.insert(all.end(), parts.begin(), parts.end());
  expect_user_error([&] { parse(npy); }, all);
}

inline const std::vector<Element> kLists = {list_of({1, 2, 300}), list_of({}), list_of({70000})};
inline const std::vector<std::vector<int64_t>> kListsRead = {{1, 2, 300}, {}, {70000}};

}  // namespace ddp::testing
