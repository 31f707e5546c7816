// `ddptrain prepare imdb-npz`: the Keras IMDB file (imdb.npz) to a dataset file, with the conventions of
// keras.datasets.imdb.load_data followed by keras pad_sequences' defaults: one numpy RandomState(seed)
// shuffles train, then test; each review becomes [1] + [w + 3 ...] with ids >= vocab replaced by 2; then
// the last maxlen ids are kept and shorter reviews are left-padded with 0.
//
// The rows are written in load_data's shuffled order, which is already a seeded random order: a contiguous
// shard is a random sample, so nothing is reshuffled. With val_fraction F the last round(F * N) shuffled
// training rows go to /val (the rows Keras' fit(validation_split=F) would hold out, up to rounding).
#pragma once

#include <cstdint>
#include <string>

namespace ddp::io {

struct ImdbNpzOptions {
  std::string input;        // the .npz: x_train, y_train, x_test, y_test
  std::string output;       // the HDF5 dataset file
  int vocab = 20000;        // load_data's num_words (>= 3): ids >= vocab become the out-of-vocabulary id
  int maxlen = 80;          // pad_sequences' maxlen
  uint64_t seed = 113;      // load_data's shuffle seed (numpy's range: at most 2^32 - 1)
  double val_fraction = 0;  // in [0, 1): the share of training rows that go to /val
};

// Writes the dataset atomically (dataset_writer.h) and returns a one-line summary for the user.
// Throws UserError naming the file (and the array or entry) when the input is malformed.
std::string prepare_imdb_npz(const ImdbNpzOptions& options);

}  // namespace ddp::io
