#include "engine/command_line.h"

#include <iostream>
#include <map>

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

}  // namespace

std::string option_error_text(const po::error& e, const std::string& context) {
  const auto* named = dynamic_cast<const po::error_with_option_name*>(&e);
  if (named == nullptr) return context + e.what();
  po::error_with_option_name copy(*named);
  for (auto& [name, value] : SubstitutionAccess::of(copy)) {
    for (size_t at = value.find('%'); at != std::string::npos; at = value.find('%', at)) {
      value.replace(at, 1, "\\x25");
    }
  }
  return context + copy.what();
}

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
    po::store(po::command_line_parser(args).options(with_stray).positional(positional).style(style).run(),
              vm);
    if (vm.count("ddptrain-stray-words")) {
      throw UserError(command + ": unexpected argument '" +
                      vm["ddptrain-stray-words"].as<std::vector<std::string>>()[0] +
                      "' (commands: train, prepare, predict, evaluate, check-env; options are --name VALUE)");
    }
  } catch (const po::error& e) {
    throw UserError(option_error_text(e, command + ": "));
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
