// What a run writes and what a message quotes: the run directory's outputs checked before training, best.h5
// copied the way last.h5 is written (never over a link's target, never half), messages kept to one line of
// bounded length, and sizes from outside refused against the node's memory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "engine/base/errors.h"
#include "engine/base/memory_limit.h"
#include "engine/checkpoint.h"
#include "engine/run_directory.h"
#include "models/param_layout.h"
#include "tests/test_util.h"

namespace ddp::engine {
namespace {

namespace fs = std::filesystem;
using ddp::testing::expect_user_error;
using ddp::testing::TempDir;

std::string bytes_of(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// No file the run replaces or appends to, nor a checkpoint's PATH.tmp, may be a directory: one there failed
// the run after its first epoch, or left it unable to write best.h5.
TEST(RunOutputs, ADirectoryWhereTheRunWritesAFileIsRefusedBeforeTraining) {
  for (const char* name : {"last.h5", "best.h5", "metrics.jsonl", "curves.svg", "last.h5.tmp", "best.h5.tmp",
                           "curves.svg.tmp"}) {
    TempDir dir;
    RunFiles files{dir.file("run")};
    fs::create_directories(files.dir / name);
    expect_user_error([&] { claim_run_directory(files, "auto", false); },
                      {(files.dir / name).string(), "not a plain file (a directory)"});
  }
  TempDir dir;
  RunFiles files{dir.file("run")};
  fs::create_directories(files.dir);
  write_bytes(files.last() + ".tmp", "a stale partial write");  // a plain stale file is overwritten later
  EXPECT_FALSE(claim_run_directory(files, "auto", false));
}

// A run killed before its first checkpoint leaves only its log: --resume auto (a requeued batch job) starts
// afresh beside it; a plain new run is still refused, without advice to resume what cannot be resumed; with
// best.h5 there the log is of a run worth keeping, refused as before.
TEST(RunOutputs, ALogWithoutACheckpointIsNoRunToResume) {
  TempDir dir;
  RunFiles files{dir.file("run")};
  fs::create_directories(files.dir);
  write_bytes(files.metrics(), "{\"run_id\":\"a\",\"epoch\":1}\n");
  write_bytes(files.curves(), "<svg/>");
  EXPECT_FALSE(claim_run_directory(files, "auto", false));
  EXPECT_EQ(bytes_of(files.metrics()), "{\"run_id\":\"a\",\"epoch\":1}\n");  // kept, to be appended to
  try {
    claim_run_directory(files, "no", false);
    FAIL() << "a new run over another run's log";
  } catch (const UserError& e) {
    EXPECT_EQ(std::string(e.what()).find("--resume"), std::string::npos) << e.what();
  }
  // Two epochs' lines, or a test line: that run had checkpoints (deleted since): its log is not taken over.
  write_bytes(files.metrics(), "{\"run_id\":\"a\",\"epoch\":1}\n{\"run_id\":\"a\",\"epoch\":2}\n");
  expect_user_error([&] { claim_run_directory(files, "auto", false); }, {"holds another run (metrics.jsonl"});
  write_bytes(files.metrics(), "{\"run_id\":\"a\",\"epoch\":1}\n{\"run_id\":\"a\",\"event\":\"test\"}\n");
  expect_user_error([&] { claim_run_directory(files, "auto", false); }, {"holds another run (metrics.jsonl"});
  write_bytes(files.metrics(), "{\"run_id\":\"a\",\"epoch\":1}\n");
  write_bytes(files.best(), "a best model");
  expect_user_error([&] { claim_run_directory(files, "auto", false); }, {"holds another run (best.h5"});
}

// A second run in a directory while the first still holds it is refused, naming the holder; once the first
// lets go the directory can be taken again.
TEST(RunOutputs, OneRunAtATimeHoldsTheDirectory) {
  TempDir dir;
  RunFiles files{dir.file("run")};
  fs::create_directories(files.dir);
  {
    RunDirectoryLock first(files);
    expect_user_error([&] { RunDirectoryLock second(files); },
                      {"checkpoint.dir = " + files.dir.string(), "another run is using this directory",
                       "(pid " + std::to_string(::getpid()) + " on host "});
  }
  RunDirectoryLock again(files);
}

TEST(RunOutputs, BestCheckpointIsCopiedThroughATemporaryFileAndNeverThroughALink) {
  TempDir dir;
  const models::ModelShape shape{20, 3, 2, 1};
  const std::vector<float> params(models::ParamLayout(shape).total_size(), 0.25f);
  const std::string last = dir.file("last.h5");
  const std::string best = dir.file("best.h5");
  write_checkpoint(last, shape, params, "adam", {}, TrainingProgress{}, "");

  // best.h5 a link to another file (a dataset, say): the link is replaced, its target left alone.
  const std::string victim = dir.file("data.h5");
  write_bytes(victim, "the user's dataset");
  fs::create_symlink(victim, best);
  fs::create_symlink(victim, best + ".tmp");
  copy_checkpoint(last, best);
  EXPECT_EQ(bytes_of(victim), "the user's dataset");
  EXPECT_FALSE(fs::is_symlink(best));
  EXPECT_EQ(bytes_of(best), bytes_of(last));
  EXPECT_FALSE(fs::exists(best + ".tmp"));
  EXPECT_EQ(read_checkpoint(best).params, params);

  // A copy that fails leaves the old best.h5 whole and no temporary file behind.
  const std::string before = bytes_of(best);
  expect_user_error([&] { copy_checkpoint(dir.file("missing.h5"), best); }, {best + ".tmp", "is unchanged"});
  EXPECT_EQ(bytes_of(best), before);
  EXPECT_FALSE(fs::exists(best + ".tmp"));
}

TEST(OneLine, EscapesControlCharactersAndCutsWhatIsLong) {
  EXPECT_EQ(one_line("a\nb\x01"), "a\\nb\\x01");
  const std::string value(10'000'000, 'x');
  const std::string message = "train.lr_schedule = " + value + ": expected constant";
  const std::string line = UserError(message).what();
  EXPECT_LT(line.size(), 2100u);
  EXPECT_NE(line.find("... (" + std::to_string(message.size()) + " bytes in all)"), std::string::npos)
      << line.substr(line.size() - 60);
  EXPECT_EQ(line.rfind("train.lr_schedule = xxx", 0), 0u);
}

TEST(MemoryLimit, SizesPastTheNodeAreRefusedNamingWhatAskedForThem) {
  const double memory = node_memory_bytes();
  if (memory <= 0) GTEST_SKIP() << "this system does not report its physical memory";
  EXPECT_NO_THROW(require_node_memory(memory / 4, "a quarter"));
  expect_user_error([&] { require_node_memory(memory * 2, "x.h5: dataset params"); },
                    {"x.h5: dataset params needs", "GB, more than this node's"});
}

}  // namespace
}  // namespace ddp::engine
