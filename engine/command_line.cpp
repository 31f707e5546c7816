#include "engine/command_line.h"

#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <set>
#include <string_view>
#include <vector>

#include "engine/base/errors.h"

namespace po = boost::program_options;

namespace ddp::engine {
namespace {

// Reaches the protected placeholder values of a Boost error (a derived class may name them).
struct SubstitutionAccess : po::error_with_option_name {
  static std::map<std::string, std::string>& of(po::error_with_option_name& e) {
    return e.*&SubstitutionAccess::m_substitutions;
  }
};

// The length of the well-formed UTF-8 sequence that starts at `at`, 0 if none does.
std::size_t utf8_length_at(const std::string& text, std::size_t at) {
  const auto lead = static_cast<unsigned char>(text[at]);
  std::size_t length = 0;
  if (lead < 0x80)
    length = 1;
  else if (lead >= 0xC2 && lead <= 0xDF)
    length = 2;
  else if (lead >= 0xE0 && lead <= 0xEF)
    length = 3;
  else if (lead >= 0xF0 && lead <= 0xF4)
    length = 4;
  for (std::size_t k = 1; k < length; ++k) {
    if (at + k >= text.size() || (static_cast<unsigned char>(text[at + k]) & 0xC0) != 0x80) return 0;
  }
  return length;
}

}  // namespace

std::string printable_value(const std::string& value) {
  constexpr std::size_t kMostShown = 160;
  std::string out;
  std::size_t at = 0;
  while (at < value.size() && out.size() < kMostShown) {
    const auto byte = static_cast<unsigned char>(value[at]);
    const std::size_t length = utf8_length_at(value, at);
    if (byte == '\n' || byte == '\r' || byte == '\t') {
      out += byte == '\n' ? "\\n" : byte == '\r' ? "\\r" : "\\t";
      ++at;
    } else if (length == 0 || byte < 0x20 || byte == 0x7F || byte == '%') {
      char escaped[5];
      std::snprintf(escaped, sizeof escaped, "\\x%02X", byte);
      out += escaped;
      ++at;
    } else {
      out.append(value, at, length);
      at += length;
    }
  }
  if (at < value.size()) out += "...";
  return out;
}

std::string option_error_text(const po::error& e, const std::string& context) {
  const auto* named = dynamic_cast<const po::error_with_option_name*>(&e);
  if (named == nullptr) return context + e.what();
  po::error_with_option_name copy(*named);
  for (auto& [name, value] : SubstitutionAccess::of(copy)) value = printable_value(value);
  return context + copy.what();
}

namespace {

// Levenshtein's distance between a and b: the fewest insertions, deletions and substitutions.
std::size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

}  // namespace

std::string did_you_mean(const po::error& e, const po::options_description& options,
                         const std::string& prefix) {
  const auto* unknown = dynamic_cast<const po::unknown_option*>(&e);
  if (unknown == nullptr) return "";
  std::string given = unknown->get_option_name();
  given.erase(0, given.find_first_not_of('-'));
  std::string closest;
  std::size_t closest_distance = 3;  // two edits at most: further off is no typo of it
  for (const auto& option : options.options()) {
    const std::string& name = option->long_name();
    if (name.empty()) continue;
    const std::size_t distance = edit_distance(given, name);
    if (distance < closest_distance) {
      closest = name;
      closest_distance = distance;
    }
  }
  return closest.empty() ? "" : " (did you mean " + prefix + closest + "?)";
}

void refuse_misread_values(const po::parsed_options& parsed, const po::options_description& options,
                           const std::string& context, const std::string& key_prefix) {
  for (const po::option& given : parsed.options) {
    const po::option_description* described = options.find_nothrow(given.string_key, false);
    if (described == nullptr) continue;
    const po::value_semantic* semantic = described->semantic().get();
    // A flag (bool_switch) takes no value; a true/false key given one must say which.
    if (dynamic_cast<const po::typed_value<bool>*>(semantic) != nullptr && semantic->max_tokens() > 0) {
      for (const std::string& value : given.value) {
        if (value.find_first_not_of(" \t") != std::string::npos) continue;
        throw UserError(context + key_prefix + given.string_key +
                        " must be true or false, got an empty value");
      }
    }
    const bool is_unsigned = dynamic_cast<const po::typed_value<unsigned long>*>(semantic) != nullptr ||
                             dynamic_cast<const po::typed_value<unsigned long long>*>(semantic) != nullptr ||
                             dynamic_cast<const po::typed_value<unsigned int>*>(semantic) != nullptr;
    if (!is_unsigned) continue;
    for (const std::string& value : given.value) {
      const std::size_t first = value.find_first_not_of(" \t");
      if (first != std::string::npos && value[first] == '-') {
        throw UserError(context + key_prefix + given.string_key + " must be 0 or more, got '" + value + "'");
      }
    }
  }
}

namespace {

// A key given twice on the command line takes the later value, as in most tools: a launcher script's own
// arguments come first and the user's (DDPTRAIN_EXTRA_ARGS) after them. Repeatable options (--text) and
// words without an option keep every occurrence.
void keep_the_last_of_each_key(po::parsed_options& parsed) {
  std::vector<po::option>& given = parsed.options;
  std::vector<bool> keep(given.size(), true);
  std::set<std::string> seen;
  for (std::size_t i = given.size(); i-- > 0;) {
    const po::option& option = given[i];
    if (option.position_key != -1 || option.unregistered) continue;
    const po::option_description* described = parsed.description->find_nothrow(option.string_key, false);
    if (described == nullptr || described->semantic()->is_composing()) continue;
    keep[i] = seen.insert(option.string_key).second;
  }
  std::vector<po::option> kept;
  for (std::size_t i = 0; i < given.size(); ++i)
    if (keep[i]) kept.push_back(given[i]);
  given = std::move(kept);
}

}  // namespace

void store_command_line(const std::vector<std::string>& args, const po::options_description& options,
                        po::variables_map& vm, const std::string& command) {
  try {
    // Words without an option are collected under a hidden name, so the first can be named in the error.
    std::vector<std::string> stray;
    po::options_description with_stray;
    with_stray.add(options).add_options()("ddptrain-stray-words", po::value(&stray));
    po::positional_options_description positional;
    positional.add("ddptrain-stray-words", -1);
    // No guessing: Boost would take --train.epoch for --train.epochs, and --train.learn for
    // --train.learning_rate, so a typo could silently set some other key.
    const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    po::parsed_options parsed =
        po::command_line_parser(args).options(with_stray).positional(positional).style(style).run();
    keep_the_last_of_each_key(parsed);
    refuse_misread_values(parsed, options, command + ": ", "--");
    po::store(parsed, vm);
    if (vm.count("ddptrain-stray-words")) {
      throw UserError(command + ": unexpected argument '" +
                      vm["ddptrain-stray-words"].as<std::vector<std::string>>()[0] +
                      "' (commands: train, prepare, predict, evaluate, check-env; options are --name VALUE)");
    }
  } catch (const po::error& e) {
    throw UserError(option_error_text(e, command + ": ") + did_you_mean(e, options, "--"));
  }
}

bool parse_subcommand(const std::vector<std::string>& args, const po::options_description& options,
                      const std::string& command, const std::string& usage, bool print_help) {
  po::variables_map vm;
  store_command_line(args, options, vm, command);
  if (vm.count("help")) {
    if (print_help) std::cout << "Usage: " << usage << "\n" << options;
    return false;
  }
  try {
    po::notify(vm);
  } catch (const po::error& e) {
    throw UserError(option_error_text(e, command + ": "));
  }
  return true;
}

}  // namespace ddp::engine
