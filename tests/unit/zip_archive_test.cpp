// The zip archive reader (io/zip_archive.h) on archives built byte by byte.
#include <gtest/gtest.h>
#include <zlib.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/base/errors.h"
#include "io/zip_archive.h"
#include "tests/numpy_files.h"
#include "tests/test_util.h"

namespace ddp::io {
namespace {

using ddp::testing::Bytes;
using ddp::testing::deflate_raw;
using ddp::testing::expect_user_error;
using ddp::testing::make_zip;
using ddp::testing::TempDir;
using ddp::testing::to_bytes;
using ddp::testing::ZipMember;
using namespace std::string_literals;

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

}  // namespace
}  // namespace ddp::io
