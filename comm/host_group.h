// The ranks of a job as a group that agrees on things: collectives on small host-memory values over MPI
// (rank, size, broadcast, sum, gather, scatter, the first error). Everything outside comm/ that needs a
// collective goes through a HostGroup, and every gradient backend (gradient_reducer.h) uses the same one,
// so there is one implementation of them. Gradients themselves travel through a GradientReducer.
//
// Every method is collective over the group unless it says otherwise: every rank calls the same ones in the
// same order. A group holds a communicator of its own (a duplicate, a split), so its collectives never pair
// with anyone else's.
#pragma once

#include <mpi.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/base/errors.h"

namespace ddp::comm {

// A maximum over the ranks under way (HostGroup::start_max); wait() gives it. Waited for on destruction
// where MPI still runs: every rank started it, so it completes on all of them.
class PendingMax {
 public:
  PendingMax();
  PendingMax(PendingMax&&) noexcept;
  PendingMax& operator=(PendingMax&&) noexcept;
  ~PendingMax();

  bool active() const { return state_ != nullptr; }
  // The maximum over the ranks; afterwards nothing is pending.
  int64_t wait();

 private:
  friend class HostGroup;
  struct State;
  std::unique_ptr<State> state_;
};

class HostGroup {
 public:
  // Over a duplicate of `comm`.
  explicit HostGroup(MPI_Comm comm);
  // Over a duplicate of MPI_COMM_WORLD: every rank of the job.
  static HostGroup world();
  // This process alone, without MPI (every collective is the identity): for code that runs outside a job,
  // such as the unit tests.
  static HostGroup alone();

  HostGroup(HostGroup&& other) noexcept;
  HostGroup& operator=(HostGroup&& other) noexcept;
  HostGroup(const HostGroup&) = delete;
  HostGroup& operator=(const HostGroup&) = delete;
  ~HostGroup();

  // Not collective.
  int rank() const { return rank_; }
  int size() const { return size_; }

  // The same ranks over a communicator of their own.
  HostGroup duplicate() const;
  // The ranks that share this rank's node (its memory), in the group's rank order.
  HostGroup node() const;
  // The ranks that pass `member` = true, in the group's rank order; nullopt on the others.
  std::optional<HostGroup> subgroup(bool member) const;

  // Copies root's `data` into every rank's `data`.
  void broadcast(std::span<float> data, int root);
  void broadcast(std::span<double> data, int root);
  void broadcast(std::span<int64_t> data, int root);
  void broadcast(std::span<std::byte> data, int root);
  // In place, element by element over the ranks.
  void sum(std::span<double> data);
  void sum(std::span<int64_t> data);
  void max(std::span<int64_t> data);
  // The maximum of every rank's `mine`, without blocking: started now, completed by PendingMax::wait().
  PendingMax start_max(int64_t mine);
  void barrier();

  // Root receives every rank's text in rank order (others get an empty vector).
  std::vector<std::string> gather(const std::string& text, int root);
  // Every rank receives every rank's text in rank order.
  std::vector<std::string> all_gather(const std::string& text);
  // gather's inverse: root passes one text per rank (in rank order; the others' `texts` are not read) and
  // every rank gets its own.
  std::string scatter(const std::vector<std::string>& texts, int root);
  // Every rank passes its error (or nothing); every rank gets back the error of the lowest rank that had
  // one, so one rank can print it and all can exit together instead of hanging.
  std::optional<std::string> first_error(const std::optional<std::string>& mine);

  // For comm/'s own MPI code (the backends, the parameter server), not collective: the group's
  // communicator, and the lock its calls take. The MPI backend's progress thread calls MPI beside the
  // trainer's collectives, and Open MPI 4.1's TCP transport can lose a connection handshake when two threads
  // call MPI while it wires up peers (mpi_reducer.cpp), so a reducer made over a group shares its lock.
  MPI_Comm mpi_comm() const { return comm_; }
  const std::shared_ptr<std::mutex>& call_lock() const { return lock_; }

 private:
  struct Owned {};
  HostGroup(MPI_Comm owned, Owned);  // takes `owned` (MPI_COMM_NULL: this process alone)

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<std::mutex> lock_;
};

// Runs `work` on every rank; if it throws a UserError on any rank, every rank throws the lowest failing
// rank's message as an AgreedUserError (errors.h). For checks of user input that run before (or between)
// collectives.
template <typename Work>
void agree_on_errors(HostGroup& group, Work&& work) {
  std::optional<std::string> error;
  try {
    work();
  } catch (const UserError& e) {
    error = e.what();
  }
  if (auto first = group.first_error(error)) throw AgreedUserError(*first);
}

}  // namespace ddp::comm
