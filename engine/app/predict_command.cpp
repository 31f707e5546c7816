// `ddptrain predict` and `ddptrain evaluate`: a trained checkpoint on new documents or on a dataset's test
// split, as one process (no MPI) on the CPU or on one GPU.

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/app/commands.h"
#include "engine/base/errors.h"
#include "engine/checkpoint.h"
#include "engine/classification_report.h"
#include "engine/command_line.h"
#include "engine/device.h"
#include "engine/metrics.h"
#include "io/batch_source.h"
#include "io/dataset.h"
#include "io/text_corpus.h"
#include "io/tokenizer.h"
#include "models/cuda_replica.h"
#include "models/replica.h"

namespace po = boost::program_options;

namespace ddp::engine {
namespace {

// Characters of a document shown next to its probability.
constexpr size_t kExcerptChars = 60;

struct ModelOptions {
  std::string checkpoint;
  std::string data;
  std::string device = "auto";
  int batch_size = 128;
};

void add_model_options(po::options_description& desc, ModelOptions& o, const char* data_help) {
  desc.add_options()("checkpoint,c", po::value(&o.checkpoint)->required(),
                     "checkpoint of a training run (RUN/best.h5 or RUN/last.h5)")(
      "data,d", po::value(&o.data), data_help)("device", po::value(&o.device)->default_value(o.device),
                                               "cpu, cuda or auto (the first GPU if any)")(
      "batch-size", po::value(&o.batch_size)->default_value(o.batch_size), "documents per forward pass");
}

void check_model_options(const ModelOptions& o, const std::string& command) {
  if (o.device != "cpu" && o.device != "cuda" && o.device != "auto") {
    throw UserError(command + ": --device must be cpu, cuda or auto, got '" + o.device + "'");
  }
  if (o.batch_size < 1) {
    throw UserError(command + ": --batch-size must be positive, got " + std::to_string(o.batch_size));
  }
}

// The checkpoint's model with its parameters, on the device asked for.
struct LoadedModel {
  std::unique_ptr<models::Replica> replica;
  int gpu = -1;  // CUDA ordinal, -1 on the CPU
};

// The dataset's token ids must mean the words they meant in training: the same vocab_size, and where both
// files carry their words (prepare text), the same word for every id (a corpus prepared again with more
// documents keeps vocab_size and moves the words). A model with words scored on ids without them is the same
// mistake. A model without words may be an older checkpoint of this dataset: that cannot be checked.
void check_same_vocab(const ModelOptions& o, const Checkpoint& checkpoint, const io::DatasetInfo& data) {
  const std::string fix = ": give the dataset the model was trained on, or one prepared with the same words";
  if (checkpoint.shape.vocab_size != data.vocab_size) {
    throw UserError(o.checkpoint + ": the model has vocab_size " +
                    std::to_string(checkpoint.shape.vocab_size) + " but " + o.data + " has vocab_size " +
                    std::to_string(data.vocab_size) + fix);
  }
  if (!checkpoint.has_vocabulary) return;
  if (!data.has_vocab) {
    throw UserError(o.checkpoint + ": the model reads words through its vocabulary, but " + o.data +
                    " holds token ids without one (prepare synthetic or imdb-npz)" + fix);
  }
  const io::Vocabulary model_vocabulary = io::read_vocabulary(o.checkpoint);
  const io::Vocabulary data_vocabulary = io::read_vocabulary(o.data);
  const std::vector<std::string>& model_words = model_vocabulary.words();
  const std::vector<std::string>& data_words = data_vocabulary.words();
  const auto quoted = [](const std::string& word) {
    constexpr std::size_t kShown = 40;
    return "\"" + (word.size() > kShown ? word.substr(0, kShown) + "..." : word) + "\"";
  };
  // Ids below the first word's name the padding, the start and the unknown word in both.
  for (std::size_t id = io::kOovId + 1; id < std::min(model_words.size(), data_words.size()); ++id) {
    if (model_words[id] != data_words[id]) {
      throw UserError(fmt::format("{}: token id {} is {} in the model's vocabulary but {} in {}{}",
                                  o.checkpoint, id, quoted(model_words[id]), quoted(data_words[id]), o.data,
                                  fix));
    }
  }
  if (model_words.size() != data_words.size()) {
    throw UserError(fmt::format("{}: the model's vocabulary has {} words but {}'s has {}{}", o.checkpoint,
                                model_words.size(), o.data, data_words.size(), fix));
  }
}

LoadedModel load_model(const ModelOptions& o, const Checkpoint& checkpoint, const std::string& command) {
  LoadedModel model;
  if (o.device != "cpu") {
    const GpuInventory inventory = probe_gpus();
    if (!inventory.gpus.empty()) {
      model.gpu = inventory.gpus.front().index;
      use_gpu(model.gpu);
    } else if (o.device == "cuda") {
      throw UserError(command + ": --device cuda: " + inventory.why_none);
    }
  }
  models::ModelOptions options;
  options.mask_padding = checkpoint.run.mask_padding;  // no dropout: inference
  model.replica =
      model.gpu >= 0
          ? models::make_cuda_replica(checkpoint.shape, model.gpu, models::RnnAlgorithm::kAuto, options)
          : models::make_cpu_replica(checkpoint.shape, models::CpuKernels::kBuiltin, options);
  model.replica->copy_params_from_host(checkpoint.params);
  return model;
}

// The first `rows` rows of a file's test split, in order, in the replica's memory.
std::unique_ptr<io::BatchSource> test_batches(const LoadedModel& model, const std::string& path, int64_t rows,
                                              int batch_size) {
  io::BatchReaderOptions options;
  options.path = path;
  options.split = "test";
  options.shard = {0, rows};
  options.batch_size = batch_size;
  options.shuffle = false;
  options.drop_last = false;
  if (model.gpu >= 0) return io::make_device_batch_source(options, model.gpu, model.replica->stream(), 2);
  return io::make_host_batch_source(options);
}

// Probabilities of encoded documents (row-major [rows, maxlen]), batch by batch: one per document for two
// classes (p of class 1), one per class for more. A GPU replica gets each
// batch through a device copy; predict is one pass over a few documents, so a plain copy is enough.
std::vector<float> predict_rows(const LoadedModel& model, const std::vector<int32_t>& tokens, int maxlen,
                                int batch_size) {
  const std::size_t rows = tokens.size() / static_cast<std::size_t>(maxlen);
  const auto outputs = static_cast<std::size_t>(model.replica->layout().shape().outputs());
  std::vector<float> probabilities(rows * outputs);
  for (std::size_t first = 0; first < rows; first += static_cast<std::size_t>(batch_size)) {
    const std::size_t count = std::min(rows - first, static_cast<std::size_t>(batch_size));
    const int32_t* host = tokens.data() + first * static_cast<std::size_t>(maxlen);
    const std::size_t bytes = count * static_cast<std::size_t>(maxlen) * sizeof(int32_t);
    std::optional<DeviceBuffer> on_gpu;
    if (model.gpu >= 0) on_gpu.emplace(model.gpu, host, bytes);
    const auto* batch_tokens = on_gpu ? static_cast<const int32_t*>(on_gpu->data()) : host;
    model.replica->predict({batch_tokens, nullptr, static_cast<int>(count), maxlen},
                           std::span<float>(probabilities).subspan(first * outputs, count * outputs));
  }
  return probabilities;
}

// --input as messages name it: "-" is stdin.
std::string input_name(const std::string& input) {
  return input == "-" ? "stdin" : input;
}

// The documents of --input: one per line, "-" for stdin.
std::vector<std::string> read_lines(const std::string& input) {
  std::ifstream file;
  if (input != "-") {
    std::error_code ignored;  // a path that cannot be examined fails at the open below
    if (std::filesystem::is_directory(input, ignored))
      throw UserError(input + ": is a directory; --input takes a file of one document per line");
    file.open(input, std::ios::binary);
    if (!file) throw UserError(input + ": cannot be read (no such file, or permission denied)");
  }
  std::istream& in = input == "-" ? std::cin : file;
  std::vector<std::string> lines;
  // Line by line, each at most one document's worth: an endless line (/dev/zero, a binary file) ends with an
  // error instead of taking every byte of memory.
  std::streambuf& stream = *in.rdbuf();
  constexpr int kEnd = std::char_traits<char>::eof();
  // A file in UTF-16 or UTF-32 (as io/tokenizer.h tells it from its first 4 KiB) is read whole and turned
  // into UTF-8 first.
  constexpr int kHeadBytes = 4096;
  std::string converted;
  std::size_t converted_at = 0;
  std::string head;
  for (int i = 0, c = 0; i < kHeadBytes && (c = stream.sbumpc()) != kEnd; ++i) head += static_cast<char>(c);
  if (std::string probe = head; io::convert_wide_unicode(probe)) {
    converted = head;
    for (int c = stream.sbumpc(); c != kEnd; c = stream.sbumpc()) converted += static_cast<char>(c);
    const io::WideEncoding encoding = io::convert_wide_unicode(converted);
    head.clear();
    // Said, since a guess from NUL bytes can be wrong (a UTF-8 file with stray NULs).
    std::fprintf(stderr, "note: %s read as %s (%s)\n", input_name(input).c_str(), encoding.name.c_str(),
                 encoding.marked ? "its byte order mark" : "where its NUL bytes fall");
  }
  std::size_t head_at = 0;
  const bool whole = !converted.empty();
  const auto next_byte = [&]() -> int {
    if (whole)
      return converted_at < converted.size() ? static_cast<unsigned char>(converted[converted_at++]) : kEnd;
    if (head_at < head.size()) return static_cast<unsigned char>(head[head_at++]);
    return stream.sbumpc();
  };
  // Lines end in LF, CRLF or a lone CR (old Mac files): each is one document.
  int pending = kEnd - 1;  // a byte read ahead past a CR, or none
  const auto next = [&]() -> int {
    if (pending != kEnd - 1) return std::exchange(pending, kEnd - 1);
    return next_byte();
  };
  for (int c = next(); c != kEnd; c = next()) {
    std::string line;
    for (; c != kEnd && c != '\n' && c != '\r'; c = next()) {
      if (line.size() == io::kMaxDocumentBytes) {
        throw UserError(input + ": line " + std::to_string(lines.size() + 1) +
                        " is longer than the 256 MiB one document may hold (one document per line)");
      }
      line.push_back(static_cast<char>(c));
    }
    if (c == '\r') {
      const int after = next_byte();
      if (after != '\n') pending = after;  // a lone CR; an end of input is read again, and ends the loop
    }
    // A UTF-8 byte order mark (Windows editors write one; files joined with cat keep theirs) is no part of
    // a document.
    if (line.starts_with("\xEF\xBB\xBF")) line.erase(0, 3);
    lines.push_back(std::move(line));
    if (c == kEnd) break;
  }
  if (lines.empty()) {
    throw UserError(input_name(input) + ": no documents in it (one document per line)");
  }
  return lines;
}

bool is_blank(const std::string& line) {
  return line.find_first_not_of(" \t\r\f\v") == std::string::npos;
}

// The document's first characters on one line: valid UTF-8, control characters as spaces, "..." if cut.
std::string excerpt(const std::string& document) {
  const std::string text = io::to_utf8(document);
  std::string out;
  size_t characters = 0;
  for (const char c : text) {
    const bool continuation = (static_cast<unsigned char>(c) & 0xC0) == 0x80;
    if (!continuation && ++characters > kExcerptChars) return out + "...";
    out += static_cast<unsigned char>(c) < 0x20 || c == 0x7F ? ' ' : c;
  }
  return out;
}

// The class a row of probabilities predicts (two classes: p of class 1 >= 0.5), and its probability.
std::pair<int, float> predicted_class(std::span<const float> row) {
  if (row.size() == 1) return row[0] >= 0.5f ? std::pair{1, row[0]} : std::pair{0, 1.0f - row[0]};
  const auto best = std::max_element(row.begin(), row.end());
  return {static_cast<int>(best - row.begin()), *best};
}

std::string class_label(const std::vector<std::string>& names, int k) {
  return static_cast<std::size_t>(k) < names.size() ? names[static_cast<std::size_t>(k)] : std::to_string(k);
}

// A class name as predict prints it: as it is, or in JSON's quotes and escapes where it holds what separates
// the output's fields (a tab, a space, '=') or a quote, a backslash or a control character, so that every
// line still splits into its fields.
std::string printed_label(const std::vector<std::string>& names, int k) {
  const std::string name = class_label(names, k);
  const bool plain = !name.empty() && std::none_of(name.begin(), name.end(), [](char c) {
    return c == ' ' || c == '=' || c == '"' || c == '\\' || static_cast<unsigned char>(c) < 0x20 || c == 0x7F;
  });
  return plain ? name : nlohmann::json(name).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

int predict_command(const std::vector<std::string>& args) {
  static const char* kCommand = "predict";
  ModelOptions o;
  std::vector<std::string> texts;
  std::string input;
  po::options_description desc("ddptrain predict");
  desc.add_options()("help,h", "print this help");
  add_model_options(desc, o,
                    "the dataset the model was trained on, for its /vocab (only for checkpoints that do "
                    "not carry theirs)");
  bool all_probabilities = false;
  desc.add_options()("text,t", po::value(&texts)->composing(), "a document (give it several times for more)")(
      "input,i", po::value(&input), "a file with one document per line ('-': standard input)")(
      "all-probabilities,a", po::bool_switch(&all_probabilities),
      "also print every class's probability (class=p ...) before the document");
  if (!parse_subcommand(args, desc, kCommand,
                        "ddptrain predict --checkpoint RUN/best.h5 (--text \"...\" ... | --input FILE)"))
    return kExitOk;
  check_model_options(o, kCommand);
  if (texts.empty() == input.empty()) {
    throw UserError(std::string(kCommand) +
                    ": give the documents either with --text \"...\" (repeatable) or with --input FILE");
  }

  // The checkpoint carries its vocabulary and maxlen; older checkpoints need the dataset they came from.
  const Checkpoint checkpoint = read_checkpoint(o.checkpoint, CheckpointParts::kModel);
  int maxlen = checkpoint.run.maxlen;
  std::string vocabulary_file = o.checkpoint;
  std::string tokenizer = checkpoint.run.tokenizer;  // what split the vocabulary's words, if recorded
  if (!o.data.empty()) {                             // given: it must be the model's
    const io::DatasetInfo data = io::inspect_dataset(o.data, io::SplitsNeeded::kTestOnly);
    check_same_vocab(o, checkpoint, data);
    if (!checkpoint.has_vocabulary || maxlen <= 0) {
      maxlen = data.maxlen;
      vocabulary_file = o.data;
      tokenizer = data.tokenizer;
    }
  } else if (!checkpoint.has_vocabulary || maxlen <= 0) {
    throw UserError(o.checkpoint +
                    " carries no vocabulary, so words cannot be turned into its token ids: it was trained on "
                    "a dataset without /vocab (prepare synthetic and imdb-npz write ids only; prepare text "
                    "writes the words), or written by an older ddptrain (then give its dataset with --data "
                    "FILE)");
  }
  const io::Vocabulary vocabulary = io::read_vocabulary(vocabulary_file);
  // On stderr, as stdout holds the scores: a vocabulary from another tool may hold words no text turns into.
  if (std::string example; const std::size_t unreachable = vocabulary.unreachable_words(&example)) {
    std::fprintf(
        stderr,
        "warning: %zu of the %d words of %s's vocabulary (the first: \"%s\") can never match a document's "
        "words, which are lower-cased and split at spaces and punctuation: documents score without "
        "them (a vocabulary `prepare text` did not write)\n",
        unreachable, vocabulary.size() - io::kFirstWordId, vocabulary_file.c_str(),
        one_line(example).c_str());
  }
  if (!tokenizer.empty() && tokenizer != io::unicode_library_version()) {
    std::fprintf(
        stderr,
        "note: %s's vocabulary was made by a ddptrain whose words were split with %s; this one splits "
        "them with %s: a word holding a character that only one of them knows may not match\n",
        vocabulary_file.c_str(), one_line(tokenizer).c_str(), io::unicode_library_version().c_str());
  }
  // Blank lines of a file are not documents; a document without a single word gets no score.
  std::vector<std::string> documents = input.empty() ? texts : read_lines(input);
  if (!input.empty()) std::erase_if(documents, [](const std::string& d) { return is_blank(d); });
  if (documents.empty()) {
    throw UserError(input_name(input) + ": only blank lines, no documents");
  }
  const LoadedModel model = load_model(o, checkpoint, kCommand);

  std::vector<int32_t> tokens;
  std::vector<bool> has_words;
  tokens.reserve(documents.size() * static_cast<size_t>(maxlen));
  int64_t not_utf8 = 0;
  for (const std::string& document : documents) {
    std::size_t words = 0;
    bool valid_utf8 = true;
    const std::vector<int32_t> row = vocabulary.encode(document, maxlen, &words, &valid_utf8);
    has_words.push_back(words > 0);
    not_utf8 += valid_utf8 ? 0 : 1;
    tokens.insert(tokens.end(), row.begin(), row.end());
  }
  const std::vector<float> probabilities = predict_rows(model, tokens, maxlen, o.batch_size);
  // Two classes: p(class 1) as always; more: the predicted class's name and its probability.
  const int classes = checkpoint.shape.classes;
  const auto outputs = static_cast<std::size_t>(checkpoint.shape.outputs());
  const std::vector<std::string>& names = checkpoint.run.class_names;
  // A document without a word gets '-' in every field a score would fill: every line splits the same way.
  const std::string no_score = std::string(classes == 2 ? "-" : "-\t-") + (all_probabilities ? "\t-" : "");
  // Which class a two-class score is the probability of, for a person reading: the number alone says nothing
  // of it (class 1 is the second class folder in byte order: "pos" of aclImdb, but "negative" beside
  // "Positive"). On stderr, so that the lines stay the same for scripts.
  if (classes == 2 && names.size() == 2 && !all_probabilities && ::isatty(STDERR_FILENO) == 1) {
    std::fprintf(stderr, "scores are the probability of class 1, %s (class 0: %s)\n",
                 printed_label(names, 1).c_str(), printed_label(names, 0).c_str());
  }
  int64_t unscored = 0;
  for (size_t i = 0; i < documents.size(); ++i) {
    if (!has_words[i]) {
      std::printf("%s\t%s\n", no_score.c_str(), excerpt(documents[i]).c_str());
      ++unscored;
      continue;
    }
    const std::span<const float> row(probabilities.data() + i * outputs, outputs);
    std::string line;
    if (classes == 2) {
      line = fmt::format("{:.4f}", row[0]);
    } else {
      const auto [best, p] = predicted_class(row);
      line = fmt::format("{}\t{:.4f}", printed_label(names, best), p);
    }
    if (all_probabilities) {
      std::string all;
      for (int k = 0; k < classes; ++k) {
        const float pk = classes == 2 ? (k == 1 ? row[0] : 1.0f - row[0]) : row[static_cast<std::size_t>(k)];
        all += fmt::format("{}{}={:.4f}", k == 0 ? "" : " ", printed_label(names, k), pk);
      }
      line += "\t" + all;
    }
    std::printf("%s\t%s\n", line.c_str(), excerpt(documents[i]).c_str());
  }
  if (unscored > 0) {
    std::fflush(stdout);
    std::fprintf(
        stderr,
        "note: %s without a single word (only punctuation, symbols, emoji or runs of letters over %zu "
        "bytes): '-' for %s\n",
        unscored == 1 ? "1 document" : (std::to_string(unscored) + " documents").c_str(), io::kMaxWordBytes,
        unscored == 1 ? "its score" : "their scores");
  }
  if (not_utf8 > 0) {
    // As prepare text reads such files: said, since a file in another 8-bit encoding reads wrongly.
    std::fflush(stdout);
    std::fprintf(stderr, "note: %s not valid UTF-8: bytes that are no UTF-8 read as Windows-1252\n",
                 not_utf8 == 1 ? "1 document" : (std::to_string(not_utf8) + " documents").c_str());
  }
  return kExitOk;
}

int evaluate_command(const std::vector<std::string>& args) {
  static const char* kCommand = "evaluate";
  ModelOptions o;
  po::options_description desc("ddptrain evaluate");
  desc.add_options()("help,h", "print this help");
  add_model_options(desc, o, "the dataset whose /test split is scored");
  if (!parse_subcommand(args, desc, kCommand, "ddptrain evaluate --checkpoint RUN/best.h5 --data F.h5"))
    return kExitOk;
  check_model_options(o, kCommand);
  if (o.data.empty()) throw UserError(std::string(kCommand) + ": give the dataset to score with --data FILE");

  const io::DatasetInfo data = io::inspect_dataset(o.data, io::SplitsNeeded::kTestOnly);
  if (data.test_size == 0) throw UserError(o.data + ": /test is empty, nothing to evaluate");
  if (const int64_t empty = io::validate_rows(data, "test", 0, data.test_size); empty > 0) {
    std::fprintf(stderr, "%s\n", io::rows_without_tokens_note(data, "test", empty, data.test_size).c_str());
  }
  const Checkpoint checkpoint = read_checkpoint(o.checkpoint, CheckpointParts::kModel);
  check_same_vocab(o, checkpoint, data);
  if (checkpoint.shape.classes != data.num_classes) {
    throw UserError(o.checkpoint + ": the model has " + std::to_string(checkpoint.shape.classes) +
                    " classes but " + o.data + " has num_classes = " + std::to_string(data.num_classes));
  }
  // The same class ids must name the same classes (a class folder renamed or added moves every id after it);
  // a file without names cannot say.
  const std::vector<std::string>& model_classes = checkpoint.run.class_names;
  if (!model_classes.empty() && !data.class_names.empty()) {
    for (std::size_t k = 0; k < model_classes.size() && k < data.class_names.size(); ++k) {
      if (model_classes[k] != data.class_names[k]) {
        throw UserError(fmt::format(
            "{}: class {} is \"{}\" in the model but \"{}\" in {}: its labels mean other classes; give the "
            "dataset the model was trained on, or one prepared with the same class folders",
            o.checkpoint, k, model_classes[k], data.class_names[k], o.data));
      }
    }
  }
  const LoadedModel model = load_model(o, checkpoint, kCommand);

  // Each row's predicted class beside the loss and accuracy the replica sums.
  const int classes = checkpoint.shape.classes;
  const auto outputs = static_cast<std::size_t>(checkpoint.shape.outputs());
  const std::vector<uint8_t> truth = io::read_labels(data, "test", 0, data.test_size);
  std::vector<int64_t> confusion(static_cast<std::size_t>(classes * classes), 0);
  std::vector<float> probabilities;
  std::size_t row = 0;
  const std::unique_ptr<io::BatchSource> source = test_batches(model, o.data, data.test_size, o.batch_size);
  while (const std::optional<BatchView> batch = source->next()) {
    probabilities.resize(static_cast<std::size_t>(batch->batch) * outputs);
    model.replica->predict(*batch, probabilities);
    for (std::size_t b = 0; b < static_cast<std::size_t>(batch->batch); ++b, ++row) {
      const int predicted =
          predicted_class(std::span<const float>(probabilities).subspan(b * outputs, outputs)).first;
      ++confusion[static_cast<std::size_t>(truth[row]) * static_cast<std::size_t>(classes) +
                  static_cast<std::size_t>(predicted)];
    }
  }
  const models::BatchStats stats = model.replica->take_stats();
  DDP_CHECK(stats.count == data.test_size && row == truth.size());
  // The replica's own counts where it keeps them (they judge the logits in double, as its accuracy does).
  if (stats.confusion.size() == confusion.size()) confusion = stats.confusion;
  const ClassReport report = classification_report(confusion, classes);
  std::printf("test: loss %.4f - accuracy %.4f - macro-F1 %.4f (%lld samples)\n",
              nan_unsigned(stats.loss_sum / static_cast<double>(stats.count)),
              static_cast<double>(stats.correct) / static_cast<double>(stats.count), report.macro_f1,
              static_cast<long long>(stats.count));
  const std::vector<std::string>& names =
      data.class_names.empty() ? checkpoint.run.class_names : data.class_names;
  std::printf("%s", format_classification_report(report, confusion, names).c_str());
  return kExitOk;
}

}  // namespace ddp::engine
