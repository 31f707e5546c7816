// `ddptrain prepare text`: a folder of documents with one sub-folder per class in each split
// (DIR/train/<class>/, DIR/test/<class>/; one document per file) to a dataset file with its vocabulary.
// The classes are the sub-folders both splits hold, sorted by name: class k is the k-th (aclImdb: neg = 0,
// pos = 1, its train/unsup ignored); more than two classes write the num_classes attribute, and /classes
// names them (dataset.h).
//
// Documents are every regular file of the class folders whose name does not start with '.', in byte order
// of their names; deeper folders are ignored. Files are read and tokenized (tokenizer.h) by a fixed pool of
// threads; a file with no words (0 bytes, or only spaces, punctuation and line breaks) is counted and
// skipped; a file that is not valid UTF-8 is decoded leniently and counted.
//
// Rows of each split are its documents (class by class from the last, each in file order: pos, then neg,
// as before there were classes) in a random permutation drawn from --seed, so a contiguous shard of the
// file is a random sample with about the split's class balance. With --val-fraction F the last
// round(F * rows) training rows go to /val instead of /train. The vocabulary is ranked on the rows of
// /train only (the /val files are read a second time to take their words out) and written to /vocab. The
// result depends on the corpus and the options, never on the thread count.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::io {

// The most one document may hold: a file of a corpus, a line of predict's --input.
inline constexpr std::size_t kMaxDocumentBytes = std::size_t{256} << 20;

struct TextCorpusOptions {
  std::string input;        // the folder: train/<class>/, test/<class>/
  std::string output;       // the HDF5 dataset file
  int vocab = 20000;        // ids < vocab: 0 padding, 1 start, 2 out of vocabulary, 3.. words (>= 4)
  int maxlen = 80;          // tokens per sample, padded and truncated 'pre' as Keras
  int threads = 0;          // 0: every core
  uint64_t seed = 1;        // the row order of each split
  double val_fraction = 0;  // in [0, 1): the share of training rows that go to /val
  // Folder names that are no class wherever they stand (aclImdb's train/unsup holds unlabelled reviews).
  // Any other folder that one split holds and the other lacks is an error: a class would be lost silently.
  std::vector<std::string> not_classes = {"unsup"};
  // Whether the summary warns of a name of not_classes that no folder has (a misspelling): the user named
  // them, rather than taking the default.
  bool warn_unmatched_not_classes = false;
  bool show_progress = false;  // a live bar (files/s, ETA) on stderr
};

// Writes the dataset atomically (dataset_writer.h) and returns a summary for the user.
// Throws UserError naming the folder or file when the input is unusable: a missing folder, a split with no
// usable document, a file that cannot be read.
std::string prepare_text(const TextCorpusOptions& options);

}  // namespace ddp::io
