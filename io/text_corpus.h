// `ddptrain prepare text`: a folder of reviews in the aclImdb layout (DIR/train/pos, DIR/train/neg,
// DIR/test/pos, DIR/test/neg; one document per file; pos = label 1) to a dataset file with its vocabulary.
//
// Documents are every regular file of the four folders whose name does not start with '.', in byte order
// of their names; sub-folders are ignored. Files are read and tokenized (tokenizer.h) by a fixed pool of
// threads; a file with no words (0 bytes, or only spaces, punctuation and line breaks) is counted and
// skipped; a file that is not valid UTF-8 is decoded leniently and counted.
//
// Rows of each split are its documents (pos, then neg, each in file order) in a random permutation drawn
// from --seed, so a contiguous shard of the file is a random sample with about the split's class balance.
// With --val-fraction F the last round(F * rows) training rows go to /val instead of /train. The vocabulary
// is ranked on the rows of /train only (the /val files are read a second time to take their words out) and
// written to /vocab. The result depends on the corpus and the options, never on the thread count.
#pragma once

#include <string>

namespace ddp::io {

struct TextCorpusOptions {
  std::string input;           // the aclImdb-layout folder
  std::string output;          // the HDF5 dataset file
  int vocab = 20000;           // ids < vocab: 0 padding, 1 start, 2 out of vocabulary, 3.. words (>= 4)
  int maxlen = 80;             // tokens per sample, padded and truncated 'pre' as Keras
  int threads = 0;             // 0: every core
  uint64_t seed = 1;           // the row order of each split
  double val_fraction = 0;     // in [0, 1): the share of training rows that go to /val
  bool show_progress = false;  // a live bar (files/s, ETA) on stderr
};

// Writes the dataset atomically (dataset_writer.h) and returns a summary for the user.
// Throws UserError naming the folder or file when the input is unusable: a missing folder, a split with no
// usable document, a file that cannot be read.
std::string prepare_text(const TextCorpusOptions& options);

}  // namespace ddp::io
