// Settings from the command line and INI files, and what a resume compares (engine/config.h).
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "engine/base/errors.h"
#include "engine/config.h"
#include "models/cuda_replica.h"
#include "tests/test_util.h"

namespace ddp::engine {
namespace {

using ddp::testing::TempDir;
using ddp::testing::write_text;

std::string error_of(const std::vector<std::string>& args) {
  try {
    parse_config(args);
  } catch (const UserError& e) {
    return e.what();
  }
  return "";
}

TEST(Config, FileThenCommandLineWins) {
  TempDir dir;
  const std::string ini =
      write_text(dir, "a.ini",
                 "device = cpu\n[data]\npath = x.h5\n[train]\nbatch_size = 16\nepochs = 3\n"
                 "[model]\nhidden = 64\n");
  const Config c = parse_config({"--config", ini, "--train.batch_size", "64"}).config;
  EXPECT_EQ(c.train.batch_size, 64);  // command line over file
  EXPECT_EQ(c.train.epochs, 3);       // file over default
  EXPECT_EQ(c.model.hidden, 64);
  EXPECT_EQ(c.model.embedding_dim, 128);  // default
  EXPECT_EQ(c.device, "cpu");
  EXPECT_EQ(c.data.path, "x.h5");
  EXPECT_EQ(c.resume, "no");
}

// A launcher script's own arguments come first, the user's after: a key given twice takes the later value.
TEST(Config, KeyGivenTwiceOnTheCommandLineTakesTheLater) {
  const Config c = parse_config({"--data.path", "x.h5", "--comm.backend", "ps", "--train.epochs", "2",
                                 "--comm.backend", "mpi", "--device=cuda", "--device", "cpu"})
                       .config;
  EXPECT_EQ(c.comm.backend, "mpi");
  EXPECT_EQ(c.device, "cpu");
  EXPECT_EQ(c.train.epochs, 2);
}

TEST(Config, ResumeAloneMeansLast) {
  EXPECT_EQ(parse_config({"--data.path", "x.h5", "--resume"}).config.resume, "last");
  EXPECT_EQ(parse_config({"--data.path", "x.h5", "--resume", "auto"}).config.resume, "auto");
  EXPECT_NE(error_of({"--data.path", "x.h5", "--resume", "sometimes"}).find("--resume"), std::string::npos);
}

// A resume names the settings of the arithmetic that changed since the checkpoint's run, and only those:
// more epochs, other threads or another run directory are no change of what a step computes.
TEST(Config, ChangedTrainingSettingsAreNamed) {
  const Config earlier = parse_config({"--data.path", "x.h5"}).config;
  const Config now =
      parse_config({"--data.path", "y.h5", "--model.dropout", "0.5", "--train.learning_rate", "0.1",
                    "--train.epochs", "9", "--train.threads", "3", "--checkpoint.dir", "elsewhere"})
          .config;
  EXPECT_EQ(
      changed_training_settings(earlier.to_ini(), now),
      (std::vector<std::string>{"model.dropout = 0.5 (was 0)", "train.learning_rate = 0.1 (was 0.001)"}));
  EXPECT_TRUE(changed_training_settings(earlier.to_ini(), earlier).empty());
  // A key the earlier ddptrain did not write is not compared.
  EXPECT_TRUE(changed_training_settings("[train]\nepochs = 2\n", now).empty());
  // Under a cosine schedule, other epochs are another curve.
  const Config cosine =
      parse_config({"--data.path", "x.h5", "--train.lr_schedule", "cosine", "--train.epochs", "9"}).config;
  EXPECT_EQ(
      changed_training_settings("[train]\nepochs = 2\nlr_schedule = cosine\n", cosine),
      (std::vector<std::string>{"train.epochs = 9 (was 2), over which the cosine learning rate falls"}));
}

// A '#' inside a value would cut it silently (an INI comment): refused naming the line and the key; a '#'
// after a blank is a comment, as before.
TEST(Config, AHashInsideAValueIsRefusedNotCut) {
  TempDir dir;
  const std::string cut = write_text(dir, "cut.ini", "[data]\npath = x.h5\n[checkpoint]\ndir = runs/exp#3\n");
  EXPECT_NE(
      error_of({"--config", cut}).find(cut + ": line 4: checkpoint.dir = runs/exp#3: an INI file reads '#'"),
      std::string::npos)
      << error_of({"--config", cut});
  const std::string commented = write_text(
      dir, "ok.ini", "# a run\n[data]\npath = x.h5  # the data\n[checkpoint]\ndir = runs/exp # 3\n");
  const Config c = parse_config({"--config", commented}).config;
  EXPECT_EQ(c.data.path, "x.h5");
  EXPECT_EQ(c.checkpoint.dir, "runs/exp");
}

// ';' starts a comment line, as in most INI dialects; the '#' check still names the right line.
TEST(Config, SemicolonLinesAreComments) {
  TempDir dir;
  const std::string ini = write_text(dir, "semi.ini", "; a run\n[data]\n  ; the data\npath = x.h5\n");
  EXPECT_EQ(parse_config({"--config", ini}).config.data.path, "x.h5");
  const std::string cut = write_text(dir, "cut.ini", "; one\n; two\n[data]\npath = x#3.h5\n");
  EXPECT_NE(error_of({"--config", cut}).find(cut + ": line 4: data.path"), std::string::npos)
      << error_of({"--config", cut});
}

TEST(Config, StrayWordsAreRefusedNotIgnored) {
  EXPECT_NE(error_of({"bogus"}).find("unexpected argument 'bogus'"), std::string::npos);
  // A value whose key was forgotten.
  EXPECT_NE(error_of({"--data.path", "x.h5", "64"}).find("'64'"), std::string::npos);
  EXPECT_EQ(error_of({"--data.path", "x.h5", "--train.batch_size", "64"}), "");
}

TEST(Config, UnknownKeyInFileNamesFileAndKey) {
  TempDir dir;
  const std::string ini = write_text(dir, "bad.ini", "[train]\nbatchsize = 16\n");
  const std::string error = error_of({"--config", ini});
  EXPECT_NE(error.find(ini), std::string::npos) << error;
  EXPECT_NE(error.find("train.batchsize"), std::string::npos) << error;
  // Within two edits of a key: named as a likely typo, in the file and on the command line; further off,
  // nothing is guessed.
  EXPECT_NE(error.find("(did you mean train.batch_size?)"), std::string::npos) << error;
  EXPECT_NE(error_of({"--train.learnig_rate", "1"}).find("(did you mean --train.learning_rate?)"),
            std::string::npos);
  EXPECT_EQ(error_of({"--zzz", "1"}).find("did you mean"), std::string::npos);
}

TEST(Config, UnknownOptionOnCommandLine) {
  EXPECT_NE(error_of({"--train.bogus", "1"}).find("train.bogus"), std::string::npos);
}

TEST(Config, BadValuesNameTheKey) {
  EXPECT_NE(error_of({"--data.path", "x", "--train.batch_size", "abc"}).find("train.batch_size"),
            std::string::npos);
  EXPECT_NE(error_of({"--data.path", "x", "--train.batch_size", "0"}).find("train.batch_size"),
            std::string::npos);
  EXPECT_NE(error_of({"--data.path", "x", "--train.learning_rate", "-1"}).find("train.learning_rate"),
            std::string::npos);
  EXPECT_NE(error_of({"--data.path", "x", "--device", "tpu"}).find("device"), std::string::npos);
  EXPECT_NE(error_of({"--data.path", "x", "--train.optimizer", "rmsprop"}).find("train.optimizer"),
            std::string::npos);
  EXPECT_NE(error_of({}).find("data.path"), std::string::npos);
  // Decays are checked as the floats the optimizer uses: 0.99999999 rounds to 1 there.
  for (const char* key : {"--train.beta1", "--train.beta2", "--train.momentum"}) {
    EXPECT_NE(error_of({"--data.path", "x", key, "0.99999999"}).find("as a float"), std::string::npos) << key;
    EXPECT_EQ(error_of({"--data.path", "x", key, "0.99999994"}), "") << key;
  }
}

TEST(Config, ParameterServerKeys) {
  const Config defaults = parse_config({"--data.path", "x"}).config;
  EXPECT_EQ(defaults.comm.backend, "auto");
  EXPECT_EQ(defaults.comm.ps_servers, 0) << "colocated where it can serve";
  EXPECT_EQ(defaults.comm.ps_mode, "sync");
  EXPECT_EQ(defaults.comm.max_staleness, 4);
  EXPECT_EQ(defaults.comm.timeout_s, 120);
  EXPECT_EQ(defaults.train.straggle_ms, 0);
  const Config c = parse_config({"--data.path", "x", "--comm.backend", "ps", "--comm.ps_servers", "3",
                                 "--comm.ps_mode", "async", "--comm.max_staleness", "0", "--comm.timeout_s",
                                 "2.5", "--train.straggle_ms", "7"})
                       .config;
  EXPECT_EQ(c.comm.backend, "ps");
  EXPECT_EQ(c.comm.ps_servers, 3);
  EXPECT_EQ(c.comm.ps_mode, "async");
  EXPECT_EQ(c.comm.max_staleness, 0);
  EXPECT_EQ(c.comm.timeout_s, 2.5);
  EXPECT_EQ(c.train.straggle_ms, 7);

  for (const auto& [key, value] :
       std::vector<std::pair<std::string, std::string>>{{"comm.ps_servers", "-1"},
                                                        {"comm.ps_servers", "two"},
                                                        {"comm.ps_mode", "eventual"},
                                                        {"comm.max_staleness", "-1"},
                                                        {"comm.timeout_s", "0"},
                                                        {"comm.timeout_s", "0.001"},
                                                        {"comm.timeout_s", "nan"},
                                                        {"train.straggle_ms", "-5"}}) {
    const std::string error = error_of({"--data.path", "x", "--" + key, value});
    EXPECT_NE(error.find(key), std::string::npos) << key << " = " << value << ": " << error;
  }
  EXPECT_NE(error_of({"--data.path", "x", "--comm.ps_mode", "eventual"}).find("sync or async"),
            std::string::npos);
}

TEST(Config, CudnnRnnAlgorithmKey) {
  EXPECT_EQ(parse_config({"--data.path", "x"}).config.model.cudnn_rnn_algo, "auto");
  for (const char* name : {"auto", "standard", "persist_small_h", "persist_static"}) {
    EXPECT_EQ(parse_config({"--data.path", "x", "--model.cudnn_rnn_algo", name}).config.model.cudnn_rnn_algo,
              name);
    EXPECT_EQ(models::rnn_algorithm_name(models::parse_rnn_algorithm(name)), name);
  }
  const std::string error = error_of({"--data.path", "x", "--model.cudnn_rnn_algo", "fastest"});
  EXPECT_NE(error.find("model.cudnn_rnn_algo = fastest"), std::string::npos) << error;
  EXPECT_NE(error.find("persist_small_h"), std::string::npos) << error;
}

// model.precision: fp32 (the default), tf32, bf16 and fp16 reach the replica's options; anything else is one
// error naming the key and the value.
TEST(Config, PrecisionKey) {
  const Config defaults = parse_config({"--data.path", "x"}).config;
  EXPECT_EQ(defaults.model.precision, "fp32");
  EXPECT_EQ(model_options(defaults).precision, models::Precision::kFp32);
  const std::pair<const char*, models::Precision> names[] = {{"fp32", models::Precision::kFp32},
                                                             {"tf32", models::Precision::kTf32},
                                                             {"bf16", models::Precision::kBf16},
                                                             {"fp16", models::Precision::kFp16}};
  for (const auto& [name, precision] : names) {
    const Config config = parse_config({"--data.path", "x", "--model.precision", name}).config;
    EXPECT_EQ(model_options(config).precision, precision);
    EXPECT_EQ(models::precision_name(precision), name);
    EXPECT_EQ(models::sixteen_bit_data(precision),
              precision == models::Precision::kBf16 || precision == models::Precision::kFp16);
    EXPECT_EQ(models::scales_loss(precision), precision == models::Precision::kFp16);
  }
  const std::string error = error_of({"--data.path", "x", "--model.precision", "fp64"});
  EXPECT_NE(error.find("model.precision = fp64: expected fp32, tf32, bf16 or fp16"), std::string::npos)
      << error;
}

TEST(Config, MissingConfigFile) {
  EXPECT_NE(error_of({"--config", "/nonexistent/ddptrain.ini"}).find("/nonexistent/ddptrain.ini"),
            std::string::npos);
}

TEST(Config, HelpListsEveryKeyWithDefault) {
  const ParsedConfig parsed = parse_config({"--help"});
  EXPECT_EQ(parsed.action, ConfigAction::kHelp);
  for (const char* key : {"data.path", "model.embedding_dim", "model.hidden", "model.layers",
                          "train.batch_size", "train.epochs", "train.learning_rate", "train.seed",
                          "comm.backend", "comm.ps_servers", "comm.ps_mode", "comm.max_staleness",
                          "comm.timeout_s", "train.straggle_ms", "checkpoint.dir", "--device"}) {
    EXPECT_NE(parsed.help.find(key), std::string::npos) << key;
  }
  EXPECT_NE(parsed.help.find("(=32)"), std::string::npos);
}

TEST(Config, KeyNamesAreTheKeysTheCommandLineTakes) {
  const std::vector<std::string> names = config_key_names();
  ASSERT_GT(names.size(), 40u);
  EXPECT_EQ(names.front(), "device");
  const std::string help = parse_config({"--help"}).help;
  const std::string ini = parse_config({"--data.path", "d.h5"}).config.to_ini();
  for (const std::string& name : names) {
    EXPECT_NE(help.find("--" + name + " "), std::string::npos) << name;
    // The effective config writes each key under its section: "[train]" then "batch_size = 32".
    const std::string key = name.substr(name.find('.') + 1);
    EXPECT_NE(ini.find("\n" + key + " = "), std::string::npos) << name;
  }
}

TEST(Config, EffectiveIniReadsBack) {
  TempDir dir;
  Config original = parse_config({"--data.path", "d.h5", "--train.learning_rate", "0.0025", "--model.layers",
                                  "2", "--data.validate", "false"})
                        .config;
  const std::string ini = write_text(dir, "effective.ini", original.to_ini());
  const Config again = parse_config({"--config", ini}).config;
  EXPECT_EQ(again.to_ini(), original.to_ini());
  EXPECT_EQ(again.train.learning_rate, 0.0025);
  EXPECT_EQ(again.model.layers, 2);
  EXPECT_FALSE(again.data.validate);
}

TEST(Config, EffectiveIniWritesNumbersAsWrittenAndReadsThemBackExactly) {
  TempDir dir;
  const std::string ini_text = parse_config({"--data.path", "d.h5"}).config.to_ini();
  EXPECT_NE(ini_text.find("beta1 = 0.9\n"), std::string::npos) << ini_text;
  EXPECT_NE(ini_text.find("beta2 = 0.999\n"), std::string::npos) << ini_text;
  EXPECT_NE(ini_text.find("epsilon = 1e-07\n"), std::string::npos) << ini_text;
  EXPECT_NE(ini_text.find("learning_rate = 0.001\n"), std::string::npos) << ini_text;
  EXPECT_NE(ini_text.find("timeout_s = 120\n"), std::string::npos) << ini_text;
  // Values whose shortest text is long, or that need an exponent, come back as the identical double.
  const double third = 1.0 / 3.0;
  const double sum = 0.1 + 0.2;  // 0.30000000000000004
  const double tiny = 1.2345678901234567e-30;
  const double big = 6.02214076e23;
  Config original = parse_config({"--data.path", "d.h5", "--train.learning_rate", "0.33333333333333331",
                                  "--train.momentum", "0.30000000000000004", "--train.epsilon",
                                  "1.2345678901234567e-30", "--comm.timeout_s", "6.02214076e23"})
                        .config;
  EXPECT_EQ(original.train.learning_rate, third);
  EXPECT_EQ(original.train.momentum, sum);
  const std::string ini = write_text(dir, "effective.ini", original.to_ini());
  const Config again = parse_config({"--config", ini}).config;
  EXPECT_EQ(again.to_ini(), original.to_ini());
  EXPECT_EQ(again.train.learning_rate, third);
  EXPECT_EQ(again.train.momentum, sum);
  EXPECT_EQ(again.train.epsilon, tiny);
  EXPECT_EQ(again.comm.timeout_s, big);
  EXPECT_NE(original.to_ini().find("momentum = 0.30000000000000004\n"), std::string::npos);
}

}  // namespace
}  // namespace ddp::engine
