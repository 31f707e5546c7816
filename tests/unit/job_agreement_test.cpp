// Every rank runs one job (engine/job_agreement.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/config.h"
#include "engine/job_agreement.h"

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
        "comm.overlap", "comm.hierarchy", "comm.selfcheck", "comm.ps_servers", "data.validation",
        "checkpoint.every_steps", "train.stop_after_steps", "log.timeline"})
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
