// The dataset file's readers (io/dataset.h, io/batch_reader.h) on HDF5 files built from the input: which of
// /train, /test and /val exist, their element types, ranks, dims, storage and values, the root attributes
// (vocab_size, maxlen, num_classes) and /vocab and /classes. Random bytes fed to libhdf5 would mostly test
// libhdf5; a structured file tests what ddptrain does with any file libhdf5 reads.
#include <hdf5.h>

#include <cstdint>
#include <string>
#include <vector>

#include "io/batch_reader.h"
#include "io/dataset.h"
#include "io/hdf5_util.h"
#include "io/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

const hid_t kTokenTypes[] = {H5T_STD_I32LE, H5T_STD_I32BE,  H5T_STD_U32LE, H5T_STD_I64LE,
                             H5T_STD_I16LE, H5T_IEEE_F32LE, H5T_STD_U8LE};
const hid_t kLabelTypes[] = {H5T_STD_U8LE,  H5T_STD_U8BE,   H5T_STD_I8LE,
                             H5T_STD_U16LE, H5T_IEEE_F64LE, H5T_STD_I32LE};

void build(FuzzedDataProvider& in, const std::string& path) {
  using ddp::fuzz::pick_int;
  ddp::fuzz::H5Builder file(path);
  const hsize_t maxlen = static_cast<hsize_t>((in.ConsumeIntegralInRange<int>(0, 6) + 1) % 7);
  for (const char* split : {"train", "test", "val"}) {
    // 0: the schema; 1: only x; 2: only y; 3: neither; 4: a group or a dataset where the other belongs.
    const int presence = in.ConsumeIntegralInRange<int>(0, std::string(split) == "val" ? 6 : 9);
    if (presence > 4 && std::string(split) == "val") continue;
    const hsize_t rows = static_cast<hsize_t>((in.ConsumeIntegralInRange<int>(0, 9) + 2) % 10);
    const std::string group = std::string("/") + split;
    std::vector<int64_t> tokens;
    const size_t distinct = in.ConsumeIntegralInRange<size_t>(1, 8);
    for (size_t i = 0; i < distinct; ++i) tokens.push_back(pick_int(in, 12));
    std::vector<int64_t> labels;
    for (size_t i = 0; i < 3; ++i) labels.push_back(pick_int(in, 3));
    if (presence == 4) {
      file.numeric(in, group, {rows}, kLabelTypes, labels);
      continue;
    }
    if (presence != 2 && presence != 3) {
      // Rank 2 as the schema says, sometimes 1 or 3; rows of x and y sometimes differ.
      const int rank = in.ConsumeIntegralInRange<int>(0, 7);
      std::vector<hsize_t> dims = rank == 5   ? std::vector<hsize_t>{rows}
                                  : rank == 6 ? std::vector<hsize_t>{rows, maxlen, 2}
                                  : rank == 7 ? std::vector<hsize_t>{rows, maxlen + 1}
                                              : std::vector<hsize_t>{rows, maxlen};
      file.numeric(in, group + "/x", dims, kTokenTypes, tokens);
    }
    if (presence != 1 && presence != 3) {
      const hsize_t y_rows = in.ConsumeIntegralInRange<int>(0, 5) == 5 ? rows + 1 : rows;
      std::vector<hsize_t> dims = in.ConsumeIntegralInRange<int>(0, 7) == 7 ? std::vector<hsize_t>{y_rows, 1}
                                                                            : std::vector<hsize_t>{y_rows};
      file.numeric(in, group + "/y", dims, kLabelTypes, labels);
    }
  }
  for (const char* name : {"vocab_size", "maxlen", "num_classes"}) {
    // num_classes is optional (absent: two classes), the others are not.
    const bool optional = std::string(name) == "num_classes";
    if (in.ConsumeIntegralInRange<int>(0, 5) == (optional ? 0 : 5)) continue;
    const int64_t value = std::string(name) == "maxlen" && !in.ConsumeBool() ? static_cast<int64_t>(maxlen)
                          : std::string(name) == "vocab_size"                ? (16 - pick_int(in, 16) % 17)
                                                                             : pick_int(in, 16);
    file.int_attribute(in, file.root(), name, value);
  }
  if (in.ConsumeBool()) {
    file.strings(in, "/vocab", ddp::fuzz::pick_strings(in, in.ConsumeIntegralInRange<size_t>(0, 8)));
  }
  if (in.ConsumeBool()) {
    file.strings(in, "/classes", ddp::fuzz::pick_strings(in, in.ConsumeIntegralInRange<size_t>(0, 5)));
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ddp;
  FuzzedDataProvider in(data, size);
  const std::string path = fuzz::scratch_dir() / "dataset.h5";
  build(in, path);
  const int batch_size = in.ConsumeIntegralInRange<int>(1, 4);
  const bool shuffle = in.ConsumeBool();
  const bool drop_last = in.ConsumeBool();
  const uint64_t seed = in.ConsumeIntegral<uint64_t>();

  // As `train` reads a file: inspect, validate each split, count labels, then read batches (also when
  // validation failed: data.validate = false skips it).
  io::DatasetInfo info;
  if (!fuzz::expect_user_error([&] { info = io::inspect_dataset(path); })) return 0;
  for (const char* split : {"train", "test", "val"}) {
    const int64_t rows = std::string(split) == "train"  ? info.train_size
                         : std::string(split) == "test" ? info.test_size
                                                        : info.val_size;
    fuzz::expect_user_error([&] {
      io::validate_rows(info, split, 0, rows);
      io::label_counts(info, split, 0, rows);
      io::read_labels(info, split, 0, rows);
    });
  }
  fuzz::expect_user_error([&] {
    if (info.has_vocab) io::read_vocabulary(path);
  });
  for (int k = 0; k < info.num_classes; ++k) io::class_name(info, k);
  fuzz::expect_user_error([&] {
    io::BatchReaderOptions options;
    options.path = path;
    options.shard = io::shard_of(info.train_size, 0, 1, false);
    options.batch_size = batch_size;
    options.shuffle = shuffle;
    options.drop_last = drop_last;
    options.seed = seed;
    options.prefetch = 2;
    io::BatchReader reader(options);
    while (const io::Batch* batch = reader.next()) {
      if (batch->tokens.size() != static_cast<size_t>(batch->batch_size) * static_cast<size_t>(batch->seq)) {
        __builtin_trap();
      }
    }
  });
  return 0;
}
