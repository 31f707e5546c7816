// The HDF5 helpers (io/hdf5_util.h): string lists and their checksums.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <string>
#include <vector>

#include "io/hdf5_util.h"
#include "tests/test_util.h"

namespace ddp::io {
namespace {

using ddp::testing::expect_user_error;
using ddp::testing::TempDir;

// A string list carries its checksum: a byte changed in place (a damaged disk, an edit) is an error naming
// the file and the list, not a renamed class or a word moved to another id; a list without one (h5py's,
// files of before) reads as it is.
TEST(StringList, ItsChecksumCatchesAChangedString) {
  TempDir dir;
  const std::string path = dir.file("lists.h5");
  const std::vector<std::string> words{"<pad>", "<start>", "<oov>", "word1x", "café"};
  {
    Hid file(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), Hid::Kind::kFile);
    write_string_list(file.get(), "vocab", words);
    write_string_list(file.get(), "plain", words);
    ASSERT_GE(H5Adelete_by_name(file.get(), "plain", "checksum", H5P_DEFAULT), 0);
  }
  Hid file(H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT), Hid::Kind::kFile);
  EXPECT_EQ(read_string_list(file.get(), path, "/vocab", 100), words);
  EXPECT_EQ(read_string_list(file.get(), path, "/vocab", 4),
            (std::vector<std::string>{"<pad>", "<start>", "<oov>", "word1x"}));
  // "word1x" becomes "xord1x" in place, the checksum attribute kept.
  for (const char* name : {"/vocab", "/plain"}) {
    Hid dataset(H5Dopen2(file.get(), name, H5P_DEFAULT), Hid::Kind::kDataset);
    Hid type(H5Tcopy(H5T_C_S1), Hid::Kind::kDatatype);
    H5Tset_size(type.get(), H5T_VARIABLE);
    H5Tset_cset(type.get(), H5T_CSET_UTF8);
    std::vector<const char*> changed{"<pad>", "<start>", "<oov>", "xord1x", "café"};
    ASSERT_GE(H5Dwrite(dataset.get(), type.get(), H5S_ALL, H5S_ALL, H5P_DEFAULT, changed.data()), 0);
  }
  expect_user_error([&] { read_string_list(file.get(), path, "/vocab", 4); },
                    {path, "/vocab does not match its checksum"});
  EXPECT_EQ(read_string_list(file.get(), path, "/plain", 100)[3], "xord1x");
}

}  // namespace
}  // namespace ddp::io
