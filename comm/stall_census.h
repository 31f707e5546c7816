// Which rank the others wait for. When a rank's watchdog (engine/watchdog.h) finds no progress, MPI cannot
// say which peer a collective waits on; Horovod names the missing ranks because its coordinator sees every
// rank's requests. Here the ranks that stalled tell every rank so, on a communicator of their own and from
// the watchdog's thread, and listen for a short while; the ranks whose watchdog has not fired (alive, and
// perhaps waiting on a peer, or with deadlines of their own) answer from theirs. The lowest stalled rank then
// writes the one message of the job, which names the ranks that did not answer (stopped, frozen or lost),
// and the others keep quiet while it ends the job.
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::comm {

// What one rank learned in the census, for the message.
struct StallFacts {
  struct Report {
    int rank = 0;
    std::string phase;  // what it was doing, as the watchdog names it
    int64_t steps_done = 0;
    bool stalled = true;  // false: alive, it answered a stalled rank (and its watchdog had not fired)
    double silent_s = 0;  // seconds since its last progress, for an alive rank
  };
  int world_size = 1;
  std::vector<std::string> hosts;  // by rank
  std::vector<Report> heard;       // the ranks heard from, this one included, in rank order
  double listened_s = 0;
};

// The end of the watchdog's message ("no progress for ... while PHASE: <this>"), written by the lowest
// stalled rank: the ranks that did not answer; where every rank did, the ones alive that the stalled ranks
// wait for, or, where every rank stalled, what each was doing.
std::string describe_stall(const StallFacts& facts, int speaker);

class StallCensus {
 public:
  // Collective over `world`, at start-up: a communicator of its own and every rank's host name.
  explicit StallCensus(MPI_Comm world);
  StallCensus(const StallCensus&) = delete;
  StallCensus& operator=(const StallCensus&) = delete;

  // Called once, from the watchdog's thread, when this rank has stalled in `phase`: tells every rank and
  // listens for theirs for `listen`. The lowest stalled rank returns describe_stall()'s words at once; any
  // other waits a while for that rank to end the job and only then returns its own words. In a job of one
  // rank it says that this rank is stuck. Without
  // MPI_THREAD_MULTIPLE (the other thread is inside MPI) or when an MPI call fails it returns "" at once:
  // the watchdog then says what it knows alone.
  std::string survey(const std::string& phase, int64_t steps_done, std::chrono::milliseconds listen);

  // Called from the watchdog's thread at each check while this rank has not stalled (a check comes at least
  // twice per `listen` of survey()): answers the notices of the ranks that have, with what this rank is
  // doing and since when, and keeps them for a survey of its own later. Nothing without
  // MPI_THREAD_MULTIPLE.
  void answer(const std::string& phase, int64_t steps_done, double silent_s);

  // Called once, by a rank about to end the job on an error it met alone (a bad token with data.validate
  // false, met by every rank at its first step): tells every rank and listens for `listen`. True for the
  // lowest rank that met one in that time, which writes the job's one line; the others wait to be ended.
  // True at once without MPI_THREAD_MULTIPLE (another thread may be inside MPI) or when a call fails.
  bool first_to_speak(std::chrono::milliseconds listen);

 private:
  // Sends `data` to every other rank without waiting (the buffer must outlive the sends); false if MPI fails.
  bool tell_every_rank(const void* data, int count, MPI_Datatype type, int tag);
  // Receives one message with `tag` if one has come: true and its report in `report`; false if none came
  // or MPI failed (then `failed`).
  bool receive_report(int tag, bool stalled, StallFacts::Report& report, bool& failed);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::vector<std::string> hosts_;
  std::vector<char> notice_;  // this rank's notice, alive while the sends are in flight
  int error_notice_ = 0;
  std::vector<MPI_Request> sends_;
  std::vector<StallFacts::Report> notices_heard_;  // by answer(), before this rank stalled
  // The answers in flight, each buffer alive until the job ends (a notice comes once from each rank).
  std::vector<std::vector<char>> answers_;
  std::vector<MPI_Request> answer_sends_;
};

}  // namespace ddp::comm
