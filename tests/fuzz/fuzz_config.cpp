// The configuration (engine/config.h): an INI file and --section.key value pairs, both from the input,
// through parse_config; and a subcommand's options through engine/command_line.h.
#include <boost/program_options.hpp>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/command_line.h"
#include "engine/config.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

// Keys the parser knows (every config key, and the general options), so that the input reaches values, not
// only "unknown key".
const std::vector<std::string>& known_keys() {
  static const std::vector<std::string> keys = [] {
    std::vector<std::string> all = ddp::engine::config_key_names();
    all.insert(all.end(), {"resume", "config", "help", "version"});
    return all;
  }();
  return keys;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ddp;
  FuzzedDataProvider in(data, size);
  const auto ini = fuzz::scratch_dir() / "fuzz.ini";
  std::vector<std::string> args;
  if (in.ConsumeBool()) args = {"--config", ini.string()};
  const int pairs = in.ConsumeIntegralInRange<int>(0, 4);
  for (int i = 0; i < pairs; ++i) {
    const int form = in.ConsumeIntegralInRange<int>(0, 3);
    const std::string key =
        form == 3 ? in.ConsumeRandomLengthString(16)
                  : known_keys()[in.ConsumeIntegralInRange<std::size_t>(0, known_keys().size() - 1)];
    std::string value = in.ConsumeRandomLengthString(16);
    if (form == 0) {
      args.push_back("--" + key + "=" + value);
    } else {
      args.push_back((in.ConsumeBool() ? "--" : "-") + key);
      if (in.ConsumeBool()) args.push_back(value);
    }
  }
  // FUZZ_PRINT_ARGS=1 shows what an input stands for, to turn a finding into a test.
  if (std::getenv("FUZZ_PRINT_ARGS") != nullptr) {
    for (const std::string& arg : args) std::fprintf(stderr, "arg: [%s]\n", arg.c_str());
  }
  // The rest of the input is the INI file.
  const std::string file = in.ConsumeRemainingBytesAsString();
  fuzz::write_bytes(ini, {reinterpret_cast<const uint8_t*>(file.data()), file.size()});
  engine::ParsedConfig parsed;
  const bool ok = fuzz::expect_user_error([&] { parsed = engine::parse_config(args); });
  if (ok && parsed.action == engine::ConfigAction::kRun) {
    // The effective config reads back to itself.
    const auto again = fuzz::scratch_dir() / "again.ini";
    const std::string text = parsed.config.to_ini();
    fuzz::write_bytes(again, {reinterpret_cast<const uint8_t*>(text.data()), text.size()});
    engine::ParsedConfig reread;
    const bool reread_ok = fuzz::expect_user_error([&] {
      reread = engine::parse_config({"--config", again.string()});
    });
    if (!reread_ok || reread.config.to_ini() != text) {
      std::fprintf(stderr, "to_ini() does not read back:\n%s\n", text.c_str());
      __builtin_trap();
    }
  }

  // A subcommand's options (as `prepare` and `predict` declare theirs): the same words.
  namespace po = boost::program_options;
  po::options_description options("fuzz");
  options.add_options()("help", "help")("input", po::value<std::string>()->required(), "input")(
      "vocab", po::value<int>()->default_value(20000), "vocab")("seed", po::value<uint64_t>(), "seed")(
      "val-fraction", po::value<double>(), "fraction")("text", po::value<std::vector<std::string>>(), "text");
  fuzz::expect_user_error([&] { engine::parse_subcommand(args, options, "fuzz", "fuzz [options]", false); });
  return 0;
}
