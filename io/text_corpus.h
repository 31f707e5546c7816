// `ddptrain prepare text`: a folder of reviews in the aclImdb layout (DIR/train/pos, DIR/train/neg,
// DIR/test/pos, DIR/test/neg; one document per file; pos = label 1) to a dataset file with its vocabulary.
#pragma once

#include <string>

namespace ddp::io {

struct TextCorpusOptions {
  std::string input;           // the aclImdb-layout folder
  std::string output;          // the HDF5 dataset file
  int vocab = 20000;           // ids < vocab: 0 padding, 1 start, 2 out of vocabulary, 3.. words
  int maxlen = 80;             // tokens per sample, padded and truncated 'pre' as Keras
  int threads = 0;             // 0: every core
  bool show_progress = false;  // a live bar (files/s, ETA) on stderr
};

// Writes the dataset atomically (dataset_writer.h) and returns a summary for the user.
// Throws UserError naming the folder or file when the input is unusable.
std::string prepare_text(const TextCorpusOptions& options);

}  // namespace ddp::io
