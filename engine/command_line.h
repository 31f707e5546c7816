// Command-line parsing shared by ddptrain's commands (Boost.Program_options): one behaviour for every
// command, so a stray word is refused the same way everywhere and errors read "COMMAND: what is wrong".
#pragma once

#include <boost/program_options.hpp>
#include <string>
#include <vector>

namespace ddp::engine {

// The text of a Boost.Program_options error, prefixed by `context` ("COMMAND: " or "FILE: ") as one line.
// Boost 1.74 fills in its placeholders (%value%, %option%, ...) until none is left, so a value that holds one
// would loop forever: the '%' of every quoted value is written as \x25 before the text is made, and so are
// control bytes and bytes that are not UTF-8; a quoted value is cut after 160 characters.
std::string option_error_text(const boost::program_options::error& e, const std::string& context);

// For an unknown option within two edits of a known one (a typo: train.batch_sze, --vocb): " (did you mean
// PREFIX + NAME?)"; otherwise "".
std::string did_you_mean(const boost::program_options::error& e,
                         const boost::program_options::options_description& options,
                         const std::string& prefix);

// A value from outside quoted for a message: newlines, tabs, other control bytes, '%' and bytes that are not
// UTF-8 (a binary file given as a config) escaped (\n, \xNN), cut after 160 characters.
std::string printable_value(const std::string& value);

// Throws UserError, prefixed by `context`, for the values Boost would misread: one given for an unsigned
// option that starts with '-' (Boost reads "-1" as the type's largest value), and an empty one for a
// true/false option (Boost reads `overwrite =` as true). `key_prefix` is "--" on a command line, "" in a
// config file.
void refuse_misread_values(const boost::program_options::parsed_options& parsed,
                           const boost::program_options::options_description& options,
                           const std::string& context, const std::string& key_prefix);

// Stores `args` into `vm` against `options`. A word that belongs to no option (a misspelt command, a value
// whose key was forgotten) is an error naming it, never silently ignored. Throws UserError prefixed by
// `command`.
void store_command_line(const std::vector<std::string>& args,
                        const boost::program_options::options_description& options,
                        boost::program_options::variables_map& vm, const std::string& command);

// A subcommand's whole parse: store, then notify (required options, value checks). Returns false when
// --help was given: then "Usage: <usage>" and the options are printed if `print_help`, and the command
// should return kExitOk.
bool parse_subcommand(const std::vector<std::string>& args,
                      const boost::program_options::options_description& options, const std::string& command,
                      const std::string& usage, bool print_help = true);

}  // namespace ddp::engine
