// Every rank checks, before anything whose sizes depend on the config or the data, that it runs the job rank
// 0 runs. A per-node config file, a per-node DDPTRAIN_EXTRA_ARGS or a stale binary on one node would
// otherwise give one rank another learning rate (replicas that silently diverge), another model (collectives
// of other sizes: MPI_ERR_TRUNCATE, or an abort in the parameter server) or another data file of the same
// shapes (each rank training on other rows).
#pragma once

#include <string>
#include <vector>

#include "comm/host_group.h"
#include "engine/config.h"

namespace ddp::engine {

// What a rank runs: the program's version and commit, job_wide_settings(config), and the data's fingerprint
// (io::dataset_fingerprint: its splits, vocabulary, maxlen and a hash of sampled rows, wherever its file is).
struct JobDescription {
  std::string host;
  std::string data_path;
  std::vector<std::string> lines;  // "key = value"
};

JobDescription describe_job(const Config& config, const std::string& host,
                            const std::string& data_fingerprint);

// "" when every description's lines equal the first's (rank 0's), else one line naming the first rank that
// differs with its host, the first key that does, and both values.
std::string first_disagreement(const std::vector<JobDescription>& ranks);

// Collective over `comm`: gathers every rank's description on rank 0, which compares them; throws the
// disagreement as a UserError on every rank.
void require_one_job(comm::HostGroup& comm, const JobDescription& mine);

}  // namespace ddp::engine
