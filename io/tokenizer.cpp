#include "io/tokenizer.h"

#include <unicode/ubrk.h>
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <unicode/uscript.h>
#include <unicode/ustring.h>
#include <unicode/utf16.h>
#include <unicode/uversion.h>

#include <algorithm>
#include <mutex>
#include <optional>
#include <stdexcept>
#include <string>

#include "engine/base/errors.h"
#include "io/damaged_file_guard.h"
#include "io/hdf5_util.h"

namespace ddp::io {
namespace {

// Windows-1252's 0x80-0x9F. The five bytes it leaves undefined keep their Latin-1 value (a C1 control).
constexpr uint32_t kWindows1252[32] = {0x20AC, 0x0081, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021,
                                       0x02C6, 0x2030, 0x0160, 0x2039, 0x0152, 0x008D, 0x017D, 0x008F,
                                       0x0090, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022, 0x2013, 0x2014,
                                       0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0x009D, 0x017E, 0x0178};

constexpr uint32_t kRightSingleQuote = 0x2019;

struct Decoded {
  uint32_t code_point = 0;
  size_t length = 1;
  bool valid = true;
};

// The character at text[i] (a byte >= 0x80): a well-formed UTF-8 sequence (Unicode's table 3-7, which
// excludes overlong forms, surrogates and code points above U+10FFFF), or else the lead byte alone as
// Windows-1252.
Decoded decode_non_ascii(std::string_view text, size_t i) {
  const auto lead = static_cast<unsigned char>(text[i]);
  size_t length = 0;
  uint32_t code_point = 0;
  unsigned char second_min = 0x80;
  unsigned char second_max = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
    code_point = lead & 0x1Fu;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    length = 3;
    code_point = lead & 0x0Fu;
    if (lead == 0xE0) second_min = 0xA0;  // shorter forms are overlong
    if (lead == 0xED) second_max = 0x9F;  // U+D800-U+DFFF are surrogates
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    length = 4;
    code_point = lead & 0x07u;
    if (lead == 0xF0) second_min = 0x90;
    if (lead == 0xF4) second_max = 0x8F;  // above U+10FFFF
  }
  if (length > 0 && i + length <= text.size()) {
    bool well_formed = true;
    for (size_t k = 1; k < length && well_formed; ++k) {
      const auto byte = static_cast<unsigned char>(text[i + k]);
      const unsigned char min = k == 1 ? second_min : 0x80;
      const unsigned char max = k == 1 ? second_max : 0xBF;
      well_formed = byte >= min && byte <= max;
      code_point = (code_point << 6) | (byte & 0x3Fu);
    }
    if (well_formed) return {code_point, length, true};
  }
  return {lead < 0xA0 ? kWindows1252[lead - 0x80] : lead, 1, false};
}

void append_utf8(std::string& out, uint32_t code_point) {
  if (code_point < 0x80) {
    out += static_cast<char>(code_point);
  } else if (code_point < 0x800) {
    out += static_cast<char>(0xC0 | (code_point >> 6));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else if (code_point < 0x10000) {
    out += static_cast<char>(0xE0 | (code_point >> 12));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (code_point >> 18));
    out += static_cast<char>(0x80 | ((code_point >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((code_point >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (code_point & 0x3F));
  }
}

// Length of the HTML line break starting at text[i] ('<'): "<br", spaces, an optional "/", ">"; 0 if none.
size_t html_break_length(std::string_view text, size_t i) {
  if (i + 3 >= text.size() || (text[i + 1] | 0x20) != 'b' || (text[i + 2] | 0x20) != 'r') return 0;
  size_t j = i + 3;
  while (j < text.size() && (text[j] == ' ' || text[j] == '\t' || text[j] == '\n' || text[j] == '\r')) ++j;
  if (j < text.size() && text[j] == '/') ++j;
  return j < text.size() && text[j] == '>' ? j + 1 - i : 0;
}

// What a non-ASCII character is to the tokenizer, by its Unicode general category and script.
enum class CharRole {
  kWordPart,       // a letter, combining mark or decimal digit of a script that spaces its words
  kSegmentedPart,  // a letter or mark of a script written without spaces (Han, kana, Thai, Lao, Khmer,
                   // Myanmar)
  kEitherPart,  // a letter or mark shared by scripts (ー, combining marks): continues whatever run it follows
  kIgnorable,   // a format character (soft hyphen, zero-width joiners, bidi marks): neither joins nor splits
  kSeparator,   // punctuation, spaces, controls, numbers that are no digits, math and currency signs
  kUnread,      // other symbols (emoji, dingbats), private-use and unassigned code points
};

bool is_segmented_script(UScriptCode script) {
  switch (script) {
    case USCRIPT_HAN:
    case USCRIPT_HIRAGANA:
    case USCRIPT_KATAKANA:
    case USCRIPT_KATAKANA_OR_HIRAGANA:
    case USCRIPT_THAI:
    case USCRIPT_LAO:
    case USCRIPT_KHMER:
    case USCRIPT_MYANMAR:
      return true;
    default:
      return false;
  }
}

CharRole role_of(uint32_t c) {
  const auto code_point = static_cast<UChar32>(c);
  const uint32_t category = U_GET_GC_MASK(code_point);
  if ((category & (U_GC_L_MASK | U_GC_M_MASK | U_GC_ND_MASK)) != 0) {
    if ((category & U_GC_ND_MASK) != 0) return CharRole::kWordPart;
    UErrorCode status = U_ZERO_ERROR;
    const UScriptCode script = uscript_getScript(code_point, &status);
    if (U_FAILURE(status) || script == USCRIPT_COMMON || script == USCRIPT_INHERITED)
      return CharRole::kEitherPart;
    return is_segmented_script(script) ? CharRole::kSegmentedPart : CharRole::kWordPart;
  }
  // A zero-width space marks a word boundary (Khmer, Thai, Burmese texts and web pages carry them); the
  // other format characters join or shape the letters around them.
  constexpr uint32_t kZeroWidthSpace = 0x200B;
  if (c == kZeroWidthSpace) return CharRole::kSeparator;
  if ((category & U_GC_CF_MASK) != 0) return CharRole::kIgnorable;
  if ((category & (U_GC_SO_MASK | U_GC_CO_MASK | U_GC_CN_MASK | U_GC_CS_MASK)) != 0) return CharRole::kUnread;
  return CharRole::kSeparator;
}

// One thread's ICU objects: the dictionary word segmenter (UAX #29 with ICU's Chinese/Japanese, Thai, Lao,
// Khmer and Burmese dictionaries) and the NFC normalizer. A break iterator is not thread-safe and costs
// about a millisecond to open, so each thread opens its own once.
class IcuText {
 public:
  IcuText() {
    UErrorCode status = U_ZERO_ERROR;
    words_ = ubrk_open(UBRK_WORD, "", nullptr, 0, &status);
    check(status, "ubrk_open(UBRK_WORD)");
    nfc_ = unorm2_getNFCInstance(&status);
    check(status, "unorm2_getNFCInstance");
  }
  ~IcuText() { ubrk_close(words_); }
  IcuText(const IcuText&) = delete;
  IcuText& operator=(const IcuText&) = delete;

  static IcuText& for_this_thread() {
    thread_local IcuText icu;
    return icu;
  }

  // Calls on_segment(begin, end) for each word ICU's dictionaries find in text (UTF-16), in order.
  template <typename OnSegment>
  void segment(std::u16string_view text, OnSegment&& on_segment) {
    UErrorCode status = U_ZERO_ERROR;
    ubrk_setText(words_, text.data(), static_cast<int32_t>(text.size()), &status);
    check(status, "ubrk_setText");
    int32_t begin = ubrk_first(words_);
    for (int32_t end = ubrk_next(words_); end != UBRK_DONE; begin = end, end = ubrk_next(words_)) {
      if (ubrk_getRuleStatus(words_) >= UBRK_WORD_NONE_LIMIT) {
        on_segment(static_cast<size_t>(begin), static_cast<size_t>(end));
      }
    }
    ubrk_setText(words_, nullptr, 0, &status);  // the text is the caller's: hold no pointer into it
  }

  // `text` (UTF-8) in Normalization Form C, so that a decomposed "é" (e + U+0301) is the word "é"; nothing
  // where it is not valid UTF-8.
  std::optional<std::string> nfc(std::string_view text) {
    UErrorCode status = U_ZERO_ERROR;
    utf16_.resize(text.size());
    int32_t length = 0;
    u_strFromUTF8(utf16_.data(), static_cast<int32_t>(utf16_.size()), &length, text.data(),
                  static_cast<int32_t>(text.size()), &status);
    if (U_FAILURE(status)) return std::nullopt;
    // NFC can lengthen a string (a singleton decomposes and composes back differently) by at most 3x.
    normalized_.resize(static_cast<size_t>(length) * 3 + 4);
    const int32_t normalized_length = unorm2_normalize(nfc_, utf16_.data(), length, normalized_.data(),
                                                       static_cast<int32_t>(normalized_.size()), &status);
    check(status, "unorm2_normalize");
    std::string out;
    out.resize(static_cast<size_t>(normalized_length) * 3);
    int32_t out_length = 0;
    u_strToUTF8(out.data(), static_cast<int32_t>(out.size()), &out_length, normalized_.data(),
                normalized_length, &status);
    check(status, "u_strToUTF8");
    out.resize(static_cast<size_t>(out_length));
    return out;
  }

 private:
  static void check(UErrorCode status, const char* call) {
    if (U_FAILURE(status))
      throw std::runtime_error(std::string("ICU: ") + call + " failed: " + u_errorName(status));
  }

  UBreakIterator* words_ = nullptr;
  const UNormalizer2* nfc_ = nullptr;
  std::u16string utf16_;
  std::u16string normalized_;
};

// Splits text into words (the rules in tokenizer.h), one character at a time. Characters of spaced scripts
// gather in word_ (UTF-8, lower-cased); those of scripts written without spaces in run_ (UTF-16, for ICU),
// which is cut into words when the run ends.
class WordSplitter {
 public:
  explicit WordSplitter(const std::function<void(std::string_view word)>& on_word) : on_word_(on_word) {}

  void ascii_word_char(char c) {
    end_run();
    word_ += c;
    ++in_words_;
  }
  void apostrophe() {
    end_run();
    if (!word_.empty()) word_ += '\'';  // a leading apostrophe is stripped
  }
  void separator() {
    end_word();
    end_run();
  }

  void non_ascii(uint32_t c, CharRole role) {
    switch (role) {
      case CharRole::kWordPart:
        end_run();
        add_to_word(c);
        break;
      case CharRole::kSegmentedPart:
        end_word();
        add_to_run(c);
        break;
      case CharRole::kEitherPart:
        if (run_.empty()) {
          add_to_word(c);
        } else {
          add_to_run(c);
        }
        break;
      case CharRole::kIgnorable:
        break;
      case CharRole::kUnread:
        ++unread_;
        separator();
        break;
      case CharRole::kSeparator:
        separator();
        break;
    }
  }

  void finish() { separator(); }
  int64_t in_words() const { return in_words_; }
  int64_t unread() const { return unread_; }

 private:
  void add_to_word(uint32_t c) {
    const auto lower = static_cast<uint32_t>(u_tolower(static_cast<UChar32>(c)));
    word_needs_nfc_ = word_needs_nfc_ ||
                      u_getIntPropertyValue(static_cast<UChar32>(lower), UCHAR_NFC_QUICK_CHECK) != UNORM_YES;
    append_utf8(word_, lower);
    ++in_words_;
  }

  void add_to_run(uint32_t c) {
    const auto lower = static_cast<UChar32>(u_tolower(static_cast<UChar32>(c)));
    if (lower <= 0xFFFF) {
      run_ += static_cast<char16_t>(lower);
    } else {
      run_ += static_cast<char16_t>(U16_LEAD(lower));
      run_ += static_cast<char16_t>(U16_TRAIL(lower));
    }
    ++in_words_;
  }

  void end_word() {
    if (word_.empty()) return;
    while (!word_.empty() && word_.back() == '\'') word_.pop_back();
    if (word_needs_nfc_ && !word_.empty() && word_.size() <= 4 * kMaxWordBytes) {
      word_ = *IcuText::for_this_thread().nfc(word_);  // the decoder's words are valid UTF-8
    }
    write_final_sigma(word_);
    emit(word_);
    word_.clear();
    word_needs_nfc_ = false;
  }

  void end_run() {
    if (!run_.empty()) cut_run();
  }

  // Out of line: the rare path, kept out of the per-character loop.
  [[gnu::noinline]] void cut_run() {
    std::string word;
    IcuText::for_this_thread().segment(run_, [&](size_t begin, size_t end) {
      word.clear();
      bool needs_nfc = false;
      for (size_t i = begin; i < end;) {
        UChar32 c = 0;
        U16_NEXT(run_.data(), i, end, c);
        needs_nfc = needs_nfc || u_getIntPropertyValue(c, UCHAR_NFC_QUICK_CHECK) != UNORM_YES;
        append_utf8(word, static_cast<uint32_t>(c));
      }
      // As end_word(): a word is in NFC, so that tokenizing it again yields it (a combining mark that a
      // run of Chinese carried along, as U+0343, which NFC writes U+0313).
      if (needs_nfc && word.size() <= 4 * kMaxWordBytes) word = *IcuText::for_this_thread().nfc(word);
      emit(word);
    });
    run_.clear();
  }

  // Greek writes σ at the end of a word as ς, and Σ lower-cases to σ one letter at a time: so "ΟΔΟΣ" and
  // "οδος" are one word, as Unicode's full lower-casing makes them. A lone σ stays.
  static void write_final_sigma(std::string& word) {
    constexpr std::string_view kSigma = "\xCF\x83";       // σ U+03C3
    constexpr std::string_view kFinalSigma = "\xCF\x82";  // ς U+03C2
    if (word.size() > kSigma.size() && word.ends_with(kSigma)) {
      word.replace(word.size() - kSigma.size(), kSigma.size(), kFinalSigma);
    }
  }

  void emit(std::string_view word) {
    if (!word.empty() && word.size() <= kMaxWordBytes) on_word_(word);
  }

  const std::function<void(std::string_view word)>& on_word_;
  std::string word_;
  bool word_needs_nfc_ = false;
  std::u16string run_;
  int64_t in_words_ = 0;
  int64_t unread_ = 0;
};

}  // namespace

bool tokenize(std::string_view text, const std::function<void(std::string_view word)>& on_word,
              CharacterCounts* counts) {
  WordSplitter words(on_word);
  bool valid = true;
  size_t i = 0;
  while (i < text.size()) {
    const char byte = text[i];
    if (static_cast<unsigned char>(byte) < 0x80) {
      ++i;
      if (byte >= 'a' && byte <= 'z') {
        words.ascii_word_char(byte);
      } else if (byte >= 'A' && byte <= 'Z') {
        words.ascii_word_char(static_cast<char>(byte - 'A' + 'a'));
      } else if (byte >= '0' && byte <= '9') {
        words.ascii_word_char(byte);
      } else if (byte == '\'') {
        words.apostrophe();
      } else {
        if (byte == '<') {
          const size_t line_break = html_break_length(text, i - 1);
          if (line_break > 0) i += line_break - 1;
        }
        words.separator();
      }
      continue;
    }
    const Decoded decoded = decode_non_ascii(text, i);
    valid = valid && decoded.valid;
    i += decoded.length;
    if (decoded.code_point == kRightSingleQuote) {
      words.apostrophe();
    } else {
      words.non_ascii(decoded.code_point, role_of(decoded.code_point));
    }
  }
  words.finish();
  if (counts != nullptr) {
    counts->in_words += words.in_words();
    counts->unread += words.unread();
  }
  return valid;
}

std::vector<std::string> tokenize(std::string_view text, bool* valid_utf8) {
  std::vector<std::string> words;
  const bool valid = tokenize(text, [&](std::string_view word) { words.emplace_back(word); });
  if (valid_utf8 != nullptr) *valid_utf8 = valid;
  return words;
}

namespace {

// UTF-32 in either byte order: a byte order mark (FF FE 00 00 or 00 00 FE FF) followed by whole units, or no
// mark and every unit of the first 4 KiB a Unicode code point (its top byte NUL, the next at most 0x10), at
// least two of them, and at least half of them holding a byte besides those. Latin UTF-16 fails the second
// rule on its first letter pair, UTF-8 on any four bytes without two NULs in the right places.
std::optional<bool> utf32_little_endian(const std::string& bytes, size_t& start) {
  const auto byte_at = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const bool whole_units = bytes.size() % 4 == 0;
  if (bytes.size() >= 4 && whole_units && bytes.compare(0, 4, std::string("\xFF\xFE\0\0", 4)) == 0) {
    start = 4;
    return true;
  }
  if (bytes.size() >= 4 && whole_units && bytes.compare(0, 4, std::string("\0\0\xFE\xFF", 4)) == 0) {
    start = 4;
    return false;
  }
  start = 0;
  const size_t units = std::min<size_t>(bytes.size(), 4096) / 4;
  if (units < 2) return std::nullopt;
  const auto all_code_points = [&](bool little_endian) {
    size_t holding_more = 0;
    for (size_t at = 0; at < 4 * units; at += 4) {
      const unsigned top = little_endian ? byte_at(at + 3) : byte_at(at);
      const unsigned plane = little_endian ? byte_at(at + 2) : byte_at(at + 1);
      if (top != 0 || plane > 0x10) return false;
      const unsigned rest =
          byte_at(at + 1) | byte_at(at + 2) | (little_endian ? byte_at(at) : byte_at(at + 3));
      holding_more += rest != 0 ? 1 : 0;
    }
    return holding_more * 2 >= units;
  };
  if (all_code_points(true)) return true;
  if (all_code_points(false)) return false;
  return std::nullopt;
}

// UTF-16 by io/tokenizer.h's rules: whether little-endian, and where the text starts past a mark.
std::optional<bool> utf16_little_endian(const std::string& bytes, size_t& start) {
  const auto byte_at = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  const bool marked_le = bytes.size() >= 2 && byte_at(0) == 0xFF && byte_at(1) == 0xFE;
  const bool marked_be = bytes.size() >= 2 && byte_at(0) == 0xFE && byte_at(1) == 0xFF;
  start = marked_le || marked_be ? 2 : 0;
  // NULs in the first 4 KiB, in the high byte of a little-endian pair (odd offsets past the mark) and of a
  // big-endian one: text in a script that spaces its words has them (a space is U+0020), UTF-8 and Latin-1
  // text never.
  const size_t pairs = (std::min<size_t>(bytes.size(), 4096 + start) - start) / 2;
  size_t nul_high_le = 0;
  size_t nul_high_be = 0;
  for (size_t p = 0; p < pairs; ++p) {
    nul_high_be += bytes[start + 2 * p] == '\0' ? 1 : 0;
    nul_high_le += bytes[start + 2 * p + 1] == '\0' ? 1 : 0;
  }
  // Unmarked: NULs in at least a tenth of the high bytes (Latin text has them in nearly all, Greek or
  // Cyrillic in its spaces and punctuation), two at least (one stray NUL in a short UTF-8 file is no
  // encoding), and ten times fewer in the low ones.
  const auto one_sided = [&](size_t high, size_t low) {
    return pairs >= 2 && high >= 2 && high * 10 >= pairs && low * 10 < high;
  };
  // Marked: the mark decides where the rest has whole pairs (Chinese or Thai text may hold no NUL at all) or
  // NULs in its high bytes (a file cut short).
  const bool pairs_whole = (bytes.size() - start) % 2 == 0;
  if (marked_le && (pairs_whole || nul_high_le > 0)) return true;
  if (marked_be && (pairs_whole || nul_high_be > 0)) return false;
  if (start == 0 && one_sided(nul_high_le, nul_high_be)) return true;
  if (start == 0 && one_sided(nul_high_be, nul_high_le)) return false;
  return std::nullopt;
}

}  // namespace

WideEncoding convert_wide_unicode(std::string& bytes) {
  constexpr uint32_t kReplacement = 0xFFFD;
  size_t start = 0;
  if (const std::optional<bool> little_endian = utf32_little_endian(bytes, start)) {
    std::string out;
    out.reserve(bytes.size() / 2);
    for (size_t i = start; i + 3 < bytes.size(); i += 4) {
      uint32_t code_point = 0;
      for (size_t b = 0; b < 4; ++b) {
        code_point = code_point << 8 | static_cast<unsigned char>(bytes[i + (*little_endian ? 3 - b : b)]);
      }
      const bool valid = code_point <= 0x10FFFF && (code_point < 0xD800 || code_point > 0xDFFF);
      append_utf8(out, valid ? code_point : kReplacement);
    }
    bytes = std::move(out);
    return {*little_endian ? "UTF-32LE" : "UTF-32BE", start > 0};
  }
  const std::optional<bool> little_endian = utf16_little_endian(bytes, start);
  if (!little_endian) return {};
  const auto unit = [&](size_t i) -> uint32_t {
    const uint32_t first = static_cast<unsigned char>(bytes[i]);
    const uint32_t second = static_cast<unsigned char>(bytes[i + 1]);
    return *little_endian ? first | (second << 8) : (first << 8) | second;
  };
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = start; i + 1 < bytes.size(); i += 2) {
    uint32_t code_point = unit(i);
    if (code_point >= 0xD800 && code_point <= 0xDBFF && i + 3 < bytes.size() && unit(i + 2) >= 0xDC00 &&
        unit(i + 2) <= 0xDFFF) {
      code_point = 0x10000 + ((code_point - 0xD800) << 10) + (unit(i + 2) - 0xDC00);
      i += 2;
    } else if (code_point >= 0xD800 && code_point <= 0xDFFF) {
      code_point = kReplacement;
    }
    append_utf8(out, code_point);
  }
  bytes = std::move(out);
  return {*little_endian ? "UTF-16LE" : "UTF-16BE", start > 0};
}

std::string nfc_form(std::string_view text) {
  std::optional<std::string> normalized = IcuText::for_this_thread().nfc(text);
  return normalized ? std::move(*normalized) : std::string(text);
}

std::string unicode_library_version() {
  const auto text = [](const UVersionInfo version) {
    char buffer[U_MAX_VERSION_STRING_LENGTH] = {};
    u_versionToString(version, buffer);
    return std::string(buffer);
  };
  UVersionInfo icu{};
  u_getVersion(icu);
  UVersionInfo unicode{};
  u_getUnicodeVersion(unicode);
  return "ICU " + text(icu) + ", Unicode " + text(unicode);
}

std::string to_utf8(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t i = 0; i < bytes.size();) {
    if (static_cast<unsigned char>(bytes[i]) < 0x80) {
      out += bytes[i++];
      continue;
    }
    const Decoded decoded = decode_non_ascii(bytes, i);
    append_utf8(out, decoded.code_point);
    i += decoded.length;
  }
  return out;
}

std::vector<int32_t> pad_pre(std::span<const int32_t> ids, int maxlen) {
  if (maxlen < 1) throw std::invalid_argument("pad_pre: maxlen must be positive");
  const auto length = static_cast<size_t>(maxlen);
  std::vector<int32_t> row(length, kPadId);
  if (ids.size() + 1 <= length) {
    row[length - ids.size() - 1] = kStartId;
    std::copy(ids.begin(), ids.end(), row.end() - static_cast<std::ptrdiff_t>(ids.size()));
  } else {
    std::copy(ids.end() - static_cast<std::ptrdiff_t>(length), ids.end(), row.begin());
  }
  return row;
}

Vocabulary::Vocabulary(std::vector<std::string> words) : words_(std::move(words)) {
  if (words_.size() < static_cast<size_t>(kFirstWordId)) {
    throw std::invalid_argument("Vocabulary: ids 0..2 are reserved, so it needs at least 3 entries");
  }
  ids_.reserve(words_.size());
  for (size_t i = kFirstWordId; i < words_.size(); ++i) ids_.emplace(words_[i], static_cast<int32_t>(i));
}

Vocabulary Vocabulary::from_counts(const WordCounts& counts, int size) {
  if (size < kFirstWordId) throw std::invalid_argument("Vocabulary::from_counts: size must be at least 3");
  std::vector<std::pair<std::string_view, int64_t>> ranked;
  ranked.reserve(counts.size());
  for (const auto& [word, count] : counts) {
    if (count > 0) ranked.emplace_back(word, count);
  }
  const size_t keep = std::min(ranked.size(), static_cast<size_t>(size - kFirstWordId));
  // string_view compares as unsigned bytes (char_traits<char>), i.e. by code point for UTF-8.
  std::partial_sort(ranked.begin(), ranked.begin() + static_cast<std::ptrdiff_t>(keep), ranked.end(),
                    [](const auto& a, const auto& b) {
                      return a.second != b.second ? a.second > b.second : a.first < b.first;
                    });
  std::vector<std::string> words{"<pad>", "<start>", "<oov>"};
  words.reserve(keep + kFirstWordId);
  for (size_t i = 0; i < keep; ++i) words.emplace_back(ranked[i].first);
  return Vocabulary(std::move(words));
}

namespace {

// The characters of a word that ICU's dictionaries may have cut from a run of a script written without
// spaces, where the cut depends on the text around the word: `of_runs` where every character may stand in
// such a run, `segmented` where one is of such a script itself.
struct RunCharacters {
  bool of_runs = false;
  bool segmented = false;
};
RunCharacters run_characters(std::string_view word) {
  RunCharacters characters{!word.empty(), false};
  for (size_t i = 0; i < word.size();) {
    if (static_cast<unsigned char>(word[i]) < 0x80) return {};
    const Decoded decoded = decode_non_ascii(word, i);
    i += decoded.length;
    const CharRole role = role_of(decoded.code_point);
    if (role != CharRole::kSegmentedPart && role != CharRole::kEitherPart) return {};
    characters.segmented = characters.segmented || role == CharRole::kSegmentedPart;
  }
  return characters;
}

}  // namespace

std::size_t Vocabulary::unreachable_words(std::string* example) const {
  std::size_t count = 0;
  for (std::size_t i = kFirstWordId; i < words_.size(); ++i) {
    const std::vector<std::string> yielded = tokenize(words_[i]);
    if (yielded.size() == 1 && yielded[0] == words_[i]) continue;
    // A word of Chinese, Japanese or Thai is reachable if the tokenizer keeps all of its characters. Such
    // words are cut from their run by ICU's dictionaries, in context: a mark that is a word only beside
    // others (the iteration mark 々 after a katakana word) yields nothing standing alone.
    std::string joined;
    for (const std::string& part : yielded) joined += part;
    const RunCharacters characters = run_characters(words_[i]);
    if (joined == words_[i] && characters.segmented) continue;
    if (yielded.empty() && characters.of_runs) continue;
    if (count++ == 0 && example != nullptr) *example = words_[i];
  }
  return count;
}

int32_t Vocabulary::id(std::string_view word) const {
  const auto it = ids_.find(word);
  return it == ids_.end() ? kOovId : it->second;
}

std::vector<int32_t> Vocabulary::encode(std::string_view text, int maxlen, std::size_t* words,
                                        bool* valid_utf8) const {
  std::vector<int32_t> ids;
  const bool valid = tokenize(text, [&](std::string_view word) { ids.push_back(id(word)); });
  if (words != nullptr) *words = ids.size();
  if (valid_utf8 != nullptr) *valid_utf8 = valid;
  return pad_pre(ids, maxlen);
}

Vocabulary read_vocabulary(const std::string& dataset_path) try {
  const DamagedFileGuard guard(dataset_path);
  std::lock_guard<std::recursive_mutex> lock(hdf5_mutex());
  quiet_hdf5_errors();
  Hid file = open_file_readonly(dataset_path);
  if (!link_exists(file.get(), "vocab")) {
    throw UserError(dataset_path + " has no /vocab: predict needs a dataset made by `ddptrain prepare text`");
  }
  const int64_t vocab_size = read_int_attribute(file.get(), dataset_path, "vocab_size");
  // Only ids below vocab_size can reach the model: the rest stays on disk.
  std::vector<std::string> words =
      read_string_list(file.get(), dataset_path, "/vocab",
                       static_cast<std::size_t>(std::max<int64_t>(vocab_size, kFirstWordId)));
  if (words.size() < static_cast<std::size_t>(kFirstWordId)) {
    throw UserError(dataset_path + ": /vocab must be a list of at least 3 strings");
  }
  return Vocabulary(std::move(words));
} catch (const Hdf5Error& e) {
  throw_unreadable_file(dataset_path, e);
}

}  // namespace ddp::io
