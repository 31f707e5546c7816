#include "engine/classification_report.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>

namespace ddp::engine {
namespace {

double ratio(int64_t part, int64_t whole) {
  return whole > 0 ? static_cast<double>(part) / static_cast<double>(whole) : 0.0;
}

// The class's name as the table shows it: a tab or another control byte would break its columns, so they are
// escaped (\t, \xNN), as messages escape what they quote.
std::string name_of(const std::vector<std::string>& names, int k) {
  if (static_cast<std::size_t>(k) >= names.size()) return std::to_string(k);
  std::string shown;
  for (const char c : names[static_cast<std::size_t>(k)]) {
    const auto byte = static_cast<unsigned char>(c);
    if (c == '\t') {
      shown += "\\t";
    } else if (byte < 0x20 || byte == 0x7F) {
      shown += fmt::format("\\x{:02X}", byte);
    } else {
      shown += c;
    }
  }
  return shown;
}

}  // namespace

ClassReport classification_report(std::span<const int64_t> confusion, int classes) {
  const auto k = static_cast<std::size_t>(classes);
  if (classes < 2 || confusion.size() != k * k) {
    throw std::invalid_argument("classification_report: " + std::to_string(confusion.size()) +
                                " counts for " + std::to_string(classes) + " classes");
  }
  ClassReport r;
  r.classes = classes;
  r.precision.assign(k, 0.0);
  r.recall.assign(k, 0.0);
  r.f1.assign(k, 0.0);
  r.support.assign(k, 0);
  std::vector<int64_t> predicted(k, 0);
  int64_t correct = 0;
  for (std::size_t t = 0; t < k; ++t) {
    for (std::size_t p = 0; p < k; ++p) {
      const int64_t n = confusion[t * k + p];
      r.support[t] += n;
      predicted[p] += n;
      r.total += n;
      if (t == p) correct += n;
    }
  }
  int occurring = 0;
  for (std::size_t c = 0; c < k; ++c) {
    const int64_t hits = confusion[c * k + c];
    r.precision[c] = ratio(hits, predicted[c]);
    r.recall[c] = ratio(hits, r.support[c]);
    const double sum = r.precision[c] + r.recall[c];
    r.f1[c] = sum > 0 ? 2 * r.precision[c] * r.recall[c] / sum : 0.0;
    if (r.support[c] == 0 && predicted[c] == 0) continue;
    ++occurring;
    r.macro_precision += r.precision[c];
    r.macro_recall += r.recall[c];
    r.macro_f1 += r.f1[c];
  }
  if (occurring > 0) {
    r.macro_precision /= occurring;
    r.macro_recall /= occurring;
    r.macro_f1 /= occurring;
  }
  r.accuracy = ratio(correct, r.total);
  return r;
}

std::string format_classification_report(const ClassReport& report, std::span<const int64_t> confusion,
                                         const std::vector<std::string>& names) {
  const auto k = static_cast<std::size_t>(report.classes);
  std::size_t width = 9;  // "macro avg"
  for (int c = 0; c < report.classes; ++c) width = std::max(width, name_of(names, c).size());
  std::string text = fmt::format("{:<{}}  precision  recall     f1  support\n", "class", width);
  for (std::size_t c = 0; c < k; ++c) {
    text += fmt::format("{:<{}}  {:>9.4f}  {:>6.4f} {:>6.4f}  {:>7}\n", name_of(names, static_cast<int>(c)),
                        width, report.precision[c], report.recall[c], report.f1[c], report.support[c]);
  }
  text += fmt::format("{:<{}}  {:>9.4f}  {:>6.4f} {:>6.4f}  {:>7}\n", "macro avg", width,
                      report.macro_precision, report.macro_recall, report.macro_f1, report.total);
  text += "confusion matrix (rows: true class, columns: predicted class):\n";
  std::size_t cell = 1;
  for (const int64_t n : confusion) cell = std::max(cell, std::to_string(n).size());
  for (std::size_t c = 0; c < k; ++c) cell = std::max(cell, name_of(names, static_cast<int>(c)).size());
  text += fmt::format("{:<{}}", "", width);
  for (std::size_t p = 0; p < k; ++p)
    text += fmt::format("  {:>{}}", name_of(names, static_cast<int>(p)), cell);
  text += "\n";
  for (std::size_t t = 0; t < k; ++t) {
    text += fmt::format("{:<{}}", name_of(names, static_cast<int>(t)), width);
    for (std::size_t p = 0; p < k; ++p) text += fmt::format("  {:>{}}", confusion[t * k + p], cell);
    text += "\n";
  }
  return text;
}

}  // namespace ddp::engine
