#include "io/synthetic.h"

#include <algorithm>
#include <random>
#include <span>
#include <vector>

#include "engine/base/errors.h"
#include "io/dataset_writer.h"
#include "io/mix.h"

namespace ddp::io {

namespace {

// Token ids, as in Keras' IMDB: 0 padding, 1 start of review, 2 out of vocabulary (unused here).
constexpr int32_t kPadding = 0;
constexpr int32_t kStart = 1;
constexpr int32_t kNegation = 3;
constexpr int32_t kFirstWord = 4;
constexpr int kMinFillerWords = 16;
constexpr uint64_t kNegationPercent = 35;
constexpr int kMaxPerPolarity = 50;
constexpr int64_t kMaxBlockRows = 65536;
constexpr int64_t kMaxBlockElements = int64_t{1} << 24;  // 64 MiB of tokens per block at most

int uniform_between(std::mt19937_64& rng, int low, int high) {  // inclusive
  return low + static_cast<int>(uniform_below(rng, static_cast<uint64_t>(high - low) + 1));
}

// Filler words follow Zipf's law (the word of rank r, from 1, drawn with probability proportional to 1/r), as
// words do in real text: a few are in every review and most are rare. Drawn uniformly instead, every review
// would be a near-unique set of filler words that a large model memorizes before it finds the sentiment words
// (measured: with vocab 20000 and maxlen 80 the imdb.ini model then stays at chance on the test split).
class ZipfTable {
 public:
  explicit ZipfTable(int64_t words) : cumulative_(static_cast<size_t>(words)) {
    double total = 0;
    for (size_t r = 0; r < cumulative_.size(); ++r)
      cumulative_[r] = total += 1.0 / static_cast<double>(r + 1);
    for (double& c : cumulative_) c /= total;  // the last is exactly 1
  }
  // A rank in [0, words): the first whose cumulative probability exceeds a uniform draw in [0, 1).
  int64_t draw(std::mt19937_64& rng) const {
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;  // 53 random bits
    return std::upper_bound(cumulative_.begin(), cumulative_.end(), u) - cumulative_.begin();
  }

 private:
  std::vector<double> cumulative_;
};

struct WordClasses {
  int per_polarity = 0;  // P: words of each polarity (two classes) or of each topic (more)
  int32_t positive_begin = kFirstWord;
  int32_t negative_begin = 0;
  int32_t filler_begin = 0;
  int32_t vocab = 0;
  int classes = 2;
  // More classes: class k's topic words are [topic_begin(k), topic_begin(k) + per_polarity).
  int32_t topic_begin(int k) const { return kFirstWord + k * per_polarity; }
};

WordClasses word_classes(int vocab, int classes) {
  WordClasses w;
  w.classes = classes;
  if (classes == 2) {
    w.per_polarity = std::clamp(vocab / 50, 4, kMaxPerPolarity);
    w.negative_begin = w.positive_begin + w.per_polarity;
    w.filler_begin = w.negative_begin + w.per_polarity;
  } else {
    w.per_polarity = std::clamp(vocab / (25 * classes), 4, kMaxPerPolarity);
    w.filler_begin = w.topic_begin(classes);
  }
  w.vocab = vocab;
  return w;
}

// One stream of reviews. Scratch vectors are kept between rows so a row costs no allocation.
class ReviewGenerator {
 public:
  ReviewGenerator(const WordClasses& words, const ZipfTable& fillers, int maxlen, uint64_t seed)
      : words_(words),
        fillers_(fillers),
        maxlen_(maxlen),
        rng_(seed),
        is_sentiment_(static_cast<size_t>(maxlen), 0) {}

  // Fills row[0, maxlen) and returns the label.
  uint8_t generate(int32_t* row) {
    return words_.classes == 2 ? generate_sentiment(row) : generate_topic(row);
  }

 private:
  // The review's length, padding, start token and filler words; returns the body's first position.
  int fill_body(int32_t* row) {
    const int length = uniform_between(rng_, maxlen_ / 2, maxlen_);
    const int start = maxlen_ - length;
    std::fill(row, row + start, kPadding);
    row[start] = kStart;
    for (int p = start + 1; p < maxlen_; ++p) {
      row[p] = words_.filler_begin + static_cast<int32_t>(fillers_.draw(rng_));
    }
    return start + 1;
  }

  // One topic word of the label's class, and in half of the reviews one of another class after a negation.
  uint8_t generate_topic(int32_t* row) {
    const int body_begin = fill_body(row);
    const auto label = static_cast<int>(uniform_below(rng_, static_cast<uint64_t>(words_.classes)));
    auto topic_word = [&](int k) {
      return words_.topic_begin(k) +
             static_cast<int32_t>(uniform_below(rng_, static_cast<uint64_t>(words_.per_polarity)));
    };
    // The body has >= 3 positions (maxlen >= 8): the kept word, and a negation with the negated word.
    const int kept = uniform_between(rng_, body_begin, maxlen_ - 1);
    row[kept] = topic_word(label);
    if (uniform_below(rng_, 2) == 1) {
      int other = static_cast<int>(uniform_below(rng_, static_cast<uint64_t>(words_.classes - 1)));
      if (other >= label) ++other;
      // A negation and its word in two free slots that do not put the negation right before the kept word.
      for (int tries = 0; tries < 64; ++tries) {
        const int p = uniform_between(rng_, body_begin + 1, maxlen_ - 1);
        if (p == kept || p - 1 == kept || p == kept - 1) continue;
        row[p - 1] = kNegation;
        row[p] = topic_word(other);
        break;
      }
    }
    return static_cast<uint8_t>(label);
  }

  // Sentiment words whose polarity a negation right before them flips; the label is the sum's sign.
  uint8_t generate_sentiment(int32_t* row) {
    const int body_begin = fill_body(row);

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
  const ZipfTable& fillers_;
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
  if (o.maxlen < kSyntheticMinMaxlen) {
    throw UserError("--maxlen " + std::to_string(o.maxlen) + " is too small: need at least " +
                    std::to_string(kSyntheticMinMaxlen));
  }
  if (o.classes < 2 || o.classes > 256) {
    throw UserError("--classes " + std::to_string(o.classes) + " must be 2 to 256 (labels are one byte)");
  }
  if (o.vocab > kMaxVocabulary) {
    throw UserError("--vocab " + std::to_string(o.vocab) + " is too large: at most " +
                    std::to_string(kMaxVocabulary));
  }
  val_rows_of("prepare synthetic", o.val_fraction, o.train);
  const WordClasses words = word_classes(o.vocab, o.classes);
  const int64_t needed = int64_t{words.filler_begin} + kMinFillerWords;
  if (o.vocab < needed) {
    throw UserError("--vocab " + std::to_string(o.vocab) + " is too small: need at least " +
                    std::to_string(needed));
  }
}

void write_split(DatasetWriter& writer, const std::string& split, int64_t rows, int maxlen,
                 ReviewGenerator& generator) {
  const int64_t block_rows = std::clamp<int64_t>(kMaxBlockElements / maxlen, 1, kMaxBlockRows);
  std::vector<int32_t> tokens(static_cast<size_t>(std::min(block_rows, rows) * maxlen));
  std::vector<uint8_t> labels(static_cast<size_t>(std::min(block_rows, rows)));
  for (int64_t first = 0; first < rows; first += block_rows) {
    const int64_t count = std::min(block_rows, rows - first);
    for (int64_t r = 0; r < count; ++r) labels[r] = generator.generate(tokens.data() + r * maxlen);
    writer.write_rows(split, first,
                      std::span<const int32_t>(tokens.data(), static_cast<size_t>(count * maxlen)),
                      std::span<const uint8_t>(labels.data(), static_cast<size_t>(count)));
  }
}

}  // namespace

void write_synthetic(const SyntheticOptions& o) {
  validate(o);
  const WordClasses words = word_classes(o.vocab, o.classes);
  const int64_t val_rows = val_rows_of("prepare synthetic", o.val_fraction, o.train);
  DatasetWriter writer(o.output, o.vocab, o.maxlen, o.train, o.test, val_rows);
  writer.write_attribute("generator", "synthetic-v2 seed=" + std::to_string(o.seed) +
                                          (val_rows > 0 ? " val_rows=" + std::to_string(val_rows) : "") +
                                          (o.classes != 2 ? " classes=" + std::to_string(o.classes) : ""));
  if (o.classes != 2) {
    std::vector<std::string> names;
    for (int k = 0; k < o.classes; ++k) names.push_back("topic" + std::to_string(k));
    writer.write_classes(o.classes, names);
  }
  const ZipfTable fillers(words.vocab - words.filler_begin);
  // The writer sends the last val_rows of these to /val.
  ReviewGenerator train(words, fillers, o.maxlen, stream_seed(o.seed, 1));
  write_split(writer, "train", o.train, o.maxlen, train);
  ReviewGenerator test(words, fillers, o.maxlen, stream_seed(o.seed, 2));
  write_split(writer, "test", o.test, o.maxlen, test);
  writer.commit();
}

}  // namespace ddp::io
