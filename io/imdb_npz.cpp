#include "io/imdb_npz.h"

#include <algorithm>
#include <filesystem>
#include <numeric>
#include <utility>
#include <vector>

#include "engine/base/errors.h"
#include "io/dataset_writer.h"
#include "io/npz.h"
#include "io/numpy_random_state.h"

namespace ddp::io {
namespace {

// keras.datasets.imdb.load_data's defaults.
constexpr int64_t kStartChar = 1;
constexpr int64_t kOovChar = 2;
constexpr int64_t kIndexFrom = 3;
constexpr int64_t kMaxSeed = 0xFFFFFFFF;               // numpy RandomState's seed range
constexpr int64_t kTokensPerBlock = int64_t{1} << 22;  // rows are written in blocks of about 16 MiB

struct Split {
  std::vector<std::vector<int64_t>> x;  // word ids as in the file, in file order
  std::vector<uint8_t> y;
};

// x: an object array of lists of word ids (Keras' file), or a 2-D integer array (one sequence per row).
std::vector<std::vector<int64_t>> sequences_of(NpyArray array, const std::string& where) {
  const bool object_1d = array.is_object() && array.shape.size() == 1;
  const bool numeric_2d = !array.is_object() && array.shape.size() == 2;
  if (!object_1d && !numeric_2d) {
    throw UserError(where +
                    ": expected a 1-D object array of lists of word ids (or a 2-D integer array), got " +
                    std::to_string(array.shape.size()) + "-D '" + array.descr + "'");
  }
  std::vector<std::vector<int64_t>> sequences;
  if (object_1d) {
    if (array.size() > 0 && !array.holds_lists()) {
      throw UserError(where + ": its elements are ints, not lists of word ids");
    }
    sequences = std::move(array.lists);
  } else {
    const auto columns = static_cast<size_t>(array.shape[1]);
    sequences.resize(static_cast<size_t>(array.shape[0]));
    for (size_t row = 0; row < sequences.size(); ++row) {
      const auto first = array.integers.begin() + static_cast<std::ptrdiff_t>(row * columns);
      sequences[row].assign(first, first + static_cast<std::ptrdiff_t>(columns));
    }
  }
  for (size_t i = 0; i < sequences.size(); ++i) {
    for (int64_t word : sequences[i]) {
      if (word < 0) {
        throw UserError(where + ": sample " + std::to_string(i) + " has a negative word id (" +
                        std::to_string(word) + ")");
      }
    }
  }
  return sequences;
}

// y: any integer type (the real file has int64), or an object array of ints; every label 0 or 1.
std::vector<uint8_t> labels_of(const NpyArray& array, const std::string& where) {
  if (array.shape.size() != 1 || array.holds_lists()) {
    throw UserError(where + ": expected a 1-D array of labels, got " + std::to_string(array.shape.size()) +
                    "-D '" + array.descr + "'" + (array.holds_lists() ? " of lists" : ""));
  }
  std::vector<uint8_t> labels(array.integers.size());
  for (size_t i = 0; i < labels.size(); ++i) {
    const int64_t label = array.integers[i];
    if (label != 0 && label != 1) {
      throw UserError(where + ": the label of sample " + std::to_string(i) + " is " + std::to_string(label) +
                      ", expected 0 or 1");
    }
    labels[i] = static_cast<uint8_t>(label);
  }
  return labels;
}

Split read_split(const NpzFile& npz, const std::string& split) {
  const std::string x_name = "x_" + split;
  const std::string y_name = "y_" + split;
  // Both arrays are read before either is checked, so a missing one is reported first.
  NpyArray x_array = npz.array(x_name);
  const NpyArray y_array = npz.array(y_name);
  Split s;
  s.x = sequences_of(std::move(x_array), npz.path() + ": " + x_name);
  s.y = labels_of(y_array, npz.path() + ": " + y_name);
  if (s.x.size() != s.y.size()) {
    throw UserError(npz.path() + ": " + x_name + " has " + std::to_string(s.x.size()) + " samples but " +
                    y_name + " has " + std::to_string(s.y.size()));
  }
  if (s.x.empty()) throw UserError(npz.path() + ": " + x_name + ": no samples");
  return s;
}

// One row of load_data + pad_sequences: [start] + [w + index_from for w in words], each id outside
// [0, num_words) replaced by the out-of-vocabulary id, then the last `maxlen` ids (truncating 'pre'),
// left-padded with 0 (padding 'pre').
void encode_row(const std::vector<int64_t>& words, int64_t num_words, int maxlen, int32_t* row) {
  const size_t length = words.size() + 1;  // with the start id
  const size_t kept = std::min(length, static_cast<size_t>(maxlen));
  const size_t padding = static_cast<size_t>(maxlen) - kept;
  std::fill(row, row + padding, 0);
  const size_t first = length - kept;  // position in [start] + words of the first id kept
  for (size_t k = 0; k < kept; ++k) {
    const size_t position = first + k;
    int64_t id = kStartChar;
    if (position > 0) {
      const int64_t word = words[position - 1];  // >= 0, checked when read
      id = word < num_words - kIndexFrom ? word + kIndexFrom : kOovChar;
    }
    row[padding + k] = static_cast<int32_t>(id < num_words ? id : kOovChar);
  }
}

void write_split(DatasetWriter& writer, const std::string& name, const Split& split,
                 const std::vector<int64_t>& order, int64_t num_words, int maxlen) {
  const int64_t rows = static_cast<int64_t>(order.size());
  const int64_t block_rows = std::max<int64_t>(1, kTokensPerBlock / maxlen);
  std::vector<int32_t> tokens;
  std::vector<uint8_t> labels;
  for (int64_t first = 0; first < rows; first += block_rows) {
    const int64_t count = std::min(block_rows, rows - first);
    tokens.resize(static_cast<size_t>(count * maxlen));
    labels.resize(static_cast<size_t>(count));
    for (int64_t r = 0; r < count; ++r) {
      const auto sample = static_cast<size_t>(order[static_cast<size_t>(first + r)]);
      encode_row(split.x[sample], num_words, maxlen, tokens.data() + r * maxlen);
      labels[static_cast<size_t>(r)] = split.y[sample];
    }
    writer.write_rows(name, first, tokens, labels);
  }
}

}  // namespace

std::string prepare_imdb_npz(const ImdbNpzOptions& options) {
  const std::string command = "prepare imdb-npz";
  if (options.vocab < 3) {
    throw UserError(command +
                    ": --vocab must be at least 3 (ids 0, 1 and 2 are padding, start and "
                    "out-of-vocabulary), got " +
                    std::to_string(options.vocab));
  }
  if (options.maxlen < 1) {
    throw UserError(command + ": --maxlen must be positive, got " + std::to_string(options.maxlen));
  }
  std::error_code same_error;
  if (std::filesystem::equivalent(options.input, options.output, same_error)) {
    throw UserError(command + ": --output " + options.output +
                    " is the input file itself; write the dataset "
                    "to another file");
  }
  if (options.seed > static_cast<uint64_t>(kMaxSeed)) {
    throw UserError(command + ": --seed must be at most 4294967295 (numpy RandomState's range), got " +
                    std::to_string(options.seed));
  }
  check_val_fraction(command, options.val_fraction);
  const NpzFile npz(options.input);
  // load_data reads x_train, y_train, x_test, y_test in this order.
  const Split train = read_split(npz, "train");
  const Split test = read_split(npz, "test");

  // One RandomState shuffles the training set, then (not re-seeded) the test set.
  NumpyRandomState rng(options.seed);
  std::vector<int64_t> train_order(train.x.size());
  std::iota(train_order.begin(), train_order.end(), 0);
  rng.shuffle(train_order);
  std::vector<int64_t> test_order(test.x.size());
  std::iota(test_order.begin(), test_order.end(), 0);
  rng.shuffle(test_order);

  // /val: the last training rows in load_data's order, so /train + /val is exactly load_data's x_train.
  const int64_t val_rows =
      val_rows_of(command, options.val_fraction, static_cast<int64_t>(train_order.size()));
  DatasetWriter writer(options.output, options.vocab, options.maxlen,
                       static_cast<int64_t>(train_order.size()), static_cast<int64_t>(test_order.size()),
                       val_rows);
  write_split(writer, "train", train, train_order, options.vocab, options.maxlen);
  write_split(writer, "test", test, test_order, options.vocab, options.maxlen);
  writer.write_attribute(
      "source", "keras imdb.npz " + std::filesystem::path(options.input).filename().string() +
                    " num_words=" + std::to_string(options.vocab) +
                    " maxlen=" + std::to_string(options.maxlen) + " seed=" + std::to_string(options.seed) +
                    (val_rows > 0 ? " val_rows=" + std::to_string(val_rows) : ""));
  writer.commit();
  const std::string val_text = val_rows > 0 ? ", " + std::to_string(val_rows) + " val" : "";
  return "wrote " + options.output + ": " +
         std::to_string(static_cast<int64_t>(train_order.size()) - val_rows) + " train" + val_text + " and " +
         std::to_string(test_order.size()) + " test samples, vocab " + std::to_string(options.vocab) +
         ", maxlen " + std::to_string(options.maxlen) +
         " (Keras imdb.load_data conventions: start 1, oov 2, index_from 3; pad and truncate 'pre')";
}

}  // namespace ddp::io
