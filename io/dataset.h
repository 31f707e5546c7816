// The dataset file: one HDF5 file per dataset, schema
//
//   /train/x   int32 [N, maxlen]   token ids, 0 = padding, sequences left-padded (Keras pad_sequences 'pre')
//   /train/y   uint8 [N]           labels: 0 or 1, or class ids 0 .. num_classes-1
//   /test/x    int32 [M, maxlen]
//   /test/y    uint8 [M]
//   /val/x     int32 [V, maxlen]   optional, validation rows held out of training
//   /val/y     uint8 [V]           (`ddptrain prepare --val-fraction F`: the last round(F * rows) of /train)
//   attributes on the root group: vocab_size (int, token ids are < vocab_size), maxlen (int), and
//              num_classes (int, 2 to 256; optional, absent means 2: the two-class files of before)
//   /vocab     optional variable-length UTF-8 strings, /vocab[i] is the word of id i
//   /classes   optional strings, num_classes of them: /classes[k] names class k (for predict and evaluate)
//
// The model takes vocab_size and maxlen from the file, so one config serves any dataset. Every `ddptrain
// prepare` writes the rows of each split in a seeded random order, so a contiguous shard (shard_of) is a
// random sample of its split, with about the file's class balance.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ddp::io {

// The largest vocabulary and row length a dataset (or a checkpoint) may declare, and `ddptrain prepare`
// writes: far past any real corpus, so that a typo or a damaged attribute is one line, not memory exhausted
// minutes later.
constexpr int kMaxVocabulary = 10'000'000;
constexpr int kMaxSequenceLength = 100'000;

// Which file a path named when it was stamped, and its state then: a file replaced (a new file renamed over
// it, as `ddptrain prepare --output` does) or rewritten in place stamps differently.
struct FileStamp {
  uint64_t device = 0;
  uint64_t inode = 0;
  int64_t size = -1;
  int64_t modified_ns = 0;
  bool empty() const { return size < 0; }
  bool operator==(const FileStamp&) const = default;
};
// The stamp of the file `path` names now (links followed); an empty one if it cannot be examined.
FileStamp file_stamp(const std::string& path);

struct DatasetInfo {
  std::string path;
  int64_t train_size = 0;
  int64_t test_size = 0;
  int64_t val_size = 0;  // 0: the file has no /val, or an empty one
  bool has_val = false;
  int vocab_size = 0;
  int maxlen = 0;
  bool has_vocab = false;
  int num_classes = 2;
  std::vector<std::string> class_names;  // empty when the file has no /classes
  std::string tokenizer;  // what split the words of /vocab (unicode_library_version()); "" if not recorded
  FileStamp stamp;        // the file as inspected: readers of the run refuse another (BatchReaderOptions)
};

// Class k's name: the file's /classes[k], else the number.
std::string class_name(const DatasetInfo& info, int k);

// Which splits a command reads: training reads /train and /test (and /val where present); scoring reads /test
// alone, so a file that holds only /test (and the attributes) serves evaluate and predict.
enum class SplitsNeeded { kTraining, kTestOnly };

// Opens the file and checks the schema: datasets present, ranks, element types, matching lengths,
// attributes; /val's too when the file has one. Throws UserError naming the file and the dataset or
// attribute that is wrong.
DatasetInfo inspect_dataset(const std::string& path, SplitsNeeded needed = SplitsNeeded::kTraining);

// Reads rows [begin, end) of split ("train", "test" or "val") in bounded chunks and checks 0 <= token <
// vocab_size and 0 <= label < num_classes. Throws UserError naming file, dataset, row and value of the first
// bad entry.
// Returns how many of the rows hold no token at all (every id 0, padding): rows a writer reserved and never
// filled read so (HDF5's fill value), with label 0, which the caller says.
// `progress` is called after each chunk (a large shard takes a while).
int64_t validate_rows(const DatasetInfo& info, const std::string& split, int64_t begin, int64_t end,
                      const std::function<void()>& progress = {});
// The note for `count` such rows of `rows` in split.
std::string rows_without_tokens_note(const DatasetInfo& info, const std::string& split, int64_t count,
                                     int64_t rows);

// How many rows [begin, end) of split ("train", "test" or "val") have each label: counts[v] rows have
// label v, counts.size() = max(2, largest label + 1). Reads only the split's y, in bounded chunks.
std::vector<int64_t> label_counts(const DatasetInfo& info, const std::string& split, int64_t begin,
                                  int64_t end);
// The labels of rows [begin, end) of split, in order.
std::vector<uint8_t> read_labels(const DatasetInfo& info, const std::string& split, int64_t begin,
                                 int64_t end);
// "31.2% 0, 68.8% 1": each label's share of the rows, in label order ("no rows" when all counts are 0); a
// label is named by names[label] where there is one (the dataset's /classes), else by its number.
std::string class_balance_text(const std::vector<int64_t>& counts,
                               const std::vector<std::string>& names = {});

// The contiguous rows [begin, end) of a split that rank `rank` of `world` reads: floor(n / world) rows each,
// so every rank runs the same number of steps (the last n % world rows are left out of training).
// For evaluation, `cover_all` spreads the remainder so that every row is read by exactly one rank.
struct Shard {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
Shard shard_of(int64_t n, int rank, int world, bool cover_all);

}  // namespace ddp::io
