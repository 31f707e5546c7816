// The .npy parser (io/npy.h) on arrays built byte by byte.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/base/errors.h"
#include "io/npy.h"
#include "tests/numpy_files.h"

namespace ddp::io {
namespace {

using ddp::testing::Bytes;
using ddp::testing::expect_npy_error;
using ddp::testing::header_dict;
using ddp::testing::make_npy;
using ddp::testing::numeric_npy;
using ddp::testing::numeric_payload;
using ddp::testing::parse;
using ddp::testing::to_bytes;

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

}  // namespace
}  // namespace ddp::io
