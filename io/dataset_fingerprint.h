// A dataset's fingerprint, recorded in every checkpoint so that --resume can tell whether it continues on
// the data it was trained on: the split sizes, vocab_size, maxlen and a hash of up to 64 evenly spaced rows
// (tokens and label) of each split. Cheap (a few hundred small reads, whatever the file's size), and it
// changes when the file is re-made from other documents, with another vocabulary or in another order.
#pragma once

#include <cstdint>
#include <string>

#include "io/dataset.h"

namespace ddp::io {

// "train 25000, test 25000, vocab 20000, maxlen 80, content 3f9a1c2b4d5e6f70" (a /val split adds "val N").
// Equal texts: the same data as far as a resume can tell. Throws UserError naming the file if it cannot be
// read.
std::string dataset_fingerprint(const DatasetInfo& info);

}  // namespace ddp::io
