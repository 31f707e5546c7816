// Config parsing, optimizers, the progress watchdog, checkpoints and metrics formatting.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "engine/base/errors.h"
#include "engine/base/json.h"
#include "engine/base/parallel_loops.h"
#include "engine/base/progress.h"
#include "engine/base/running_clock.h"
#include "engine/checkpoint.h"
#include "engine/config.h"
#include "engine/job_agreement.h"
#include "engine/metrics.h"
#include "engine/optimizer.h"
#include "engine/self_check.h"
#include "engine/topology.h"
#include "engine/watchdog.h"
#include "models/cuda_replica.h"
#include "models/initializers.h"
#include "models/replica.h"
#include "tests/test_util.h"

namespace ddp::engine {
namespace {

using ddp::testing::expect_user_error;
using ddp::testing::TempDir;

std::string write_text(const TempDir& dir, const std::string& name, const std::string& text) {
  const std::string path = dir.file(name);
  std::ofstream(path) << text;
  return path;
}

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

TEST(Optimizer, AdamMatchesKerasFormulaInDouble) {
  OptimizerSettings s;
  s.learning_rate = 0.01;
  auto adam = make_optimizer(s, 3);
  std::vector<float> p{1.0f, -2.0f, 0.5f};
  std::vector<double> ref(p.begin(), p.end()), m(3, 0), v(3, 0);
  const std::vector<std::vector<float>> grads{{0.1f, -0.2f, 0.0f}, {0.3f, 0.1f, -1.0f}, {-0.05f, 0.2f, 0.4f}};
  for (std::size_t t = 1; t <= grads.size(); ++t) {
    adam->step(p, grads[t - 1]);
    const double lr_t = 0.01 * std::sqrt(1 - std::pow(0.999, t)) / (1 - std::pow(0.9, t));
    for (int i = 0; i < 3; ++i) {
      const double g = grads[t - 1][i];
      m[i] = 0.9 * m[i] + 0.1 * g;
      v[i] = 0.999 * v[i] + 0.001 * g * g;
      ref[i] -= lr_t * m[i] / (std::sqrt(v[i]) + 1e-7);
    }
  }
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(p[i], ref[i], 1e-6) << i;
  EXPECT_EQ(adam->state().iterations, 3);
}

TEST(Optimizer, SgdMomentum) {
  OptimizerSettings s;
  s.name = "sgd";
  s.learning_rate = 0.1;
  s.momentum = 0.9;
  auto sgd = make_optimizer(s, 1);
  std::vector<float> p{1.0f};
  const std::vector<float> g{1.0f};
  sgd->step(p, g);  // v = -0.1, p = 0.9
  sgd->step(p, g);  // v = -0.09 - 0.1 = -0.19, p = 0.71
  EXPECT_NEAR(p[0], 0.71f, 1e-6);
}

TEST(Optimizer, StateRoundTripContinuesIdentically) {
  OptimizerSettings s;
  auto a = make_optimizer(s, 4);
  std::vector<float> pa{1, 2, 3, 4};
  const std::vector<float> g{0.1f, -0.3f, 0.2f, 0.0f};
  a->step(pa, g);
  auto b = make_optimizer(s, 4);
  b->load_state(a->state());
  std::vector<float> pb = pa;
  a->step(pa, g);
  b->step(pb, g);
  EXPECT_EQ(pa, pb);
  OptimizerSettings sgd = s;
  sgd.name = "sgd";
  EXPECT_THROW(make_optimizer(sgd, 4)->load_state(a->state()), UserError);
}

// Every operation of the update rounded to float on its own, as the CUDA kernels do with their _rn
// intrinsics: a volatile store keeps the compiler from fusing a multiply and an add here.
float rounded(float x) {
  volatile float r = x;
  return r;
}

// The host optimizers round each operation separately (no multiply-add contracted into an FMA, whatever the
// CPU's vector clone), so that CPU and GPU replicas applying the same gradient keep the same parameters to
// the last bit. An odd size runs the vector loops' tails too.
// visit_state hands a checkpoint each buffer of the state: a host optimizer its own memory, any other (the
// CUDA optimizer) through the default, which copies state(). Both must give state()'s buffers in order.
TEST(Optimizer, VisitStateGivesTheStateBuffersInOrder) {
  // An optimizer that keeps the default visit_state, as the CUDA one does.
  class StateOnly final : public Optimizer {
   public:
    explicit StateOnly(std::unique_ptr<Optimizer> inner) : inner_(std::move(inner)) {}
    void step(std::span<float> p, std::span<const float> g, const TouchedRows* t, float scale) override {
      inner_->step(p, g, t, scale);
    }
    OptimizerState state() const override { return inner_->state(); }
    void load_state(const OptimizerState& state) override { inner_->load_state(state); }
    int64_t iterations() const override { return inner_->iterations(); }
    std::string name() const override { return inner_->name(); }

   private:
    std::unique_ptr<Optimizer> inner_;
  };
  for (const std::string name : {"adam", "sgd"}) {
    OptimizerSettings s;
    s.name = name;
    s.momentum = 0.9;
    std::vector<float> params(17, 0.5f), grads(17);
    for (std::size_t i = 0; i < grads.size(); ++i) grads[i] = 0.01f * static_cast<float>(i) - 0.05f;
    auto host = make_optimizer(s, params.size());
    StateOnly copying(make_optimizer(s, params.size()));
    std::vector<float> other = params;
    for (int i = 0; i < 3; ++i) {
      host->step(params, grads);
      copying.step(other, grads, nullptr, 1.0f);
    }
    const OptimizerState expected = host->state();
    EXPECT_EQ(host->iterations(), 3);
    EXPECT_EQ(copying.iterations(), 3);
    for (const Optimizer* optimizer :
         {static_cast<const Optimizer*>(host.get()), static_cast<const Optimizer*>(&copying)}) {
      std::vector<std::pair<std::string, std::vector<float>>> visited;
      optimizer->visit_state([&](const std::string& buffer, std::span<const float> values) {
        visited.emplace_back(buffer, std::vector<float>(values.begin(), values.end()));
      });
      EXPECT_EQ(visited, expected.buffers) << name;
    }
  }
}

TEST(Optimizer, UpdatesRoundEveryOperationLikeTheCudaKernels) {
  constexpr std::size_t n = 1003;
  std::vector<float> p(n), g(n);
  uint32_t state = 12345;
  auto next = [&state] {
    state = state * 1664525u + 1013904223u;
    return static_cast<float>(state >> 8) / 16777216.0f - 0.5f;
  };
  for (std::size_t i = 0; i < n; ++i) p[i] = next();

  OptimizerSettings adam_settings;
  adam_settings.learning_rate = 0.003;
  auto adam = make_optimizer(adam_settings, n);
  std::vector<float> pa = p, ref = p, m(n, 0.0f), v(n, 0.0f);
  const auto b1 = static_cast<float>(adam_settings.beta1);
  const auto b2 = static_cast<float>(adam_settings.beta2);
  const auto eps = static_cast<float>(adam_settings.epsilon);
  for (int t = 1; t <= 5; ++t) {
    for (std::size_t i = 0; i < n; ++i) g[i] = next() * 0.01f;
    adam->step(pa, g);
    const auto lr_t = static_cast<float>(adam_settings.learning_rate * std::sqrt(1.0 - std::pow(0.999, t)) /
                                         (1.0 - std::pow(0.9, t)));
    for (std::size_t i = 0; i < n; ++i) {
      m[i] = rounded(rounded(b1 * m[i]) + rounded(rounded(1.0f - b1) * g[i]));
      v[i] = rounded(rounded(b2 * v[i]) + rounded(rounded(rounded(1.0f - b2) * g[i]) * g[i]));
      ref[i] = rounded(ref[i] - rounded(rounded(lr_t * m[i]) / rounded(rounded(std::sqrt(v[i])) + eps)));
    }
  }
  std::size_t differ = 0;
  for (std::size_t i = 0; i < n; ++i) differ += pa[i] != ref[i] ? 1 : 0;
  EXPECT_EQ(differ, 0u) << "Adam: parameters that differ from the per-operation rounding";

  OptimizerSettings sgd_settings;
  sgd_settings.name = "sgd";
  sgd_settings.learning_rate = 0.05;
  sgd_settings.momentum = 0.9;
  auto sgd = make_optimizer(sgd_settings, n);
  std::vector<float> ps = p, velocity(n, 0.0f);
  ref = p;
  const auto lr = static_cast<float>(sgd_settings.learning_rate);
  const auto momentum = static_cast<float>(sgd_settings.momentum);
  for (int t = 1; t <= 5; ++t) {
    for (std::size_t i = 0; i < n; ++i) g[i] = next();
    sgd->step(ps, g);
    for (std::size_t i = 0; i < n; ++i) {
      velocity[i] = rounded(rounded(momentum * velocity[i]) - rounded(lr * g[i]));
      ref[i] = rounded(ref[i] + velocity[i]);
    }
  }
  differ = 0;
  for (std::size_t i = 0; i < n; ++i) differ += ps[i] != ref[i] ? 1 : 0;
  EXPECT_EQ(differ, 0u) << "SGD: parameters that differ from the per-operation rounding";
}

// Lazy rows: a matrix at offset 2 of width 2 with 3 rows. A first step touches every row; then only row 1 has
// a gradient. Lazily, rows 0 and 2 keep the values of the first step; densely their moments keep moving them.
// Outside the matrix, and on row 1, both updates are the same.
TEST(Optimizer, LazyRowsLeaveUntouchedRowsAlone) {
  OptimizerSettings dense_settings;
  OptimizerSettings lazy_settings;
  lazy_settings.lazy_update = true;
  auto dense = make_optimizer(dense_settings, 10);
  auto lazy = make_optimizer(lazy_settings, 10);
  std::vector<float> pd{1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  std::vector<float> pl = pd;
  const std::vector<float> all{0.5f, -0.5f, 0.1f, 0.2f, 0.25f, 0.75f, -0.3f, 0.4f, 1, -1};
  const std::vector<int32_t> every_row{0, 1, 2};
  const TouchedRows first{2, 2, 3, every_row};
  dense->step(pd, all, &first);
  lazy->step(pl, all, &first);
  const std::vector<float> after_first = pl;
  const std::vector<float> g{0.5f, -0.5f, 0, 0, 0.25f, 0.75f, 0, 0, 1, -1};
  const std::vector<int32_t> row_one{1};
  const TouchedRows sparse{2, 2, 3, row_one};
  for (int i = 0; i < 3; ++i) {
    dense->step(pd, g, &sparse);  // dense settings ignore the rows
    lazy->step(pl, g, &sparse);
  }
  for (int i : {0, 1, 4, 5, 8, 9}) EXPECT_EQ(pl[i], pd[i]) << i;
  for (int i : {2, 3, 6, 7}) {
    EXPECT_EQ(pl[i], after_first[i]) << i;
    EXPECT_NE(pd[i], after_first[i]) << i;
  }
}

// Given the touched rows, a dense update decays the other rows without reading their (zero) gradient: the
// same bits as the full update, on one compute thread or several (the ranges the threads split the buffer
// into fall inside rows and between them). A lazy update gives the same bits on any number of threads too.
TEST(Optimizer, TouchedRowsChangeNoBitOfTheDenseUpdateOnAnyThreadCount) {
  const std::size_t width = 7, rows = 40000, offset = 1000, size = offset + width * rows + 333;
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> start(size);
  for (float& p : start) p = u(rng);
  std::vector<int32_t> touched;
  for (int32_t row = 0; row < static_cast<int32_t>(rows); ++row)
    if (rng() % 9 == 0 || row == 0 || row + 1 == static_cast<int32_t>(rows)) touched.push_back(row);
  std::vector<float> grads(size, 0.0f);
  auto draw_gradient = [&] {
    std::fill(grads.begin(), grads.end(), 0.0f);
    for (std::size_t i = 0; i < offset; ++i) grads[i] = u(rng);
    for (const int32_t row : touched)
      for (std::size_t j = 0; j < width; ++j) grads[offset + row * width + j] = u(rng);
    for (std::size_t i = offset + width * rows; i < size; ++i) grads[i] = u(rng);
  };
  const TouchedRows sparse{offset, width, rows, touched};
  for (const std::string name : {"adam", "sgd"}) {
    for (const bool lazy : {false, true}) {
      OptimizerSettings settings;
      settings.name = name;
      settings.momentum = 0.9;
      settings.lazy_update = lazy;
      std::vector<std::vector<float>> results;
      for (const int threads : {1, 2, 3}) {
        set_loop_threads(threads);
        rng.seed(6);
        auto optimizer = make_optimizer(settings, size);
        std::vector<float> params = start;
        for (int step = 0; step < 3; ++step) {
          draw_gradient();
          optimizer->step(params, grads, &sparse);
        }
        results.push_back(params);
        if (lazy) continue;
        // The reference: the full dense update, reading every gradient, on the calling thread.
        set_loop_threads(1);
        rng.seed(6);
        auto full = make_optimizer(settings, size);
        std::vector<float> reference = start;
        for (int step = 0; step < 3; ++step) {
          draw_gradient();
          full->step(reference, grads);
        }
        EXPECT_EQ(0, std::memcmp(params.data(), reference.data(), size * sizeof(float)))
            << name << " " << threads;
      }
      set_loop_threads(1);
      for (const auto& r : results)
        EXPECT_EQ(0, std::memcmp(r.data(), results[0].data(), size * sizeof(float)))
            << name << " lazy " << lazy;
      if (lazy) {  // an untouched row kept its start
        int32_t untouched = 0;
        while (std::binary_search(touched.begin(), touched.end(), untouched)) ++untouched;
        EXPECT_EQ(results[0][offset + untouched * width], start[offset + untouched * width]) << name;
      }
    }
  }
}

// A gradient in pieces (the colocated parameter server's compact shard average) gives the dense update's
// bits: the pieces' elements updated, every other element decayed as with a zero gradient; on any number of
// threads, with a clipping scale and weight decay, pieces that split a thread's range, and an empty one.
TEST(Optimizer, PiecesChangeNoBitOfTheDenseUpdate) {
  const std::size_t size = 300000;
  std::mt19937 rng(8);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> start(size);
  for (float& p : start) p = u(rng);
  // Pieces of 1 to 300 floats with gaps of 0 to 2000, and one empty piece.
  std::vector<std::pair<std::size_t, std::size_t>> spans;  // offset, length
  for (std::size_t at = 5; at < size;) {
    const std::size_t length = std::min<std::size_t>(1 + rng() % 300, size - at);
    spans.emplace_back(at, length);
    at += length + rng() % 2001;
    if (spans.size() == 10) spans.emplace_back(at, 0);
  }
  for (const std::string name : {"adam", "sgd"}) {
    OptimizerSettings settings;
    settings.name = name;
    settings.momentum = 0.9;
    settings.weight_decay = 0.01;
    for (const int threads : {1, 2, 3}) {
      set_loop_threads(threads);
      auto in_pieces = make_optimizer(settings, size);
      auto dense = make_optimizer(settings, size);
      std::vector<float> params = start, reference = start;
      for (int step = 0; step < 3; ++step) {
        std::vector<float> values, grads(size, 0.0f);
        for (const auto& [offset, length] : spans)
          for (std::size_t i = 0; i < length; ++i) values.push_back(u(rng));
        std::vector<GradientPiece> pieces;
        std::size_t next = 0;
        for (const auto& [offset, length] : spans) {
          pieces.push_back({offset, std::span<const float>(values).subspan(next, length)});
          std::copy(values.begin() + static_cast<std::ptrdiff_t>(next),
                    values.begin() + static_cast<std::ptrdiff_t>(next + length),
                    grads.begin() + static_cast<std::ptrdiff_t>(offset));
          next += length;
        }
        in_pieces->step_pieces(params, pieces, 0.5f);
        dense->step(reference, grads, nullptr, 0.5f);
      }
      EXPECT_EQ(0, std::memcmp(params.data(), reference.data(), size * sizeof(float)))
          << name << " " << threads;
      EXPECT_NE(params, start);
    }
  }
  set_loop_threads(1);
}

TEST(Optimizer, LearningRateSchedulesWarmUpStepAndCosine) {
  OptimizerSettings s;
  s.learning_rate = 0.1;
  EXPECT_EQ(learning_rate_at(s, 1), 0.1);
  EXPECT_EQ(learning_rate_at(s, 1000), 0.1);
  s.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(learning_rate_at(s, 1), 0.025);
  EXPECT_DOUBLE_EQ(learning_rate_at(s, 2), 0.05);
  EXPECT_DOUBLE_EQ(learning_rate_at(s, 4), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate_at(s, 5), 0.1);
  s.schedule = "step";
  s.decay_steps = 10;
  s.decay_rate = 0.5;
  EXPECT_DOUBLE_EQ(learning_rate_at(s, 14), 0.1);    // the 10th update after warm-up
  EXPECT_DOUBLE_EQ(learning_rate_at(s, 15), 0.05);   // the 11th
  EXPECT_DOUBLE_EQ(learning_rate_at(s, 34), 0.025);  // the 30th: two decays
  EXPECT_DOUBLE_EQ(learning_rate_at(s, 35), 0.0125);
  s.schedule = "cosine";
  s.total_steps = 104;
  EXPECT_DOUBLE_EQ(learning_rate_at(s, 5), 0.1);
  EXPECT_NEAR(learning_rate_at(s, 55), 0.05, 1e-12);  // half way: cos(pi/2)
  EXPECT_NEAR(learning_rate_at(s, 105), 0.0, 1e-12);
  EXPECT_NEAR(learning_rate_at(s, 500), 0.0, 1e-12);  // past the end it stays at 0
}

// AdamW's decoupled decay (p -= lr wd p before Adam's step) and clipping's scale (the gradient times it) in
// double against the float optimizer; a scale given to step() equals gradients multiplied by it beforehand,
// bit for bit.
TEST(Optimizer, WeightDecayAndGradientScaleFollowTheFormulas) {
  OptimizerSettings s;
  s.learning_rate = 0.01;
  s.weight_decay = 0.1;
  auto adam = make_optimizer(s, 3);
  std::vector<float> p{1.0f, -2.0f, 0.5f};
  const std::vector<float> g{0.3f, -0.1f, 0.0f};
  const float scale = 0.5f;
  adam->step(p, g, nullptr, scale);
  const double lr_t = 0.01 * std::sqrt(1 - 0.999) / (1 - 0.9);
  const std::vector<double> start{1.0, -2.0, 0.5};
  for (std::size_t i = 0; i < 3; ++i) {
    const double gs = static_cast<double>(g[i]) * scale;
    const double decayed = start[i] - 0.01 * 0.1 * start[i];
    const double m = 0.1 * gs, v = 0.001 * gs * gs;
    EXPECT_NEAR(p[i], decayed - lr_t * m / (std::sqrt(v) + 1e-7), 1e-6) << i;
  }
  for (const std::string name : {"adam", "sgd"}) {
    s.name = name;
    s.momentum = 0.9;
    auto scaled = make_optimizer(s, 3), premultiplied = make_optimizer(s, 3);
    std::vector<float> a{1.0f, 2.0f, 3.0f}, b = a;
    std::vector<float> gb = g;
    for (float& x : gb) x *= 0.25f;
    for (int i = 0; i < 3; ++i) {
      scaled->step(a, g, nullptr, 0.25f);
      premultiplied->step(b, gb);
    }
    EXPECT_EQ(a, b) << name;
  }
  EXPECT_EQ(clipping_scale(4.0, 0), 1.0f);    // off
  EXPECT_EQ(clipping_scale(4.0, 3.0), 1.0f);  // norm 2 is within 3
  EXPECT_FLOAT_EQ(clipping_scale(16.0, 1.0), 0.25f);
}

// The squared norm in gradient_clipping.h's order (which the GPU kernel follows too): the true sum to double
// rounding; a sparse gradient that leaves its zero rows out gets the same bits as the dense sum over them;
// step_clipped is step() with clipping_scale of that norm.
TEST(GradientClipping, TheNormHasOneOrderAndZeroRowsMaySkip) {
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  const std::size_t width = 7, rows = 1000, offset = 13, n = offset + width * rows + 5;
  std::vector<float> g(n, 0.0f);
  std::vector<int32_t> touched;
  for (std::size_t i = 0; i < offset; ++i) g[i] = normal(rng);
  for (std::size_t i = offset + width * rows; i < n; ++i) g[i] = normal(rng);
  for (int32_t r = 0; r < static_cast<int32_t>(rows); r += 3) {
    touched.push_back(r);
    for (std::size_t j = 0; j < width; ++j) g[offset + static_cast<std::size_t>(r) * width + j] = normal(rng);
  }
  long double exact = 0;
  for (const float x : g) exact += static_cast<long double>(x) * x;
  const double dense = squared_norm(g, nullptr);
  EXPECT_NEAR(dense, static_cast<double>(exact), 1e-12 * static_cast<double>(exact));
  const TouchedRows sparse{offset, width, rows, touched};
  EXPECT_EQ(squared_norm(g, &sparse), dense);

  OptimizerSettings s;
  s.learning_rate = 0.01;
  auto clipped = make_optimizer(s, n), scaled = make_optimizer(s, n);
  std::vector<float> a(n, 0.5f), b = a;
  clipped->step_clipped(a, g, nullptr, 2.0);
  scaled->step(b, g, nullptr, clipping_scale(dense, 2.0));
  EXPECT_LT(clipping_scale(dense, 2.0), 1.0f);
  EXPECT_EQ(a, b);
}

TEST(ParallelLoops, RangesCoverEveryElementOnceAlignedOnAnyThreadCount) {
  for (const int threads : {1, 2, 3, 8}) {
    set_loop_threads(threads);
    for (const std::size_t n : {0ul, 1ul, 15ul, 16ul, 1000ul, 100003ul}) {
      std::vector<std::atomic<int>> seen(n);
      std::atomic<int> calls{0};
      parallel_ranges(n, 16, 100, [&](std::size_t begin, std::size_t end) {
        ++calls;
        EXPECT_LT(begin, end);
        EXPECT_TRUE(begin % 16 == 0) << begin;
        for (std::size_t i = begin; i < end; ++i) ++seen[i];
      });
      for (std::size_t i = 0; i < n; ++i) {
        ASSERT_EQ(seen[i].load(), 1) << n << " " << i;
      }
      EXPECT_LE(calls.load(), std::max(1, loop_threads())) << n;
      if (n == 0) {
        EXPECT_EQ(calls.load(), 0);
      }
    }
  }
  set_loop_threads(1);
}

// The watchdog's judgement on a clock the test steps: no test waits for real time to pass.
class ManualClock {
 public:
  ProgressWatchdog::Now now() {
    return [this] { return time_; };
  }
  void advance(double seconds) {
    time_ +=
        std::chrono::duration_cast<ProgressWatchdog::Clock::duration>(std::chrono::duration<double>(seconds));
  }

 private:
  ProgressWatchdog::Clock::time_point time_{std::chrono::hours(1000)};
};

// The stall handler is called once no beat came for the timeout, with the last step in its message, and
// only once.
// Sizes in messages: three digits and a unit, never 6.12e-05 GB.
TEST(Progress, SizesForAPerson) {
  EXPECT_EQ(progress::bytes_text(0), "0 B");
  EXPECT_EQ(progress::bytes_text(812), "812 B");
  EXPECT_EQ(progress::bytes_text(61240), "61.2 kB");
  EXPECT_EQ(progress::bytes_text(999999), "1.00 MB");
  EXPECT_EQ(progress::bytes_text(12.34e6), "12.3 MB");
  EXPECT_EQ(progress::bytes_text(1.5e9), "1.50 GB");
  EXPECT_EQ(progress::bytes_text(3e18), "3000 PB");
}

TEST(ProgressWatchdog, CallsTheHandlerWhenBeatsStop) {
  ManualClock clock;
  std::vector<std::string> reasons;
  auto watchdog = ProgressWatchdog::without_thread(0.2, clock.now(),
                                                   [&](const std::string& why) { reasons.push_back(why); });
  watchdog->enter("training");
  watchdog->beat(41);
  clock.advance(0.1);
  watchdog->beat(42);
  clock.advance(0.19);
  EXPECT_FALSE(watchdog->check());
  clock.advance(0.01);
  EXPECT_TRUE(watchdog->check());
  clock.advance(1.0);
  EXPECT_FALSE(watchdog->check());
  ASSERT_EQ(reasons.size(), 1u);
  EXPECT_EQ(
      reasons[0].find("no progress for 0.2 s (comm.timeout_s 0.2) while training (steps done: 42): a rank "
                      "is hung or lost"),
      0u)
      << reasons[0];
}

// Start-up work that proceeds is no stall, however long it takes in all: the initial parameters (orthogonal
// matrices take seconds at large hidden sizes) and the GPU self-check tell the watchdog as each piece is
// done. Here each piece takes 0.4 of the timeout on the watchdog's clock, the pieces many timeouts together,
// and the watchdog stays quiet; the same silence without a word of the work is a stall.
TEST(ProgressWatchdog, StartUpWorkThatProceedsIsNoStall) {
  ManualClock clock;
  int stalls = 0;
  auto watchdog = ProgressWatchdog::without_thread(1.0, clock.now(), [&](const std::string&) { ++stalls; });
  int pieces = 0;
  const auto piece_done = [&] {
    clock.advance(0.4);
    watchdog->proceed();
    ++pieces;
    EXPECT_FALSE(watchdog->check()) << "after piece " << pieces;
  };
  watchdog->enter("drawing the initial parameters");
  const models::ParamLayout layout({100, 16, 320, 2});
  std::vector<float> params(layout.total_size());
  models::initialize_keras(layout, params, 1, piece_done);
  EXPECT_GE(pieces, 2 * (320 / 32));  // at least one per block of 32 columns of each orthogonal matrix
  watchdog->enter("preparing the batch shapes and the GPU self-check");
  const int before = pieces;
  auto replica = models::make_cpu_replica({100, 8, 8, 2});
  const std::vector<std::pair<int, int>> shapes{{16, 20}, {5, 20}};
  EXPECT_TRUE(check_gpu_replica(*replica, 0, shapes, OptimizerSettings{}, 1, {}, piece_done).ok);
  EXPECT_EQ(pieces - before, 5);
  EXPECT_EQ(stalls, 0);
  clock.advance(1.0);
  EXPECT_TRUE(watchdog->check());
  EXPECT_EQ(stalls, 1);
}

// A pause (the exchange's own deadlines) outlives work done within it: proceed() does not end it.
TEST(ProgressWatchdog, ProceedLeavesAPauseAsItIs) {
  ManualClock clock;
  int stalls = 0;
  auto watchdog = ProgressWatchdog::without_thread(1.0, clock.now(), [&](const std::string&) { ++stalls; });
  watchdog->pause();
  watchdog->proceed();
  clock.advance(5.0);
  EXPECT_FALSE(watchdog->check());
  EXPECT_EQ(stalls, 0);
}

// Before the first step (a collective of start-up waiting for a hung rank) the message names the phase.
TEST(ProgressWatchdog, NamesThePhaseItStalledIn) {
  ManualClock clock;
  std::string reason;
  auto watchdog =
      ProgressWatchdog::without_thread(0.2, clock.now(), [&](const std::string& why) { reason = why; });
  watchdog->enter("reading data.path /frozen/imdb.h5");
  clock.advance(0.5);
  ASSERT_TRUE(watchdog->check());
  EXPECT_EQ(reason.find("no progress for 0.5 s"), 0u) << reason;
  EXPECT_NE(reason.find(" while reading data.path /frozen/imdb.h5: a rank is hung"), std::string::npos)
      << reason;
  EXPECT_EQ(reason.find("steps done"), std::string::npos) << reason;
}

// The other ranks' words (comm/stall_census.h) replace the guess at the end of the message.
TEST(ProgressWatchdog, TheSurveysWordsNameTheRank) {
  ManualClock clock;
  std::string reason;
  auto watchdog =
      ProgressWatchdog::without_thread(0.2, clock.now(), [&](const std::string& why) { reason = why; });
  watchdog->set_stall_survey([&](const std::string& phase, int64_t steps_done) {
    return phase + " after " + std::to_string(steps_done) + ": rank 9 is gone";
  });
  watchdog->enter("training");
  watchdog->beat(7);
  clock.advance(0.3);
  ASSERT_TRUE(watchdog->check());
  EXPECT_NE(reason.find(" while training (steps done: 7): training after 7: rank 9 is gone"),
            std::string::npos)
      << reason;
  EXPECT_EQ(reason.find("a rank is hung"), std::string::npos) << reason;
}

// A wake far later than the sleep asked for is time the process was stopped: the running clock leaves it
// out, so a job stopped and continued finds no silence in it. A scheduler's delay is no stop.
TEST(RunningClock, LeavesOutTheSpellsAProcessWasStopped) {
  using std::chrono::milliseconds;
  using std::chrono::seconds;
  const RunningClock::duration before = RunningClock::stopped_total();
  EXPECT_EQ(RunningClock::note_wake(seconds(1), milliseconds(1400)), RunningClock::duration::zero());
  EXPECT_EQ(RunningClock::stopped_total(), before);
  EXPECT_EQ(RunningClock::note_wake(seconds(1), seconds(4)), seconds(3));
  EXPECT_EQ(RunningClock::stopped_total() - before, seconds(3));
  const auto running = RunningClock::now().time_since_epoch();
  EXPECT_GE(std::chrono::steady_clock::now().time_since_epoch() - running, seconds(3));
}

// What the rank knows it is stuck in (a file read that does not return) ends the message.
TEST(ProgressWatchdog, TheRanksOwnDetailEndsTheMessage) {
  ManualClock clock;
  std::string reason;
  auto watchdog =
      ProgressWatchdog::without_thread(0.2, clock.now(), [&](const std::string& why) { reason = why; });
  watchdog->set_stall_survey([](const std::string&, int64_t) { return "rank 1 is hung"; });
  watchdog->set_stall_detail([] { return "this rank has been reading /frozen/imdb.h5 for 0.5 s"; });
  watchdog->enter("reading data.path /frozen/imdb.h5");
  clock.advance(0.5);
  ASSERT_TRUE(watchdog->check());
  EXPECT_NE(reason.find(": rank 1 is hung; this rank has been reading /frozen/imdb.h5 for 0.5 s"),
            std::string::npos)
      << reason;
}

// Paused (the parameter server's deadlines hold), it lets any silence pass; the next phase arms it again,
// with a fresh timeout.
TEST(ProgressWatchdog, JudgesNothingWhilePausedAndWatchesAgainFromTheNextPhase) {
  ManualClock clock;
  std::string reason;
  auto watchdog =
      ProgressWatchdog::without_thread(0.2, clock.now(), [&](const std::string& why) { reason = why; });
  watchdog->pause();
  clock.advance(60);
  EXPECT_FALSE(watchdog->check());
  watchdog->enter("gathering the start-up log");
  clock.advance(0.1);
  EXPECT_FALSE(watchdog->check());
  clock.advance(0.1);
  ASSERT_TRUE(watchdog->check());
  EXPECT_NE(reason.find("while gathering the start-up log"), std::string::npos) << reason;
}

// Beats that keep coming, each within the timeout, keep it quiet however long the run.
TEST(ProgressWatchdog, StaysQuietWhileBeatsCome) {
  ManualClock clock;
  int calls = 0;
  auto watchdog = ProgressWatchdog::without_thread(1.0, clock.now(), [&](const std::string&) { ++calls; });
  for (int step = 1; step <= 1000; ++step) {  // 900 s of beats, 0.9 s apart
    clock.advance(0.9);
    EXPECT_FALSE(watchdog->check());
    watchdog->beat(step);
  }
  EXPECT_EQ(calls, 0);
}

// An error the health check reports ends the run at the next check, long before the timeout, even while
// beats keep coming.
TEST(ProgressWatchdog, EndsAtOnceOnAnErrorTheHealthCheckReports) {
  ManualClock clock;
  std::string reason;
  bool broken = false;
  auto watchdog = ProgressWatchdog::without_thread(
      60.0, clock.now(), [&](const std::string& why) { reason = why; },
      [&]() -> std::optional<std::string> {
        if (broken) return std::string("NCCL asynchronous error: remote process exited");
        return std::nullopt;
      });
  watchdog->beat(7);
  EXPECT_FALSE(watchdog->check());
  broken = true;
  watchdog->beat(8);
  ASSERT_TRUE(watchdog->check());
  EXPECT_EQ(reason, "NCCL asynchronous error: remote process exited");
}

// Once set_health_check returns, the old check is neither running nor called again: the trainer clears it
// before the communicator it asks goes away. A check in progress holds the replacement back until it ends.
TEST(ProgressWatchdog, NeverCallsAHealthCheckAfterItIsReplaced) {
  ManualClock clock;
  auto watchdog = ProgressWatchdog::without_thread(1.0, clock.now(), [](const std::string&) {});
  std::mutex mutex;
  std::condition_variable changed;
  bool inside = false;
  bool release = false;
  std::atomic<bool> replaced{false};
  int calls_after_replacement = 0;
  watchdog->set_health_check([&]() -> std::optional<std::string> {
    std::unique_lock<std::mutex> lock(mutex);
    if (replaced) ++calls_after_replacement;
    inside = true;
    changed.notify_all();
    changed.wait(lock, [&] { return release; });
    if (replaced) ++calls_after_replacement;
    return std::nullopt;
  });
  std::thread checking([&] { watchdog->check(); });
  {
    std::unique_lock<std::mutex> lock(mutex);
    changed.wait(lock, [&] { return inside; });
  }
  std::thread replacing([&] {
    watchdog->set_health_check({});
    replaced = true;
  });
  {
    std::lock_guard<std::mutex> lock(mutex);
    release = true;
  }
  changed.notify_all();
  checking.join();
  replacing.join();
  EXPECT_FALSE(watchdog->check());
  EXPECT_EQ(calls_after_replacement, 0);
}

// The real thing: its own thread notices the silence (here a millisecond) without anyone calling check().
TEST(ProgressWatchdog, ItsThreadCallsTheHandler) {
  std::mutex mutex;
  std::condition_variable called;
  std::string reason;
  ProgressWatchdog watchdog(0.001, [&](const std::string& why) {
    std::lock_guard<std::mutex> lock(mutex);
    reason = why;
    called.notify_all();
  });
  watchdog.enter("training");
  std::unique_lock<std::mutex> lock(mutex);
  ASSERT_TRUE(called.wait_for(lock, std::chrono::seconds(30), [&] { return !reason.empty(); }))
      << "the handler was not called";
  // Not which phase: with a 1 ms timeout the thread may fire before enter() names one (the phase in the
  // reason is checked with a clock the test drives).
  EXPECT_NE(reason.find("no progress for"), std::string::npos) << reason;
}

// The hint names a binding that leaves cores idle: one rank bound to one core of two (Open MPI's default for
// a job of one rank), and not the bindings that use the node's cores.
TEST(Topology, IdleCoresHintOnlyWhenTheBindingLeavesCoresIdle) {
  const std::string lone_rank_on_one_core = idle_cores_hint(2, 1, 1);
  EXPECT_NE(lone_rank_on_one_core.find("1 of the node's 2 cores, less than its share of 2"),
            std::string::npos)
      << lone_rank_on_one_core;
  EXPECT_NE(lone_rank_on_one_core.find("--bind-to none"), std::string::npos);
  EXPECT_EQ(idle_cores_hint(2, 2, 1), "");    // unbound lone rank
  EXPECT_EQ(idle_cores_hint(2, 1, 2), "");    // two ranks, a core each
  EXPECT_EQ(idle_cores_hint(64, 16, 4), "");  // srun --cpus-per-task 16, 4 tasks
  EXPECT_NE(idle_cores_hint(64, 1, 4), "");   // four ranks on one core each of 64
  EXPECT_EQ(idle_cores_hint(2, 1, 3), "");    // oversubscribed: no share left to miss
}

TEST(Checkpoint, RoundTripAndAtomicWrite) {
  TempDir dir;
  const models::ModelShape shape{50, 8, 6, 2};
  const models::ParamLayout layout(shape);
  std::vector<float> params(layout.total_size());
  for (std::size_t i = 0; i < params.size(); ++i) params[i] = static_cast<float>(i) * 0.001f - 0.3f;
  OptimizerSettings s;
  auto adam = make_optimizer(s, params.size());
  std::vector<float> scratch = params;
  adam->step(scratch, params);
  TrainingProgress progress;
  progress.epoch = 3;
  progress.step_in_epoch = 7;
  progress.global_step = 100;
  progress.seed = 42;
  progress.world_size = 2;
  progress.batch_size = 16;
  progress.best_val_loss = 0.25;
  progress.loss_sum = 12.5;
  const std::string path = dir.file("last.h5");
  write_checkpoint(path, shape, params, adam->name(), adam->state(), progress, "[train]\nepochs = 3\n");
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  const Checkpoint c = read_checkpoint(path);
  EXPECT_EQ(c.shape, shape);
  EXPECT_EQ(c.params, params);
  EXPECT_EQ(c.optimizer_name, "adam");
  EXPECT_EQ(c.optimizer.iterations, 1);
  ASSERT_EQ(c.optimizer.buffers.size(), 2u);
  EXPECT_EQ(c.optimizer.buffers[0].second, adam->state().buffers[0].second);
  EXPECT_EQ(c.progress.epoch, 3);
  EXPECT_EQ(c.progress.step_in_epoch, 7);
  EXPECT_EQ(c.progress.global_step, 100);
  EXPECT_EQ(c.progress.seed, 42u);
  EXPECT_EQ(c.progress.best_val_loss, 0.25);
  EXPECT_EQ(c.progress.loss_sum, 12.5);
  EXPECT_EQ(c.config_ini, "[train]\nepochs = 3\n");

  // Overwriting keeps a readable file at every moment: the new one replaces the old by rename.
  params[0] = 99.0f;
  write_checkpoint(path, shape, params, adam->name(), adam->state(), progress, "");
  EXPECT_EQ(read_checkpoint(path).params[0], 99.0f);
}

// The writer takes the optimizer's buffers one at a time (visit_state hands the host optimizer's own memory);
// a writer given up before commit() leaves the previous checkpoint as it was and no temporary file.
TEST(Checkpoint, WriterTakesBuffersOneAtATimeAndAbandonsCleanly) {
  TempDir dir;
  const models::ModelShape shape{40, 4, 3, 1};
  const models::ParamLayout layout(shape);
  std::vector<float> params(layout.total_size(), 0.25f);
  OptimizerSettings s;
  auto adam = make_optimizer(s, params.size());
  std::vector<float> grads(params.size(), 0.5f);
  adam->step(params, grads);
  const std::string path = dir.file("last.h5");
  {
    CheckpointWriter writer(path, shape, params, adam->name(), adam->iterations(), {}, "");
    adam->visit_state([&](const std::string& name, std::span<const float> values) {
      writer.add_optimizer_buffer(name, values);
    });
    writer.commit();
  }
  const Checkpoint written = read_checkpoint(path);
  EXPECT_EQ(written.optimizer.iterations, 1);
  ASSERT_EQ(written.optimizer.buffers.size(), 2u);
  EXPECT_EQ(written.optimizer.buffers[0].first, "m");
  EXPECT_EQ(written.optimizer.buffers[0].second, adam->state().buffers[0].second);
  EXPECT_EQ(written.optimizer.buffers[1].second, adam->state().buffers[1].second);
  {
    std::vector<float> other(params.size(), 9.0f);
    CheckpointWriter abandoned(path, shape, other, adam->name(), 7, {}, "");
    abandoned.add_optimizer_buffer("m", other);
    EXPECT_TRUE(std::filesystem::exists(path + ".tmp"));
  }
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  EXPECT_EQ(read_checkpoint(path).params, params);
}

// The replicas' random states (cuDNN's dropout state on GPUs) travel as bytes, by rank, a rank without one
// kept apart from a rank whose state is empty; a checkpoint whose ranks have none holds no group, and the
// model-only read leaves them out.
TEST(Checkpoint, KeepsEachRanksReplicaRandomState) {
  TempDir dir;
  const models::ModelShape shape{30, 4, 3, 2};
  const std::vector<float> params(models::ParamLayout(shape).total_size(), 0.5f);
  std::string binary;
  for (int i = 0; i < 256; ++i) binary.push_back(static_cast<char>(i));
  const std::vector<std::string> states{binary, "", std::string(3, '\0')};
  const std::string path = dir.file("last.h5");
  {
    CheckpointWriter writer(path, shape, params, "adam", 0, {}, "");
    writer.add_replica_rng_states(states);
    writer.commit();
  }
  EXPECT_EQ(read_checkpoint(path).replica_rng_states, states);
  EXPECT_TRUE(read_checkpoint(path, CheckpointParts::kModel).replica_rng_states.empty());
  {
    CheckpointWriter writer(path, shape, params, "adam", 0, {}, "");
    writer.add_replica_rng_states({"", ""});
    writer.commit();
  }
  EXPECT_TRUE(read_checkpoint(path).replica_rng_states.empty());
}

TEST(Checkpoint, DamagedCountersSumsFlagsAndClassNamesAreUserErrors) {
  TempDir dir;
  const models::ModelShape shape{30, 4, 3, 1};
  const std::vector<float> params(models::ParamLayout(shape).total_size(), 0.5f);
  const std::string path = dir.file("last.h5");
  const auto expect_refused = [&](const std::string& mention) {
    expect_user_error([&] { read_checkpoint(path); }, {path, mention});
  };
  TrainingProgress progress;
  progress.step_in_epoch = -3;
  write_checkpoint(path, shape, params, "adam", {}, progress, "");
  expect_refused("step_in_epoch = -3 is not 0 to 2^53");
  progress.step_in_epoch = 0;
  OptimizerState state;
  state.iterations = -1;
  write_checkpoint(path, shape, params, "adam", state, progress, "");
  expect_refused("iterations = -1 is not 0 to 2^53");
  // Counters whose next step would wrap, or that the doubles carrying progress between ranks cannot hold:
  // an epoch of 2^63 - 1 resumed as epoch -2^63 and trained forever, an optimizer step as NaN parameters.
  state.iterations = 3;
  for (int64_t TrainingProgress::*counter : {&TrainingProgress::epoch, &TrainingProgress::global_step}) {
    TrainingProgress huge;
    huge.*counter = INT64_MAX;
    write_checkpoint(path, shape, params, "adam", state, huge, "");
    expect_refused(" = 9223372036854775807 is not 0 to 2^53");
    huge.*counter = (int64_t{1} << 53) - 1;  // the largest that passes
    write_checkpoint(path, shape, params, "adam", state, huge, "");
    EXPECT_EQ(read_checkpoint(path).progress.*counter, (int64_t{1} << 53) - 1);
  }
  state.iterations = INT64_MAX;
  write_checkpoint(path, shape, params, "adam", state, TrainingProgress{}, "");
  expect_refused("iterations = 9223372036854775807 is not 0 to 2^53");

  // best.h5's epoch cannot come after the epochs the checkpoint has finished.
  TrainingProgress later_best;
  later_best.epoch = 2;
  later_best.best_epoch = 3;
  write_checkpoint(path, shape, params, "adam", {}, later_best, "");
  expect_refused("best_epoch = 3 is after its epoch = 2");
  later_best.best_epoch = 2;
  write_checkpoint(path, shape, params, "adam", {}, later_best, "");
  EXPECT_EQ(read_checkpoint(path).progress.best_epoch, 2);

  // The interrupted epoch's sums, the 0/1 attributes and the class names are checked as the counters are:
  // edited values printed an accuracy of 2.8e27 or named two classes with one name.
  const auto sums = [&](double loss_sum, double correct, double count) {
    TrainingProgress p;
    p.loss_sum = loss_sum;
    p.correct = correct;
    p.count = count;
    write_checkpoint(path, shape, params, "adam", {}, p, "");
  };
  sums(12.5, 3, 8);
  EXPECT_EQ(read_checkpoint(path).progress.correct, 3);
  for (const auto& [loss_sum, correct, count] :
       {std::tuple{12.5, 9.0, 8.0}, std::tuple{12.5, 1e30, 8.0}, std::tuple{12.5, 2.5, 8.0},
        std::tuple{-1.0, 3.0, 8.0}, std::tuple{std::nan(""), 3.0, 8.0}, std::tuple{1.0, 3.0, std::nan("")},
        std::tuple{1.0, -1.0, 8.0}, std::tuple{HUGE_VAL, 3.0, 8.0}}) {
    sums(loss_sum, correct, count);
    expect_refused("are not the sums of an epoch");
  }

  // An edit made on purpose drops the header's checksum, as the refusal of an edit says to.
  const auto set_int = [&](const char* name, int64_t value, bool keep_checksum = false) {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    if (!keep_checksum) H5Adelete(file, "header_checksum");
    H5Adelete(file, name);
    const hid_t space = H5Screate(H5S_SCALAR);
    const hid_t attr = H5Acreate2(file, name, H5T_STD_I64LE, space, H5P_DEFAULT, H5P_DEFAULT);
    EXPECT_GE(H5Awrite(attr, H5T_NATIVE_INT64, &value), 0);
    H5Aclose(attr);
    H5Sclose(space);
    H5Fclose(file);
  };
  for (const char* flag : {"mask_padding", "bidirectional"}) {
    write_checkpoint(path, shape, params, "adam", {}, TrainingProgress{}, "");
    set_int(flag, 5);
    expect_refused(std::string(flag) + " = 5 is not 0 or 1");
  }
  // A counter changed in a way no range check can see (a flipped bit: step 0 became 2^32) is caught by the
  // checksum over the root's attributes; without that checksum (an edit, or a checkpoint of before) it reads.
  write_checkpoint(path, shape, params, "adam", {}, TrainingProgress{}, "");
  set_int("step_in_epoch", int64_t{1} << 32, /*keep_checksum=*/true);
  expect_refused("attributes (model dimensions, progress, run) do not match the checksum written with them");
  set_int("step_in_epoch", int64_t{1} << 32);
  EXPECT_EQ(read_checkpoint(path).progress.step_in_epoch, int64_t{1} << 32);

  RunRecord run;
  run.class_names = {"neg", "pos"};
  write_checkpoint(path, shape, params, "adam", {}, TrainingProgress{}, "", run);
  EXPECT_EQ(read_checkpoint(path).run.class_names, run.class_names);
  models::ModelShape three = shape;
  three.classes = 3;
  const std::vector<float> three_params(models::ParamLayout(three).total_size(), 0.5f);
  write_checkpoint(path, three, three_params, "adam", {}, TrainingProgress{}, "", run);
  expect_refused("/classes names 2 classes, not the model's 3");
  run.class_names = {"a", "b", "c", "d"};
  write_checkpoint(path, three, three_params, "adam", {}, TrainingProgress{}, "", run);
  expect_refused("/classes names more classes, not the model's 3");
}

// A value changed on disk after the write (a torn copy, a bad sector) is caught by the checksum written with
// the values, in the parameters and in the optimizer's state, instead of resuming as garbage; a checkpoint
// from before the checksum (none beside its values) still reads.
TEST(Checkpoint, DamagedValuesAreUserErrors) {
  TempDir dir;
  const models::ModelShape shape{30, 4, 3, 1};
  const std::size_t total = models::ParamLayout(shape).total_size();
  std::vector<float> params(total);
  for (std::size_t i = 0; i < total; ++i) params[i] = 0.01f * static_cast<float>(i);
  OptimizerState state;
  state.iterations = 3;
  state.buffers = {{"m", params}, {"v", params}};
  const std::string path = dir.file("last.h5");
  // Rewrites one value of `dataset` in place, or (`drop_checksum`) removes the checksum beside it.
  const auto tamper = [&](const char* dataset, bool drop_checksum) {
    const hid_t file = H5Fopen(path.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
    ASSERT_GE(file, 0);
    const hid_t set = H5Dopen2(file, dataset, H5P_DEFAULT);
    ASSERT_GE(set, 0);
    if (drop_checksum) {
      EXPECT_GE(H5Adelete(set, "checksum"), 0);
    } else {
      std::vector<float> values = params;
      values[7] = std::nextafter(values[7], 1.0f);  // one bit
      EXPECT_GE(H5Dwrite(set, H5T_NATIVE_FLOAT, H5S_ALL, H5S_ALL, H5P_DEFAULT, values.data()), 0);
    }
    H5Dclose(set);
    H5Fclose(file);
  };
  for (const char* dataset : {"params", "optimizer/v"}) {
    write_checkpoint(path, shape, params, "adam", state, TrainingProgress{}, "");
    EXPECT_EQ(read_checkpoint(path).params, params);
    tamper(dataset, false);
    try {
      read_checkpoint(path);
      ADD_FAILURE() << dataset << ": no error";
    } catch (const UserError& e) {
      EXPECT_NE(std::string(e.what()).find("is damaged"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
    tamper(dataset, true);
    EXPECT_NO_THROW(read_checkpoint(path)) << dataset << " without its checksum";
  }
  // Without a checksum the values must at least be numbers (a NaN loaded silently and predicted NaN); with
  // one, a run that diverged is read back as it was written.
  std::vector<float> diverged = params;
  diverged[5] = std::numeric_limits<float>::quiet_NaN();
  write_checkpoint(path, shape, diverged, "adam", state, TrainingProgress{}, "");
  EXPECT_TRUE(std::isnan(read_checkpoint(path).params[5]));
  tamper("params", true);
  expect_user_error([&] { read_checkpoint(path); }, {path, "params", "not finite"});
}

TEST(Checkpoint, ForeignFilesAreUserErrors) {
  TempDir dir;
  EXPECT_THROW(read_checkpoint(dir.file("missing.h5")), UserError);
  const std::string text = write_text(dir, "text.h5", "not hdf5");
  try {
    read_checkpoint(text);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find(text), std::string::npos);
  }
}

TEST(Metrics, EpochLineAndJson) {
  EpochMetrics m;
  m.epoch = 3;
  m.epochs = 15;
  m.steps = 782;
  m.epoch_time_s = 18.23;
  m.step_time_ms = 0.73;
  m.loss = 0.2127;
  m.acc = 0.9186;
  m.val_loss = 0.4426;
  m.val_acc = 0.8319;
  m.world_size = 2;
  m.backend = "mpi";
  EXPECT_EQ(format_epoch_line(m),
            "Epoch 3/15 - 782 steps - 18.2s - 0.73ms/step - loss: 0.2127 - acc: 0.9186 - val_loss: 0.4426 - "
            "val_acc: 0.8319");
  const nlohmann::json line = nlohmann::json::parse(to_json(m));
  EXPECT_EQ(line["epoch"], 3);
  EXPECT_EQ(line["loss"], 0.2127);
  EXPECT_EQ(line["acc"], 0.9186);
  EXPECT_EQ(line["val_loss"], 0.4426);
  EXPECT_EQ(line["val_acc"], 0.8319);
  EXPECT_EQ(line["epoch_time_s"], 18.23);
  EXPECT_EQ(line["step_time_ms"], 0.73);
  EXPECT_TRUE(line.contains("samples_per_s"));
  EXPECT_EQ(line["world_size"], 2);
  EXPECT_EQ(line["backend"], "mpi");
  EXPECT_FALSE(line.contains("gpu_util"));
  EXPECT_FALSE(line.contains("not_finite"));
}

// JSON has no NaN: a diverged loss is null, and "not_finite" says what it was, so the curves read it back.
TEST(Metrics, ADivergedLossIsNullAndSaysWhy) {
  EpochMetrics m;
  m.epoch = 2;
  m.loss = std::numeric_limits<double>::quiet_NaN();
  m.val_loss = std::numeric_limits<double>::infinity();
  const std::string text = to_json(m);
  EXPECT_EQ(text.find("nan"), text.find("\"nan\"") + 1) << "only as a string: " << text;
  const nlohmann::json line = nlohmann::json::parse(text);
  EXPECT_TRUE(line["loss"].is_null());
  EXPECT_TRUE(line["val_loss"].is_null());
  EXPECT_EQ(line["not_finite"], (nlohmann::json{{"loss", "nan"}, {"val_loss", "inf"}}));
  EXPECT_TRUE(std::isnan(json::number_at(line, "loss")));
  EXPECT_EQ(json::number_at(line, "val_loss"), std::numeric_limits<double>::infinity());
  EXPECT_EQ(json::number_at(line, "acc"), 0.0);
  EXPECT_TRUE(std::isnan(json::number_at(line, "no such key")));
  // On the console too, a NaN with its sign bit set (as a diverged sum often is) reads "nan", not "-nan".
  m.loss = -std::numeric_limits<double>::quiet_NaN();
  const std::string console = format_epoch_line(m);
  EXPECT_NE(console.find("- loss: nan -"), std::string::npos) << console;
  EXPECT_EQ(console.find("-nan"), std::string::npos) << console;
}

TEST(Metrics, SayWhichRunWhenAndOnWhatRows) {
  EpochMetrics m;
  m.run_id = "20261123T204512Z-3f9a";
  m.time = "2026-11-23T20:45:12Z";
  m.epoch = 2;
  m.epochs = 3;
  m.steps = 300;
  m.steps_run = 200;  // resumed at step 100
  m.epoch_time_s = 7.0;
  m.step_time_ms = 35.0;
  m.held_out = "test";  // data.validation = test
  const std::string line = format_epoch_line(m);
  EXPECT_NE(line.find("300 steps (200 after resuming)"), std::string::npos) << line;
  EXPECT_NE(line.find("test_loss: "), std::string::npos) << line;
  EXPECT_EQ(line.find("val_"), std::string::npos) << line;
  const nlohmann::json json_line = nlohmann::json::parse(to_json(m));
  EXPECT_EQ(json_line["run_id"], "20261123T204512Z-3f9a");
  EXPECT_EQ(json_line["time"], "2026-11-23T20:45:12Z");
  EXPECT_EQ(json_line["steps_run"], 200);
  EXPECT_TRUE(json_line.contains("test_loss") && json_line.contains("test_acc")) << json_line;
  EXPECT_FALSE(json_line.contains("val_loss")) << json_line;

  TestMetrics t;
  t.run_id = m.run_id;
  t.best_epoch = 4;
  t.test_loss = 0.35714;
  t.test_acc = 0.84681;
  t.samples = 25000;
  EXPECT_EQ(format_test_line(t),
            "Test (best.h5, epoch 4) - test_loss: 0.3571 - test_acc: 0.8468 (25000 samples)");
  const nlohmann::json test_line = nlohmann::json::parse(to_json(t));
  EXPECT_EQ(test_line["event"], "test");
  EXPECT_EQ(test_line["test_loss"], 0.35714);
  EXPECT_FALSE(test_line.contains("epoch")) << "curves would take it for an epoch";
}

}  // namespace
}  // namespace ddp::engine

namespace ddp {
namespace {

TEST(FatalErrors, EndTheProcessWithTheMessage) {
  EXPECT_EXIT(DDP_CHECK(1 + 1 == 3), ::testing::ExitedWithCode(kExitInternalError),
              "ddptrain: fatal: check failed: 1 \\+ 1 == 3 \\(.*engine_test.cpp:[0-9]+, host .*, rank .*\\)");
}

TEST(FatalErrors, NameTheLaunchersRankBeforeMpiStarts) {
  // The watchdog may end a rank that waits in MPI_Init: MPI cannot say its rank yet, its launcher can.
  const char* saved = std::getenv("OMPI_COMM_WORLD_RANK");
  const std::string previous = saved != nullptr ? saved : "";
  ::setenv("OMPI_COMM_WORLD_RANK", "3", 1);
  EXPECT_EXIT(DDP_FATAL("stalled"), ::testing::ExitedWithCode(kExitInternalError),
              "ddptrain: fatal: stalled \\(.*, host .*, rank 3\\)");
  if (saved != nullptr) {
    ::setenv("OMPI_COMM_WORLD_RANK", previous.c_str(), 1);
  } else {
    ::unsetenv("OMPI_COMM_WORLD_RANK");
  }
}

// A rank stuck in MPI_Finalize leaves without MPI: its stdout (the run's last lines) is flushed, the reason
// and the launcher's rank go to stderr, and the exit status is the one given.
TEST(FatalErrors, LeavingWithoutFinalizingKeepsTheOutputAndTheStatus) {
  const std::string output = ::testing::TempDir() + "leaving_without_finalizing.txt";
  std::remove(output.c_str());
  EXPECT_EXIT(
      {
        if (std::freopen(output.c_str(), "w", stdout) == nullptr) std::abort();
        std::printf("the run's result\n");  // buffered: stdout is a file
        leave_without_finalizing("waited in MPI_Finalize", kExitPreempted);
      },
      ::testing::ExitedWithCode(kExitPreempted),
      "ddptrain: error: waited in MPI_Finalize; leaving without MPI, so that the launcher ends the job "
      "\\(host "
      ".*, rank .*\\)");
  std::ifstream written(output);
  std::string line;
  std::getline(written, line);
  EXPECT_EQ(line, "the run's result");
  std::remove(output.c_str());
}

TEST(FatalErrors, ThrowWhileAScopeAsksForIt) {
  {
    const ThrowFatalErrors outer;
    {
      const ThrowFatalErrors inner;
      EXPECT_THROW(DDP_FATAL("inner"), FatalError);
    }
    try {
      DDP_CHECK(1 + 1 == 3);
      ADD_FAILURE() << "DDP_CHECK did not throw";
    } catch (const FatalError& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.rfind("check failed: 1 + 1 == 3 (", 0), 0u) << what;
      EXPECT_NE(what.find("engine_test.cpp:"), std::string::npos) << what;
    }
  }
  // Outside every scope it ends the process again.
  EXPECT_EXIT(DDP_FATAL("after"), ::testing::ExitedWithCode(kExitInternalError), "ddptrain: fatal: after");
}

}  // namespace
}  // namespace ddp

// --- Every rank runs one job (engine/job_agreement.h)
// ---------------------------------------------------------

namespace ddp::engine {
namespace {

TEST(JobAgreement, TheJobWideSettingsLeaveOutWhatANodeMaySetForItself) {
  Config config;
  const std::vector<std::string> lines = job_wide_settings(config);
  const auto has = [&](const std::string& key) {
    return std::any_of(lines.begin(), lines.end(),
                       [&](const std::string& l) { return l.starts_with(key + " = "); });
  };
  // Every key that decides whether a rank joins a collective is job-wide, or ranks would wait for each other:
  // the self-check's NCCL average check, the timeline's barrier and gather, checkpoints every N steps, the
  // backend and its layout, a stop after N steps.
  for (const char* shared :
       {"model.hidden", "train.learning_rate", "train.seed", "comm.backend", "comm.compression",
        "comm.overlap", "comm.selfcheck", "comm.ps_servers", "data.validation", "checkpoint.every_steps",
        "train.stop_after_steps", "log.timeline"})
    EXPECT_TRUE(has(shared)) << shared;
  for (const char* per_node : {"device", "data.path", "train.threads", "train.straggle_ms", "comm.timeout_s",
                               "checkpoint.dir", "log.progress", "model.cpu_kernels"})
    EXPECT_FALSE(has(per_node)) << per_node;
}

TEST(JobAgreement, NamesTheFirstRankAndKeyThatDiffer) {
  Config config;
  const JobDescription rank0 = describe_job(config, "node1", "train 64, content aa");
  EXPECT_EQ(first_disagreement({rank0, rank0, rank0}), "");
  EXPECT_EQ(first_disagreement({rank0}), "");

  Config other_node = config;
  other_node.train.threads = 3;
  other_node.data.path = "/local/copy.h5";
  EXPECT_EQ(first_disagreement({rank0, describe_job(other_node, "node2", "train 64, content aa")}), "");

  Config faster = config;
  faster.train.learning_rate = 0.5;
  const std::string rate =
      first_disagreement({rank0, rank0, describe_job(faster, "node3", "train 64, content aa")});
  EXPECT_EQ(
      rate.find("the ranks were not given one job: rank 2 (host node3) has train.learning_rate = 0.5, rank 0 "
                "(host node1) 0.001;"),
      0u)
      << rate;

  Config elsewhere = config;
  elsewhere.data.path = "other.h5";
  const std::string data =
      first_disagreement({rank0, describe_job(elsewhere, "node2", "train 64, content bb")});
  EXPECT_NE(data.find("rank 1 (host node2) reads other data than rank 0 (host node1): data.path other.h5 "
                      "(train 64, content bb) against " +
                      config.data.path + " (train 64, content aa)"),
            std::string::npos)
      << data;

  JobDescription older = rank0;
  older.lines.front() = "ddptrain = 0.1 (commit 0000000)";
  const std::string version = first_disagreement({rank0, older});
  EXPECT_NE(version.find("rank 1 (host node1) has ddptrain = 0.1 (commit 0000000)"), std::string::npos)
      << version;
  older.lines.pop_back();
  older.lines.front() = rank0.lines.front();
  const std::string fewer = first_disagreement({rank0, older});
  EXPECT_NE(fewer.find("runs another ddptrain than rank 0"), std::string::npos) << fewer;
}

}  // namespace
}  // namespace ddp::engine

namespace ddp::engine {
namespace {

// The epoch's parameter checksum tells replicas apart by a single bit (0.0 and -0.0 too), and names the
// first rank that differs from rank 0.
TEST(ParametersChecksum, DiffersInOneBitAndNamesTheFirstOtherRank) {
  std::vector<float> params{0.5f, -1.25f, 0.0f, 3e-8f};
  const std::string checksum = parameters_checksum(params);
  EXPECT_EQ(checksum.size(), 16u);
  EXPECT_EQ(parameters_checksum(std::vector<float>(params)), checksum);
  std::vector<float> other = params;
  other[2] = -0.0f;
  EXPECT_NE(parameters_checksum(other), checksum);
  other = params;
  other[3] = std::nextafter(other[3], 1.0f);
  EXPECT_NE(parameters_checksum(other), checksum);
  EXPECT_EQ(first_other_checksum({checksum, checksum, checksum}), std::nullopt);
  EXPECT_EQ(first_other_checksum({checksum, checksum, "x", "y"}), std::optional<std::size_t>(2));
  EXPECT_EQ(first_other_checksum({checksum}), std::nullopt);
}

}  // namespace
}  // namespace ddp::engine
