// The .npz reader (zip, .npy, the restricted unpickler), numpy's RandomState shuffle, and `prepare imdb-npz`
// end to end. Every archive, header and pickle here is built byte by byte by the test itself.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "engine/base/errors.h"
#include "io/hdf5_util.h"
#include "io/imdb_npz.h"
#include "io/npy.h"
#include "io/npz.h"
#include "io/numpy_random_state.h"
#include "io/zip_archive.h"
#include "tests/test_util.h"

namespace ddp::io {
namespace {

using Bytes = std::vector<uint8_t>;
using ddp::testing::expect_user_error;
using ddp::testing::TempDir;
using namespace std::string_literals;

// ---------------------------------------------------------------------------------------------------------
// Byte builders

void put(Bytes& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out.push_back(static_cast<uint8_t>(value >> (8 * i)));
}
void put(Bytes& out, std::string_view text) {
  out.insert(out.end(), text.begin(), text.end());
}

Bytes from_hex(std::string_view hex) {
  Bytes out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<uint8_t>(std::stoi(std::string(hex.substr(i, 2)), nullptr, 16)));
  }
  return out;
}

Bytes deflate_raw(const Bytes& data) {
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

uint32_t crc_of(const Bytes& data) {
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
Bytes make_zip(const std::vector<ZipMember>& members, bool zip64_end = false) {
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

std::string header_dict(const std::string& descr, const std::string& shape, bool fortran = false) {
  return "{'descr': '" + descr + "', 'fortran_order': " + (fortran ? "True" : "False") +
         ", 'shape': " + shape + ", }";
}

// A .npy file: magic, version, header padded with spaces to a multiple of 64 and ended by '\n', payload.
Bytes make_npy(const std::string& dict, const Bytes& payload, int major = 1) {
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

Bytes numeric_payload(const std::vector<int64_t>& values, int bytes) {
  Bytes out;
  for (int64_t v : values) put(out, static_cast<uint64_t>(v), bytes);
  return out;
}

Bytes numeric_npy(const std::vector<int64_t>& values, const std::string& descr = "<i8") {
  return make_npy(header_dict(descr, "(" + std::to_string(values.size()) + ",)"),
                  numeric_payload(values, descr[2] - '0'));
}

// One element of a pickled object array.
struct Element {
  enum class Kind { kList, kInt, kNone, kText, kRaw } kind = Kind::kList;
  std::vector<int64_t> list;
  int64_t number = 0;
  Bytes raw;  // kRaw: pickle code that leaves one value on the stack
};
Element list_of(std::vector<int64_t> list) {
  return {Element::Kind::kList, std::move(list), 0, {}};
}
Element int_of(int64_t number) {
  return {Element::Kind::kInt, {}, number, {}};
}
Element raw_of(Bytes raw) {
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

Bytes object_npy(const Bytes& pickle, const std::string& shape) {
  return make_npy(header_dict("|O", shape), pickle);
}

Bytes to_bytes(const std::string& s) {
  return Bytes(s.begin(), s.end());
}

void write_file(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

NpyArray parse(const Bytes& npy) {
  return parse_npy(npy, "f.npz: a.npy");
}
void expect_npy_error(const Bytes& npy, const std::vector<std::string>& parts) {
  std::vector<std::string> all = {"f.npz: a.npy: "};
  all.insert(all.end(), parts.begin(), parts.end());
  expect_user_error([&] { parse(npy); }, all);
}

// ---------------------------------------------------------------------------------------------------------
// Zip

TEST(Zip, ReadsStoredAndDeflatedMembers) {
  Bytes big(100000);
  for (size_t i = 0; i < big.size(); ++i) big[i] = static_cast<uint8_t>(i % 7 + (i / 1000) % 3);
  const Bytes archive =
      make_zip({{"a.npy", to_bytes("hello"), 0}, {"b.npy", big, 8}, {"empty.npy", {}, 0}, {"e8.npy", {}, 8}});
  const Bytes deflated = deflate_raw(big);
  ASSERT_LT(deflated.size(), big.size() / 10);  // so that member really went through inflate
  const ZipArchive zip("t.npz", archive);
  EXPECT_EQ(zip.member_names(), (std::vector<std::string>{"a.npy", "b.npy", "empty.npy", "e8.npy"}));
  EXPECT_TRUE(zip.contains("b.npy"));
  EXPECT_FALSE(zip.contains("c.npy"));
  EXPECT_EQ(zip.read("a.npy"), to_bytes("hello"));
  EXPECT_EQ(zip.read("b.npy"), big);
  EXPECT_TRUE(zip.read("empty.npy").empty());
  EXPECT_TRUE(zip.read("e8.npy").empty());
}

TEST(Zip, ReadsZip64FieldsAndEndRecords) {
  const Bytes data = to_bytes("zip64 member contents");
  ZipMember stored{"s.npy", data, 0};
  stored.local_sizes_in_zip64 = true;
  stored.central_zip64 = true;
  ZipMember deflated{"d.npy", data, 8};
  deflated.central_zip64 = true;
  const ZipArchive zip("t.npz", make_zip({stored, deflated}, /*zip64_end=*/true));
  EXPECT_EQ(zip.member_names(), (std::vector<std::string>{"s.npy", "d.npy"}));
  EXPECT_EQ(zip.read("s.npy"), data);
  EXPECT_EQ(zip.read("d.npy"), data);
}

TEST(Zip, MalformedArchivesAreUserErrors) {
  const Bytes good = make_zip({{"a.npy", to_bytes("some contents"), 0}});
  expect_user_error([] { ZipArchive("t.npz", to_bytes("just a text file, renamed")); },
                    {"t.npz: ", "not a zip archive"});
  expect_user_error([] { ZipArchive("t.npz", {}); }, {"t.npz: ", "not a zip archive"});
  // Cut anywhere, the end record is gone.
  expect_user_error([&] { ZipArchive("t.npz", Bytes(good.begin(), good.end() - 30)); },
                    {"not a zip archive"});

  ZipMember bad_crc{"a.npy", to_bytes("some contents"), 0};
  bad_crc.crc_xor = 0x10;
  expect_user_error([&] { ZipArchive("t.npz", make_zip({bad_crc})).read("a.npy"); },
                    {"t.npz: a.npy: ", "CRC-32 mismatch"});
  ZipMember bad_crc_deflated = bad_crc;
  bad_crc_deflated.method = 8;
  expect_user_error([&] { ZipArchive("t.npz", make_zip({bad_crc_deflated})).read("a.npy"); },
                    {"t.npz: a.npy: ", "CRC-32 mismatch"});

  // The central directory says more bytes than the member has: the data runs into the directory (stored:
  // size mismatch), or past the end of the file.
  ZipMember too_long{"a.npy", to_bytes("some contents"), 0};
  too_long.compressed_size_delta = 1000;
  expect_user_error([&] { ZipArchive("t.npz", make_zip({too_long})).read("a.npy"); },
                    {"t.npz: a.npy: ", "truncated"});
  ZipMember short_deflate{"a.npy", Bytes(5000, 'x'), 8};
  short_deflate.compressed_size_delta = -3;
  expect_user_error([&] { ZipArchive("t.npz", make_zip({short_deflate})).read("a.npy"); },
                    {"t.npz: a.npy: ", "truncated"});

  // Recorded sizes that do not match the data.
  auto with_size_delta = [](uint16_t method, int64_t delta) {
    ZipMember m{"a.npy", Bytes(3000, 'z'), method};
    m.size_delta = delta;
    m.central_zip64 = true;  // room for sizes above 4 GiB
    return make_zip({m});
  };
  expect_user_error([&] { ZipArchive("t.npz", with_size_delta(8, -1000)).read("a.npy"); },
                    {"t.npz: a.npy: ", "inflates to more than the recorded 2000 bytes"});
  expect_user_error([&] { ZipArchive("t.npz", with_size_delta(8, 5)).read("a.npy"); },
                    {"t.npz: a.npy: ", "inflates to 3000 bytes, the archive records 3005"});
  expect_user_error([&] { ZipArchive("t.npz", with_size_delta(8, int64_t{1} << 40)).read("a.npy"); },
                    {"t.npz: a.npy: ", "impossible for"});
  expect_user_error([&] { ZipArchive("t.npz", with_size_delta(0, 1)).read("a.npy"); },
                    {"t.npz: a.npy: ", "differs from its size"});

  ZipMember unknown_method{"a.npy", to_bytes("x"), 12};  // bzip2
  expect_user_error([&] { ZipArchive("t.npz", make_zip({unknown_method})).read("a.npy"); },
                    {"t.npz: a.npy: ", "compression method 12"});
  expect_user_error([&] { ZipArchive("t.npz", good).read("b.npy"); }, {"t.npz: ", "no member 'b.npy'"});

  // ZIP64 sentinels without the extra field that should carry the values.
  Bytes no_extra = make_zip({{"a.npy", to_bytes("abc"), 0}});
  const size_t directory = no_extra.size() - 22 - (46 + 5);
  ASSERT_EQ(no_extra[directory], 0x50);
  for (int i = 0; i < 4; ++i) no_extra[directory + 24 + static_cast<size_t>(i)] = 0xFF;
  expect_user_error([&] { ZipArchive("t.npz", no_extra); }, {"t.npz: a.npy: ", "ZIP64"});

  // Deflate data that is not deflate.
  Bytes corrupt = make_zip({{"a.npy", Bytes(2000, 'y'), 8}});
  const size_t data_start = 30 + 5 + 20;
  corrupt[data_start] = 0xFF;  // a reserved block type
  corrupt[data_start + 1] = 0xFF;
  expect_user_error([&] { ZipArchive("t.npz", corrupt).read("a.npy"); }, {"t.npz: a.npy: ", "deflate"});
}

TEST(Zip, ReadFileNamesTheFile) {
  TempDir dir;
  expect_user_error([&] { ZipArchive::read_file(dir.file("absent.npz")); }, {"absent.npz: ", "cannot open"});
  expect_user_error([&] { ZipArchive::read_file(dir.path().string()); }, {"is a directory"});
}

// ---------------------------------------------------------------------------------------------------------
// .npy

TEST(Npy, ReadsLittleEndianIntegerTypes) {
  const std::vector<int64_t> values = {0, 1, -1, 100, -128, 127};
  for (const std::string descr : {"|i1", "<i2", "<i4", "<i8"}) {
    const NpyArray a = parse(numeric_npy(values, descr));
    EXPECT_EQ(a.integers, values) << descr;
    EXPECT_EQ(a.shape, std::vector<int64_t>{6});
  }
  const std::vector<int64_t> unsigned_values = {0, 1, 200, 255};
  for (const std::string descr : {"|u1", "<u2", "<u4", "<u8"}) {
    EXPECT_EQ(parse(numeric_npy(unsigned_values, descr)).integers, unsigned_values) << descr;
  }
  EXPECT_EQ(parse(numeric_npy({70000, -70000, int64_t{1} << 40}, "<i8")).integers,
            (std::vector<int64_t>{70000, -70000, int64_t{1} << 40}));
  EXPECT_EQ(parse(numeric_npy({1, 0, 1}, "|b1")).integers, (std::vector<int64_t>{1, 0, 1}));
  EXPECT_EQ(parse(numeric_npy({65535}, "<u2")).integers, std::vector<int64_t>{65535});
  EXPECT_EQ(parse(numeric_npy({-2}, "<i2")).integers, std::vector<int64_t>{-2});
}

TEST(Npy, ReadsVersionsShapesAndPython2Headers) {
  const Bytes payload = numeric_payload({1, 2, 3, 4, 5, 6}, 4);
  for (int major : {1, 2, 3}) {
    const NpyArray a = parse(make_npy(header_dict("<i4", "(2, 3)"), payload, major));
    EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3})) << major;
    EXPECT_EQ(a.integers, (std::vector<int64_t>{1, 2, 3, 4, 5, 6})) << major;
  }
  // Python 2's numpy wrote longs with an L, and keys in any order.
  const NpyArray old = parse(
      make_npy("{'shape': (3L,), 'fortran_order': False, 'descr': '<i4'}", numeric_payload({7, 8, 9}, 4)));
  EXPECT_EQ(old.integers, (std::vector<int64_t>{7, 8, 9}));
  // 1-D Fortran order is the same layout.
  EXPECT_EQ(parse(make_npy(header_dict("<i4", "(3,)", true), numeric_payload({7, 8, 9}, 4))).integers.size(),
            3u);
  // A scalar and an empty array.
  EXPECT_EQ(parse(make_npy(header_dict("<i8", "()"), numeric_payload({42}, 8))).integers,
            std::vector<int64_t>{42});
  EXPECT_TRUE(parse(make_npy(header_dict("<i8", "(0,)"), {})).integers.empty());
}

TEST(Npy, MalformedArraysAreUserErrors) {
  expect_npy_error(to_bytes("PK\x03\x04 not an npy file"), {"bad magic"});
  Bytes version = numeric_npy({1});
  version[6] = 4;
  expect_npy_error(version, {"format version 4.0"});
  Bytes header_cut = numeric_npy({1});
  header_cut.resize(40);
  expect_npy_error(header_cut, {"truncated .npy header"});
  expect_npy_error(make_npy("{'descr': '<i8', 'shape': (1,), }", numeric_payload({1}, 8)),
                   {"malformed header"});
  expect_npy_error(make_npy("not a dict at all", {}), {"malformed header"});
  expect_npy_error(make_npy("{'descr': '<i8', 'fortran_order': False, 'shape': (1,), 'x': 1}", {}),
                   {"unexpected key 'x'"});
  expect_npy_error(make_npy(header_dict("<f4", "(1,)"), numeric_payload({0}, 4)),
                   {"unsupported dtype '<f4'"});
  expect_npy_error(make_npy(header_dict(">i8", "(1,)"), numeric_payload({0}, 8)),
                   {"unsupported dtype '>i8'"});
  expect_npy_error(make_npy("{'descr': [('a', '<i4')], 'fortran_order': False, 'shape': (1,), }", {}),
                   {"structured"});
  expect_npy_error(make_npy(header_dict("<i4", "(2, 2)", true), numeric_payload({1, 2, 3, 4}, 4)),
                   {"fortran_order True"});
  expect_npy_error(make_npy(header_dict("<i8", "(3,)"), numeric_payload({1, 2}, 8)), {"truncated data"});
  expect_npy_error(make_npy(header_dict("<u8", "(1,)"), numeric_payload({-1}, 8)), {"too large"});
}

// ---------------------------------------------------------------------------------------------------------
// Pickled object arrays

const std::vector<Element> kLists = {list_of({1, 2, 300}), list_of({}), list_of({70000})};
const std::vector<std::vector<int64_t>> kListsRead = {{1, 2, 300}, {}, {70000}};

TEST(Pickle, ReadsWhatNumpyWrites) {
  // np.save(f, x, allow_pickle=True) with numpy 1.24.2 (Debian 12's python3-numpy), for x = np.empty(3,
  // dtype=object) holding [1, 2, 300], [], [70000]: the pickle after the .npy header, printed with
  // data[10 + header_len:].hex().
  const Bytes numpy_pickle = from_hex(
      "8003636e756d70792e636f72652e6d756c746961727261790a5f7265636f6e7374727563740a7100636e756d70790a6e6461"
      "727261790a71014b008571024301627103877104527105284b014b03857106636e756d70790a64747970650a710758020000"
      "004f387108898887710952710a284b0358010000007c710b4e4e4e4affffffff4affffffff4b3f74710c62895d710d285d71"
      "0e284b014b024d2c01655d710f5d71104a701101006165747111622e");
  const NpyArray a = parse(object_npy(numpy_pickle, "(3,)"));
  EXPECT_TRUE(a.is_object());
  EXPECT_TRUE(a.holds_lists());
  EXPECT_EQ(a.lists, kListsRead);
  // The builder below writes the same bytes, so its other styles are numpy's too.
  EXPECT_EQ(NumpyPickle(NumpyPickle::Style::kProtocol3).object_array(kLists), numpy_pickle);
}

TEST(Pickle, ReadsProtocols2To4AndNumpy2Names) {
  const std::vector<Element> elements = {list_of({1, -2, int64_t{1} << 40, -(int64_t{1} << 40)}),
                                         list_of({5}), list_of({}),
                                         list_of({65535, 65536, INT64_MAX, INT64_MIN})};
  const std::vector<std::vector<int64_t>> expected = {
      {1, -2, int64_t{1} << 40, -(int64_t{1} << 40)}, {5}, {}, {65535, 65536, INT64_MAX, INT64_MIN}};
  for (const auto style :
       {NumpyPickle::Style::kPython2, NumpyPickle::Style::kProtocol3, NumpyPickle::Style::kProtocol4}) {
    for (const std::string module : {"numpy.core.multiarray", "numpy._core.multiarray"}) {
      const NpyArray a = parse(object_npy(NumpyPickle(style, module).object_array(elements), "(4,)"));
      EXPECT_EQ(a.lists, expected) << static_cast<int>(style) << " " << module;
    }
  }
  // More than 256 memo entries (LONG_BINPUT) and a list longer than one APPENDS batch.
  std::vector<Element> many;
  for (int i = 0; i < 300; ++i) many.push_back(list_of({i}));
  std::vector<int64_t> long_list(2500);
  std::iota(long_list.begin(), long_list.end(), 0);
  many.push_back(list_of(long_list));
  const NpyArray big =
      parse(object_npy(NumpyPickle(NumpyPickle::Style::kProtocol3).object_array(many), "(301,)"));
  ASSERT_EQ(big.lists.size(), 301u);
  EXPECT_EQ(big.lists[299], std::vector<int64_t>{299});
  EXPECT_EQ(big.lists[300], long_list);
}

TEST(Pickle, ObjectArraysOfInts) {
  const NpyArray a = parse(object_npy(
      NumpyPickle(NumpyPickle::Style::kProtocol3).object_array({int_of(1), int_of(0), int_of(1)}), "(3,)"));
  EXPECT_FALSE(a.holds_lists());
  EXPECT_EQ(a.integers, (std::vector<int64_t>{1, 0, 1}));
}

TEST(Pickle, RefusesAnythingElse) {
  NumpyPickle p3(NumpyPickle::Style::kProtocol3);
  auto npy = [](const std::vector<Element>& elements, const std::string& shape = "") {
    const std::string s = shape.empty() ? "(" + std::to_string(elements.size()) + ",)" : shape;
    return object_npy(NumpyPickle(NumpyPickle::Style::kProtocol3).object_array(elements), s);
  };
  // Code execution through a global: refused by name, whatever it is.
  expect_npy_error(object_npy(to_bytes("\x80\x03"
                                       "cos\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85q\x02R."s),
                              "(1,)"),
                   {"pickle: global os.system is not allowed"});
  expect_npy_error(object_npy(to_bytes("\x80\x04\x8c\x08"
                                       "builtins\x8c\x04"
                                       "eval\x93."s),
                              "(1,)"),
                   {"global builtins.eval is not allowed"});
  // Opcodes outside the list, also inside an element.
  expect_npy_error(object_npy(to_bytes("\x80\x03}q\x00."s), "(1,)"),
                   {"opcode 0x7d (EMPTY_DICT) is not allowed"});
  expect_npy_error(npy({raw_of(from_hex("47400921fb54442d18"))}), {"opcode 0x47 (BINFLOAT) is not allowed"});
  expect_npy_error(npy({raw_of(to_bytes("\x81"))}), {"opcode 0x81 (NEWOBJ) is not allowed"});
  // Elements that are not lists of ints.
  expect_npy_error(npy({list_of({1}), Element{Element::Kind::kNone, {}, 0, {}}}), {"element 1 is None"});
  expect_npy_error(npy({list_of({1}), Element{Element::Kind::kText, {}, 0, {}}}), {"element 1 is a str"});
  expect_npy_error(npy({list_of({1}), int_of(3)}), {"element 1 is an int, not a list of ints"});
  expect_npy_error(npy({list_of({1}), raw_of(to_bytes("](K\x01X\x01\x00\x00\x00"
                                                      "we"s))}),
                   {"element 1 holds a str, not only ints"});
  expect_npy_error(npy({list_of({1}), raw_of(to_bytes("h\x0e"))}), {"element 1 repeats an earlier element"});
  // Ints beyond 64 bits, unknown memo entries, stack underflow, a cycle, deep nesting, no STOP.
  expect_npy_error(npy({raw_of(from_hex("8a09000000000000000001"))}), {"wider than 64 bits"});
  expect_npy_error(npy({raw_of(to_bytes("h\xee"))}), {"GET of memo entry 238, which was never stored"});
  expect_npy_error(object_npy(to_bytes("\x80\x03"
                                       "a."),
                              "(1,)"),
                   {"stack underflow"});
  expect_npy_error(object_npy(to_bytes("\x80\x03]q\x00h\x00"
                                       "a."s),
                              "(1,)"),
                   {"already inside another container"});
  std::string deep = "\x80\x03(";
  for (int i = 0; i < 20; ++i) deep += "]";
  for (int i = 0; i < 19; ++i) deep += "a";
  expect_npy_error(object_npy(to_bytes(deep + "."), "(1,)"), {"nesting deeper than 16"});
  Bytes cut = p3.object_array(kLists);
  cut.pop_back();
  expect_npy_error(object_npy(cut, "(3,)"), {"ends without STOP"});
  expect_npy_error(object_npy(to_bytes("\x80\x07."), "(1,)"), {"protocol 7 is not supported"});
  // The pickle must be an object ndarray whose shape is the header's.
  expect_npy_error(npy(kLists, "(4,)"), {"the pickled shape differs from the header's"});
  expect_npy_error(object_npy(NumpyPickle(NumpyPickle::Style::kProtocol3).object_array(kLists, 4), "(4,)"),
                   {"the pickle holds 3 elements, the shape says 4"});
  expect_npy_error(
      object_npy(NumpyPickle(NumpyPickle::Style::kProtocol3).object_array(kLists, -1, "<i8"), "(3,)"),
      {"dtype '<i8'", "only object arrays"});
  expect_npy_error(object_npy(to_bytes("\x80\x03K\x01."), "(1,)"),
                   {"the pickle holds an int, not an ndarray"});
}

// ---------------------------------------------------------------------------------------------------------
// .npz

TEST(Npz, ReadsArraysByNameAndNamesMissingOnes) {
  TempDir dir;
  const std::string path = dir.file("t.npz");
  write_file(
      path,
      make_zip({{"x_train.npy",
                 object_npy(NumpyPickle(NumpyPickle::Style::kProtocol3).object_array(kLists), "(3,)"), 0},
                {"y_train.npy", numeric_npy({0, 1, 1}), 8}}));
  const NpzFile npz(path);
  EXPECT_EQ(npz.array_names(), (std::vector<std::string>{"x_train", "y_train"}));
  EXPECT_EQ(npz.array("x_train").lists, kListsRead);
  EXPECT_EQ(npz.array("y_train").integers, (std::vector<int64_t>{0, 1, 1}));
  expect_user_error([&] { npz.array("x_test"); },
                    {path + ": missing array 'x_test' (the file has: x_train, y_train)"});
}

// ---------------------------------------------------------------------------------------------------------
// numpy's RandomState

// Reference permutations from numpy 1.24.2 (/usr/bin/python3 on Debian 12):
//   r = np.random.RandomState(seed); a = np.arange(n); r.shuffle(a); print(a.tolist())
// and, for the second shuffle, the same `r` shuffling np.arange(m) afterwards (as load_data does for test).
TEST(NumpyRandomState, ShufflesAsNumpyDoes) {
  auto shuffled = [](NumpyRandomState& rng, int64_t n) {
    std::vector<int64_t> v(static_cast<size_t>(n));
    std::iota(v.begin(), v.end(), 0);
    rng.shuffle(v);
    return v;
  };
  NumpyRandomState a(113);
  EXPECT_EQ(shuffled(a, 10), (std::vector<int64_t>{9, 3, 6, 1, 0, 7, 4, 8, 2, 5}));
  EXPECT_EQ(shuffled(a, 6), (std::vector<int64_t>{3, 1, 0, 5, 4, 2}));
  NumpyRandomState b(113);
  EXPECT_EQ(shuffled(b, 25), (std::vector<int64_t>{18, 19, 3,  8,  13, 14, 1,  6,  9,  24, 4, 17, 11,
                                                   7,  22, 21, 20, 15, 0,  16, 23, 12, 10, 2, 5}));
  NumpyRandomState c(0);
  EXPECT_EQ(shuffled(c, 12), (std::vector<int64_t>{6, 11, 4, 10, 2, 8, 1, 7, 9, 3, 0, 5}));
  NumpyRandomState d(4294967295);
  EXPECT_EQ(shuffled(d, 9), (std::vector<int64_t>{5, 1, 8, 7, 0, 6, 4, 2, 3}));
  NumpyRandomState e(113);
  EXPECT_EQ(shuffled(e, 1), std::vector<int64_t>{0});
  EXPECT_EQ(shuffled(e, 0), std::vector<int64_t>{});
  // IMDB's sizes: the first and last entries of both shuffles of load_data.
  NumpyRandomState f(113);
  const std::vector<int64_t> train = shuffled(f, 25000);
  const std::vector<int64_t> test = shuffled(f, 25000);
  EXPECT_EQ(std::vector<int64_t>(train.begin(), train.begin() + 4),
            (std::vector<int64_t>{7798, 13226, 18078, 793}));
  EXPECT_EQ(std::vector<int64_t>(train.end() - 3, train.end()), (std::vector<int64_t>{22690, 4828, 14501}));
  EXPECT_EQ(std::vector<int64_t>(test.begin(), test.begin() + 4),
            (std::vector<int64_t>{22748, 4083, 8015, 13688}));
  EXPECT_EQ(std::vector<int64_t>(test.end() - 2, test.end()), (std::vector<int64_t>{20869, 16517}));

  EXPECT_THROW(NumpyRandomState(uint64_t{1} << 32), UserError);
}

TEST(NumpyRandomState, RandomIntervalStaysInRange) {
  NumpyRandomState rng(7);
  for (uint64_t max : {uint64_t{1}, uint64_t{2}, uint64_t{5}, uint64_t{1} << 31, (uint64_t{1} << 32) - 1,
                       uint64_t{1} << 32, (uint64_t{1} << 40) + 3}) {
    for (int i = 0; i < 200; ++i) ASSERT_LE(rng.random_interval(max), max) << max;
  }
  EXPECT_EQ(rng.random_interval(0), 0u);
}

// ---------------------------------------------------------------------------------------------------------
// prepare imdb-npz

struct ImdbArrays {
  std::vector<Element> x_train = {list_of({5}), list_of({0, 1, 2, 3, 4, 30}), list_of({})};
  Bytes y_train = numeric_npy({1, 0, 1});
  std::vector<Element> x_test = {list_of({7, 8}), list_of({6})};
  Bytes y_test = numeric_npy({0, 1}, "|u1");
  bool with_y_test = true;
};

std::string write_imdb(const TempDir& dir, const ImdbArrays& arrays) {
  const std::string path = dir.file("imdb.npz");
  auto x = [](const std::vector<Element>& elements) {
    return object_npy(NumpyPickle(NumpyPickle::Style::kProtocol3).object_array(elements),
                      "(" + std::to_string(elements.size()) + ",)");
  };
  std::vector<ZipMember> members = {{"x_test.npy", x(arrays.x_test), 8},
                                    {"x_train.npy", x(arrays.x_train), 0},
                                    {"y_train.npy", arrays.y_train, 0}};
  if (arrays.with_y_test) members.push_back({"y_test.npy", arrays.y_test, 8});
  write_file(path, make_zip(members));
  return path;
}

std::vector<int32_t> read_ints(const std::string& path, const std::string& name) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  Hid file = open_file_readonly(path);
  Hid set = open_dataset(file.get(), path, name);
  int64_t size = 1;
  for (int64_t d : dataset_dims(set.get())) size *= d;
  std::vector<int32_t> data(static_cast<size_t>(size));
  check_h5(H5Dread(set.get(), H5T_NATIVE_INT32, H5S_ALL, H5S_ALL, H5P_DEFAULT, data.data()), "H5Dread");
  return data;
}

TEST(PrepareImdbNpz, FollowsKerasConventions) {
  TempDir dir;
  ImdbNpzOptions options;
  options.input = write_imdb(dir, {});
  options.output = dir.file("out.h5");
  options.vocab = 10;
  options.maxlen = 4;
  const std::string summary = prepare_imdb_npz(options);
  EXPECT_NE(summary.find("3 train and 2 test samples, vocab 10, maxlen 4"), std::string::npos) << summary;
  // Rows, in file order, after [1] + [w + 3 ...] (ids >= 10 become 2) and pad/truncate 'pre' to 4:
  //   [5]                -> [1, 8]                   -> 0 0 1 8
  //   [0, 1, 2, 3, 4, 30] -> [1, 3, 4, 5, 6, 7, 2]   -> 5 6 7 2 (the start id is cut off)
  //   []                 -> [1]                      -> 0 0 0 1
  // test: [7, 8] -> [1, 2, 2] -> 0 1 2 2;  [6] -> [1, 9] -> 0 0 1 9
  // RandomState(113) orders train [2, 0, 1] and then test [1, 0] (numpy, as in the test above).
  EXPECT_EQ(read_ints(options.output, "/train/x"),
            (std::vector<int32_t>{0, 0, 0, 1, 0, 0, 1, 8, 5, 6, 7, 2}));
  EXPECT_EQ(read_ints(options.output, "/train/y"), (std::vector<int32_t>{1, 1, 0}));
  EXPECT_EQ(read_ints(options.output, "/test/x"), (std::vector<int32_t>{0, 0, 1, 9, 0, 1, 2, 2}));
  EXPECT_EQ(read_ints(options.output, "/test/y"), (std::vector<int32_t>{1, 0}));
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  Hid file = open_file_readonly(options.output);
  EXPECT_EQ(read_int_attribute(file.get(), options.output, "vocab_size"), 10);
  EXPECT_EQ(read_int_attribute(file.get(), options.output, "maxlen"), 4);
  EXPECT_EQ(read_string_attribute(file.get(), "source"),
            "keras imdb.npz imdb.npz num_words=10 maxlen=4 seed=113");
  EXPECT_FALSE(link_exists(file.get(), "vocab"));
}

TEST(PrepareImdbNpz, ValFractionHoldsOutTheLastRowsOfLoadDatasOrder) {
  TempDir dir;
  ImdbNpzOptions options;
  options.input = write_imdb(dir, {});
  options.output = dir.file("out.h5");
  options.vocab = 10;
  options.maxlen = 4;
  options.val_fraction = 0.34;  // round(1.02) = 1 of 3 rows
  const std::string summary = prepare_imdb_npz(options);
  EXPECT_NE(summary.find("2 train, 1 val and 2 test samples"), std::string::npos) << summary;
  // load_data's order as in FollowsKerasConventions, not reshuffled: its last row goes to /val.
  EXPECT_EQ(read_ints(options.output, "/train/x"), (std::vector<int32_t>{0, 0, 0, 1, 0, 0, 1, 8}));
  EXPECT_EQ(read_ints(options.output, "/train/y"), (std::vector<int32_t>{1, 1}));
  EXPECT_EQ(read_ints(options.output, "/val/x"), (std::vector<int32_t>{5, 6, 7, 2}));
  EXPECT_EQ(read_ints(options.output, "/val/y"), (std::vector<int32_t>{0}));
  EXPECT_EQ(read_ints(options.output, "/test/x"), (std::vector<int32_t>{0, 0, 1, 9, 0, 1, 2, 2}));

  options.val_fraction = 0.9;  // round(2.7) = 3 of 3
  expect_user_error([&] { prepare_imdb_npz(options); },
                    {"prepare imdb-npz: --val-fraction 0.9 of 3 training rows leaves no row in /train"});
  options.val_fraction = -1;
  expect_user_error([&] { prepare_imdb_npz(options); },
                    {"prepare imdb-npz: --val-fraction must be in [0, 1), got -1"});
}

TEST(PrepareImdbNpz, BadInputIsAUserErrorAndWritesNothing) {
  TempDir dir;
  ImdbNpzOptions options;
  options.output = dir.file("out.h5");
  auto expect_error = [&](const ImdbArrays& arrays, const std::vector<std::string>& parts) {
    options.input = write_imdb(dir, arrays);
    expect_user_error([&] { prepare_imdb_npz(options); }, parts);
    EXPECT_FALSE(std::filesystem::exists(options.output));
    EXPECT_FALSE(std::filesystem::exists(options.output + ".tmp"));
  };
  ImdbArrays bad_label;
  bad_label.y_train = numeric_npy({1, 2, 0});
  expect_error(bad_label, {"imdb.npz: y_train: the label of sample 1 is 2, expected 0 or 1"});
  ImdbArrays negative;
  negative.x_test = {list_of({1}), list_of({4, -3})};
  expect_error(negative, {"imdb.npz: x_test: sample 1 has a negative word id (-3)"});
  ImdbArrays mismatch;
  mismatch.y_train = numeric_npy({1, 0});
  expect_error(mismatch, {"imdb.npz: x_train has 3 samples but y_train has 2"});
  ImdbArrays missing;
  missing.with_y_test = false;
  expect_error(missing, {"imdb.npz: missing array 'y_test'"});
  ImdbArrays ints_as_x;
  ints_as_x.x_train = {int_of(1), int_of(2), int_of(3)};
  expect_error(ints_as_x, {"imdb.npz: x_train: its elements are ints"});
  ImdbArrays float_labels;
  float_labels.y_test = make_npy(header_dict("<f8", "(2,)"), numeric_payload({0, 0}, 8));
  expect_error(float_labels, {"imdb.npz: y_test.npy: unsupported dtype '<f8'"});

  options.input = write_imdb(dir, {});
  options.vocab = 2;
  expect_user_error([&] { prepare_imdb_npz(options); }, {"--vocab must be at least 3"});
  options.vocab = 100;
  options.seed = uint64_t{1} << 32;
  expect_user_error([&] { prepare_imdb_npz(options); }, {"--seed must be at most 4294967295"});
}

}  // namespace
}  // namespace ddp::io
