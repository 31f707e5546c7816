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
constexpr int kAnswerTag = 3;
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

// "rank 0 while writing x (last progress 4.1 s ago); ranks 2-3 while training (last progress up to 0.3 s
// ago)": the ranks alive, those with the same phase together.
std::string alive_words(const std::vector<const StallFacts::Report*>& alive) {
  std::map<std::string, std::vector<const StallFacts::Report*>> by_phase;
  for (const StallFacts::Report* r : alive) by_phase[r->phase].push_back(r);
  std::string text;
  for (const auto& [phase, reports] : by_phase) {
    std::vector<int> ranks;
    double longest_s = 0;
    for (const StallFacts::Report* r : reports) {
      ranks.push_back(r->rank);
      longest_s = std::max(longest_s, r->silent_s);
    }
    text += fmt::format("{}{} while {} (last progress {}{:.1f} s ago)", text.empty() ? "" : "; ",
                        ranks_named(ranks), phase, ranks.size() > 1 ? "up to " : "", longest_s);
  }
  return text;
}

// The wire form of a notice and of an answer: the steps done, the seconds since the last progress, the phase.
constexpr std::size_t kHeaderBytes = sizeof(int64_t) + sizeof(double);

std::vector<char> report_bytes(const std::string& phase, int64_t steps_done, double silent_s) {
  const std::size_t phase_bytes = std::min(phase.size(), kPhaseBytes);
  std::vector<char> bytes(kHeaderBytes + phase_bytes, '\0');
  std::memcpy(bytes.data(), &steps_done, sizeof steps_done);
  std::memcpy(bytes.data() + sizeof(int64_t), &silent_s, sizeof silent_s);
  std::memcpy(bytes.data() + kHeaderBytes, phase.data(), phase_bytes);
  return bytes;
}

}  // namespace

std::string describe_stall(const StallFacts& facts, int speaker) {
  std::vector<const StallFacts::Report*> by_rank(static_cast<std::size_t>(facts.world_size), nullptr);
  for (const StallFacts::Report& r : facts.heard) by_rank[static_cast<std::size_t>(r.rank)] = &r;
  const StallFacts::Report* own = by_rank[static_cast<std::size_t>(speaker)];
  std::vector<int> silent;
  std::vector<int> stalled;
  std::vector<const StallFacts::Report*> alive;
  for (int rank = 0; rank < facts.world_size; ++rank) {
    const StallFacts::Report* r = by_rank[static_cast<std::size_t>(rank)];
    if (r == nullptr) {
      silent.push_back(rank);
    } else if (r->stalled) {
      stalled.push_back(rank);
    } else {
      alive.push_back(r);
    }
  }

  std::string text;
  if (!silent.empty()) {
    const bool one = silent.size() == 1;
    text = fmt::format(
        "{} ({}) {} hung, lost or slower than the timeout: {} did not answer the stalled {} within {:.1f} s",
        ranks_named(silent), hosts_of(silent, facts.hosts), one ? "is" : "are", one ? "it" : "they",
        ranks_named(stalled), facts.listened_s);
    // A stalled rank busy with something else than the speaker (a read that never returns) is worth naming.
    for (const int rank : stalled) {
      const StallFacts::Report& r = *by_rank[static_cast<std::size_t>(rank)];
      if (own != nullptr && r.phase != own->phase) text += fmt::format("; rank {} was {}", r.rank, doing(r));
    }
    if (!alive.empty()) text += "; alive: " + alive_words(alive);
    return text;
  }
  if (!alive.empty()) {
    // Nobody is missing: the stalled ranks wait for ranks that answer but give them nothing in time.
    std::vector<int> alive_ranks;
    for (const StallFacts::Report* r : alive) alive_ranks.push_back(r->rank);
    return fmt::format(
        "every rank answered: the stalled {} wait{} for {} ({}), alive but slower than the timeout: {}",
        ranks_named(stalled), stalled.size() == 1 ? "s" : "", ranks_named(alive_ranks),
        hosts_of(alive_ranks, facts.hosts), alive_words(alive));
  }
  // Every rank stalled: nobody is missing, so say what each was doing, ranks with the same phase together.
  std::map<std::string, std::vector<int>> by_phase;
  for (const StallFacts::Report& r : facts.heard) by_phase[doing(r)].push_back(r.rank);
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

bool StallCensus::receive_report(int tag, bool stalled, StallFacts::Report& report, bool& failed) {
  int arrived = 0;
  MPI_Status status;
  failed = MPI_Iprobe(MPI_ANY_SOURCE, tag, comm_, &arrived, &status) != MPI_SUCCESS;
  if (failed || !arrived) return false;
  int bytes = 0;
  std::vector<char> received(kHeaderBytes + kPhaseBytes);
  MPI_Get_count(&status, MPI_CHAR, &bytes);
  failed = bytes < static_cast<int>(kHeaderBytes) || bytes > static_cast<int>(received.size()) ||
           MPI_Recv(received.data(), bytes, MPI_CHAR, status.MPI_SOURCE, tag, comm_, MPI_STATUS_IGNORE) !=
               MPI_SUCCESS;
  if (failed) return false;
  report.rank = status.MPI_SOURCE;
  report.stalled = stalled;
  std::memcpy(&report.steps_done, received.data(), sizeof(int64_t));
  std::memcpy(&report.silent_s, received.data() + sizeof(int64_t), sizeof(double));
  report.phase.assign(received.data() + kHeaderBytes, static_cast<std::size_t>(bytes) - kHeaderBytes);
  return true;
}

void StallCensus::answer(const std::string& phase, int64_t steps_done, double silent_s) {
  if (size_ == 1 || !mpi_thread_multiple()) return;
  StallFacts::Report notice;
  bool failed = false;
  while (receive_report(kNoticeTag, /*stalled=*/true, notice, failed)) {
    answers_.push_back(report_bytes(phase, steps_done, silent_s));
    MPI_Request request = MPI_REQUEST_NULL;
    if (MPI_Isend(answers_.back().data(), static_cast<int>(answers_.back().size()), MPI_CHAR, notice.rank,
                  kAnswerTag, comm_, &request) != MPI_SUCCESS) {
      return;
    }
    answer_sends_.push_back(request);  // never waited for, as the notices
    notices_heard_.push_back(notice);
  }
}

std::string StallCensus::survey(const std::string& phase, int64_t steps_done,
                                std::chrono::milliseconds listen) {
  if (size_ == 1) return "this rank, the job's only one, is stuck";
  if (!mpi_thread_multiple()) return "";
  notice_ = report_bytes(phase, steps_done, 0);
  if (!tell_every_rank(notice_.data(), static_cast<int>(notice_.size()), MPI_CHAR, kNoticeTag)) return "";

  StallFacts facts;
  facts.world_size = size_;
  facts.hosts = hosts_;
  auto hear = [&](const StallFacts::Report& report) {
    // A rank that answered and then stalled itself sends both: the notice tells more.
    for (StallFacts::Report& known : facts.heard) {
      if (known.rank == report.rank) {
        if (report.stalled) known = report;
        return;
      }
    }
    facts.heard.push_back(report);
  };
  hear({rank_, phase, steps_done});
  for (const StallFacts::Report& notice : notices_heard_) hear(notice);
  const auto start = std::chrono::steady_clock::now();
  while (facts.heard.size() < static_cast<std::size_t>(size_) &&
         std::chrono::steady_clock::now() - start < listen) {
    StallFacts::Report report;
    bool failed = false;
    bool arrived = receive_report(kNoticeTag, /*stalled=*/true, report, failed);
    if (!arrived && !failed) arrived = receive_report(kAnswerTag, /*stalled=*/false, report, failed);
    if (failed) return "";
    if (arrived) {
      hear(report);
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
  facts.listened_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  std::sort(facts.heard.begin(), facts.heard.end(),
            [](const StallFacts::Report& a, const StallFacts::Report& b) { return a.rank < b.rank; });
  int speaker = rank_;
  for (const StallFacts::Report& r : facts.heard) {
    if (r.stalled) {
      speaker = r.rank;
      break;
    }
  }
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
