// The parameter-server protocol (see ps_protocol.h): servers and clients over non-blocking MPI
// point-to-point, every wait a poll against a deadline.
#include "comm/ps_protocol.h"

#include <fmt/format.h>
#include <algorithm>
#include <chrono>
#include <climits>
#include <csignal>
#include <cstring>
#include <limits>

#include "comm/mpi_check.h"
#include "comm/poller.h"
#include "engine/base/errors.h"
#include "engine/base/running_clock.h"

namespace ddp::comm {
namespace {

// Deadlines on the running clock: a job stopped and continued has no rank to blame for that time.
using Clock = RunningClock;

// The header rides in the first floats of every message buffer (copied with memcpy, sent as bytes).
constexpr std::size_t kHeaderFloats = sizeof(PsHeader) / sizeof(float);
static_assert(sizeof(PsHeader) % sizeof(float) == 0);

double seconds_since(Clock::time_point start, Clock::time_point now) {
  return std::chrono::duration<double>(now - start).count();
}

// As the config writes it: 0.5, 30, 1e-05.
std::string format_seconds(double seconds) {
  return fmt::format("{}", seconds);
}

std::string kind_name(int64_t kind) {
  switch (static_cast<PsKind>(kind)) {
    case PsKind::kGrads:
      return "grads";
    case PsKind::kPull:
      return "pull";
    case PsKind::kDone:
      return "done";
    case PsKind::kParams:
      return "params";
    case PsKind::kSparseGrads:
      return "sparse grads";
  }
  return "kind " + std::to_string(kind);
}

// Server to server, on PsChannels::alive() (a worker's messages carry the PsKind tags): "are you alive?" and
// its answer, both empty.
constexpr int kAliveQuestionTag = 16;
constexpr int kAliveAnswerTag = 17;
// How long a server waits for the others' answers (less where comm.timeout_s is shorter).
constexpr double kAliveListenSeconds = 2.0;

int tag_of(PsKind kind) {
  return static_cast<int>(kind);
}

// Bytes of a message of `floats` payload floats, as MPI counts them.
int message_bytes(std::size_t floats) {
  const std::size_t bytes = (kHeaderFloats + floats) * sizeof(float);
  if (bytes > static_cast<std::size_t>(INT_MAX)) {
    throw UserError("parameter server: a shard of " + std::to_string(floats) +
                    " parameters is too large for one MPI message; use more servers");
  }
  return static_cast<int>(bytes);
}

void write_header(std::vector<float>& buffer, int64_t step, PsKind kind, int stop_signal = 0) {
  const PsHeader header{step, static_cast<int64_t>(kind), stop_signal};
  std::memcpy(buffer.data(), &header, sizeof(header));
}

PsHeader read_header(const std::vector<float>& buffer) {
  PsHeader header;
  std::memcpy(static_cast<void*>(&header), buffer.data(), sizeof(header));  // PsHeader is trivially copyable
  return header;
}

// Bytes of a message whose payload is `payload_bytes` long (16-bit payloads, PsOptions::wire, are not whole
// floats).
int message_bytes_of_payload(std::size_t payload_bytes) {
  return static_cast<int>(sizeof(PsHeader) + payload_bytes);  // never more than message_bytes(shard)
}

// Payload bytes of a received message; a message shorter than a header is fatal.
std::size_t received_bytes(const MPI_Status& status, const std::string& what) {
  int bytes = 0;
  DDP_CHECK_MPI(MPI_Get_count(&status, MPI_BYTE, &bytes));
  const auto size = static_cast<std::size_t>(bytes);
  if (size < sizeof(PsHeader)) DDP_FATAL(what + ": malformed message of " + std::to_string(bytes) + " bytes");
  return size - sizeof(PsHeader);
}

// What follows the header of a message buffer.
const unsigned char* payload_bytes(const std::vector<float>& buffer) {
  return reinterpret_cast<const unsigned char*>(buffer.data() + kHeaderFloats);
}

void validate(const PsOptions& options) {
  if (options.async && options.max_staleness < 0) {
    throw UserError("parameter server: max_staleness = " + std::to_string(options.max_staleness) +
                    " must be >= 0");
  }
  if (!(options.timeout_s > 0))
    throw UserError("parameter server: timeout_s = " + format_seconds(options.timeout_s) + " must be > 0");
}

// MPI_Comm_dup without a blocking wait: a rank that never joins ends the job instead of hanging it. The
// deadline is twice the timeout: where the rank's watchdog judges this phase (a training rank between runs
// of steps) its stall census names the missing rank first, which this collective cannot; the deadline ends
// the job where nothing else would (a dedicated server, whose watchdog is paused).
MPI_Comm duplicate(MPI_Comm parent, double timeout_s, const std::string& who) {
  MPI_Comm comm = MPI_COMM_NULL;
  MPI_Request request = MPI_REQUEST_NULL;
  DDP_CHECK_MPI(MPI_Comm_idup(parent, &comm, &request));
  const double limit_s = 2 * timeout_s;
  wait_or_fatal(std::span<MPI_Request>(&request, 1), Clock::now(), limit_s, [&] {
    return who + " waited " + format_seconds(limit_s) +
           " s for every rank to join the parameter server's exchange (a collective, which cannot say which "
           "rank is missing): rank lost?";
  });
  DDP_CHECK_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
  return comm;
}

int rank_of(MPI_Comm comm) {
  int rank = 0;
  DDP_CHECK_MPI(MPI_Comm_rank(comm, &rank));
  return rank;
}

class Server {
 public:
  Server(const PsChannels& channels, const PsOptions& options, std::size_t total_size, std::span<float> shard,
         const ShardUpdate& update)
      : options_(options),
        shard_(shard),
        update_(update),
        requests_(channels.requests()),
        replies_(channels.replies()),
        alive_(channels.alive()),
        own_client_(&channels.client_waits()) {
    int size = 0;
    DDP_CHECK_MPI(MPI_Comm_size(requests_, &size));
    DDP_CHECK_MPI(MPI_Comm_rank(requests_, &rank_));
    roles_ = PsRoles::of(size, options.servers);
    validate(options);
    if (!roles_.is_server(rank_))
      DDP_FATAL("run_parameter_server on rank " + std::to_string(rank_) + ", which is a worker");
    const int index = roles_.server_index(rank_);
    const std::size_t expected = roles_.shard_end(index, total_size) - roles_.shard_begin(index, total_size);
    if (shard.size() != expected) {
      DDP_FATAL("parameter server (rank " + std::to_string(rank_) + ") got a shard of " +
                std::to_string(shard.size()) + " parameters, owns " + std::to_string(expected));
    }
    DDP_CHECK(options.sparse_exchange_rows.end() <= total_size);
    message_bytes_ = message_bytes(shard.size());
    me_ = "parameter server (rank " + std::to_string(rank_) + ")";

    const auto workers = static_cast<std::size_t>(roles_.workers());
    workers_.resize(workers);
    receives_.assign(workers, MPI_REQUEST_NULL);
    shard_begin_ = roles_.shard_begin(index, total_size);
    for (Worker& w : workers_) {
      w.receive.resize(kHeaderFloats + shard.size());
      w.send.resize(kHeaderFloats + shard.size());
      // A row-sparse or 16-bit push expands here (a row-sparse 16-bit one widened in `wide` first).
      const bool sixteen_bits = options.wire != WireFormat::kFloat;
      if (!options.sparse_exchange_rows.empty() || sixteen_bits) w.dense.resize(shard.size());
      if (!options.sparse_exchange_rows.empty() && sixteen_bits) w.wide.resize(shard.size());
    }
    if (!options.async) mean_.resize(shard.size());
    if (rounds_updates()) {
      before_update_.resize(shard.size());
      update_wire_.resize(shard.size());
      rounded_update_.resize(shard.size());
    }
    active_ = roles_.workers();
  }

  PsServerStats run() {
    const auto start = Clock::now();
    for (int w = 0; w < roles_.workers(); ++w) {
      post_receive(w);
      worker(w).last_contact = start;
    }
    Poller poller;
    while (active_ > 0) {
      int index = MPI_UNDEFINED;
      int flag = 0;
      MPI_Status status;
      DDP_CHECK_MPI(
          MPI_Testany(static_cast<int>(receives_.size()), receives_.data(), &index, &flag, &status));
      if (flag && index != MPI_UNDEFINED) {
        handle(index, status);
        poller.progressed();
        continue;
      }
      if (servers_elsewhere()) answer_alive_questions();
      check_silence(poller);
      poller.idle();
    }
    for (int w = 0; w < roles_.workers(); ++w) wait_send(w);
    return stats_;
  }

 private:
  struct Worker {
    std::vector<float> receive;  // header + gradients; in sync mode held until the step is applied
    std::vector<float> dense;    // the last row-sparse or 16-bit push, expanded
    std::vector<float> wide;     // a row-sparse 16-bit push, widened to a float row-sparse payload
    bool expanded = false;       // the last push's gradients are in `dense`
    std::vector<float> send;     // header + parameters
    MPI_Request send_request = MPI_REQUEST_NULL;
    int64_t pushes = 0;              // gradients received: the step the worker pushes next
    bool active = true;              // has not said done
    bool owed_reply = false;         // pushed, not yet answered (sync: step under way; async: too far ahead)
    Clock::time_point last_contact;  // last message from or to it
  };

  Worker& worker(int w) { return workers_[static_cast<std::size_t>(w)]; }

  void post_receive(int w) {
    DDP_CHECK_MPI(MPI_Irecv(worker(w).receive.data(), message_bytes_, MPI_BYTE, w, MPI_ANY_TAG, requests_,
                            &receives_[static_cast<std::size_t>(w)]));
  }

  void handle(int w, const MPI_Status& status) {
    Worker& from = worker(w);
    from.last_contact = Clock::now();
    const std::size_t bytes = received_bytes(status, me_);
    const int tag = status.MPI_TAG;
    if (tag != tag_of(PsKind::kGrads) && tag != tag_of(PsKind::kSparseGrads) &&
        tag != tag_of(PsKind::kPull) && tag != tag_of(PsKind::kDone))
      DDP_FATAL(me_ + " got a message with unknown tag " + std::to_string(tag) + " from worker rank " +
                std::to_string(w));
    const auto kind = static_cast<PsKind>(tag);
    const std::string error =
        ps_header_error(read_header(from.receive), tag, kind, from.pushes, w, rank_, true);
    if (!error.empty()) DDP_FATAL(error);
    const bool pushed = kind == PsKind::kGrads || kind == PsKind::kSparseGrads;
    if (pushed && options_.wire != WireFormat::kFloat) {
      expand_16_bit_push(w, kind, bytes);
    } else if (bytes % sizeof(float) != 0) {
      DDP_FATAL(me_ + ": malformed message of " + std::to_string(bytes + sizeof(PsHeader)) +
                " bytes from worker rank " + std::to_string(w));
    } else if (kind == PsKind::kSparseGrads) {
      const std::string corrupt =
          decode_row_sparse(payload(from.receive, bytes / sizeof(float)), shard_begin_,
                            shard_begin_ + shard_.size(), options_.sparse_exchange_rows, from.dense);
      if (!corrupt.empty()) DDP_FATAL(me_ + " got " + corrupt + " from worker rank " + std::to_string(w));
      from.expanded = true;
    } else {
      const std::size_t expected = kind == PsKind::kGrads ? shard_.size() : 0;
      const std::size_t floats = bytes / sizeof(float);
      if (floats != expected) {
        DDP_FATAL(me_ + " got " + kind_name(tag) + " with " + std::to_string(floats) +
                  " values from worker rank " + std::to_string(w) + ", expected " + std::to_string(expected));
      }
      from.expanded = false;
    }
    switch (kind) {
      case PsKind::kGrads:
      case PsKind::kSparseGrads:
        stats_.gradient_bytes += static_cast<int64_t>(bytes);
        on_grads(w);
        break;
      case PsKind::kPull:
        reply(w, from.pushes);
        post_receive(w);
        break;
      case PsKind::kDone:
        on_done(w);
        break;
      case PsKind::kParams:
        break;
    }
  }

  // A 16-bit push (PsOptions::wire) into the worker's `dense`, as floats.
  void expand_16_bit_push(int w, PsKind kind, std::size_t bytes) {
    Worker& from = worker(w);
    const unsigned char* raw = payload_bytes(from.receive);
    std::string corrupt;
    if (kind == PsKind::kGrads) {
      const std::size_t floats = widen_values(raw, bytes, 0, from.dense, options_.wire, corrupt);
      if (corrupt.empty() && floats != shard_.size()) {
        corrupt = "grads with " + std::to_string(floats) + " 16-bit values, expected " +
                  std::to_string(shard_.size());
      }
    } else {
      const std::size_t words = row_sparse_words(raw, bytes, corrupt);
      const std::size_t floats =
          corrupt.empty() ? widen_values(raw, bytes, words, from.wide, options_.wire, corrupt) : 0;
      if (corrupt.empty()) {
        corrupt = decode_row_sparse(std::span<const float>(from.wide).first(floats), shard_begin_,
                                    shard_begin_ + shard_.size(), options_.sparse_exchange_rows, from.dense);
      }
    }
    if (!corrupt.empty()) DDP_FATAL(me_ + " got " + corrupt + " from worker rank " + std::to_string(w));
    from.expanded = true;
  }

  // Sync replies carry the step's update in 16 bits (PsOptions::wire).
  bool rounds_updates() const { return options_.wire != WireFormat::kFloat && !options_.async; }

  // After the optimizer's step: the update (shard now minus before it) on the wire, kept for the replies,
  // and the shard set to before + that update as the wire gives it back, which is what every worker computes.
  void round_the_update() {
    for (std::size_t i = 0; i < shard_.size(); ++i) update_wire_[i] = shard_[i] - before_update_[i];
    update_bytes_ = narrow_values(update_wire_, 0, options_.wire);
    std::string corrupt;
    widen_values(reinterpret_cast<const unsigned char*>(update_wire_.data()), update_bytes_, 0,
                 rounded_update_, options_.wire, corrupt);
    DDP_CHECK(corrupt.empty());
    for (std::size_t i = 0; i < shard_.size(); ++i) shard_[i] = before_update_[i] + rounded_update_[i];
  }

  void on_grads(int w) {
    Worker& from = worker(w);
    const int64_t step = from.pushes;
    ++from.pushes;
    from.owed_reply = true;
    record_gap();
    if (!options_.async) {
      if (done_rank_ >= 0) {
        DDP_FATAL("worker rank " + std::to_string(w) + " pushed step " + std::to_string(step) +
                  " after worker rank " + std::to_string(done_rank_) + " said done after " +
                  std::to_string(done_steps_) + " steps: in sync mode every worker runs the same steps");
      }
      DDP_CHECK(step == stats_.steps);
      // The gradients stay in the receive buffer until every worker's have come: no receive is posted, and
      // none is needed, since the worker waits for this step's reply before it sends again.
      if (++owed_ == active_) apply_sync_step();
      return;
    }
    update_(shard_, gradients(w));
    ++stats_.updates;
    ++stats_.steps;
    post_receive(w);
    release_async_replies();
  }

  // Sums the workers' gradients in rank order and scales once, so every run gives the same bits.
  void apply_sync_step() {
    const std::span<float> mean(mean_);
    const std::span<const float> first = gradients(0);
    std::copy(first.begin(), first.end(), mean.begin());
    for (int w = 1; w < roles_.workers(); ++w) {
      const std::span<const float> grads = gradients(w);
      for (std::size_t i = 0; i < mean.size(); ++i) mean[i] += grads[i];
    }
    const float scale = 1.0f / static_cast<float>(roles_.workers());
    for (float& x : mean) x *= scale;
    if (rounds_updates()) std::copy(shard_.begin(), shard_.end(), before_update_.begin());
    update_(shard_, mean);
    if (rounds_updates()) round_the_update();
    ++stats_.updates;
    const int64_t step = stats_.steps++;
    owed_ = 0;
    for (int w = 0; w < roles_.workers(); ++w) {
      reply(w, step, rounds_updates());
      post_receive(w);
    }
  }

  // Answers every owed worker that is at most max_staleness pushes ahead of the slowest active one.
  void release_async_replies() {
    int64_t slowest = INT64_MAX;
    for (const Worker& w : workers_) {
      if (w.active) slowest = std::min(slowest, w.pushes);
    }
    if (slowest == INT64_MAX) return;  // every worker is done: nobody is owed a reply
    for (int w = 0; w < roles_.workers(); ++w) {
      Worker& candidate = worker(w);
      if (candidate.owed_reply && candidate.pushes <= slowest + options_.max_staleness)
        reply(w, candidate.pushes - 1);
    }
  }

  void on_done(int w) {
    Worker& from = worker(w);
    if (!options_.async && owed_ > 0) {
      int pushed = 0;
      while (!worker(pushed).owed_reply) ++pushed;
      DDP_FATAL("worker rank " + std::to_string(w) + " said done after " + std::to_string(from.pushes) +
                " steps while worker rank " + std::to_string(pushed) + " pushed step " +
                std::to_string(stats_.steps) + ": in sync mode every worker runs the same steps");
    }
    from.active = false;
    --active_;
    if (done_rank_ < 0) {
      done_rank_ = w;
      done_steps_ = from.pushes;
    }
    if (options_.async) release_async_replies();
  }

  // The shard's parameters, or with `rounded_update` the step's update in 16 bits (round_the_update).
  void reply(int w, int64_t step, bool rounded_update = false) {
    wait_send(w);  // the previous reply may still be reading the buffer
    Worker& to = worker(w);
    write_header(to.send, step, PsKind::kParams, options_.stop_signal ? options_.stop_signal() : 0);
    int bytes = message_bytes_;
    if (rounded_update) {
      std::memcpy(to.send.data() + kHeaderFloats, update_wire_.data(), update_bytes_);
      bytes = message_bytes_of_payload(update_bytes_);
    } else {
      std::copy(shard_.begin(), shard_.end(), to.send.begin() + kHeaderFloats);
    }
    DDP_CHECK_MPI(
        MPI_Isend(to.send.data(), bytes, MPI_BYTE, w, tag_of(PsKind::kParams), replies_, &to.send_request));
    to.owed_reply = false;
    to.last_contact = Clock::now();
  }

  void wait_send(int w) {
    wait_or_fatal(std::span<MPI_Request>(&worker(w).send_request, 1), Clock::now(), options_.timeout_s, [&] {
      return me_ + " could not deliver parameters to worker rank " + std::to_string(w) + " for " +
             format_seconds(options_.timeout_s) + " s: rank lost?";
    });
  }

  // Dedicated servers, more than one: a worker silent here may be waiting for another server's reply (sync:
  // that server replied to some workers, then stopped). The workers would name it only at their own limit,
  // twice the timeout, after this server had blamed the wrong rank; so this server first asks the others
  // whether they are alive, and names the ones that do not answer. Each server answers while it polls.
  bool other_servers() const { return !roles_.colocated && roles_.servers > 1; }
  // Servers on other ranks, dedicated or colocated: a silent worker may be waiting for one that is lost,
  // which the alive question finds (colocated, a rank whose whole process is lost answers nothing either).
  bool servers_elsewhere() const { return roles_.servers > 1; }

  void answer_alive_questions() {
    for (;;) {
      int arrived = 0;
      MPI_Status status;
      DDP_CHECK_MPI(MPI_Iprobe(MPI_ANY_SOURCE, kAliveQuestionTag, alive_, &arrived, &status));
      if (!arrived) return;
      DDP_CHECK_MPI(MPI_Recv(nullptr, 0, MPI_BYTE, status.MPI_SOURCE, kAliveQuestionTag, alive_,
                             MPI_STATUS_IGNORE));  // empty, and already here: no wait
      send_empty(status.MPI_SOURCE, kAliveAnswerTag);
    }
  }

  // The other servers that do not answer within `listen`; the ones that do are not asked again for a while.
  std::vector<int> servers_not_answering(std::chrono::duration<double> listen) {
    std::vector<int> waiting;
    for (int j = 0; j < roles_.servers; ++j) {
      const int server = roles_.server_rank(j);
      if (server == rank_) continue;
      send_empty(server, kAliveQuestionTag);
      waiting.push_back(server);
    }
    const auto start = Clock::now();
    Poller poller;
    while (!waiting.empty() && Clock::now() - start < listen) {
      answer_alive_questions();  // another server may be asking at the same time
      int arrived = 0;
      MPI_Status status;
      DDP_CHECK_MPI(MPI_Iprobe(MPI_ANY_SOURCE, kAliveAnswerTag, alive_, &arrived, &status));
      if (!arrived) {
        poller.idle();
        continue;
      }
      DDP_CHECK_MPI(
          MPI_Recv(nullptr, 0, MPI_BYTE, status.MPI_SOURCE, kAliveAnswerTag, alive_, MPI_STATUS_IGNORE));
      std::erase(waiting, status.MPI_SOURCE);
      poller.progressed();
    }
    if (waiting.empty()) servers_answered_ = Clock::now();
    return waiting;
  }

  // An empty message that nobody waits for: MPI completes the send on its own (MPI_Request_free).
  void send_empty(int to, int tag) {
    MPI_Request request = MPI_REQUEST_NULL;
    DDP_CHECK_MPI(MPI_Isend(nullptr, 0, MPI_BYTE, to, tag, alive_, &request));
    DDP_CHECK_MPI(MPI_Request_free(&request));
  }

  // Ends the job if a worker the server waits for (active, no reply owed) has been silent too long.
  void check_silence(Poller& poller) {
    const auto now = Clock::now();
    std::vector<int> silent;
    double least_silence = std::numeric_limits<double>::infinity();
    for (int w = 0; w < roles_.workers(); ++w) {
      const Worker& candidate = worker(w);
      const double silence = seconds_since(candidate.last_contact, now);
      if (candidate.active && !candidate.owed_reply && silence > options_.timeout_s) {
        silent.push_back(w);
        least_silence = std::min(least_silence, silence);
      }
    }
    if (!poller.confirm_overdue(!silent.empty())) return;
    if (servers_elsewhere() && seconds_since(servers_answered_, now) > options_.timeout_s) {
      const double listen_s = std::min(options_.timeout_s, kAliveListenSeconds);
      const std::vector<int> lost = servers_not_answering(std::chrono::duration<double>(listen_s));
      if (!lost.empty()) {
        DDP_FATAL(me_ + " heard nothing from parameter server " + rank_list(lost) + " within " +
                  format_seconds(listen_s) + " s of asking, while worker " + rank_list(silent) +
                  " fell silent for " + format_seconds(options_.timeout_s) +
                  " s (waiting for it, most likely): rank lost?");
      }
    }
    // Dedicated servers that all answer: every active worker silent at once may still be every worker
    // waiting for a server busy elsewhere, which the workers name when their own limit (twice the timeout)
    // passes. This server blames them only past that, so that the message names the server.
    if (other_servers() && static_cast<int>(silent.size()) == active_ &&
        least_silence <= 3 * options_.timeout_s)
      return;
    // Colocated, this rank's worker falls silent here while it waits for another server's reply, or for
    // the other ranks in a collective (the stop-signal agreement, an epoch's end): it is not the one to
    // blame. If no other worker is silent, the server it waits for names whom that one waits for (async: a
    // lost worker holds back replies), or this rank's client names the server.
    std::string waits;
    if (roles_.colocated && std::find(silent.begin(), silent.end(), rank_) != silent.end()) {
      std::vector<int> blocking = own_client_->get();
      std::erase(blocking, rank_);
      if (!blocking.empty()) {
        std::erase(silent, rank_);
        if (silent.empty()) return;
        waits = " (this rank's worker waits for parameter server " + rank_list(blocking) + ")";
      } else if (silent.size() > 1) {
        std::erase(silent, rank_);  // the others' silence explains its own
      }
    }
    DDP_FATAL(me_ + " heard nothing from worker " + rank_list(silent) + " for " +
              format_seconds(options_.timeout_s) + " s" + waits + ": rank lost?");
  }

  void record_gap() {
    int64_t low = INT64_MAX;
    int64_t high = 0;
    for (const Worker& w : workers_) {
      if (!w.active) continue;
      low = std::min(low, w.pushes);
      high = std::max(high, w.pushes);
    }
    stats_.max_gap = std::max(stats_.max_gap, high - low);
  }

  static std::span<const float> payload(const std::vector<float>& buffer, std::size_t size) {
    return std::span<const float>(buffer).subspan(kHeaderFloats, size);
  }

  // Worker w's last pushed gradients for this shard, dense.
  std::span<const float> gradients(int w) {
    const Worker& from = worker(w);
    return from.expanded ? std::span<const float>(from.dense) : payload(from.receive, shard_.size());
  }

  PsOptions options_;
  std::span<float> shard_;
  std::size_t shard_begin_ = 0;  // where the shard starts in the flat vector
  const ShardUpdate& update_;
  PsRoles roles_;
  int rank_ = 0;
  std::string me_;
  MPI_Comm requests_;              // the workers' messages come here
  MPI_Comm replies_;               // the parameters go back here
  MPI_Comm alive_;                 // the servers' questions whether each other is alive (PsChannels::alive)
  const ClientWaits* own_client_;  // colocated: what this rank's worker waits for
  int message_bytes_ = 0;
  std::vector<Worker> workers_;
  std::vector<MPI_Request> receives_;  // one per worker, contiguous for MPI_Testany
  std::vector<float> mean_;            // sync: the averaged gradients
  std::vector<float> before_update_;   // rounds_updates(): the shard before the step's update
  std::vector<float> update_wire_;     // rounds_updates(): the step's update, on the wire (update_bytes_)
  std::size_t update_bytes_ = 0;
  std::vector<float> rounded_update_;  // rounds_updates(): the same, back in float
  int active_ = 0;                     // workers that have not said done
  int owed_ = 0;                       // sync: workers that pushed the current step
  int done_rank_ = -1;                 // the first worker that said done, and after how many steps
  int64_t done_steps_ = 0;
  PsServerStats stats_;
  Clock::time_point servers_answered_{};  // when the other servers last all answered
};

}  // namespace

PsRoles PsRoles::make(int world_size, int servers) {
  if (servers < 1 || servers >= world_size) {
    throw UserError("parameter server: " + std::to_string(servers) + " server(s) need at least " +
                    std::to_string(std::max(servers, 1) + 1) + " ranks (one worker or more); the job has " +
                    std::to_string(world_size));
  }
  return PsRoles{world_size, servers};
}

std::size_t PsRoles::shard_begin(int server_index, std::size_t total) const {
  const auto k = static_cast<std::size_t>(servers);
  const auto j = static_cast<std::size_t>(server_index);
  return j * (total / k) + std::min(j, total % k);
}

std::size_t PsRoles::shard_end(int server_index, std::size_t total) const {
  return shard_begin(server_index + 1, total);
}

std::string ps_header_error(const PsHeader& got, int tag, PsKind expected_kind, int64_t expected_step,
                            int sender, int receiver, bool receiver_is_server) {
  const std::string from =
      (receiver_is_server ? "worker rank " : "parameter server rank ") + std::to_string(sender);
  const std::string to =
      (receiver_is_server ? "parameter server rank " : "worker rank ") + std::to_string(receiver);
  const auto expected = static_cast<int64_t>(expected_kind);
  if (got.kind != expected || tag != expected) {
    return from + " sent a " + kind_name(got.kind) + " header with tag " + kind_name(tag) + " where " + to +
           " expected " + kind_name(expected) + ": corrupt or mismatched message";
  }
  if (got.step != expected_step) {
    return from + " sent " + kind_name(got.kind) + " for step " + std::to_string(got.step) + " but " + to +
           " expected step " + std::to_string(expected_step) + ": workers and servers disagree on the step";
  }
  if (got.stop_signal < 0 || got.stop_signal >= NSIG) {
    return from + " sent " + kind_name(got.kind) + " with stop signal " + std::to_string(got.stop_signal) +
           ", which is no signal number: corrupt or mismatched message";
  }
  return {};
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string text = ranks.size() == 1 ? "rank " : "ranks ";
  for (std::size_t i = 0; i < ranks.size(); ++i) text += (i ? ", " : "") + std::to_string(ranks[i]);
  return text;
}

void ClientWaits::set(std::vector<int> server_ranks) {
  const std::lock_guard<std::mutex> lock(mutex_);
  server_ranks_ = std::move(server_ranks);
}

std::vector<int> ClientWaits::get() const {
  const std::lock_guard<std::mutex> lock(mutex_);
  return server_ranks_;
}

PsChannels::PsChannels(MPI_Comm parent, bool colocated, double timeout_s, const std::string& who) {
  requests_ = duplicate(parent, timeout_s, who);
  if (colocated) {
    replies_ = duplicate(parent, timeout_s, who);
    alive_ = duplicate(parent, timeout_s, who);
  }
}

PsChannels::~PsChannels() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  MPI_Comm_free(&requests_);
  if (replies_ != MPI_COMM_NULL) MPI_Comm_free(&replies_);
  if (alive_ != MPI_COMM_NULL) MPI_Comm_free(&alive_);
}

PsServerStats run_parameter_server(const PsChannels& channels, const PsOptions& options,
                                   std::size_t total_size, std::span<float> shard,
                                   const ShardUpdate& update) {
  Server server(channels, options, total_size, shard, update);
  return server.run();
}

PsServerStats run_parameter_server(MPI_Comm comm, const PsOptions& options, std::size_t total_size,
                                   std::span<float> shard, const ShardUpdate& update) {
  DDP_CHECK(options.servers > 0);  // colocated: one PsChannels shared by a rank's client and server
  const PsChannels channels(comm, false, options.timeout_s,
                            "parameter server (rank " + std::to_string(rank_of(comm)) + ")");
  return run_parameter_server(channels, options, total_size, shard, update);
}

ParameterClient::ParameterClient(MPI_Comm comm, const PsOptions& options, std::size_t total_size)
    : own_channels_(std::make_unique<PsChannels>(comm, false, 2 * options.timeout_s,
                                                 "worker (rank " + std::to_string(rank_of(comm)) + ")")),
      requests_(own_channels_->requests()),
      replies_(own_channels_->replies()),
      options_(options),
      total_size_(total_size) {
  DDP_CHECK(options.servers > 0);  // colocated: one PsChannels shared by a rank's client and server
  set_up();
}

ParameterClient::ParameterClient(const PsChannels& channels, const PsOptions& options, std::size_t total_size)
    : waits_(&channels.client_waits()),
      requests_(channels.requests()),
      replies_(channels.replies()),
      options_(options),
      total_size_(total_size) {
  set_up();
}

void ParameterClient::set_up() {
  int size = 0;
  DDP_CHECK_MPI(MPI_Comm_size(requests_, &size));
  DDP_CHECK_MPI(MPI_Comm_rank(requests_, &rank_));
  roles_ = PsRoles::of(size, options_.servers);
  validate(options_);
  if (!roles_.is_worker(rank_))
    DDP_FATAL("ParameterClient on rank " + std::to_string(rank_) + ", which is a parameter server");
  DDP_CHECK(options_.sparse_exchange_rows.end() <= total_size_);
  for (int j = 0; j < roles_.servers; ++j) {
    Peer peer;
    peer.rank = roles_.server_rank(j);
    peer.begin = roles_.shard_begin(j, total_size_);
    peer.end = roles_.shard_end(j, total_size_);
    message_bytes(peer.end - peer.begin);  // throws if too large
    peer.send.resize(kHeaderFloats + peer.end - peer.begin);
    peer.receive.resize(kHeaderFloats + peer.end - peer.begin);
    peers_.push_back(std::move(peer));
  }
}

ParameterClient::~ParameterClient() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  finish();
}

void ParameterClient::push_pull(std::span<const float> grads, std::span<float> params) {
  DDP_CHECK(grads.size() == total_size_);
  exchange(PsKind::kGrads, grads, nullptr, params);
  ++step_;
}

void ParameterClient::push_pull(std::span<const float> grads, std::span<const int32_t> touched_rows,
                                std::span<float> params) {
  DDP_CHECK(grads.size() == total_size_);
  exchange(PsKind::kGrads, grads, &touched_rows, params);
  ++step_;
}

void ParameterClient::push_pull(std::span<const float> grads, const std::span<const int32_t>* touched_rows,
                                std::span<float> params) {
  if (touched_rows != nullptr && !options_.sparse_exchange_rows.empty()) {
    push_pull(grads, *touched_rows, params);
  } else {
    push_pull(grads, params);
  }
}

void ParameterClient::pull(std::span<float> params) {
  exchange(PsKind::kPull, {}, nullptr, params);
}

void ParameterClient::exchange(PsKind kind, std::span<const float> grads,
                               const std::span<const int32_t>* touched_rows, std::span<float> params) {
  DDP_CHECK(!finished_);
  DDP_CHECK(params.size() == total_size_);
  // PsOptions::wire in 16 bits, sync: a step's reply is the update, rounded; a pull's is the parameters.
  const bool rounded_update =
      kind == PsKind::kGrads && options_.wire != WireFormat::kFloat && !options_.async;
  for (Peer& peer : peers_) {
    const std::size_t shard = peer.end - peer.begin;
    DDP_CHECK_MPI(MPI_Irecv(peer.receive.data(), message_bytes(shard), MPI_BYTE, peer.rank,
                            tag_of(PsKind::kParams), replies_, &peer.receive_request));
    PsKind sent = kind;
    std::size_t floats = kind == PsKind::kGrads ? shard : 0;
    if (touched_rows != nullptr) {
      const std::size_t sparse =
          encode_row_sparse(grads, peer.begin, peer.end, options_.sparse_exchange_rows, *touched_rows,
                            std::span<float>(peer.send).subspan(kHeaderFloats, shard));
      if (sparse > 0) {
        sent = PsKind::kSparseGrads;
        floats = sparse;
      }
    }
    write_header(peer.send, step_, sent);
    if (sent == PsKind::kGrads)
      std::copy(grads.begin() + peer.begin, grads.begin() + peer.end, peer.send.begin() + kHeaderFloats);
    int bytes = message_bytes(floats);
    if (kind == PsKind::kGrads && options_.wire != WireFormat::kFloat) {
      const std::span<float> payload = std::span<float>(peer.send).subspan(kHeaderFloats, floats);
      std::string unused;
      const std::size_t words =
          sent == PsKind::kSparseGrads
              ? row_sparse_words(payload_bytes(peer.send), floats * sizeof(float), unused)
              : 0;
      bytes = message_bytes_of_payload(narrow_values(payload, words, options_.wire));
    }
    DDP_CHECK_MPI(
        MPI_Isend(peer.send.data(), bytes, MPI_BYTE, peer.rank, tag_of(sent), requests_, &peer.send_request));
  }
  const std::string me = "worker (rank " + std::to_string(rank_) + ")";
  const double limit = 2 * options_.timeout_s;
  const auto start = Clock::now();
  Poller poller;
  std::size_t published = 0;  // how many replies were awaited when waits_ was last told (0: not told)
  for (std::size_t waiting = peers_.size(); waiting > 0;) {
    bool progressed = false;
    for (Peer& peer : peers_) {
      if (peer.receive_request == MPI_REQUEST_NULL) continue;
      int done = 0;
      MPI_Status status;
      DDP_CHECK_MPI(MPI_Test(&peer.receive_request, &done, &status));
      if (!done) continue;
      const std::size_t bytes = received_bytes(status, me);
      const PsHeader header = read_header(peer.receive);
      const std::string error =
          ps_header_error(header, status.MPI_TAG, PsKind::kParams, step_, peer.rank, rank_, false);
      if (!error.empty()) DDP_FATAL(error);
      servers_stop_signal_ = std::max(servers_stop_signal_, static_cast<int>(header.stop_signal));
      const std::size_t shard = peer.end - peer.begin;
      if (rounded_update) {
        // The server's update in 16 bits, added as the server added it to its own shard.
        std::string corrupt;
        update_.resize(shard);
        const std::size_t floats =
            widen_values(payload_bytes(peer.receive), bytes, 0, update_, options_.wire, corrupt);
        DDP_CHECK(corrupt.empty() && floats == shard);
        for (std::size_t i = 0; i < shard; ++i) params[peer.begin + i] += update_[i];
      } else {
        DDP_CHECK(bytes == shard * sizeof(float));
        std::copy(peer.receive.begin() + kHeaderFloats, peer.receive.end(), params.begin() + peer.begin);
      }
      --waiting;
      progressed = true;
    }
    if (waiting == 0) break;
    if (progressed) {
      poller.progressed();
      continue;
    }
    if (waits_ != nullptr && published != waiting) {  // a wait to tell the server beside this client
      waits_->set(pending_servers());
      published = waiting;
    }
    if (poller.confirm_overdue(seconds_since(start, Clock::now()) > limit)) {
      DDP_FATAL(me + " heard nothing from parameter server " + rank_list(pending_servers()) + " for " +
                format_seconds(limit) + " s (waiting for its " + kind_name(static_cast<int64_t>(kind)) +
                " reply, step " + std::to_string(step_) + "): rank lost?");
    }
    poller.idle();
  }
  if (published != 0) waits_->set({});
  wait_sends();  // a server that replied has received the request, so this returns at once
}

std::vector<int> ParameterClient::pending_servers() const {
  std::vector<int> ranks;
  for (const Peer& peer : peers_) {
    if (peer.receive_request != MPI_REQUEST_NULL) ranks.push_back(peer.rank);
  }
  return ranks;
}

void ParameterClient::finish() {
  if (finished_) return;
  for (Peer& peer : peers_) {
    write_header(peer.send, step_, PsKind::kDone);
    DDP_CHECK_MPI(MPI_Isend(peer.send.data(), message_bytes(0), MPI_BYTE, peer.rank, tag_of(PsKind::kDone),
                            requests_, &peer.send_request));
  }
  wait_sends();
  finished_ = true;
}

void ParameterClient::wait_sends() {
  const double limit = 2 * options_.timeout_s;
  const auto start = Clock::now();
  for (Peer& peer : peers_) {
    wait_or_fatal(std::span<MPI_Request>(&peer.send_request, 1), start, limit, [&] {
      return "worker (rank " + std::to_string(rank_) + ") could not deliver to parameter server rank " +
             std::to_string(peer.rank) + " for " + format_seconds(limit) + " s: rank lost?";
    });
  }
}

}  // namespace ddp::comm
