// The .npz readers (io/zip_archive.h, io/npy.h, io/pickle.h) on arbitrary bytes: the zip container, every
// member's inflation and CRC, the .npy header and its pickle, and `prepare imdb-npz` on an archive that has
// the four Keras arrays.
#include <cstdint>
#include <string>
#include <vector>

#include "io/imdb_npz.h"
#include "io/npy.h"
#include "io/zip_archive.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ddp;
  const std::span<const uint8_t> bytes(data, size);
  // The bytes as one .npy file (the member parser on its own reaches deeper than through a zip's CRC).
  fuzz::expect_user_error([&] { io::parse_npy(bytes, "fuzz.npy"); });

  bool keras_arrays = false;
  fuzz::expect_user_error([&] {
    const io::ZipArchive zip("fuzz.npz", std::vector<uint8_t>(bytes.begin(), bytes.end()));
    int found = 0;
    for (const std::string& member : zip.member_names()) {
      fuzz::expect_user_error([&] {
        const std::vector<uint8_t> contents = zip.read(member);
        io::parse_npy(contents, "fuzz.npz: " + member);
      });
      for (const char* name : {"x_train.npy", "y_train.npy", "x_test.npy", "y_test.npy"}) {
        if (member == name) ++found;
      }
    }
    keras_arrays = found == 4;
  });
  if (!keras_arrays) return 0;
  // The whole command, with a small vocabulary and maxlen so that the output stays small.
  const auto dir = fuzz::scratch_dir();
  fuzz::write_bytes(dir / "in.npz", bytes);
  io::ImdbNpzOptions options;
  options.input = dir / "in.npz";
  options.output = dir / "out.h5";
  options.vocab = 50;
  options.maxlen = 8;
  options.val_fraction = size % 2 == 0 ? 0.0 : 0.25;
  fuzz::expect_user_error([&] { io::prepare_imdb_npz(options); });
  return 0;
}
