#include "comm/host_group.h"

#include <mpi.h>

#include <cstdint>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "comm/mpi_check.h"
#include "engine/base/errors.h"

namespace ddp::comm {
namespace {

int checked_count(std::size_t n) {
  DDP_CHECK(n <= static_cast<std::size_t>(INT32_MAX));
  return static_cast<int>(n);
}

bool mpi_finalized() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  return finalized != 0;
}

// Errors come back as codes and end the job through fatal(), with a message naming the call.
MPI_Comm returning_errors(MPI_Comm comm) {
  if (comm != MPI_COMM_NULL) DDP_CHECK_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  return comm;
}

MPI_Comm duplicate_of(MPI_Comm comm) {
  MPI_Comm copy = MPI_COMM_NULL;
  DDP_CHECK_MPI(MPI_Comm_dup(comm, &copy));
  return returning_errors(copy);
}

}  // namespace

struct PendingMax::State {
  int64_t mine = 0;
  int64_t max = 0;
  MPI_Request request = MPI_REQUEST_NULL;
  std::shared_ptr<std::mutex> lock;
};

PendingMax::PendingMax() = default;
PendingMax::PendingMax(PendingMax&&) noexcept = default;

PendingMax& PendingMax::operator=(PendingMax&& other) noexcept {
  if (this != &other) {
    PendingMax old(std::move(*this));  // waits for what was pending here
    state_ = std::move(other.state_);
  }
  return *this;
}

PendingMax::~PendingMax() {
  if (state_ == nullptr || state_->request == MPI_REQUEST_NULL || mpi_finalized()) return;
  const std::lock_guard lock(*state_->lock);
  MPI_Wait(&state_->request, MPI_STATUS_IGNORE);
}

int64_t PendingMax::wait() {
  DDP_CHECK(state_ != nullptr);
  if (state_->request != MPI_REQUEST_NULL) {
    const std::lock_guard lock(*state_->lock);
    DDP_CHECK_MPI(MPI_Wait(&state_->request, MPI_STATUS_IGNORE));
  }
  const int64_t max = state_->max;
  state_.reset();
  return max;
}

HostGroup::HostGroup(MPI_Comm comm) : HostGroup(duplicate_of(comm), Owned{}) {}

HostGroup::HostGroup(MPI_Comm owned, Owned) : comm_(owned), lock_(std::make_shared<std::mutex>()) {
  if (comm_ == MPI_COMM_NULL) return;
  DDP_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
  DDP_CHECK_MPI(MPI_Comm_size(comm_, &size_));
}

HostGroup HostGroup::world() {
  return HostGroup(MPI_COMM_WORLD);
}

HostGroup HostGroup::alone() {
  return HostGroup(MPI_COMM_NULL, Owned{});
}

HostGroup::HostGroup(HostGroup&& other) noexcept
    : comm_(std::exchange(other.comm_, MPI_COMM_NULL)),
      rank_(other.rank_),
      size_(other.size_),
      lock_(other.lock_) {}

HostGroup& HostGroup::operator=(HostGroup&& other) noexcept {
  if (this != &other) {
    HostGroup old(std::move(*this));  // frees this group's communicator
    comm_ = std::exchange(other.comm_, MPI_COMM_NULL);
    rank_ = other.rank_;
    size_ = other.size_;
    lock_ = other.lock_;
  }
  return *this;
}

HostGroup::~HostGroup() {
  if (comm_ != MPI_COMM_NULL && !mpi_finalized()) MPI_Comm_free(&comm_);
}

HostGroup HostGroup::duplicate() const {
  if (comm_ == MPI_COMM_NULL) return alone();
  const std::lock_guard lock(*lock_);
  return HostGroup(duplicate_of(comm_), Owned{});
}

HostGroup HostGroup::node() const {
  if (comm_ == MPI_COMM_NULL) return alone();
  MPI_Comm node = MPI_COMM_NULL;
  const std::lock_guard lock(*lock_);
  DDP_CHECK_MPI(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &node));
  return HostGroup(returning_errors(node), Owned{});
}

std::optional<HostGroup> HostGroup::subgroup(bool member) const {
  if (comm_ == MPI_COMM_NULL) return member ? std::optional<HostGroup>(alone()) : std::nullopt;
  MPI_Comm members = MPI_COMM_NULL;
  const std::lock_guard lock(*lock_);
  DDP_CHECK_MPI(MPI_Comm_split(comm_, member ? 0 : MPI_UNDEFINED, 0, &members));
  if (members == MPI_COMM_NULL) return std::nullopt;
  return HostGroup(returning_errors(members), Owned{});
}

void HostGroup::broadcast(std::span<float> data, int root) {
  if (size_ == 1 || data.empty()) return;
  const std::lock_guard lock(*lock_);
  DDP_CHECK_MPI(MPI_Bcast(data.data(), checked_count(data.size()), MPI_FLOAT, root, comm_));
}

void HostGroup::broadcast(std::span<double> data, int root) {
  if (size_ == 1 || data.empty()) return;
  const std::lock_guard lock(*lock_);
  DDP_CHECK_MPI(MPI_Bcast(data.data(), checked_count(data.size()), MPI_DOUBLE, root, comm_));
}

void HostGroup::broadcast(std::span<int64_t> data, int root) {
  if (size_ == 1 || data.empty()) return;
  const std::lock_guard lock(*lock_);
  DDP_CHECK_MPI(MPI_Bcast(data.data(), checked_count(data.size()), MPI_INT64_T, root, comm_));
}

void HostGroup::broadcast(std::span<std::byte> data, int root) {
  if (size_ == 1 || data.empty()) return;
  const std::lock_guard lock(*lock_);
  DDP_CHECK_MPI(MPI_Bcast(data.data(), checked_count(data.size()), MPI_BYTE, root, comm_));
}

void HostGroup::sum(std::span<double> data) {
  if (size_ == 1 || data.empty()) return;
  const std::lock_guard lock(*lock_);
  DDP_CHECK_MPI(
      MPI_Allreduce(MPI_IN_PLACE, data.data(), checked_count(data.size()), MPI_DOUBLE, MPI_SUM, comm_));
}

void HostGroup::sum(std::span<int64_t> data) {
  if (size_ == 1 || data.empty()) return;
  const std::lock_guard lock(*lock_);
  DDP_CHECK_MPI(
      MPI_Allreduce(MPI_IN_PLACE, data.data(), checked_count(data.size()), MPI_INT64_T, MPI_SUM, comm_));
}

void HostGroup::max(std::span<int64_t> data) {
  if (size_ == 1 || data.empty()) return;
  const std::lock_guard lock(*lock_);
  DDP_CHECK_MPI(
      MPI_Allreduce(MPI_IN_PLACE, data.data(), checked_count(data.size()), MPI_INT64_T, MPI_MAX, comm_));
}

PendingMax HostGroup::start_max(int64_t mine) {
  PendingMax pending;
  pending.state_ = std::make_unique<PendingMax::State>();
  PendingMax::State& state = *pending.state_;
  state.mine = mine;
  state.max = mine;
  state.lock = lock_;
  if (size_ == 1) return pending;
  const std::lock_guard lock(*lock_);
  DDP_CHECK_MPI(MPI_Iallreduce(&state.mine, &state.max, 1, MPI_INT64_T, MPI_MAX, comm_, &state.request));
  return pending;
}

void HostGroup::barrier() {
  if (size_ == 1) return;
  const std::lock_guard lock(*lock_);
  DDP_CHECK_MPI(MPI_Barrier(comm_));
}

std::vector<std::string> HostGroup::gather(const std::string& text, int root) {
  if (size_ == 1) return {text};
  const std::lock_guard lock(*lock_);
  int length = checked_count(text.size());
  std::vector<int> lengths(rank_ == root ? static_cast<std::size_t>(size_) : 0);
  DDP_CHECK_MPI(MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, root, comm_));
  std::vector<int> offsets(lengths.size());
  int total = 0;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    offsets[i] = total;
    total += lengths[i];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  DDP_CHECK_MPI(MPI_Gatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                            MPI_CHAR, root, comm_));
  std::vector<std::string> texts;
  for (std::size_t i = 0; i < lengths.size(); ++i) {
    texts.push_back(all.substr(static_cast<std::size_t>(offsets[i]), static_cast<std::size_t>(lengths[i])));
  }
  return texts;
}

std::vector<std::string> HostGroup::all_gather(const std::string& text) {
  if (size_ == 1) return {text};
  const std::lock_guard lock(*lock_);
  const int length = checked_count(text.size());
  std::vector<int> lengths(static_cast<std::size_t>(size_));
  DDP_CHECK_MPI(MPI_Allgather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, comm_));
  std::vector<int> offsets(lengths.size());
  int total = 0;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    offsets[r] = total;
    total += lengths[r];
  }
  std::string all(static_cast<std::size_t>(total), '\0');
  DDP_CHECK_MPI(MPI_Allgatherv(text.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(),
                               MPI_CHAR, comm_));
  std::vector<std::string> texts;
  for (std::size_t r = 0; r < lengths.size(); ++r) {
    texts.push_back(all.substr(static_cast<std::size_t>(offsets[r]), static_cast<std::size_t>(lengths[r])));
  }
  return texts;
}

std::string HostGroup::scatter(const std::vector<std::string>& texts, int root) {
  const bool is_root = rank_ == root;
  if (is_root) DDP_CHECK(texts.size() == static_cast<std::size_t>(size_));
  if (size_ == 1) return texts.at(0);
  const std::lock_guard lock(*lock_);
  std::vector<int> lengths;
  std::vector<int> offsets;
  std::string all;
  if (is_root) {
    for (const std::string& text : texts) {
      offsets.push_back(checked_count(all.size()));
      lengths.push_back(checked_count(text.size()));
      all += text;
      checked_count(all.size());  // every offset must fit MPI's int
    }
  }
  int length = 0;
  DDP_CHECK_MPI(MPI_Scatter(lengths.data(), 1, MPI_INT, &length, 1, MPI_INT, root, comm_));
  std::string mine(static_cast<std::size_t>(length), '\0');
  DDP_CHECK_MPI(MPI_Scatterv(all.data(), lengths.data(), offsets.data(), MPI_CHAR, mine.data(), length,
                             MPI_CHAR, root, comm_));
  return mine;
}

std::optional<std::string> HostGroup::first_error(const std::optional<std::string>& mine) {
  if (size_ == 1) return mine;
  const std::lock_guard lock(*lock_);
  int candidate = mine ? rank_ : size_;
  int first = size_;
  DDP_CHECK_MPI(MPI_Allreduce(&candidate, &first, 1, MPI_INT, MPI_MIN, comm_));
  if (first == size_) return std::nullopt;
  std::string message = rank_ == first ? *mine : std::string();
  int length = checked_count(message.size());
  DDP_CHECK_MPI(MPI_Bcast(&length, 1, MPI_INT, first, comm_));
  message.resize(static_cast<std::size_t>(length));
  DDP_CHECK_MPI(MPI_Bcast(message.data(), length, MPI_CHAR, first, comm_));
  return message;
}

}  // namespace ddp::comm
