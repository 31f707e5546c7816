// The synthetic dataset generator (io/synthetic.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "io/hdf5_util.h"
#include "io/synthetic.h"
#include "tests/dataset_files.h"
#include "tests/test_util.h"

namespace ddp::io {
namespace {

using ddp::testing::expect_user_error;
using ddp::testing::read_all;
using ddp::testing::TempDir;

class SyntheticTest : public ::testing::Test {
 protected:
  SyntheticOptions options(const std::string& name, uint64_t seed = 7) const {
    SyntheticOptions o;
    o.output = dir_.file(name);
    o.train = 3000;
    o.test = 500;
    o.vocab = 200;  // P = 4 words per polarity: ids 4-7 positive, 8-11 negative, 12-199 filler
    o.maxlen = 40;
    o.seed = seed;
    return o;
  }
  TempDir dir_;
};

constexpr int32_t kNegation = 3;
bool is_positive(int32_t token) {
  return token >= 4 && token < 8;
}
bool is_negative(int32_t token) {
  return token >= 8 && token < 12;
}

TEST_F(SyntheticTest, SameSeedSameFile) {
  const SyntheticOptions a = options("a.h5");
  const SyntheticOptions b = options("b.h5");
  const SyntheticOptions c = options("c.h5", 8);
  write_synthetic(a);
  write_synthetic(b);
  write_synthetic(c);
  for (const char* name : {"/train/x", "/train/y", "/test/x", "/test/y"}) {
    EXPECT_EQ(read_all(a.output, name), read_all(b.output, name)) << name;
    EXPECT_NE(read_all(a.output, name), read_all(c.output, name)) << name;
  }
  // No timestamps in the file, so it is byte-identical too (a checksum identifies a dataset).
  const auto bytes = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    return std::vector<char>(std::istreambuf_iterator<char>(in), {});
  };
  EXPECT_EQ(bytes(a.output), bytes(b.output));
  // Train and test come from different streams.
  const std::vector<int32_t> train = read_all(a.output, "/train/x");
  const std::vector<int32_t> test = read_all(a.output, "/test/x");
  EXPECT_FALSE(std::equal(test.begin(), test.end(), train.begin()));
}

TEST_F(SyntheticTest, SchemaAndAttributes) {
  const SyntheticOptions o = options("nested/dir/data.h5");
  write_synthetic(o);
  EXPECT_TRUE(std::filesystem::exists(o.output));
  EXPECT_FALSE(std::filesystem::exists(o.output + ".tmp"));
  const DatasetInfo info = inspect_dataset(o.output);
  EXPECT_EQ(info.train_size, 3000);
  EXPECT_EQ(info.test_size, 500);
  EXPECT_EQ(info.vocab_size, 200);
  EXPECT_EQ(info.maxlen, 40);
  EXPECT_NO_THROW(validate_rows(info, "train", 0, info.train_size));
  EXPECT_NO_THROW(validate_rows(info, "test", 0, info.test_size));
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  Hid file = open_file_readonly(o.output);
  EXPECT_EQ(read_string_attribute(file.get(), "generator"), "synthetic-v2 seed=7");
  EXPECT_EQ(read_string_attribute(file.get(), "no such attribute"), "");
}

TEST_F(SyntheticTest, ReviewsFollowTheGrammar) {
  const SyntheticOptions o = options("data.h5");
  write_synthetic(o);
  std::vector<int64_t> dims;
  const std::vector<int32_t> x = read_all(o.output, "/train/x", &dims);
  const std::vector<int32_t> y = read_all(o.output, "/train/y");
  ASSERT_EQ(dims, (std::vector<int64_t>{3000, 40}));
  const int maxlen = 40;

  int64_t positives = 0;
  int64_t rows_with_negated_word = 0;
  int64_t rows_with_distractor = 0;
  // Key: the multiset of non-filler tokens. A bag of words sees only this (and fillers, which carry nothing).
  std::map<std::multiset<int32_t>, std::set<int32_t>> labels_by_bag;
  for (int64_t r = 0; r < dims[0]; ++r) {
    const int32_t* row = x.data() + r * maxlen;
    int start = 0;
    while (start < maxlen && row[start] == 0) ++start;
    ASSERT_LT(start, maxlen);
    ASSERT_EQ(row[start], 1) << "row " << r;
    ASSERT_GE(maxlen - start, maxlen / 2) << "row " << r;
    int sentiment_words = 0;
    int polarity_sum = 0;
    bool negated_word = false;
    bool distractor = false;
    std::multiset<int32_t> bag;
    for (int p = start + 1; p < maxlen; ++p) {
      ASSERT_GE(row[p], 3) << "row " << r << " position " << p;  // no padding, start or OOV in the body
      ASSERT_LT(row[p], 200);
      const bool sentiment = is_positive(row[p]) || is_negative(row[p]);
      if (row[p] == kNegation || sentiment) bag.insert(row[p]);
      if (row[p] == kNegation && (p + 1 == maxlen || !(is_positive(row[p + 1]) || is_negative(row[p + 1])))) {
        distractor = true;
      }
      if (!sentiment) continue;
      ++sentiment_words;
      const bool negated = row[p - 1] == kNegation;
      negated_word = negated_word || negated;
      polarity_sum += is_positive(row[p]) != negated ? 1 : -1;
    }
    ASSERT_TRUE(sentiment_words == 1 || sentiment_words == 3) << "row " << r;
    // The rule the data promises: a negation right before a sentiment word flips it.
    ASSERT_EQ(y[r], polarity_sum > 0 ? 1 : 0) << "row " << r;
    positives += y[r];
    rows_with_negated_word += negated_word;
    rows_with_distractor += distractor;
    labels_by_bag[bag].insert(y[r]);
  }
  EXPECT_GT(positives, 3000 * 30 / 100);
  EXPECT_LT(positives, 3000 * 70 / 100);
  EXPECT_GT(rows_with_negated_word, 3000 / 10);
  EXPECT_GT(rows_with_distractor, 3000 / 10);
  // Order matters: some bags of words occur with both labels.
  int64_t ambiguous_bags = 0;
  for (const auto& [bag, labels] : labels_by_bag) ambiguous_bags += labels.size() > 1;
  EXPECT_GE(ambiguous_bags, 5);
}

TEST_F(SyntheticTest, FillerWordsFollowZipfsLaw) {
  // Fillers are ids 12-199, the id's rank among them r = id - 11: drawn with probability proportional to 1/r.
  const SyntheticOptions o = options("data.h5");
  write_synthetic(o);
  std::map<int32_t, int64_t> count;
  int64_t fillers = 0;
  for (const int32_t token : read_all(o.output, "/train/x")) {
    if (token < 12) continue;
    ++count[token];
    ++fillers;
  }
  double harmonic = 0;
  for (int r = 1; r <= 188; ++r) harmonic += 1.0 / r;
  for (const int rank : {1, 2, 10, 100}) {
    const double expected = static_cast<double>(fillers) / (rank * harmonic);
    EXPECT_NEAR(static_cast<double>(count[11 + rank]), expected, 5 * std::sqrt(expected)) << "rank " << rank;
  }
}

TEST_F(SyntheticTest, RejectsImpossibleOptions) {
  SyntheticOptions o = options("bad.h5");
  o.vocab = 10;
  expect_user_error([&] { write_synthetic(o); }, {"--vocab 10 is too small: need at least 28"});
  o.vocab = 27;
  expect_user_error([&] { write_synthetic(o); }, {"--vocab 27"});
  o.vocab = 10'000'001;
  expect_user_error([&] { write_synthetic(o); }, {"--vocab 10000001 is too large: at most 10000000"});
  o.vocab = 28;
  o.maxlen = 5;
  expect_user_error([&] { write_synthetic(o); }, {"--maxlen 5 is too small: need at least 8"});
  o.maxlen = 8;
  o.train = 0;
  expect_user_error([&] { write_synthetic(o); }, {"--train 0"});
  EXPECT_FALSE(std::filesystem::exists(o.output));
  o.train = 100;
  EXPECT_NO_THROW(write_synthetic(o));  // the smallest vocabulary and length that are allowed
  EXPECT_NO_THROW(validate_rows(inspect_dataset(o.output), "train", 0, 100));
}

TEST_F(SyntheticTest, ValFractionTakesTheLastTrainingRows) {
  const SyntheticOptions whole = options("whole.h5");
  SyntheticOptions held = options("held.h5");
  held.val_fraction = 0.1;
  write_synthetic(whole);
  write_synthetic(held);
  const DatasetInfo info = inspect_dataset(held.output);
  EXPECT_EQ(info.train_size, 2700);
  EXPECT_EQ(info.val_size, 300);
  EXPECT_EQ(info.test_size, 500);
  EXPECT_NO_THROW(validate_rows(info, "val", 0, 300));
  // The same stream of training rows, its last 300 in /val; the test split is untouched.
  for (const char* name : {"x", "y"}) {
    std::vector<int32_t> rows = read_all(held.output, std::string("/train/") + name);
    const std::vector<int32_t> val = read_all(held.output, std::string("/val/") + name);
    rows.insert(rows.end(), val.begin(), val.end());
    EXPECT_EQ(rows, read_all(whole.output, std::string("/train/") + name)) << name;
    EXPECT_EQ(read_all(held.output, std::string("/test/") + name),
              read_all(whole.output, std::string("/test/") + name))
        << name;
  }
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  Hid file = open_file_readonly(held.output);
  EXPECT_EQ(read_string_attribute(file.get(), "generator"), "synthetic-v2 seed=7 val_rows=300");
}

TEST_F(SyntheticTest, BadValFractionNamesTheOption) {
  SyntheticOptions o = options("bad.h5");
  o.train = 10;
  o.val_fraction = -0.1;
  expect_user_error([&] { write_synthetic(o); },
                    {"prepare synthetic: --val-fraction must be in [0, 1), got -0.1"});
  o.val_fraction = 1;
  expect_user_error([&] { write_synthetic(o); },
                    {"prepare synthetic: --val-fraction must be in [0, 1), got 1"});
  o.val_fraction = 0.96;  // round(9.6) = 10 of 10 rows
  expect_user_error([&] { write_synthetic(o); },
                    {"prepare synthetic: --val-fraction 0.96 of 10 training rows leaves no row in /train"});
  o.val_fraction = 0.04;  // round(0.4) = 0
  expect_user_error([&] { write_synthetic(o); },
                    {"--val-fraction 0.04 of 10 training rows gives no row to /val"});
  EXPECT_FALSE(std::filesystem::exists(o.output));
  o.val_fraction = 0.94;  // 9 of 10 rows to /val
  write_synthetic(o);
  EXPECT_EQ(inspect_dataset(o.output).train_size, 1);
}

TEST_F(SyntheticTest, FailedWriteLeavesNoTemporaryFile) {
  SyntheticOptions o = options("occupied");
  std::filesystem::create_directories(std::filesystem::path(o.output) / "child");  // rename onto it fails
  expect_user_error([&] { write_synthetic(o); }, {o.output});
  EXPECT_FALSE(std::filesystem::exists(o.output + ".tmp"));
}

}  // namespace
}  // namespace ddp::io
