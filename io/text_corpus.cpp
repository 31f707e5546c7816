#include "io/text_corpus.h"

#include <fmt/format.h>
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <exception>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string_view>
#include <system_error>
#include <thread>
#include <unordered_map>
#include <vector>

#include "engine/base/errors.h"
#include "engine/base/progress.h"
#include "io/batch_reader.h"
#include "io/dataset_writer.h"
#include "io/mix.h"
#include "io/tokenizer.h"

namespace ddp::io {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kTrain = 0;
constexpr int kTest = 1;
constexpr const char* kSplitNames[2] = {"train", "test"};
constexpr int kMaxClasses = 256;  // labels are one byte
// How many file names a summary line lists before "...".
constexpr size_t kNamesShown = 3;

struct InputFile {
  fs::path path;
  std::string name;  // "train/pos/0_9.txt", for the summary and messages
  int split = kTrain;
  int label = 0;  // the class's index
};

// What reading and tokenizing one file gave.
struct FileResult {
  int64_t words = 0;          // 0: no words, the file is skipped
  std::vector<int32_t> tail;  // the last min(words, maxlen) words as ids of the worker's WordTable
  int worker = 0;
  bool valid_utf8 = true;
  std::string wide_encoding;   // converted from UTF-16 or UTF-32 (io/tokenizer.h): its name
  bool holds_nul = false;      // NUL bytes after that: a binary file, most likely
  bool mostly_unread = false;  // more characters the tokenizer passes over than it reads (emoji, symbols)
};

// The words one reader thread has seen, each with a local id, and their counts in the training split.
// Merged after reading: the result is then the same whatever thread read which file.
class WordTable {
 public:
  int32_t intern(std::string_view word) {
    const auto found = ids_.find(word);
    if (found != ids_.end()) return found->second;
    const auto id = static_cast<int32_t>(words_.size());
    // Map nodes never move, so the key can be referred to by pointer.
    words_.push_back(&ids_.emplace(std::string(word), id).first->first);
    train_counts_.push_back(0);
    return id;
  }
  void count(int32_t id) { ++train_counts_[static_cast<size_t>(id)]; }
  size_t size() const { return words_.size(); }
  const std::string& word(size_t id) const { return *words_[id]; }
  int64_t train_count(size_t id) const { return train_counts_[id]; }

 private:
  std::unordered_map<std::string, int32_t, WordHash, std::equal_to<>> ids_;
  std::vector<const std::string*> words_;
  std::vector<int64_t> train_counts_;
};

const char* kLayout =
    "prepare text expects a folder per class in each split: DIR/train/<class>/, DIR/test/<class>/ (aclImdb: "
    "pos and neg)";

// Why `path` is no folder to read: absent, or something else (a file given as --input).
std::string no_folder(const fs::path& path) {
  std::error_code error;
  return path.string() + (fs::exists(path, error) ? ": is not a folder (" : ": no such folder (") + kLayout +
         ")";
}

// The sub-folders of `folder` (not starting with '.'), by name; empty if it is not a folder. Its other
// entries (a document put beside the class folders) go to `others`, by name.
std::vector<std::string> sub_folders(const fs::path& folder, std::vector<std::string>& others,
                                     std::vector<std::string>& hidden) {
  std::vector<std::string> names;
  std::error_code error;
  fs::directory_iterator it(folder, error);
  for (; !error && it != fs::directory_iterator(); it.increment(error)) {
    const std::string name = it->path().filename().string();
    if (name.starts_with('.')) {
      hidden.push_back(name);
      continue;
    }
    std::error_code type_error;
    (it->is_directory(type_error) ? names : others).push_back(name);
  }
  std::sort(names.begin(), names.end());
  std::sort(others.begin(), others.end());
  return names;
}

// The classes: the folders that both train/ and test/ hold, by name (class k is the k-th). A folder named in
// `not_classes` (aclImdb's train/unsup, unlabelled reviews) is none: it goes to `ignored`. Any other folder
// in one split only is an error naming the folder the other split lacks: most likely a class misspelt or not
// copied, whose documents would otherwise be left out without a word.
std::vector<std::string> class_folders(const fs::path& root, const std::vector<std::string>& not_classes,
                                       std::vector<std::string>& ignored, std::vector<std::string>& outside,
                                       std::vector<std::string>& hidden) {
  for (const int split : {kTrain, kTest}) {
    std::error_code error;
    if (!fs::is_directory(root / kSplitNames[split], error)) {
      throw UserError(no_folder(root / kSplitNames[split]));
    }
  }
  const auto is_class = [&](const std::string& name) {
    return std::find(not_classes.begin(), not_classes.end(), name) == not_classes.end();
  };
  // The list a user would give to leave `name` out as well: the one in force, not only `name`.
  const auto not_classes_with = [&](const std::string& name) {
    std::string list;
    for (const std::string& other : not_classes) list += other + ",";
    return list + name;
  };
  std::vector<std::string> by_split[2];
  for (const int split : {kTrain, kTest}) {
    std::vector<std::string> others;
    std::vector<std::string> hidden_here;
    by_split[split] = sub_folders(root / kSplitNames[split], others, hidden_here);
    for (const std::string& name : others) outside.push_back(std::string(kSplitNames[split]) + "/" + name);
    for (const std::string& name : hidden_here)
      hidden.push_back(std::string(kSplitNames[split]) + "/" + name);
  }
  const std::vector<std::string>& train = by_split[kTrain];
  const std::vector<std::string>& test = by_split[kTest];
  std::vector<std::string> classes;
  std::set_intersection(train.begin(), train.end(), test.begin(), test.end(), std::back_inserter(classes));
  std::erase_if(classes, [&](const std::string& name) { return !is_class(name); });
  for (const int split : {kTrain, kTest}) {
    for (const std::string& name : split == kTrain ? train : test) {
      if (std::binary_search(classes.begin(), classes.end(), name)) continue;
      if (is_class(name)) {
        const fs::path missing = root / kSplitNames[1 - split] / name;
        std::error_code error;
        // The same name in other code points (macOS writes "é" as e + U+0301): alike on screen, not in bytes.
        const std::vector<std::string>& other_split = split == kTrain ? test : train;
        const auto look_alike =
            std::find_if(other_split.begin(), other_split.end(),
                         [&](const std::string& n) { return nfc_form(n) == nfc_form(name); });
        if (look_alike != other_split.end()) {
          throw UserError((root / kSplitNames[split] / name).string() + " and " +
                          (root / kSplitNames[1 - split] / *look_alike).string() +
                          " are one name written in other Unicode code points (composed and decomposed "
                          "accents): rename one so that both are written alike");
        }
        throw UserError(missing.string() +
                        (fs::exists(missing, error) ? ": is not a folder" : ": no such folder") +
                        ", though " + (root / kSplitNames[split] / name).string() +
                        " is one: a class needs a folder in both splits (--not-classes " +
                        not_classes_with(name) + " leaves it out)");
      }
      ignored.push_back(std::string(kSplitNames[split]) + "/" + name);
    }
  }
  if (classes.size() < 2) {
    throw UserError(root.string() + ": found " + std::to_string(classes.size()) +
                    " class folder(s) in both train/ and test/, a classifier needs at least two (" + kLayout +
                    ")");
  }
  if (classes.size() > static_cast<std::size_t>(kMaxClasses)) {
    throw UserError(root.string() + ": " + std::to_string(classes.size()) + " class folders, at most " +
                    std::to_string(kMaxClasses));
  }
  return classes;
}

// The documents of one folder, by name; the entries that are no file (a folder, a broken link, a socket) go
// to `not_files`, and those whose names start with '.' to `hidden`, for the summary: a corpus that loses
// documents that way should say so.
std::vector<fs::path> list_documents(const fs::path& folder, std::vector<fs::path>& not_files,
                                     std::vector<fs::path>& hidden) {
  std::error_code error;
  if (!fs::is_directory(folder, error)) {
    throw UserError(no_folder(folder));
  }
  std::vector<fs::path> files;
  fs::directory_iterator it(folder, error);
  for (; !error && it != fs::directory_iterator(); it.increment(error)) {
    if (it->path().filename().string().starts_with('.')) {
      hidden.push_back(it->path());
      continue;
    }
    std::error_code type_error;
    if (it->is_regular_file(type_error)) {  // follows symbolic links
      files.push_back(it->path());
    } else {
      not_files.push_back(it->path());
    }
  }
  if (error) throw UserError(folder.string() + ": cannot be listed (" + error.message() + ")");
  const auto by_name = [](const fs::path& a, const fs::path& b) {
    return a.filename().string() < b.filename().string();
  };
  std::sort(files.begin(), files.end(), by_name);
  std::sort(not_files.begin(), not_files.end(), by_name);
  std::sort(hidden.begin(), hidden.end(), by_name);
  return files;
}

// One file is one document: past this it is not one (a log, an archive, a disk image put in a class folder by
// mistake), and reading it whole on every reader thread could exhaust the node's memory.

// The whole file into `bytes` (whose capacity is reused from file to file).
void read_whole_file(const InputFile& file, std::string& bytes) {
  const auto too_large = [&](std::string size) {
    return UserError(file.path.string() + ": " + size +
                     " bytes, more than the 256 MiB one document (one file) may hold");
  };
  std::unique_ptr<std::FILE, int (*)(std::FILE*)> handle(std::fopen(file.path.c_str(), "rb"), &std::fclose);
  if (!handle) {
    throw UserError(file.path.string() + ": cannot be read (" + std::generic_category().message(errno) + ")");
  }
  constexpr size_t kChunk = size_t{1} << 16;
  bytes.clear();
  size_t used = 0;
  std::error_code ec;
  const uintmax_t size = std::filesystem::file_size(file.path, ec);
  if (!ec && size > kMaxDocumentBytes) throw too_large(std::to_string(size));
  int read_errno = 0;
  while (true) {
    if (used > kMaxDocumentBytes) throw too_large("over " + std::to_string(kMaxDocumentBytes));
    bytes.resize(used + kChunk);
    errno = 0;
    const size_t got = std::fread(bytes.data() + used, 1, kChunk, handle.get());
    read_errno = errno;
    used += got;
    if (got < kChunk) break;
  }
  bytes.resize(used);
  if (std::ferror(handle.get()) != 0) {
    throw UserError(file.path.string() + ": read error (" +
                    (read_errno != 0 ? std::generic_category().message(read_errno) : "no reason given") +
                    ")");
  }
}

// Shared by the reader threads and the thread that shows progress.
struct ReadState {
  std::atomic<size_t> next{0};
  std::atomic<size_t> done{0};
  std::atomic<bool> failed{false};
  std::mutex mutex;
  std::condition_variable finished;
  int workers_running = 0;
  std::exception_ptr error;
};

void read_files(int worker, const std::vector<InputFile>& files, int maxlen, WordTable& table,
                std::vector<FileResult>& results, ReadState& state) {
  try {
    std::string bytes;
    std::vector<int32_t> ids;
    for (size_t i = state.next++; i < files.size() && !state.failed; i = state.next++) {
      read_whole_file(files[i], bytes);
      ids.clear();
      FileResult& result = results[i];
      result.worker = worker;
      result.wide_encoding = convert_wide_unicode(bytes).name;
      result.holds_nul = bytes.find('\0') != std::string::npos;
      CharacterCounts characters;
      result.valid_utf8 = tokenize(
          bytes, [&](std::string_view word) { ids.push_back(table.intern(word)); }, &characters);
      result.mostly_unread = characters.unread > characters.in_words;
      if (files[i].split == kTrain) {
        for (const int32_t id : ids) table.count(id);
      }
      result.words = static_cast<int64_t>(ids.size());
      const size_t kept = std::min(ids.size(), static_cast<size_t>(maxlen));
      result.tail.assign(ids.end() - static_cast<std::ptrdiff_t>(kept), ids.end());
      ++state.done;
    }
  } catch (...) {
    std::lock_guard<std::mutex> lock(state.mutex);
    if (!state.error) state.error = std::current_exception();
    state.failed = true;
  }
  std::lock_guard<std::mutex> lock(state.mutex);
  --state.workers_running;
  state.finished.notify_all();
}

// One line on stderr, redrawn with '\r': files done/total, the bar, files/s and the time left.
void draw_progress(size_t done, size_t total, double elapsed, bool final) {
  const double fraction = total > 0 ? static_cast<double>(done) / static_cast<double>(total) : 1.0;
  const double rate = elapsed > 0 ? static_cast<double>(done) / elapsed : 0.0;
  const std::string when =
      final ? "in " + progress::seconds_text(elapsed)
            : "ETA " + (rate > 0 ? progress::seconds_text(static_cast<double>(total - done) / rate)
                                 : std::string("?"));
  fmt::print(stderr, "\rreading {}/{} files {} {:3.0f}% {:.0f} files/s {}   ", done, total,
             progress::bar(fraction), 100.0 * fraction, rate, when);
  if (final) std::fputc('\n', stderr);
  std::fflush(stderr);
}

// Runs the reader threads over `files`; shows progress while they run when asked to.
std::vector<WordTable> read_all(const std::vector<InputFile>& files, int maxlen, int threads,
                                bool show_progress, std::vector<FileResult>& results) {
  std::vector<WordTable> tables(static_cast<size_t>(threads));
  ReadState state;
  state.workers_running = threads;
  const auto start = Clock::now();
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(threads));
  for (int w = 0; w < threads; ++w) {
    pool.emplace_back(read_files, w, std::cref(files), maxlen, std::ref(tables[static_cast<size_t>(w)]),
                      std::ref(results), std::ref(state));
  }
  {
    std::unique_lock<std::mutex> lock(state.mutex);
    // At most ten redraws a second.
    while (!state.finished.wait_for(lock, std::chrono::milliseconds(100),
                                    [&] { return state.workers_running == 0; })) {
      if (show_progress) {
        draw_progress(state.done, files.size(), std::chrono::duration<double>(Clock::now() - start).count(),
                      false);
      }
    }
  }
  for (std::thread& t : pool) t.join();
  if (state.error) std::rethrow_exception(state.error);
  if (show_progress) {
    draw_progress(state.done, files.size(), std::chrono::duration<double>(Clock::now() - start).count(),
                  true);
  }
  return tables;
}

// "3 (a, b, c, ...)" for a summary line.
std::string count_and_names(const std::vector<std::string>& names) {
  std::string text = std::to_string(names.size());
  if (names.empty()) return text;
  text += " (";
  // A name with a line break or bytes that are no UTF-8 must not break the summary's lines.
  for (size_t i = 0; i < names.size() && i < kNamesShown; ++i) {
    text += (i > 0 ? ", " : "") + one_line(to_utf8(names[i]));
  }
  return text + (names.size() > kNamesShown ? ", ...)" : ")");
}

// Takes the words of the training documents that go to /val (order[train_rows..]) out of `counts`, so the
// vocabulary is ranked on the rows of /train only. Reader threads keep no per-file counts, so those files
// are read again: a tenth more reading for --val-fraction 0.1, and no memory that grows with the corpus.
void subtract_val_counts(const std::vector<InputFile>& files, const std::vector<size_t>& train_order,
                         int64_t train_rows, const std::vector<FileResult>& results, int threads,
                         const fs::path& train_folder, int maxlen, WordCounts& counts,
                         int64_t& train_tokens) {
  std::vector<InputFile> val_files;
  std::vector<size_t> first_read;
  for (size_t i = static_cast<size_t>(train_rows); i < train_order.size(); ++i) {
    val_files.push_back(files[train_order[i]]);
    first_read.push_back(train_order[i]);
  }
  std::vector<FileResult> again(val_files.size());
  const std::vector<WordTable> tables =
      read_all(val_files, maxlen, std::min(threads, static_cast<int>(val_files.size())), false, again);
  const auto changed = [](const fs::path& path) {
    return UserError(path.string() + ": changed while prepare text was reading it; run it again");
  };
  for (size_t i = 0; i < val_files.size(); ++i) {
    if (again[i].words != results[first_read[i]].words) throw changed(val_files[i].path);
  }
  for (const WordTable& table : tables) {
    for (size_t id = 0; id < table.size(); ++id) {
      const int64_t n = table.train_count(id);
      if (n == 0) continue;
      const auto found = counts.find(table.word(id));
      if (found == counts.end() || found->second < n) throw changed(train_folder);
      found->second -= n;
      train_tokens -= n;
    }
  }
  // A word seen only in /val documents is not a word of /train.
  std::erase_if(counts, [](const auto& entry) { return entry.second == 0; });
}

std::string format_count(int64_t n) {
  return n >= 1'000'000 ? fmt::format("{:.1f}M", static_cast<double>(n) / 1e6) : std::to_string(n);
}

}  // namespace

std::string prepare_text(const TextCorpusOptions& options) {
  const std::string command = "prepare text";
  check_val_fraction(command, options.val_fraction);
  if (options.vocab < kFirstWordId + 1) {
    throw UserError("prepare text: --vocab must be at least 4 (ids 0, 1 and 2 are reserved), got " +
                    std::to_string(options.vocab));
  }
  if (options.maxlen < 1) {
    throw UserError("prepare text: --maxlen must be positive, got " + std::to_string(options.maxlen));
  }
  const fs::path root(options.input);
  std::error_code error;
  if (!fs::is_directory(root, error)) {
    throw UserError(no_folder(root));
  }
  // An output among the documents would be read as one by the next prepare (and replace one now).
  for (const int split : {kTrain, kTest}) {
    const fs::path folder = fs::weakly_canonical(root / kSplitNames[split], error);
    const fs::path output = fs::weakly_canonical(options.output, error);
    const auto [end, unused] = std::mismatch(folder.begin(), folder.end(), output.begin(), output.end());
    if (!error && end == folder.end()) {
      throw UserError("prepare text: --output " + options.output + " lies inside " +
                      (root / kSplitNames[split]).string() +
                      ", among the documents: write the dataset outside the corpus's train/ and test/");
    }
  }
  check_output_replaceable(options.output, "prepare text");
  std::vector<std::string> ignored_folders;
  std::vector<std::string> outside_classes;
  std::vector<std::string> hidden_entries;  // names starting with '.': .git, .DS_Store, a class named .NET
  const std::vector<std::string> classes =
      class_folders(root, options.not_classes, ignored_folders, outside_classes, hidden_entries);
  const int class_count = static_cast<int>(classes.size());
  // The names as /classes stores them (UTF-8, as HDF5 is told): a folder name that is no UTF-8 (Latin-1
  // "caf\xe9") decoded as documents are; the folders keep their bytes.
  std::vector<std::string> class_names;
  for (const std::string& folder : classes) {
    class_names.push_back(to_utf8(folder));
    const auto same = std::find(class_names.begin(), class_names.end() - 1, class_names.back());
    if (same != class_names.end() - 1) {
      throw UserError((root / kSplitNames[kTrain] / folder).string() + ": its name reads as " +
                      class_names.back() + ", as the folder " +
                      (root / kSplitNames[kTrain] / classes[same - class_names.begin()]).string() +
                      "'s does: rename one");
    }
  }

  // Every folder is listed before any file is read, so a missing one is reported at once. Classes go from
  // the last to the first (aclImdb: pos, then neg), the order every earlier ddptrain wrote, so the same
  // corpus gives the same file.
  std::vector<InputFile> files;
  std::vector<std::string> not_files;
  for (const int split : {kTrain, kTest}) {
    for (int label = class_count - 1; label >= 0; --label) {
      const std::string& class_name = classes[static_cast<std::size_t>(label)];
      const fs::path folder = root / kSplitNames[split] / class_name;
      const std::string prefix = std::string(kSplitNames[split]) + "/" + class_name + "/";
      std::vector<fs::path> skipped;
      std::vector<fs::path> hidden;
      for (fs::path& path : list_documents(folder, skipped, hidden)) {
        std::string name = prefix + path.filename().string();
        files.push_back({std::move(path), std::move(name), split, label});
      }
      for (const fs::path& path : skipped) not_files.push_back(prefix + path.filename().string());
      for (const fs::path& path : hidden) hidden_entries.push_back(prefix + path.filename().string());
    }
  }

  const int threads = std::max(
      1,
      std::min(options.threads > 0 ? options.threads : static_cast<int>(std::thread::hardware_concurrency()),
               static_cast<int>(std::max<size_t>(files.size(), 1))));
  const auto start = Clock::now();
  std::vector<FileResult> results(files.size());
  const std::vector<WordTable> tables =
      read_all(files, options.maxlen, threads, options.show_progress, results);
  const double read_seconds = std::chrono::duration<double>(Clock::now() - start).count();

  // Documents per split and label, in file order; what was skipped or decoded leniently.
  std::vector<std::vector<size_t>> documents[2] = {std::vector<std::vector<size_t>>(classes.size()),
                                                   std::vector<std::vector<size_t>>(classes.size())};
  std::vector<std::string> empty_files;
  std::vector<std::string> lenient_files;
  std::vector<std::string> utf16_files;
  std::vector<std::string> utf32_files;
  std::vector<std::string> nul_files;
  std::vector<std::string> unread_files;
  for (size_t i = 0; i < files.size(); ++i) {
    if (results[i].mostly_unread) unread_files.push_back(files[i].name);
    if (!results[i].valid_utf8) lenient_files.push_back(files[i].name);
    if (results[i].wide_encoding.starts_with("UTF-16")) utf16_files.push_back(files[i].name);
    if (results[i].wide_encoding.starts_with("UTF-32")) utf32_files.push_back(files[i].name);
    if (results[i].holds_nul) nul_files.push_back(files[i].name);
    if (results[i].words == 0) {
      empty_files.push_back(files[i].name);
      continue;
    }
    documents[files[i].split][files[i].label].push_back(i);
  }
  for (const int split : {kTrain, kTest}) {
    if (std::all_of(documents[split].begin(), documents[split].end(),
                    [](const std::vector<size_t>& d) { return d.empty(); })) {
      throw UserError(
          (root / kSplitNames[split]).string() +
          ": no usable documents in its class folders (every file there is empty or has no words)");
    }
  }

  // Each split's documents, class by class from the last in file order, then in a seeded random order
  // (text_corpus.h): the order depends on the seed and the corpus only, not on which thread read what.
  std::vector<size_t> order[2];
  for (const int split : {kTrain, kTest}) {
    std::vector<size_t> in_file_order;
    for (int label = class_count - 1; label >= 0; --label) {
      const std::vector<size_t>& of_class = documents[split][static_cast<std::size_t>(label)];
      in_file_order.insert(in_file_order.end(), of_class.begin(), of_class.end());
    }
    // The reader's own seeded permutation (batch_reader.h), keyed per split.
    const IndexPermutation permutation(in_file_order.size(),
                                       stream_seed(options.seed, static_cast<uint64_t>(split)));
    for (uint64_t i = 0; i < permutation.size(); ++i) order[split].push_back(in_file_order[permutation(i)]);
  }
  const auto training_rows = static_cast<int64_t>(order[kTrain].size());
  const int64_t val_rows = val_rows_of(command, options.val_fraction, training_rows);
  const int64_t train_rows = training_rows - val_rows;

  // The vocabulary from the training counts of every reader.
  WordCounts counts;
  int64_t train_tokens = 0;
  for (const WordTable& table : tables) {
    for (size_t id = 0; id < table.size(); ++id) {
      const int64_t n = table.train_count(id);
      if (n == 0) continue;
      train_tokens += n;
      const auto found = counts.find(table.word(id));
      if (found != counts.end()) {
        found->second += n;
      } else {
        counts.emplace(table.word(id), n);
      }
    }
  }
  if (val_rows > 0) {
    subtract_val_counts(files, order[kTrain], train_rows, results, threads, root / kSplitNames[kTrain],
                        options.maxlen, counts, train_tokens);
  }
  const Vocabulary vocabulary = Vocabulary::from_counts(counts, options.vocab);
  int64_t covered_tokens = 0;
  for (size_t id = kFirstWordId; id < vocabulary.words().size(); ++id) {
    covered_tokens += counts.find(vocabulary.words()[id])->second;
  }
  std::vector<std::vector<int32_t>> to_vocabulary(tables.size());
  for (size_t w = 0; w < tables.size(); ++w) {
    to_vocabulary[w].resize(tables[w].size());
    for (size_t id = 0; id < tables[w].size(); ++id) to_vocabulary[w][id] = vocabulary.id(tables[w].word(id));
  }

  // Rows in each split's order; the writer sends the last val_rows training rows to /val.
  std::vector<int32_t> tokens[2];
  std::vector<uint8_t> labels[2];
  std::vector<int32_t> ids;
  for (const int split : {kTrain, kTest}) {
    for (const size_t file : order[split]) {
      const FileResult& result = results[file];
      ids.clear();
      for (const int32_t local : result.tail) {
        ids.push_back(to_vocabulary[static_cast<size_t>(result.worker)][static_cast<size_t>(local)]);
      }
      // The tail holds every word that can survive truncation, so this is the whole document's row.
      const std::vector<int32_t> row = pad_pre(ids, options.maxlen);
      tokens[split].insert(tokens[split].end(), row.begin(), row.end());
      labels[split].push_back(static_cast<uint8_t>(files[file].label));
    }
  }

  DatasetWriter writer(options.output, vocabulary.size(), options.maxlen, training_rows,
                       static_cast<int64_t>(order[kTest].size()), val_rows);
  writer.write_rows("train", 0, tokens[kTrain], labels[kTrain]);
  writer.write_rows("test", 0, tokens[kTest], labels[kTest]);
  writer.write_vocab(vocabulary.words());
  writer.write_classes(class_count, class_names);
  std::string source = "text " + options.input + " vocab=" + std::to_string(options.vocab) +
                       " maxlen=" + std::to_string(options.maxlen) + " seed=" + std::to_string(options.seed);
  if (val_rows > 0) source += " val_rows=" + std::to_string(val_rows);
  writer.write_attribute("source", source);
  // Another ICU's tables may split a rare character's words differently: predict compares.
  writer.write_attribute("tokenizer", unicode_library_version());
  writer.commit();

  // "train 109 (54 neg, 55 pos)" for each group of rows: the rows of each class, by class id.
  const auto group_text = [&](const char* name, const std::vector<uint8_t>& y, int64_t begin, int64_t end) {
    std::string text = std::string(name) + " " + std::to_string(end - begin) + " (";
    for (int label = 0; label < class_count; ++label) {
      const auto rows = std::count(y.begin() + begin, y.begin() + end, static_cast<uint8_t>(label));
      text += std::to_string(rows) + " " + one_line(class_names[static_cast<std::size_t>(label)]) +
              (label + 1 < class_count ? ", " : ")");
    }
    return text;
  };
  std::string summary = "wrote " + options.output + ": " + group_text("train", labels[kTrain], 0, train_rows);
  if (val_rows > 0) summary += ", " + group_text("val", labels[kTrain], train_rows, training_rows);
  summary += ", " + group_text("test", labels[kTest], 0, static_cast<int64_t>(labels[kTest].size()));
  summary +=
      ", vocab_size " + std::to_string(vocabulary.size()) + ", maxlen " + std::to_string(options.maxlen);
  summary += fmt::format("\nread {} files in {:.2f} s ({:.0f} files/s, {} thread{})", files.size(),
                         read_seconds, static_cast<double>(files.size()) / std::max(read_seconds, 1e-9),
                         threads, threads == 1 ? "" : "s");
  summary += "\nempty files skipped (no words): " + count_and_names(empty_files);
  if (!unread_files.empty()) {
    // Files of emoji or symbols would otherwise pass for empty files, or for a few words.
    summary +=
        "\nwarning: files mostly of characters the tokenizer does not read (symbols, emoji, private-use code "
        "points; it reads letters and digits of every script): " +
        count_and_names(unread_files);
  }
  if (!not_files.empty()) {
    summary += "\nentries skipped, not files (folders, broken links, ...): " + count_and_names(not_files);
  }
  summary += "\nfiles not valid UTF-8, decoded leniently (bad bytes read as Windows-1252): " +
             count_and_names(lenient_files);
  if (!utf16_files.empty()) summary += "\nfiles in UTF-16, read as such: " + count_and_names(utf16_files);
  if (!utf32_files.empty()) summary += "\nfiles in UTF-32, read as such: " + count_and_names(utf32_files);
  if (!nul_files.empty()) {
    summary += "\nfiles holding NUL bytes, not text (binary files?), their other bytes read as words: " +
               count_and_names(nul_files);
  }
  const double coverage =
      train_tokens > 0 ? 100.0 * static_cast<double>(covered_tokens) / static_cast<double>(train_tokens)
                       : 0.0;
  summary +=
      fmt::format("\nvocabulary: {} word{} of {} distinct in train; they cover {:.1f}% of {} training tokens",
                  vocabulary.size() - kFirstWordId, vocabulary.size() - kFirstWordId == 1 ? "" : "s",
                  counts.size(), coverage, format_count(train_tokens));
  for (const int split : {kTrain, kTest}) {
    for (int label = class_count - 1; label >= 0; --label) {
      if (documents[split][static_cast<std::size_t>(label)].empty()) {
        summary +=
            "\nwarning: " + (root / kSplitNames[split] / classes[static_cast<std::size_t>(label)]).string() +
            " has no usable documents: no " + kSplitNames[split] + " row has class " + std::to_string(label);
      }
    }
  }
  // --val-fraction takes random rows: a small class may lose every training row to /val.
  for (int label = 0; val_rows > 0 && label < class_count; ++label) {
    const std::size_t documents_of_class = documents[kTrain][static_cast<std::size_t>(label)].size();
    if (documents_of_class > 0 && std::count(labels[kTrain].begin(), labels[kTrain].begin() + train_rows,
                                             static_cast<uint8_t>(label)) == 0) {
      summary += fmt::format(
          "\nwarning: class {} has no /train row: --val-fraction put {} in /val, so the model cannot learn "
          "it",
          one_line(class_names[static_cast<std::size_t>(label)]),
          documents_of_class == 1 ? std::string("its only training document")
                                  : fmt::format("all {} of its training documents", documents_of_class));
    }
  }
  if (!outside_classes.empty()) {
    summary += "\nentries beside the class folders, no class's documents, left out: " +
               count_and_names(outside_classes);
  }
  if (!ignored_folders.empty()) {
    summary += "\nfolders that are no class (--not-classes), left out: " + count_and_names(ignored_folders);
  }
  if (!hidden_entries.empty()) {
    summary += "\nhidden entries (names starting with '.'), left out: " + count_and_names(hidden_entries);
  }
  if (options.warn_unmatched_not_classes) {
    std::vector<std::string> unmatched;
    for (const std::string& name : options.not_classes) {
      const bool found =
          std::any_of(ignored_folders.begin(), ignored_folders.end(), [&](const std::string& f) {
            return f == std::string(kSplitNames[kTrain]) + "/" + name ||
                   f == std::string(kSplitNames[kTest]) + "/" + name;
          });
      if (!found) unmatched.push_back(name);
    }
    if (!unmatched.empty()) {
      summary += "\nwarning: --not-classes names no folder of train/ or test/ (misspelt?): " +
                 count_and_names(unmatched);
    }
  }
  return summary;
}

}  // namespace ddp::io
