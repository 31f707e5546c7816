// `ddptrain prepare synthetic`: an IMDB-shaped dataset that an LSTM can learn and a bag of words cannot
// fully. Each review is filler tokens (Zipf-distributed, as words in real text) with a few sentiment-bearing
// words; a negation token right before a sentiment word flips its polarity, so the label depends on order,
// not only on which words occur. Deterministic from the seed.
//
// With classes = K > 2 each class has its own topic words; a review holds one word of its class and, in
// half of the reviews, also one word of another class right after a negation token ("not about that"), in
// either order: a bag of words sees two topics and a negation and cannot tell which topic is negated (about
// 75% at best), a recurrent model can (K = 2 is the sentiment task above, the files of before).
//
// Every row is an independent draw (one generator stream per split), so the rows are already in a random
// order: a contiguous shard is a random sample. With val_fraction F the last round(F * train) rows of the
// training stream go to /val, leaving train - round(F * train) rows in /train.
#pragma once

#include <cstdint>
#include <string>

namespace ddp::io {

// The shortest rows the generator writes: a start token, sentiment words, negations and filler.
constexpr int kSyntheticMinMaxlen = 8;

struct SyntheticOptions {
  std::string output;
  int64_t train = 25000;
  int64_t test = 25000;
  int vocab = 20000;
  int maxlen = 80;
  uint64_t seed = 1;
  double val_fraction = 0;  // in [0, 1)
  int classes = 2;          // 2 to 256
};

// Writes the file in the schema of dataset.h (atomically: temporary file, then rename).
// Throws UserError for impossible options (vocab too small for the word classes, maxlen < 8, a val_fraction
// that leaves /train empty, ...).
void write_synthetic(const SyntheticOptions& options);

}  // namespace ddp::io
