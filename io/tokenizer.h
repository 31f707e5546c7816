// The text side of a dataset: how a document becomes words, and words become token ids. Shared by
// `ddptrain prepare text` (which builds the vocabulary) and `ddptrain predict` (which reads it back from
// /vocab), so a review is tokenized the same way in both.
//
// Decoding. Bytes are read as UTF-8, leniently: a well-formed sequence (RFC 3629: no overlong forms, no
// surrogates, nothing above U+10FFFF) is one character; every byte that does not start one (a stray
// continuation byte, an overlong or surrogate lead, a truncated sequence) is one character of Windows-1252,
// so a Latin-1 or Windows-1252 file still reads "café" and "don’t". The five bytes Windows-1252 leaves
// undefined (0x81, 0x8D, 0x8F, 0x90, 0x9D) read as Latin-1 (the C1 control of the same value).
//
// Tokenizing, in this order (character classes from ICU's Unicode tables, so every script is read):
//  1. HTML line breaks are replaced by a space: "<br", any spaces, tabs or newlines, an optional "/", then
//     ">", in any case (<br>, <br/>, <br />, <BR >). Other markup is not special.
//  2. Characters are lower-cased by Unicode's simple case mapping (É becomes é, İ becomes i, Σ becomes σ;
//     ß, ı, ſ and ς stay as they are), and a σ that ends a word of two letters or more is written ς, so
//     that ΟΔΟΣ and οδος are one word.
//  3. A word is a maximal run of word characters:
//       letters and combining marks of any script (general categories L and M);
//       decimal digits of any script (Nd: 0-9, ٣, ३, ...);
//       apostrophes ' (U+0027) and ’ (U+2019), both written as '.
//     Format characters (Cf: soft hyphen, zero-width joiner and non-joiner, bidi marks) are dropped without
//     splitting a word; the zero-width space U+200B separates words, as a space does. Leading and trailing
//     apostrophes are stripped ("'quoted'" gives quoted, "dogs'" gives dogs), so a run of apostrophes alone
//     is no word; inner ones stay (don't, rock'n'roll). Everything else separates words: spaces, punctuation,
//     hyphens, symbols, emoji, numbers that are no digits (½, ²).
//  4. Scripts written without spaces between words (Han, Hiragana, Katakana, Thai, Lao, Khmer, Myanmar) are
//     cut into words by ICU's dictionary word segmenter (UAX #29 with its Chinese/Japanese and Southeast
//     Asian dictionaries): "这部电影很好看" gives 这 部 电影 很好 看. A letter or mark that belongs to no one
//     script (ー, a combining mark) continues the run before it.
//  5. Words are in Unicode Normalization Form C (a decomposed "é", e + U+0301, is the word "é").
//     A word longer than kMaxWordBytes (an embedded image's base64, a hash) is no word: it would take a
//     place in the vocabulary, and its bytes in every file that holds it.
//  Words come out as UTF-8. The dictionaries are ICU's: prepare a dataset and predict from it with the same
//  ICU major version, or a word of those scripts may be cut differently.
//
// Token ids as Keras' IMDB: 0 padding, 1 start of the document, 2 a word out of the vocabulary, 3.. the
// words by falling frequency in the training split (ties: the word's UTF-8 bytes in ascending order, so the
// result does not depend on the order files were read in). A document becomes [1] + its ids, then
// pad_pre() keeps the last maxlen tokens and left-pads with 0, as Keras pad_sequences does by default.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace ddp::io {

inline constexpr int32_t kPadId = 0;
inline constexpr int32_t kStartId = 1;
inline constexpr int32_t kOovId = 2;
inline constexpr int32_t kFirstWordId = 3;
// The longest word, in UTF-8 bytes: 128 Latin, 64 Greek or Cyrillic, 42 CJK letters.
inline constexpr std::size_t kMaxWordBytes = 128;

// What tokenize() read into words and what it passed over that is neither punctuation nor space: symbols,
// emoji, private-use and unassigned code points. A corpus of such files is then said, not taken for empty
// files.
struct CharacterCounts {
  int64_t in_words = 0;  // characters (code points) that went into words
  int64_t unread = 0;    // characters of general category So (other symbols: emoji, dingbats), Co
                         // (private use), Cn (unassigned) or Cs (a lone surrogate)
};

// Calls on_word with each word of `text` (the view is valid during the call only). Returns false when some
// byte was not valid UTF-8 and was read as Windows-1252. `counts`, when given, is added to.
bool tokenize(std::string_view text, const std::function<void(std::string_view word)>& on_word,
              CharacterCounts* counts = nullptr);
// The words of `text`; `valid_utf8`, when given, says whether every byte was valid UTF-8.
std::vector<std::string> tokenize(std::string_view text, bool* valid_utf8 = nullptr);

// UTF-16 text (what Windows calls "Unicode") and UTF-32, which the lenient UTF-8 reading would take apart
// letter by letter, rewritten in place as UTF-8 (the mark dropped; an unpaired surrogate, or a UTF-32 unit
// past U+10FFFF, as U+FFFD).
// - UTF-32: a UTF-32 byte order mark followed by whole units of four bytes, or no mark where every unit of
//   the first 4 KiB is a code point (its top byte NUL, the next at most 0x10).
// - UTF-16: a file that starts with a UTF-16 byte order mark followed by whole pairs of bytes, or by a NUL
// high
//   byte in its first 4 KiB (a file cut short), or one without a mark where NUL bytes fill the high byte of
//   at least a tenth (and two) of the pairs of its first 4 KiB (Latin text: nearly all; Greek or Cyrillic:
//   its spaces; a NUL is never part of UTF-8 or Latin-1 text) and ten times fewer low bytes. Chinese,
//   Japanese or Thai UTF-16 without a mark has too few NULs to be told from other bytes: it is left as it is.
//   A Latin-1 file that starts with "ÿþ" and has an even length reads as UTF-16.
struct WideEncoding {
  std::string name;     // "UTF-16LE", "UTF-16BE", "UTF-32LE" or "UTF-32BE"; empty when left as they are
  bool marked = false;  // told by its byte order mark (else by its NUL bytes)
  explicit operator bool() const { return !name.empty(); }
};
WideEncoding convert_wide_unicode(std::string& bytes);

// `text` in Unicode's Normalization Form C (a decomposed "é", e + U+0301, composed); text that is not valid
// UTF-8 comes back as it is.
std::string nfc_form(std::string_view text);

// The Unicode library whose tables and dictionaries the tokenizer reads: "ICU 72.1, Unicode 15.0".
std::string unicode_library_version();

// `bytes` decoded as above and written back as well-formed UTF-8 (for showing a document).
std::string to_utf8(std::string_view bytes);

// [1] + ids, keeping the last maxlen tokens and left-padding with 0 (pad_sequences' 'pre' and 'pre').
std::vector<int32_t> pad_pre(std::span<const int32_t> ids, int maxlen);

// Hash and equality that let a std::string-keyed map be searched with a std::string_view.
struct WordHash {
  using is_transparent = void;
  size_t operator()(std::string_view word) const { return std::hash<std::string_view>{}(word); }
};
using WordCounts = std::unordered_map<std::string, int64_t, WordHash, std::equal_to<>>;

class Vocabulary {
 public:
  // words[i] is the word of id i; words[0..2] name the reserved ids ("<pad>", "<start>", "<oov>") and are
  // never looked up. A word listed twice keeps its lower id.
  explicit Vocabulary(std::vector<std::string> words);

  // The size - 3 most frequent words of `counts` (those counted at least once), ties by their bytes. Fewer
  // when counts has fewer words: size() is then 3 + counts' words.
  static Vocabulary from_counts(const WordCounts& counts, int size);

  // Ids are < size().
  int size() const { return static_cast<int>(words_.size()); }
  const std::vector<std::string>& words() const { return words_; }
  // The word's id, or kOovId.
  int32_t id(std::string_view word) const;
  // A document's padded token ids: tokenize, look up, pad_pre. `words` gets how many words the document
  // has, `valid_utf8` whether every byte was valid UTF-8 (each when given).
  std::vector<int32_t> encode(std::string_view text, int maxlen, std::size_t* words = nullptr,
                              bool* valid_utf8 = nullptr) const;
  // How many words (past the reserved three) tokenize() can never yield, as it lower-cases and splits at
  // spaces and punctuation: a vocabulary written by another tool ("Word", "New York"). `example` gets the
  // first of them.
  std::size_t unreachable_words(std::string* example) const;

 private:
  std::vector<std::string> words_;
  std::unordered_map<std::string, int32_t, WordHash, std::equal_to<>> ids_;
};

// /vocab of a dataset file, cut to its vocab_size attribute (ids >= vocab_size are out of vocabulary, as
// load_data's num_words makes them). Throws UserError naming the file when it has no /vocab or when /vocab
// is not a list of strings of at least 3 entries.
Vocabulary read_vocabulary(const std::string& dataset_path);

}  // namespace ddp::io
