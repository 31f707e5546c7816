// `ddptrain prepare synthetic`: an IMDB-shaped dataset that an LSTM can learn and a bag of words cannot
// fully. Each review is filler tokens (Zipf-distributed, as words in real text) with a few sentiment-bearing
// words; a negation token right before a sentiment word flips its polarity, so the label depends on order,
// not only on which words occur. Deterministic from the seed.
#pragma once

#include <cstdint>
#include <string>

namespace ddp::io {

struct SyntheticOptions {
  std::string output;
  int64_t train = 25000;
  int64_t test = 25000;
  int vocab = 20000;
  int maxlen = 80;
  uint64_t seed = 1;
};

// Writes the file in the schema of dataset.h (atomically: temporary file, then rename).
// Throws UserError for impossible options (vocab too small for the word classes, maxlen < 8, ...).
void write_synthetic(const SyntheticOptions& options);

}  // namespace ddp::io
