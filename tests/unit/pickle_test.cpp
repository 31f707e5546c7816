// The restricted unpickler (io/pickle.h), through numpy's object arrays in .npy files built byte by byte.
#include <gtest/gtest.h>

#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "io/npy.h"
#include "tests/numpy_files.h"

namespace ddp::io {
namespace {

using ddp::testing::Bytes;
using ddp::testing::Element;
using ddp::testing::expect_npy_error;
using ddp::testing::from_hex;
using ddp::testing::int_of;
using ddp::testing::kLists;
using ddp::testing::kListsRead;
using ddp::testing::list_of;
using ddp::testing::NumpyPickle;
using ddp::testing::object_npy;
using ddp::testing::parse;
using ddp::testing::raw_of;
using ddp::testing::shape_1d;
using ddp::testing::to_bytes;
using namespace std::string_literals;

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
    const std::string s = shape.empty() ? shape_1d(elements.size()) : shape;
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

}  // namespace
}  // namespace ddp::io
