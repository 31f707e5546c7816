#include "comm/stall_census.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <thread>

#include "comm/mpi_check.h"

namespace ddp::comm {

namespace {

constexpr int kNoticeTag = 1;
constexpr int kErrorTag = 2;
constexpr std::size_t kHostBytes = 256;
constexpr std::size_t kPhaseBytes = 512;  // a phase names a file: longer ones are cut
// How long a rank that does not speak waits for the one that does to end the job, past the listening.
constexpr auto kSpeakerGrace = std::chrono::seconds(15);

// "1", "0, 2", "0-3, 5": ranks in increasing order, runs as ranges.
std::string rank_list(const std::vector<int>& ranks) {
  std::string text;
  for (std::size_t i = 0; i < ranks.size();) {
    std::size_t end = i;
    while (end + 1 < ranks.size() && ranks[end + 1] == ranks[end] + 1) ++end;
    if (!text.empty()) text += ", ";
    text += end == i ? std::to_string(ranks[i]) : fmt::format("{}-{}", ranks[i], ranks[end]);
    i = end + 1;
  }
  return text;
}

std::string ranks_named(const std::vector<int>& ranks) {
  return (ranks.size() == 1 ? "rank " : "ranks ") + rank_list(ranks);
}

// "host a" or "hosts a, b, c and 5 more": the distinct hosts of `ranks`, in rank order.
std::string hosts_of(const std::vector<int>& ranks, const std::vector<std::string>& hosts) {
  constexpr std::size_t kNamed = 4;
  std::vector<std::string> distinct;
  for (const int rank : ranks) {
    const std::string& host = static_cast<std::size_t>(rank) < hosts.size() ? hosts[rank] : "?";
    if (std::find(distinct.begin(), distinct.end(), host) == distinct.end()) distinct.push_back(host);
  }
  std::string text = distinct.size() == 1 ? "host " : "hosts ";
  for (std::size_t i = 0; i < distinct.size() && i < kNamed; ++i) text += (i ? ", " : "") + distinct[i];
  if (distinct.size() > kNamed) text += fmt::format(" and {} more", distinct.size() - kNamed);
  return text;
}

std::string doing(const StallFacts::Report& r) {
  return r.steps_done > 0 ? fmt::format("{} (steps done: {})", r.phase, r.steps_done) : r.phase;
}

}  // namespace

std::string describe_stall(const StallFacts& facts, int speaker) {
  std::vector<bool> heard(static_cast<std::size_t>(facts.world_size), false);
  const StallFacts::Report* own = nullptr;
  for (const StallFacts::Report& r : facts.stalled) {
    heard[static_cast<std::size_t>(r.rank)] = true;
    if (r.rank == speaker) own = &r;
  }
  std::vector<int> silent;
  std::vector<int> waiting;
  for (int rank = 0; rank < facts.world_size; ++rank) (heard[rank] ? waiting : silent).push_back(rank);

  std::string text;
  if (!silent.empty()) {
    const bool one = silent.size() == 1;
    text = fmt::format(
        "{} ({}) {} hung, lost or slower than the timeout: {} did not answer the stalled {} within {:.1f} s",
        ranks_named(silent), hosts_of(silent, facts.hosts), one ? "is" : "are", one ? "it" : "they",
        ranks_named(waiting), facts.listened_s);
    // A stalled rank busy with something else than the speaker (a read that never returns) is worth naming.
    for (const StallFacts::Report& r : facts.stalled) {
      if (own != nullptr && r.phase != own->phase) text += fmt::format("; rank {} was {}", r.rank, doing(r));
    }
    return text;
  }
  // Every rank stalled: nobody is missing, so say what each was doing, ranks with the same phase together.
  std::map<std::string, std::vector<int>> by_phase;
  for (const StallFacts::Report& r : facts.stalled) by_phase[doing(r)].push_back(r.rank);
  text = "every rank stalled (none failed to answer)";
  if (by_phase.size() == 1) return text + ", all while the same thing";
  for (const auto& [phase, ranks] : by_phase) text += fmt::format("; {} while {}", ranks_named(ranks), phase);
  return text;
}

StallCensus::StallCensus(MPI_Comm world) {
  DDP_CHECK_MPI(MPI_Comm_dup(world, &comm_));
  DDP_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  DDP_CHECK_MPI(MPI_Comm_size(comm_, &size_));
  std::vector<char> mine(kHostBytes, '\0');
  const std::string host = host_name();
  std::memcpy(mine.data(), host.data(), std::min(host.size(), kHostBytes - 1));
  std::vector<char> all(kHostBytes * static_cast<std::size_t>(size_));
  DDP_CHECK_MPI(MPI_Allgather(mine.data(), static_cast<int>(kHostBytes), MPI_CHAR, all.data(),
                              static_cast<int>(kHostBytes), MPI_CHAR, comm_));
  for (int rank = 0; rank < size_; ++rank) hosts_.emplace_back(all.data() + kHostBytes * rank);
}

bool StallCensus::tell_every_rank(const void* data, int count, MPI_Datatype type, int tag) {
  for (int rank = 0; rank < size_; ++rank) {
    if (rank == rank_) continue;
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Isend(data, count, type, rank, tag, comm_, &request) != MPI_SUCCESS) return false;
    sends_.push_back(request);  // never waited for: the job ends before they matter
  }
  return true;
}

std::string StallCensus::survey(const std::string& phase, int64_t steps_done,
                                std::chrono::milliseconds listen) {
  if (size_ == 1) return "this rank, the job's only one, is stuck";
  if (!mpi_thread_multiple()) return "";
  // The notice: the steps done, then the phase.
  notice_.assign(sizeof(int64_t), '\0');
  std::memcpy(notice_.data(), &steps_done, sizeof steps_done);
  notice_.insert(notice_.end(), phase.begin(), phase.begin() + std::min(phase.size(), kPhaseBytes));
  if (!tell_every_rank(notice_.data(), static_cast<int>(notice_.size()), MPI_CHAR, kNoticeTag)) return "";

  StallFacts facts;
  facts.world_size = size_;
  facts.hosts = hosts_;
  facts.stalled.push_back({rank_, phase, steps_done});
  const auto start = std::chrono::steady_clock::now();
  std::vector<char> received(sizeof(int64_t) + kPhaseBytes);
  while (facts.stalled.size() < static_cast<std::size_t>(size_) &&
         std::chrono::steady_clock::now() - start < listen) {
    int arrived = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kNoticeTag, comm_, &arrived, &status) != MPI_SUCCESS) return "";
    if (!arrived) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    int bytes = 0;
    MPI_Get_count(&status, MPI_CHAR, &bytes);
    if (bytes < static_cast<int>(sizeof(int64_t)) || bytes > static_cast<int>(received.size()) ||
        MPI_Recv(received.data(), bytes, MPI_CHAR, status.MPI_SOURCE, kNoticeTag, comm_, MPI_STATUS_IGNORE) !=
            MPI_SUCCESS) {
      return "";
    }
    StallFacts::Report report{
        status.MPI_SOURCE,
        std::string(received.data() + sizeof(int64_t), static_cast<std::size_t>(bytes) - sizeof(int64_t)), 0};
    std::memcpy(&report.steps_done, received.data(), sizeof(int64_t));
    facts.stalled.push_back(std::move(report));
  }
  facts.listened_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::sort(facts.stalled.begin(), facts.stalled.end(),
            [](const StallFacts::Report& a, const StallFacts::Report& b) { return a.rank < b.rank; });
  const int speaker = facts.stalled.front().rank;
  // Another rank speaks for the job and ends it; this one says its own words only if that never happens.
  if (speaker != rank_) std::this_thread::sleep_for(listen + kSpeakerGrace);
  return describe_stall(facts, speaker);
}

bool StallCensus::first_to_speak(std::chrono::milliseconds listen) {
  if (size_ == 1 || !mpi_thread_multiple()) return true;
  if (!tell_every_rank(&error_notice_, 1, MPI_INT, kErrorTag)) return true;
  const auto start = std::chrono::steady_clock::now();
  while (std::chrono::steady_clock::now() - start < listen) {
    int arrived = 0;
    MPI_Status status;
    if (MPI_Iprobe(MPI_ANY_SOURCE, kErrorTag, comm_, &arrived, &status) != MPI_SUCCESS) return true;
    if (arrived && status.MPI_SOURCE < rank_) return false;
    if (arrived) {
      int ignored = 0;
      if (MPI_Recv(&ignored, 1, MPI_INT, status.MPI_SOURCE, kErrorTag, comm_, MPI_STATUS_IGNORE) !=
          MPI_SUCCESS)
        return true;
      continue;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return true;
}

}  // namespace ddp::comm
