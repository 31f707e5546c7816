#include "io/synthetic.h"

#include <algorithm>
#include <filesystem>
#include <random>
#include <stdexcept>
#include <system_error>
#include <vector>

#include "engine/errors.h"
#include "io/hdf5_util.h"
#include "io/mix.h"

namespace ddp::io {

namespace {

// Token ids, as in Keras' IMDB: 0 padding, 1 start of review, 2 out of vocabulary (unused here).
constexpr int32_t kPadding = 0;
constexpr int32_t kStart = 1;
constexpr int32_t kNegation = 3;
constexpr int32_t kFirstWord = 4;
constexpr int kMinFillerWords = 16;
constexpr int kMinMaxlen = 8;
constexpr uint64_t kNegationPercent = 35;
constexpr int64_t kMaxBlockRows = 65536;
constexpr int64_t kMaxBlockElements = int64_t{1} << 24;  // 64 MiB of tokens per block at most

// Independent generator streams of one seed (splitmix64 of seed and stream number).
uint64_t stream_seed(uint64_t seed, uint64_t stream) {
  return mix64(mix64(seed + 0x9E3779B97F4A7C15ULL) ^ stream);
}

// Uniform in [0, n), n > 0, by rejection: the same numbers with every standard library, unlike
// std::uniform_int_distribution whose algorithm is unspecified.
uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  const uint64_t threshold = (0 - n) % n;  // 2^64 mod n: values below it would favour small results
  for (;;) {
    const uint64_t r = rng();
    if (r >= threshold) return r % n;
  }
}

int uniform_between(std::mt19937_64& rng, int low, int high) {  // inclusive
  return low + static_cast<int>(uniform_below(rng, static_cast<uint64_t>(high - low) + 1));
}

struct WordClasses {
  int per_polarity = 0;  // P
  int32_t positive_begin = kFirstWord;
  int32_t negative_begin = 0;
  int32_t filler_begin = 0;
  int32_t vocab = 0;
};

WordClasses word_classes(int vocab) {
  WordClasses w;
  w.per_polarity = std::max(4, vocab / 50);
  w.negative_begin = w.positive_begin + w.per_polarity;
  w.filler_begin = w.negative_begin + w.per_polarity;
  w.vocab = vocab;
  return w;
}

// One stream of reviews. Scratch vectors are kept between rows so a row costs no allocation.
class ReviewGenerator {
 public:
  ReviewGenerator(const WordClasses& words, int maxlen, uint64_t seed)
      : words_(words), maxlen_(maxlen), rng_(seed), is_sentiment_(static_cast<size_t>(maxlen), 0) {}

  // Fills row[0, maxlen) and returns the label.
  uint8_t generate(int32_t* row) {
    const int length = uniform_between(rng_, maxlen_ / 2, maxlen_);
    const int start = maxlen_ - length;
    const int body_begin = start + 1;
    std::fill(row, row + start, kPadding);
    row[start] = kStart;
    const uint64_t fillers = static_cast<uint64_t>(words_.vocab - words_.filler_begin);
    for (int p = body_begin; p < maxlen_; ++p) {
      row[p] = words_.filler_begin + static_cast<int32_t>(uniform_below(rng_, fillers));
    }

    // K in {1, 3}, odd, so the polarity sum is never 0. The body has >= 3 positions (maxlen >= 8).
    const int k = uniform_below(rng_, 2) == 0 ? 1 : 3;
    positions_.clear();
    while (static_cast<int>(positions_.size()) < k) {
      const int p = uniform_between(rng_, body_begin, maxlen_ - 1);
      if (is_sentiment_[p]) continue;
      is_sentiment_[p] = 1;
      positions_.push_back(p);
    }
    int polarity_sum = 0;
    for (const int p : positions_) {
      const bool positive = uniform_below(rng_, 2) == 1;
      const int32_t first = positive ? words_.positive_begin : words_.negative_begin;
      row[p] = first + static_cast<int32_t>(uniform_below(rng_, static_cast<uint64_t>(words_.per_polarity)));
      // Always draw, so the stream does not depend on whether the slot before p is free.
      const bool want_negation = uniform_below(rng_, 100) < kNegationPercent;
      const bool negated = want_negation && p - 1 >= body_begin && !is_sentiment_[p - 1];
      if (negated) row[p - 1] = kNegation;
      polarity_sum += positive != negated ? 1 : -1;
    }

    // Distractors: negations that precede no sentiment word, so counting negations says nothing.
    const int distractors = static_cast<int>(uniform_below(rng_, 3));
    eligible_.clear();
    for (int p = body_begin; p < maxlen_; ++p) {
      const bool before_sentiment = p + 1 < maxlen_ && is_sentiment_[p + 1];
      if (row[p] >= words_.filler_begin && !before_sentiment) eligible_.push_back(p);
    }
    for (int d = 0; d < distractors && !eligible_.empty(); ++d) {
      const size_t pick = static_cast<size_t>(uniform_below(rng_, eligible_.size()));
      row[eligible_[pick]] = kNegation;
      eligible_[pick] = eligible_.back();
      eligible_.pop_back();
    }
    for (const int p : positions_) is_sentiment_[p] = 0;
    return polarity_sum > 0 ? 1 : 0;
  }

 private:
  WordClasses words_;
  int maxlen_;
  std::mt19937_64 rng_;
  std::vector<char> is_sentiment_;
  std::vector<int> positions_;
  std::vector<int> eligible_;
};

void validate(const SyntheticOptions& o) {
  if (o.output.empty()) throw UserError("--output is empty: name the dataset file to write");
  if (o.train < 1) throw UserError("--train " + std::to_string(o.train) + " must be at least 1");
  if (o.test < 1) throw UserError("--test " + std::to_string(o.test) + " must be at least 1");
  if (o.maxlen < kMinMaxlen) {
    throw UserError("--maxlen " + std::to_string(o.maxlen) + " is too small: need at least " +
                    std::to_string(kMinMaxlen));
  }
  const WordClasses words = word_classes(o.vocab);
  const int64_t needed = int64_t{words.filler_begin} + kMinFillerWords;
  if (o.vocab < needed) {
    throw UserError("--vocab " + std::to_string(o.vocab) + " is too small: need at least " +
                    std::to_string(needed));
  }
}

Hid create_property_list(hid_t property_class) {
  Hid list(check_h5_id(H5Pcreate(property_class), "H5Pcreate"), Hid::Kind::kPropertyList);
  // No object timestamps: the same seed then gives a byte-identical file.
  check_h5(H5Pset_obj_track_times(list.get(), false), "H5Pset_obj_track_times");
  return list;
}

Hid create_dataset(hid_t group, const char* name, hid_t file_type, int rank, const hsize_t* dims) {
  Hid space(check_h5_id(H5Screate_simple(rank, dims, nullptr), "H5Screate_simple"), Hid::Kind::kDataspace);
  Hid dcpl = create_property_list(H5P_DATASET_CREATE);
  // Every element is written, so skip writing fill values first.
  check_h5(H5Pset_fill_time(dcpl.get(), H5D_FILL_TIME_NEVER), "H5Pset_fill_time");
  check_h5(H5Pset_layout(dcpl.get(), H5D_CONTIGUOUS), "H5Pset_layout");
  return Hid(check_h5_id(
                 H5Dcreate2(group, name, file_type, space.get(), H5P_DEFAULT, dcpl.get(), H5P_DEFAULT), name),
             Hid::Kind::kDataset);
}

void write_block(hid_t dataset, int rank, int64_t first, int64_t rows, int64_t columns, hid_t memory_type,
                 const void* data, const char* what) {
  const hsize_t start[2] = {static_cast<hsize_t>(first), 0};
  const hsize_t block[2] = {static_cast<hsize_t>(rows), static_cast<hsize_t>(columns)};
  const hsize_t one[2] = {1, 1};
  Hid file_space(check_h5_id(H5Dget_space(dataset), "H5Dget_space"), Hid::Kind::kDataspace);
  check_h5(H5Sselect_hyperslab(file_space.get(), H5S_SELECT_SET, start, nullptr, one, block),
           "H5Sselect_hyperslab");
  Hid memory_space(check_h5_id(H5Screate_simple(rank, block, nullptr), "H5Screate_simple"),
                   Hid::Kind::kDataspace);
  check_h5(H5Dwrite(dataset, memory_type, memory_space.get(), file_space.get(), H5P_DEFAULT, data), what);
}

void write_split(hid_t file, const std::string& path, const std::string& split, int64_t rows, int maxlen,
                 ReviewGenerator& generator) {
  const std::string x_what = "H5Dwrite " + path + " /" + split + "/x";
  const std::string y_what = "H5Dwrite " + path + " /" + split + "/y";
  Hid x;
  Hid y;
  {
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    Hid gcpl = create_property_list(H5P_GROUP_CREATE);
    Hid group(
        check_h5_id(H5Gcreate2(file, split.c_str(), H5P_DEFAULT, gcpl.get(), H5P_DEFAULT), split.c_str()),
        Hid::Kind::kGroup);
    const hsize_t dims[2] = {static_cast<hsize_t>(rows), static_cast<hsize_t>(maxlen)};
    x = create_dataset(group.get(), "x", H5T_STD_I32LE, 2, dims);
    y = create_dataset(group.get(), "y", H5T_STD_U8LE, 1, dims);
  }
  const int64_t block_rows = std::clamp<int64_t>(kMaxBlockElements / maxlen, 1, kMaxBlockRows);
  std::vector<int32_t> tokens(static_cast<size_t>(std::min(block_rows, rows) * maxlen));
  std::vector<uint8_t> labels(static_cast<size_t>(std::min(block_rows, rows)));
  for (int64_t first = 0; first < rows; first += block_rows) {
    const int64_t count = std::min(block_rows, rows - first);
    for (int64_t r = 0; r < count; ++r) labels[r] = generator.generate(tokens.data() + r * maxlen);
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    write_block(x.get(), 2, first, count, maxlen, H5T_NATIVE_INT32, tokens.data(), x_what.c_str());
    write_block(y.get(), 1, first, count, 1, H5T_NATIVE_UINT8, labels.data(), y_what.c_str());
  }
}

void write_file(const SyntheticOptions& o, const std::string& path) {
  const WordClasses words = word_classes(o.vocab);
  Hid file;
  {
    std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
    quiet_hdf5_errors();
    try {
      file = Hid(check_h5_id(H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT), "H5Fcreate"),
                 Hid::Kind::kFile);
    } catch (const std::runtime_error& e) {
      // Usually permissions or a full disk: the user's to fix, so a UserError with HDF5's reason.
      throw UserError(path + ": cannot create the dataset file (" + e.what() + ")");
    }
    write_int_attribute(file.get(), "vocab_size", o.vocab);
    write_int_attribute(file.get(), "maxlen", o.maxlen);
    write_string_attribute(file.get(), "generator", "synthetic-v1 seed=" + std::to_string(o.seed));
  }
  ReviewGenerator train(words, o.maxlen, stream_seed(o.seed, 1));
  write_split(file.get(), path, "train", o.train, o.maxlen, train);
  ReviewGenerator test(words, o.maxlen, stream_seed(o.seed, 2));
  write_split(file.get(), path, "test", o.test, o.maxlen, test);
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  // Checked here: the close in Hid's destructor cannot report a failed final write.
  check_h5(H5Fflush(file.get(), H5F_SCOPE_GLOBAL), ("H5Fflush " + path).c_str());
  file.reset();
}

}  // namespace

void write_synthetic(const SyntheticOptions& options) {
  validate(options);
  namespace fs = std::filesystem;
  const fs::path output(options.output);
  std::error_code error;
  if (output.has_parent_path()) {
    fs::create_directories(output.parent_path(), error);
    if (error) {
      throw UserError(output.parent_path().string() + ": cannot create directory (" + error.message() + ")");
    }
  }
  // Readers never see a half-written file: write aside, then rename over the output in one step.
  const std::string tmp = options.output + ".tmp";
  try {
    write_file(options, tmp);
    fs::rename(tmp, output, error);
    if (error) {
      throw UserError(options.output + ": cannot move " + tmp + " into place (" + error.message() + ")");
    }
  } catch (...) {
    fs::remove(tmp, error);
    throw;
  }
}

}  // namespace ddp::io
