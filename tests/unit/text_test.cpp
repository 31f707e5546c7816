// Text datasets: the tokenizer's rules, the vocabulary's ranking and Keras ids, 'pre' padding, and
// `prepare text` on small aclImdb-layout folders made here (row order, thread count, messages).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "engine/errors.h"
#include "io/hdf5_util.h"
#include "io/synthetic.h"
#include "io/text_corpus.h"
#include "io/tokenizer.h"
#include "tests/test_util.h"

namespace ddp::io {
namespace {

using ddp::testing::TempDir;
using Words = std::vector<std::string>;

Words words_of(const std::string& text, bool expect_valid_utf8 = true) {
  bool valid = !expect_valid_utf8;
  Words words = tokenize(text, &valid);
  EXPECT_EQ(valid, expect_valid_utf8) << text;
  return words;
}

TEST(Tokenizer, HtmlLineBreaksSeparateWordsAndVanish) {
  EXPECT_EQ(words_of("one<br />two<br/>three<BR>four<Br  \n/>five"),
            (Words{"one", "two", "three", "four", "five"}));
  // Not a line break: "<b>" and "<bra" are ordinary markup, whose letters are words.
  EXPECT_EQ(words_of("<b>bold</b> <bra>"), (Words{"b", "bold", "b", "bra"}));
  EXPECT_EQ(words_of("end<br"), (Words{"end", "br"}));
}

TEST(Tokenizer, LowerCasesAsciiAndLatinLetters) {
  EXPECT_EQ(words_of("HeLLo WORLD"), (Words{"hello", "world"}));
  EXPECT_EQ(words_of("ÉCOLE Straße ŁÓDŹ İSTANBUL ŸES Ελλάδα МОСКВА"),
            (Words{"école", "straße", "łódź", "istanbul", "ÿes", "ελλάδα", "москва"}));
  // Lower-case letters without a capital in the table stay as they are.
  EXPECT_EQ(words_of("ı ĸ ſ"), (Words{"ı", "ĸ", "ſ"}));
}

TEST(Tokenizer, ApostrophesInsideWordsOnly) {
  EXPECT_EQ(words_of("don't 'quoted' '' ''' dogs' rock'n'roll"),
            (Words{"don't", "quoted", "dogs", "rock'n'roll"}));
  // The typographic apostrophe is written as '.
  EXPECT_EQ(words_of("don\u2019t \u2019tis"), (Words{"don't", "tis"}));
}

TEST(Tokenizer, DigitsJoinWordsAndPunctuationSeparates) {
  EXPECT_EQ(words_of("Top 10 of 2023, the 3rd!"), (Words{"top", "10", "of", "2023", "the", "3rd"}));
  EXPECT_EQ(words_of("well-made...yes?(no) a_b \"q\" x.y 7/10 $5 #1 @me"),
            (Words{"well", "made", "yes", "no", "a", "b", "q", "x", "y", "7", "10", "5", "1", "me"}));
  EXPECT_TRUE(words_of(" \t\n.,;:!?-()[]{}").empty());
}

TEST(Tokenizer, MultiByteLettersAndOtherScripts) {
  // A decomposed é (e + U+0301) stays one word; CJK and Arabic are not letters here and separate words.
  EXPECT_EQ(words_of("cafe\u0301 naïve 日本語film مرحبا ok"), (Words{"cafe\u0301", "naïve", "film", "ok"}));
  EXPECT_EQ(words_of("a×b c÷d"), (Words{"a", "b", "c", "d"}));
}

TEST(Tokenizer, InvalidUtf8BytesAreWindows1252) {
  EXPECT_EQ(words_of("caf\xe9 na\xefve", false), (Words{"café", "naïve"}));
  EXPECT_EQ(words_of("don\x92t \x93quoted\x94", false), (Words{"don't", "quoted"}));
  EXPECT_EQ(words_of("\x8a\x9a", false), (Words{"šš"}));  // Š lower-cased
  // Overlong form of '/', a surrogate, a truncated sequence, a stray continuation byte, bytes above F4:
  // each byte alone, as Windows-1252 (À Ã í ¯ are letters; the others separate).
  EXPECT_EQ(words_of("a\xc0\xafz", false), (Words{"aà", "z"}));
  EXPECT_EQ(words_of("x\xed\xa0\x80y", false), (Words{"xí", "y"}));
  EXPECT_EQ(words_of("ab\xe2\x82", false), (Words{"abâ"}));
  EXPECT_EQ(words_of("p\x80q", false), (Words{"p", "q"}));
  EXPECT_EQ(words_of("\xf5\xff", false), (Words{"õÿ"}));
  EXPECT_EQ(words_of("\xe2\x82\xac \xf0\x9f\x98\x80 caf\xc3\xa9"), (Words{"café"}));  // € and an emoji
  EXPECT_EQ(to_utf8("caf\xe9 \x80 ok \xc3\xa9"), "café € ok é");
}

TEST(Vocabulary, RanksByCountThenBytes) {
  WordCounts counts{{"b", 3}, {"a", 3}, {"c", 5}, {"d", 1}, {"z", 2}, {"é", 2}, {"never", 0}};
  const Vocabulary five = Vocabulary::from_counts(counts, 5);
  EXPECT_EQ(five.words(), (Words{"<pad>", "<start>", "<oov>", "c", "a"}));
  EXPECT_EQ(five.id("c"), 3);
  EXPECT_EQ(five.id("a"), 4);
  EXPECT_EQ(five.id("b"), kOovId);
  EXPECT_EQ(five.id("<pad>"), kOovId);
  // Ties by bytes: "z" (0x7A) before "é" (0xC3 0xA9); a word never counted is left out.
  const Vocabulary all = Vocabulary::from_counts(counts, 100);
  EXPECT_EQ(all.words(), (Words{"<pad>", "<start>", "<oov>", "c", "a", "b", "z", "é", "d"}));
  EXPECT_EQ(all.size(), 9);
}

TEST(Vocabulary, EncodesAsKerasPadSequencesPre) {
  const std::vector<int32_t> ids{5, 6, 7};
  EXPECT_EQ(pad_pre(ids, 6), (std::vector<int32_t>{0, 0, 1, 5, 6, 7}));
  EXPECT_EQ(pad_pre(ids, 4), (std::vector<int32_t>{1, 5, 6, 7}));
  EXPECT_EQ(pad_pre(ids, 3), (std::vector<int32_t>{5, 6, 7}));
  EXPECT_EQ(pad_pre(ids, 2), (std::vector<int32_t>{6, 7}));
  EXPECT_EQ(pad_pre({}, 3), (std::vector<int32_t>{0, 0, 1}));
  const Vocabulary v(Words{"<pad>", "<start>", "<oov>", "good", "movie"});
  EXPECT_EQ(v.encode("A GOOD movie, good!", 7), (std::vector<int32_t>{0, 0, 1, 2, 3, 4, 3}));
  EXPECT_EQ(v.encode("A GOOD movie, good!", 3), (std::vector<int32_t>{3, 4, 3}));
}

// ---------------------------------------------------------------------------------------------------------
// prepare_text on folders made here.

void write_text(const std::filesystem::path& path, const std::string& bytes) {
  std::filesystem::create_directories(path.parent_path());
  std::ofstream(path, std::ios::binary) << bytes;
}

template <typename T>
std::vector<T> read_all(const std::string& path, const std::string& name, hid_t memory_type) {
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  Hid file = open_file_readonly(path);
  Hid set = open_dataset(file.get(), path, name);
  int64_t elements = 1;
  for (const int64_t d : dataset_dims(set.get())) elements *= d;
  std::vector<T> values(static_cast<size_t>(elements));
  check_h5(H5Dread(set.get(), memory_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), "H5Dread");
  return values;
}

TextCorpusOptions options_for(const TempDir& dir, const std::string& output, int threads) {
  TextCorpusOptions o;
  o.input = dir.file("corpus");
  o.output = dir.file(output);
  o.vocab = 7;
  o.maxlen = 5;
  o.threads = threads;
  return o;
}

TEST(PrepareText, RowsVocabularyAndSummary) {
  TempDir dir;
  const std::filesystem::path corpus = dir.file("corpus");
  write_text(corpus / "train/pos/b.txt", "Good good MOVIE");
  write_text(corpus / "train/pos/a.txt", "good acting<br />and a good movie, good");
  write_text(corpus / "train/pos/.hidden", "not a document");
  write_text(corpus / "train/neg/x.txt", "bad movie");
  write_text(corpus / "train/neg/y.txt", "");
  write_text(corpus / "test/pos/t.txt", "good unknown");
  write_text(corpus / "test/neg/u.txt", "caf\xe9 bad?");
  write_text(corpus / "test/neg/v.txt", " ... ");
  const std::string summary = prepare_text(options_for(dir, "data.h5", 2));

  // Training counts: good 5, movie 3, a/acting/and/bad 1 each: vocab 7 keeps good, movie, then "a", "acting".
  const Vocabulary vocabulary = read_vocabulary(dir.file("data.h5"));
  EXPECT_EQ(vocabulary.words(), (Words{"<pad>", "<start>", "<oov>", "good", "movie", "a", "acting"}));
  // Rows: pos a.txt (its last 5 words), neg x.txt, pos b.txt (pos and neg alternate, files by name, the
  // empty y.txt skipped).
  EXPECT_EQ(read_all<int32_t>(dir.file("data.h5"), "/train/x", H5T_NATIVE_INT32),
            (std::vector<int32_t>{2, 5, 3, 4, 3, /**/ 0, 0, 1, 2, 4, /**/ 0, 1, 3, 3, 4}));
  EXPECT_EQ(read_all<uint8_t>(dir.file("data.h5"), "/train/y", H5T_NATIVE_UINT8),
            (std::vector<uint8_t>{1, 0, 1}));
  EXPECT_EQ(read_all<int32_t>(dir.file("data.h5"), "/test/x", H5T_NATIVE_INT32),
            (std::vector<int32_t>{0, 0, 1, 3, 2, /**/ 0, 0, 1, 2, 2}));
  EXPECT_EQ(read_all<uint8_t>(dir.file("data.h5"), "/test/y", H5T_NATIVE_UINT8),
            (std::vector<uint8_t>{1, 0}));

  EXPECT_NE(summary.find("train 3 (2 pos, 1 neg), test 2 (1 pos, 1 neg), vocab_size 7, maxlen 5"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("read 7 files"), std::string::npos) << summary;
  EXPECT_NE(summary.find("empty files skipped (no words): 2 (train/neg/y.txt, test/neg/v.txt)"),
            std::string::npos)
      << summary;
  EXPECT_NE(summary.find("decoded leniently (bad bytes read as Windows-1252): 1 (test/neg/u.txt)"),
            std::string::npos)
      << summary;
  // good, movie, a and acting are 10 of the 12 training tokens.
  EXPECT_NE(summary.find("4 words of 6 distinct in train; they cover 83.3% of 12 training tokens"),
            std::string::npos)
      << summary;
}

TEST(PrepareText, ThreadCountDoesNotChangeTheFile) {
  TempDir dir;
  const std::filesystem::path corpus = dir.file("corpus");
  // Enough files and shared words that threads interleave and see words in different orders.
  const char* words[] = {"alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota"};
  for (int i = 0; i < 40; ++i) {
    for (const char* folder : {"train/pos", "train/neg", "test/pos", "test/neg"}) {
      std::string text;
      for (int k = 0; k < 3 + (i * 7) % 11; ++k) text += std::string(words[(i * 5 + k * k) % 9]) + " ";
      write_text(corpus / folder / (std::to_string(i) + ".txt"), text + (i % 13 == 0 ? "caf\xe9" : ""));
    }
  }
  write_text(corpus / "train/neg/empty.txt", "");
  TextCorpusOptions one = options_for(dir, "one.h5", 1);
  TextCorpusOptions three = options_for(dir, "three.h5", 3);
  one.maxlen = three.maxlen = 8;
  prepare_text(one);
  prepare_text(three);
  for (const char* name : {"/train/x", "/test/x"}) {
    EXPECT_EQ(read_all<int32_t>(one.output, name, H5T_NATIVE_INT32),
              read_all<int32_t>(three.output, name, H5T_NATIVE_INT32))
        << name;
  }
  EXPECT_EQ(read_all<uint8_t>(one.output, "/train/y", H5T_NATIVE_UINT8),
            read_all<uint8_t>(three.output, "/train/y", H5T_NATIVE_UINT8));
  EXPECT_EQ(read_vocabulary(one.output).words(), read_vocabulary(three.output).words());
  // The writer stores no timestamps, so the files are byte for byte the same.
  std::ifstream a(one.output, std::ios::binary);
  std::ifstream b(three.output, std::ios::binary);
  const std::string bytes_one((std::istreambuf_iterator<char>(a)), {});
  const std::string bytes_three((std::istreambuf_iterator<char>(b)), {});
  EXPECT_EQ(bytes_one, bytes_three);
}

std::string user_error_of(const TextCorpusOptions& options) {
  try {
    prepare_text(options);
  } catch (const UserError& e) {
    return e.what();
  }
  return "no error";
}

TEST(PrepareText, MissingFolderOrEmptySplitNamesTheFolder) {
  TempDir dir;
  const std::filesystem::path corpus = dir.file("corpus");
  write_text(corpus / "train/pos/a.txt", "good");
  write_text(corpus / "train/neg/b.txt", "bad");
  write_text(corpus / "test/pos/c.txt", "good");
  const TextCorpusOptions options = options_for(dir, "data.h5", 2);
  std::string message = user_error_of(options);
  EXPECT_NE(message.find((corpus / "test/neg").string() + ": no such folder"), std::string::npos) << message;

  write_text(corpus / "test/neg/d.txt", "");
  write_text(corpus / "test/pos/c.txt", "<br /> ... ");
  message = user_error_of(options);
  EXPECT_NE(message.find((corpus / "test").string() + ": no usable documents"), std::string::npos) << message;
  EXPECT_FALSE(std::filesystem::exists(options.output));

  message = user_error_of(options_for(dir, "data.h5", 0));
  EXPECT_NE(message.find("no usable documents"), std::string::npos) << message;
  TextCorpusOptions absent = options;
  absent.input = dir.file("absent");
  message = user_error_of(absent);
  EXPECT_NE(message.find(dir.file("absent") + ": no such folder"), std::string::npos) << message;
}

TEST(ReadVocabulary, DatasetWithoutVocabIsAUserError) {
  TempDir dir;
  SyntheticOptions o;
  o.output = dir.file("plain.h5");
  o.train = 8;
  o.test = 4;
  o.vocab = 50;
  o.maxlen = 10;
  write_synthetic(o);
  try {
    read_vocabulary(o.output);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("plain.h5 has no /vocab: predict needs a dataset made by"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace ddp::io
