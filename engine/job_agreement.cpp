#include "engine/job_agreement.h"

#include <cstddef>
#include <sstream>

#include "engine/base/build_info.h"
#include "engine/base/errors.h"

namespace ddp::engine {
namespace {

constexpr const char* kDataKey = "data";

// The text a rank sends: host, data path, then the lines, one per line (none holds a newline: values that
// do are refused by the config's parser, and the fingerprint is one line).
std::string to_text(const JobDescription& d) {
  std::string text = d.host + "\n" + d.data_path + "\n";
  for (const std::string& line : d.lines) text += line + "\n";
  return text;
}

JobDescription from_text(const std::string& text) {
  JobDescription d;
  std::istringstream in(text);
  std::getline(in, d.host);
  std::getline(in, d.data_path);
  for (std::string line; std::getline(in, line);) d.lines.push_back(line);
  return d;
}

// "train.learning_rate = 0.01" -> ("train.learning_rate", "0.01").
std::pair<std::string, std::string> split_line(const std::string& line) {
  const std::size_t eq = line.find(" = ");
  if (eq == std::string::npos) return {line, ""};
  return {line.substr(0, eq), line.substr(eq + 3)};
}

}  // namespace

JobDescription describe_job(const Config& config, const std::string& host,
                            const std::string& data_fingerprint) {
  JobDescription d;
  d.host = host;
  d.data_path = config.data.path;
  d.lines.push_back(std::string("ddptrain = ") + DDPTRAIN_VERSION + " (commit " + build_commit() + ")");
  for (std::string& line : job_wide_settings(config)) d.lines.push_back(std::move(line));
  d.lines.push_back(std::string(kDataKey) + " = " + data_fingerprint);
  return d;
}

std::string first_disagreement(const std::vector<JobDescription>& ranks) {
  if (ranks.empty()) return "";
  const JobDescription& first = ranks.front();
  const std::string rank0 = "rank 0 (host " + first.host + ")";
  for (std::size_t r = 1; r < ranks.size(); ++r) {
    const JobDescription& other = ranks[r];
    const std::string this_rank = "rank " + std::to_string(r) + " (host " + other.host + ")";
    for (std::size_t i = 0; i < std::max(first.lines.size(), other.lines.size()); ++i) {
      const std::string mine = i < first.lines.size() ? first.lines[i] : "";
      const std::string theirs = i < other.lines.size() ? other.lines[i] : "";
      if (mine == theirs) continue;
      const auto [key, value0] = split_line(mine);
      const auto [other_key, value] = split_line(theirs);
      std::string what;
      if (key == kDataKey && other_key == kDataKey) {
        what = this_rank + " reads other data than " + rank0 + ": data.path " + other.data_path + " (" +
               value + ") against " + first.data_path + " (" + value0 + ")";
      } else if (key != other_key) {
        what = this_rank + " runs another ddptrain than " + rank0 +
               " (its settings differ in name: " + (theirs.empty() ? "none" : theirs) + " against " +
               (mine.empty() ? "none" : mine) + ")";
      } else {
        what = this_rank + " has " + key + " = " + value + ", " + rank0 + " " + value0;
      }
      return "the ranks were not given one job: " + what +
             "; every rank must run the same ddptrain with the same settings on the same data (only device, "
             "data.path, data.prefetch, data.validate, model.cpu_kernels, model.cudnn_rnn_algo, "
             "train.threads, train.straggle_ms, comm.timeout_s, checkpoint.* but checkpoint.every_steps, "
             "log.progress and log.interval may differ between ranks)";
    }
  }
  return "";
}

void require_one_job(comm::HostGroup& comm, const JobDescription& mine) {
  const std::vector<std::string> texts = comm.gather(to_text(mine), 0);
  comm::agree_on_errors(comm, [&] {
    if (comm.rank() != 0) return;
    std::vector<JobDescription> ranks;
    for (const std::string& text : texts) ranks.push_back(from_text(text));
    if (const std::string problem = first_disagreement(ranks); !problem.empty()) throw UserError(problem);
  });
}

}  // namespace ddp::engine
