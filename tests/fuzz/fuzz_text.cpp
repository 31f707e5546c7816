// `prepare text` on fuzzed documents: the tokenizer and UTF-8 decoding (io/tokenizer.h) on the raw bytes,
// then the whole command (io/text_corpus.h) on a tiny corpus made from them: train/<class>/ and test/<class>/
// folders whose class names and documents come from the input.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "io/dataset.h"
#include "io/text_corpus.h"
#include "io/tokenizer.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// A folder name from the input that the file system takes: no '/', no NUL, not "." or "..".
std::string folder_name(FuzzedDataProvider& in) {
  std::string name = in.ConsumeRandomLengthString(8);
  std::erase(name, '/');
  std::erase(name, '\0');
  if (name.empty() || name == "." || name == "..") name = "c";
  return name;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ddp;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  bool valid = true;
  const std::vector<std::string> words = io::tokenize(text, &valid);
  for (const std::string& word : words) {
    // Words are well-formed UTF-8 (decoding them again changes nothing) and no longer than a word can be.
    if (word.empty() || word.size() > io::kMaxWordBytes || io::to_utf8(word) != word) __builtin_trap();
  }
  const std::string utf8 = io::to_utf8(text);
  if (io::to_utf8(utf8) != utf8) __builtin_trap();
  io::WordCounts counts;
  for (const std::string& word : words) ++counts[word];
  const io::Vocabulary vocabulary = io::Vocabulary::from_counts(counts, 8);
  // The tokenizer's own words are words a document can yield: predict would warn of them otherwise.
  if (io::Vocabulary::from_counts(counts, 64).unreachable_words(nullptr) != 0) __builtin_trap();
  for (const int32_t id : vocabulary.encode(text, 6)) {
    if (id < 0 || id >= vocabulary.size()) __builtin_trap();
  }

  // The corpus: two or three classes, each with one training and one test document cut from the input.
  FuzzedDataProvider in(data, size);
  const auto root = fuzz::scratch_dir() / "corpus";
  std::filesystem::remove_all(root);
  const int classes = in.ConsumeIntegralInRange<int>(1, 3);
  for (int k = 0; k < classes; ++k) {
    const std::string name = folder_name(in);
    for (const char* split : {"train", "test"}) {
      const auto dir = root / split / name;
      std::filesystem::create_directories(dir);
      const std::string document = in.ConsumeRandomLengthString(256);
      fuzz::write_bytes(dir / (std::string(split) + ".txt"),
                        {reinterpret_cast<const uint8_t*>(document.data()), document.size()});
    }
  }
  io::TextCorpusOptions options;
  options.input = root;
  options.output = fuzz::scratch_dir() / "text.h5";
  std::filesystem::remove(options.output);  // each input writes a new file, not over the last one's
  options.vocab = in.ConsumeIntegralInRange<int>(4, 12);
  options.maxlen = in.ConsumeIntegralInRange<int>(1, 8);
  options.threads = 1;
  options.val_fraction = in.ConsumeBool() ? 0.5 : 0.0;
  const bool prepared = fuzz::expect_user_error([&] { io::prepare_text(options); });
  // What prepare writes, the reader accepts.
  if (prepared) {
    const io::DatasetInfo info = io::inspect_dataset(options.output);
    io::validate_rows(info, "train", 0, info.train_size);
    io::validate_rows(info, "test", 0, info.test_size);
    if (!info.has_vocab) __builtin_trap();
    io::read_vocabulary(options.output);
  }
  return 0;
}
