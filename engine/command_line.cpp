#include "engine/command_line.h"

#include <iostream>

#include "engine/base/errors.h"

namespace po = boost::program_options;

namespace ddp::engine {

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
    throw UserError(command + ": " + e.what());
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
    throw UserError(command + ": " + e.what());
  }
  return true;
}

}  // namespace ddp::engine
