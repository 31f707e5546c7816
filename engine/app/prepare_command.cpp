// `ddptrain prepare KIND`: option parsing for each dataset preparer; the work is in io/.
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/app/commands.h"
#include "engine/base/errors.h"
#include "engine/command_line.h"
#include "engine/metrics.h"
#include "io/dataset_writer.h"
#include "io/imdb_npz.h"
#include "io/synthetic.h"
#include "io/text_corpus.h"
#include "io/tokenizer.h"

namespace po = boost::program_options;

namespace ddp::engine {
namespace {

// A prepare killed by Ctrl-C, a job's time limit or a closed terminal takes its unfinished file with it.
extern "C" void remove_unfinished_dataset_and_die(int signal_number) {
  const char* unfinished = io::dataset_file_in_progress();
  if (unfinished[0] != '\0') ::unlink(unfinished);
  std::signal(signal_number, SIG_DFL);
  std::raise(signal_number);
}

void remove_unfinished_dataset_on_signals() {
  for (const int signal_number : {SIGINT, SIGTERM, SIGHUP}) {
    std::signal(signal_number, remove_unfinished_dataset_and_die);
  }
}

const char* kValFractionHelp = "share of the training rows that go to /val instead of /train, in [0, 1)";

void require_in_range(int value, const char* option, const std::string& command, int least, int most) {
  if (value < least || value > most) {
    throw UserError(command + ": " + option + " must be from " + std::to_string(least) + " to " +
                    std::to_string(most) + ", got " + std::to_string(value));
  }
}

// Before any work, as each would fail only at the end, after the whole corpus was read: an empty name or a
// folder's.
void require_output_named(const std::string& output, const std::string& command) {
  if (output.empty()) throw UserError(command + ": --output is empty: name the dataset file to write");
  if (output.back() == '/') {
    throw UserError(command + ": --output " + output + " names a folder: name the dataset file to write (" +
                    output + "data.h5)");
  }
}

int prepare_synthetic(const std::vector<std::string>& args) {
  io::SyntheticOptions o;
  po::options_description desc("ddptrain prepare synthetic");
  desc.add_options()("help,h", "print this help")("output,o", po::value(&o.output)->required(),
                                                  "HDF5 file to write")(
      "train", po::value(&o.train)->default_value(o.train), "training samples")(
      "test", po::value(&o.test)->default_value(o.test), "test samples")(
      "vocab", po::value(&o.vocab)->default_value(o.vocab), "vocabulary size (token ids < vocab)")(
      "maxlen", po::value(&o.maxlen)->default_value(o.maxlen), "tokens per sample")(
      "seed", po::value(&o.seed)->default_value(o.seed), "random seed")(
      "classes", po::value(&o.classes)->default_value(o.classes),
      "2: sentiment with negations; K > 2: K topics, one of them negated in half of the samples")(
      "val-fraction", po::value(&o.val_fraction)->default_value(o.val_fraction, "0"), kValFractionHelp);
  if (!parse_subcommand(args, desc, "prepare synthetic",
                        "ddptrain prepare synthetic --output FILE [options]"))
    return kExitOk;
  require_output_named(o.output, "prepare synthetic");
  io::check_output_replaceable(o.output, "prepare synthetic");
  if (o.train < 1 || o.test < 1) throw UserError("prepare synthetic: --train and --test must be positive");
  require_in_range(o.maxlen, "--maxlen", "prepare synthetic", io::kSyntheticMinMaxlen,
                   io::kMaxSequenceLength);
  const int64_t val_rows = io::val_rows_of("prepare synthetic", o.val_fraction, o.train);
  io::write_synthetic(o);
  const std::string val_text = val_rows > 0 ? ", " + std::to_string(val_rows) + " val" : "";
  const std::string classes_text = o.classes != 2 ? ", " + std::to_string(o.classes) + " classes" : "";
  std::printf("wrote %s: %lld train%s and %lld test samples, vocab %d, maxlen %d%s, seed %llu\n",
              o.output.c_str(), static_cast<long long>(o.train - val_rows), val_text.c_str(),
              static_cast<long long>(o.test), o.vocab, o.maxlen, classes_text.c_str(),
              static_cast<unsigned long long>(o.seed));
  return kExitOk;
}

int prepare_imdb_npz(const std::vector<std::string>& args) {
  io::ImdbNpzOptions o;
  po::options_description desc("ddptrain prepare imdb-npz");
  desc.add_options()("help,h", "print this help")("input,i", po::value(&o.input)->required(),
                                                  "the Keras IMDB file (imdb.npz)")(
      "output,o", po::value(&o.output)->required(), "HDF5 file to write")(
      "vocab", po::value(&o.vocab)->default_value(o.vocab),
      "keep the most frequent words: ids >= vocab become 2 (load_data's num_words)")(
      "maxlen", po::value(&o.maxlen)->default_value(o.maxlen), "tokens per sample (pad_sequences' maxlen)")(
      "seed", po::value(&o.seed)->default_value(o.seed), "load_data's shuffle seed")(
      "val-fraction", po::value(&o.val_fraction)->default_value(o.val_fraction, "0"), kValFractionHelp);
  if (!parse_subcommand(args, desc, "prepare imdb-npz",
                        "ddptrain prepare imdb-npz --input imdb.npz --output imdb.h5 [options]"))
    return kExitOk;
  require_output_named(o.output, "prepare imdb-npz");
  io::check_output_replaceable(o.output, "prepare imdb-npz");
  require_in_range(o.vocab, "--vocab", "prepare imdb-npz", 3, io::kMaxVocabulary);  // ids 0-2 reserved
  require_in_range(o.maxlen, "--maxlen", "prepare imdb-npz", 1, io::kMaxSequenceLength);
  std::printf("%s\n", io::prepare_imdb_npz(o).c_str());
  return kExitOk;
}

int prepare_text(const std::vector<std::string>& args) {
  io::TextCorpusOptions o;
  std::string progress = "auto";
  const std::string default_not_classes = "unsup";
  std::string not_classes = default_not_classes;
  po::options_description desc("ddptrain prepare text");
  desc.add_options()("help,h", "print this help")("input,i", po::value(&o.input)->required(),
                                                  "folder in the aclImdb layout (train/pos, train/neg, ...)")(
      "output,o", po::value(&o.output)->required(), "HDF5 file to write")(
      "vocab", po::value(&o.vocab)->default_value(o.vocab),
      "vocabulary size: the vocab - 3 most frequent training words get ids 3..")(
      "maxlen", po::value(&o.maxlen)->default_value(o.maxlen), "tokens per sample")(
      "threads", po::value(&o.threads)->default_value(o.threads), "reader threads (0: every core)")(
      "seed", po::value(&o.seed)->default_value(o.seed), "seed of the random row order of each split")(
      "val-fraction", po::value(&o.val_fraction)->default_value(o.val_fraction, "0"), kValFractionHelp)(
      "not-classes", po::value(&not_classes)->default_value(not_classes),
      "sub-folders that are no class, comma-separated (aclImdb's unlabelled train/unsup); any other folder "
      "in one split only is an error")("progress", po::value(&progress)->default_value(progress),
                                       "auto (bar on a terminal) | bar | none");
  if (!parse_subcommand(args, desc, "prepare text",
                        "ddptrain prepare text --input DIR --output FILE [options]"))
    return kExitOk;
  require_output_named(o.output, "prepare text");
  require_in_range(o.vocab, "--vocab", "prepare text", io::kFirstWordId + 1, io::kMaxVocabulary);
  require_in_range(o.maxlen, "--maxlen", "prepare text", 1, io::kMaxSequenceLength);
  if (o.threads < 0) throw UserError("prepare text: --threads must be 0 or positive");
  if (progress != "auto" && progress != "bar" && progress != "none")
    throw UserError("prepare text: --progress must be auto, bar or none, got '" + progress + "'");
  o.show_progress = progress == "bar" || (progress == "auto" && stdout_is_terminal());
  o.not_classes.clear();
  for (std::size_t begin = 0; begin <= not_classes.size();) {
    const std::size_t end = std::min(not_classes.find(',', begin), not_classes.size());
    // "unsup, extra" as "unsup,extra": spaces around a name are no part of it.
    const std::size_t first = not_classes.find_first_not_of(" \t", begin);
    const std::size_t last = not_classes.find_last_not_of(" \t", end == 0 ? 0 : end - 1);
    if (first < end && last != std::string::npos && last >= first)
      o.not_classes.push_back(not_classes.substr(first, last - first + 1));
    begin = end + 1;
  }
  o.warn_unmatched_not_classes = not_classes != default_not_classes;
  std::printf("%s\n", io::prepare_text(o).c_str());
  return kExitOk;
}

}  // namespace

int prepare_command(const std::vector<std::string>& args) {
  static const char* kUsage =
      "Usage: ddptrain prepare synthetic --output FILE [--train N --test M --vocab V --maxlen T --seed S "
      "--classes K]\n"
      "       ddptrain prepare imdb-npz --input imdb.npz --output FILE [--vocab V --maxlen T]\n"
      "       ddptrain prepare text --input DIR --output FILE [--vocab V --maxlen T --threads N --seed S "
      "--not-classes unsup]\n"
      "Every KIND takes --val-fraction F: the last round(F * rows) training rows go to /val.\n"
      "Each KIND takes --help.\n";
  if (args.empty()) {  // a mistake: the usage goes where errors go, as for ddptrain alone
    std::fprintf(stderr, "%s", kUsage);
    return kExitUserError;
  }
  if (args[0] == "--help" || args[0] == "-h") {
    std::printf("%s", kUsage);
    return kExitOk;
  }
  const std::vector<std::string> rest(args.begin() + 1, args.end());
  remove_unfinished_dataset_on_signals();
  if (args[0] == "synthetic") return prepare_synthetic(rest);
  if (args[0] == "imdb-npz") return prepare_imdb_npz(rest);
  if (args[0] == "text") return prepare_text(rest);
  throw UserError("prepare: unknown dataset kind '" + args[0] + "' (expected: synthetic, imdb-npz, text)");
}

}  // namespace ddp::engine
