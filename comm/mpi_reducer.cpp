// The MPI backend: gradient segments are averaged with non-blocking MPI_Iallreduce (sum, then one scale by
// 1/size on every rank, so all ranks compute bit-identical averages from bit-identical sums).
//
// Open MPI moves a non-blocking collective only inside MPI calls, and backward makes none: across a slow
// link the buckets would travel only once finish_average() waits. So on a job of several nodes, where MPI
// allows calls from several threads (MPI_THREAD_MULTIPLE), a progress thread of the communicator tests the
// pending reductions every 200 us (progress_period) while any is pending, and sleeps otherwise. The thread
// touches only pending_, under mutex_, and every MPI call of this reducer is made under mutex_: Open
// MPI 4.1's TCP transport can lose a connection handshake when two threads call MPI while it wires up peers
// (a job across two nodes hung in its first steps about one run in thirty when the row all-gathers went on
// beside the progress thread's tests). mutex_ is the lock of the HostGroup the reducer was made over, so the
// trainer's host collectives (metrics, broadcasts) take it too.
//
// comm.compression = bf16 halves the bytes: a segment travels as bfloat16 in two collectives instead of one
// float all-reduce. An all-to-all hands rank r every rank's r-th chunk; rank r adds them in float, in rank
// order, scales by 1/size and rounds its chunk's average to bfloat16 once; an all-gather hands every rank
// every chunk's average. The averaging stays in float and every rank ends with the same bits. fp16 goes the
// same way with a scale: each chunk a rank sends, and each chunk's average, is multiplied by the power of two
// that puts its largest magnitude in [2^14, 2^15) (wire_cast.h: half_wire_scale) and carries that exponent
// in one 16-bit word in front, so every value keeps fp16's 11 bits relative to its chunk's largest without
// a collective to agree on a scale first. Each collective
// moves (size - 1) / size of the segment in 16 bits, where the float ring's two phases move it in 32; the
// progress thread (or the next test) starts the second once the first completes. Non-blocking collectives
// pair up by the order each rank starts them on a communicator, and a segment's first half may complete
// earlier on one rank than on another, after the next segment's all-to-all started there: so the all-gathers
// run on a communicator of their own, started in the segments' order on every rank.
//
// Several ranks per node, several nodes (comm.hierarchy = auto): a segment goes in three steps, so that each
// node sends one copy of it over the links instead of one per rank. A gather inside the node to its leader
// (its lowest rank; shared memory carries it, in float whatever the wire), which adds the node's copies in
// rank order; the exchange across the leaders alone (a float all-reduce in place, whose scale by 1/size
// stays in finish_average(); or the 16-bit wire's all-to-all and all-gather among the leaders, which scale
// each chunk's sum of node sums by 1/size of the whole job); and a broadcast of the float result from the
// leader inside the node. The sparse exchange's row ids go the same way (union_of_rows). A gather, not
// MPI_Ireduce: Open MPI 4.1's non-blocking reduce of a large segment between two ranks is a chain of 8 KB
// pieces, one piece per test of the request, and made a step at 1 Gbit/s several times slower than the flat
// all-reduce (benchmarks/RESULTS.md). Every rank ends with its leader's bits, and the leaders with the same
// ones (one all-reduce, as the flat path). The same ordering rule as the 16-bit all-gathers holds for every
// stage: a segment starts a stage once its previous stage completed and the segment before it started that
// stage, and each stage of a rank runs on a communicator of its own (a leader may start segment k's broadcast
// after segment k + 1's gather). A job whose ranks each have a node, or share one, takes the flat path.
//
// Every path is a list of such stages per rank (stages_): the flat float all-reduce is one, the flat 16-bit
// exchange two, the hierarchy two (a node's other ranks) to four (a leader on a 16-bit wire).
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "comm/mpi_check.h"
#include "comm/node_layout.h"
#include "comm/wire_payload.h"
#include "engine/base/errors.h"
#include "engine/base/timeline.h"

namespace ddp::comm {
namespace {

// Errors come back as codes and end the job through fatal(), with a message naming the call.
void return_errors(MPI_Comm comm) {
  DDP_CHECK_MPI(MPI_Comm_set_errhandler(comm, MPI_ERRORS_RETURN));
}

// Whether the hierarchy applies to the ranks `layout` groups.
bool hierarchical(const NodeLayout& layout, const MpiReducerOptions& options) {
  return options.hierarchy == "auto" && layout.nodes > 1 && layout.largest_node > 1;
}

class MpiReducer final : public GradientReducer {
 public:
  MpiReducer(const HostGroup& group, const MpiReducerOptions& options)
      : wire_(wire_format(options.compression)),
        progress_period_(progress_period()),
        lock_(group.call_lock()),
        mutex_(*lock_) {
    std::lock_guard lock(mutex_);
    DDP_CHECK_MPI(MPI_Comm_dup(group.mpi_comm(), &comm_));
    return_errors(comm_);
    DDP_CHECK_MPI(MPI_Comm_rank(comm_, &rank_));
    DDP_CHECK_MPI(MPI_Comm_size(comm_, &size_));
    int threading = MPI_THREAD_SINGLE;
    DDP_CHECK_MPI(MPI_Query_thread(&threading));
    NodeLayout layout = find_nodes(comm_, options.test_node);
    // Within one node, shared-memory reductions complete inside the MPI calls the step makes anyway, and the
    // progress thread's polls only took cores from the replicas (the quickstart's step on 2 ranks was slower
    // with it).
    progress_thread_allowed_ =
        threading == MPI_THREAD_MULTIPLE && layout.nodes > 1 && progress_period_.count() > 0;
    const bool sixteen_bits = wire_ != WireFormat::kFloat;
    if (!hierarchical(layout, options)) {
      DDP_CHECK_MPI(MPI_Comm_free(&layout.node));
      stages_ = sixteen_bits ? std::vector<Stage>{Stage::kWireAllToAll, Stage::kWireAllGather}
                             : std::vector<Stage>{Stage::kAllReduce};
      if (sixteen_bits) flat_wire_ = wire_group(comm_);
      return;
    }
    node_comm_ = layout.node;
    leader_ = layout.node_rank == 0;
    DDP_CHECK_MPI(MPI_Comm_size(node_comm_, &node_size_));
    DDP_CHECK_MPI(MPI_Comm_dup(node_comm_, &broadcast_comm_));
    return_errors(broadcast_comm_);
    DDP_CHECK_MPI(MPI_Comm_dup(node_comm_, &rows_node_comm_));
    return_errors(rows_node_comm_);
    DDP_CHECK_MPI(MPI_Comm_split(comm_, leader_ ? 0 : MPI_UNDEFINED, rank_, &leaders_comm_));
    if (!leader_) {
      stages_ = {Stage::kNodeGather, Stage::kNodeBroadcast};
      return;
    }
    return_errors(leaders_comm_);
    DDP_CHECK_MPI(MPI_Comm_dup(leaders_comm_, &rows_leaders_comm_));
    return_errors(rows_leaders_comm_);
    if (sixteen_bits) {
      leaders_wire_ = wire_group(leaders_comm_);
      stages_ = {Stage::kNodeGather, Stage::kLeadersWireAllToAll, Stage::kLeadersWireAllGather,
                 Stage::kNodeBroadcast};
    } else {
      stages_ = {Stage::kNodeGather, Stage::kLeadersSum, Stage::kNodeBroadcast};
    }
  }
  ~MpiReducer() override {
    if (progress_.joinable()) {
      {
        std::lock_guard lock(mutex_);
        stopping_ = true;
      }
      work_.notify_one();
      progress_.join();
    }
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) {
      std::lock_guard lock(mutex_);
      for (MPI_Comm* c : {&flat_wire_.gather, &leaders_wire_.gather, &node_comm_, &broadcast_comm_,
                          &leaders_comm_, &rows_node_comm_, &rows_leaders_comm_}) {
        if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
      }
      MPI_Comm_free(&comm_);
    }
  }

  std::string backend() const override { return "mpi"; }
  int size() const override { return size_; }

  void start_average(std::span<float> segment) override {
    if (size_ == 1 || segment.empty()) return;
    if (progress_thread_allowed_ && !progress_.joinable())
      progress_ = std::thread([this] { make_progress(); });
    std::lock_guard lock(mutex_);
    Pending pending{segment, MPI_REQUEST_NULL, timeline::Clock::now(), {}, nullptr, 0, 0};
    // The i-th segment of a step takes the i-th buffer: the same segments every step, no growth after one.
    pending.buffer = pending_.size();
    if (leader_ && gathered_.size() <= pending.buffer) gathered_.resize(pending.buffer + 1);
    start_stage(pending);  // its first: the segment before started its own already
    pending_.push_back(std::move(pending));
    // Poke MPI once now: without a progress thread, nothing moves the reduction until the next MPI call.
    complete_some(/*wait=*/false);
    work_.notify_one();
  }

  void finish_average() override {
    std::lock_guard lock(mutex_);
    if (pending_.empty()) return;
    while (complete_some(/*wait=*/true)) {
    }
    // The 16-bit wire's averages are final (read back to float as their all-gather completed); a float sum
    // is scaled here.
    const float factor = wire_ != WireFormat::kFloat ? 1.0f : 1.0f / static_cast<float>(size_);
    for (const Pending& p : pending_) {
      if (p.rows_target) {
        unpack_rows(*p.rows_target, factor);
      } else if (factor != 1.0f) {
        for (float& x : p.segment) x *= factor;
      }
    }
    pending_.clear();
  }

  std::vector<int32_t> start_average_rows(std::span<float> matrix, std::size_t width,
                                          std::span<const int32_t> rows) override {
    if (size_ == 1) return {rows.begin(), rows.end()};
    const std::size_t total_rows = matrix.size() / width;
    const std::vector<int32_t> gathered = union_of_rows(rows);

    if (2 * gathered.size() > total_rows) {  // dense is cheaper than packing most of the matrix
      start_average(matrix);
      return gathered;
    }
    // Untouched rows are zero, so packing the union's rows from every rank's matrix sums correctly.
    {
      std::lock_guard lock(mutex_);
      DDP_CHECK(
          std::none_of(pending_.begin(), pending_.end(), [](const Pending& p) { return p.rows_target; }));
    }
    packed_.resize(gathered.size() * width);
    for (std::size_t i = 0; i < gathered.size(); ++i) {
      const float* row = matrix.data() + static_cast<std::size_t>(gathered[i]) * width;
      std::copy(row, row + width, packed_.data() + i * width);
    }
    start_average(packed_);
    std::lock_guard lock(mutex_);
    pending_.back().rows_target = RowsTarget{matrix, width, gathered};
    return gathered;
  }

 private:
  // Collective: the sorted union of every rank's `rows`, the same on every rank. Flat: one all-gather of the
  // ids over every rank. The hierarchy: each node's ids to its leader, the node's union across the leaders,
  // the job's union back inside the node; on communicators of their own, since the progress thread may
  // start a segment's stage on the others at any time.
  std::vector<int32_t> union_of_rows(std::span<const int32_t> rows) {
    std::lock_guard lock(mutex_);
    if (rows_node_comm_ == MPI_COMM_NULL) return sorted_unique(all_gather_ids(rows, comm_));
    std::vector<int32_t> ids = sorted_unique(gather_ids(rows, rows_node_comm_));  // the leader's node's
    if (leader_) ids = sorted_unique(all_gather_ids(ids, rows_leaders_comm_));
    int count = checked_count(ids.size());
    DDP_CHECK_MPI(MPI_Bcast(&count, 1, MPI_INT, 0, rows_node_comm_));
    ids.resize(static_cast<std::size_t>(count));
    DDP_CHECK_MPI(MPI_Bcast(ids.data(), count, MPI_INT32_T, 0, rows_node_comm_));
    return ids;
  }

  static std::vector<int32_t> sorted_unique(std::vector<int32_t> ids) {
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    return ids;
  }

  // Collective over `comm`: every rank's `ids`, rank after rank, on every rank.
  static std::vector<int32_t> all_gather_ids(std::span<const int32_t> ids, MPI_Comm comm) {
    int ranks = 1;
    DDP_CHECK_MPI(MPI_Comm_size(comm, &ranks));
    const int mine = checked_count(ids.size());
    std::vector<int> counts(static_cast<std::size_t>(ranks));
    DDP_CHECK_MPI(MPI_Allgather(&mine, 1, MPI_INT, counts.data(), 1, MPI_INT, comm));
    const std::vector<int> offsets = offsets_of(counts);
    std::vector<int32_t> all(static_cast<std::size_t>(offsets.back() + counts.back()));
    DDP_CHECK_MPI(MPI_Allgatherv(ids.data(), mine, MPI_INT32_T, all.data(), counts.data(), offsets.data(),
                                 MPI_INT32_T, comm));
    return all;
  }

  // Collective over `comm`: every rank's `ids`, rank after rank, on its rank 0 (empty elsewhere).
  static std::vector<int32_t> gather_ids(std::span<const int32_t> ids, MPI_Comm comm) {
    int rank = 0;
    int ranks = 1;
    DDP_CHECK_MPI(MPI_Comm_rank(comm, &rank));
    DDP_CHECK_MPI(MPI_Comm_size(comm, &ranks));
    const int mine = checked_count(ids.size());
    std::vector<int> counts(static_cast<std::size_t>(ranks));
    DDP_CHECK_MPI(MPI_Gather(&mine, 1, MPI_INT, counts.data(), 1, MPI_INT, 0, comm));
    std::vector<int32_t> all;
    std::vector<int> offsets;
    if (rank == 0) {
      offsets = offsets_of(counts);
      all.resize(static_cast<std::size_t>(offsets.back() + counts.back()));
    }
    DDP_CHECK_MPI(MPI_Gatherv(ids.data(), mine, MPI_INT32_T, all.data(), counts.data(), offsets.data(),
                              MPI_INT32_T, 0, comm));
    return all;
  }

  // Where each count's items start when laid end to end.
  static std::vector<int> offsets_of(const std::vector<int>& counts) {
    std::vector<int> offsets(counts.size());
    std::size_t at = 0;
    for (std::size_t r = 0; r < counts.size(); ++r) {
      offsets[r] = checked_count(at);
      at += static_cast<std::size_t>(counts[r]);
    }
    checked_count(at);
    return offsets;
  }

  // Where the packed, summed rows of start_average_rows() go once their reduction completes.
  struct RowsTarget {
    std::span<float> matrix;
    std::size_t width = 0;
    std::vector<int32_t> rows;
  };
  // The ranks a 16-bit exchange runs over (every rank, or the node leaders): its two communicators (the
  // all-to-alls', the all-gathers'), this rank's place and their number.
  struct WireGroup {
    MPI_Comm exchange = MPI_COMM_NULL;
    MPI_Comm gather = MPI_COMM_NULL;  // a duplicate of `exchange` (top of the file), freed by the reducer
    int rank = 0;
    int size = 1;
  };
  // A segment on a 16-bit wire: its chunks (chunk r is the group's rank r's to average). On the fp16 wire
  // every chunk starts with its scale's exponent (one word), then its values.
  struct WireExchange {
    std::size_t values_count = 0;    // the segment's floats
    std::vector<uint16_t> values;    // the segment: this rank's, then every chunk's average
    std::vector<uint16_t> received;  // every rank's values of this rank's chunk, rank after rank
    std::vector<uint16_t> averages;  // this rank's chunk, averaged
    std::vector<int> counts;         // per rank: its chunk's length in words
    std::vector<int> offsets;        // per rank: its chunk's start in words
    std::vector<int> received_counts;
    std::vector<int> received_offsets;
  };
  struct Pending {
    std::span<float> segment;
    MPI_Request request;
    timeline::Clock::time_point started;  // for the timeline's bucket track
    std::optional<RowsTarget> rows_target;
    WireExchange* wire;              // 16 bits on the wire, while its exchange runs: one of wires_
    std::size_t stages_started = 0;  // how many of stages_ it started
    std::size_t buffer = 0;          // its buffers: gathered_ (on a node's leader), wires_
  };
  // The collectives a segment goes through, each on a communicator of its own (top of the file).
  enum class Stage {
    kAllReduce,             // float, every rank
    kWireAllToAll,          // 16 bits, every rank: the chunks to their owners
    kWireAllGather,         // the chunks' averages to every rank
    kNodeGather,            // the hierarchy: every node rank's copy to its leader
    kLeadersSum,            // the node's sum, then a float all-reduce across the leaders
    kLeadersWireAllToAll,   // the node's sum, then the 16-bit all-to-all across the leaders
    kLeadersWireAllGather,  // and its all-gather
    kNodeBroadcast,         // the leader's result to its node
  };

  WireGroup wire_group(MPI_Comm comm) const {
    WireGroup group{comm, MPI_COMM_NULL, 0, 1};
    DDP_CHECK_MPI(MPI_Comm_rank(comm, &group.rank));
    DDP_CHECK_MPI(MPI_Comm_size(comm, &group.size));
    DDP_CHECK_MPI(MPI_Comm_dup(comm, &group.gather));
    return_errors(group.gather);
    return group;
  }

  // Starts the next stage of `p`. Called with mutex_ held.
  void start_stage(Pending& p) {
    float* data = p.segment.data();
    const int count = checked_count(p.segment.size());
    switch (stages_[p.stages_started++]) {
      case Stage::kAllReduce:
        DDP_CHECK_MPI(MPI_Iallreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, comm_, &p.request));
        break;
      case Stage::kWireAllToAll:
        p.wire = start_wire_exchange(p.segment, flat_wire_, p.buffer, p.request);
        break;
      case Stage::kWireAllGather:
        start_wire_gather(*p.wire, flat_wire_, p.request);
        break;
      case Stage::kNodeGather: {
        float* copies = nullptr;
        if (leader_) {
          std::vector<float>& buffer = gathered_[p.buffer];
          buffer.resize(p.segment.size() * static_cast<std::size_t>(node_size_));
          copies = buffer.data();
        }
        // Not in place: the 16-bit all-gathers' in-place form failed in Open MPI 4.1 (start_wire_gather).
        DDP_CHECK_MPI(
            MPI_Igather(data, count, MPI_FLOAT, copies, count, MPI_FLOAT, 0, node_comm_, &p.request));
        break;
      }
      case Stage::kLeadersSum:
        add_node_copies(p);
        DDP_CHECK_MPI(
            MPI_Iallreduce(MPI_IN_PLACE, data, count, MPI_FLOAT, MPI_SUM, leaders_comm_, &p.request));
        break;
      case Stage::kLeadersWireAllToAll:
        add_node_copies(p);
        p.wire = start_wire_exchange(p.segment, leaders_wire_, p.buffer, p.request);
        break;
      case Stage::kLeadersWireAllGather:
        start_wire_gather(*p.wire, leaders_wire_, p.request);
        break;
      case Stage::kNodeBroadcast:
        DDP_CHECK_MPI(MPI_Ibcast(data, count, MPI_FLOAT, 0, broadcast_comm_, &p.request));
        break;
    }
  }

  // A leader's segment becomes its node's sum: its own copy plus the others', in node rank order.
  void add_node_copies(Pending& p) const {
    const float* copies = gathered_[p.buffer].data();
    const std::size_t n = p.segment.size();
    float* data = p.segment.data();
    for (std::size_t r = 1; r < static_cast<std::size_t>(node_size_); ++r) {
      for (std::size_t i = 0; i < n; ++i) data[i] += copies[r * n + i];
    }
  }

  // The stages ready to start, in the segments' order on each communicator: a segment whose last stage
  // completed starts the next one if the segment before it started that one already. Called with mutex_
  // held.
  void start_ready_stages() {
    std::size_t before = stages_.size();  // the stages the segment before started
    for (Pending& p : pending_) {
      if (p.request == MPI_REQUEST_NULL && p.stages_started < before) start_stage(p);
      before = p.stages_started;
    }
  }

  // Words a chunk of `n` values takes on the wire (wire_payload.h: fp16 adds its exponent word).
  std::size_t wire_words(std::size_t n) const { return wire_payload_bytes(n, 0, wire_) / sizeof(uint16_t); }

  // Chunk r of `ranks`: values [n r / ranks, n (r + 1) / ranks) of a segment of n.
  static std::pair<std::size_t, std::size_t> chunk(std::size_t n, std::size_t r, std::size_t ranks) {
    return {n * r / ranks, n * (r + 1) / ranks};
  }

  // The segment's every chunk, averaged, from the all-gathered wire into `segment`.
  void read_wire(const WireExchange& wire, std::span<float> segment) const {
    const std::size_t ranks = wire.counts.size();
    for (std::size_t r = 0; r < ranks; ++r) {
      const auto [begin, end] = chunk(segment.size(), r, ranks);
      decode_values(reinterpret_cast<const unsigned char*>(wire.values.data() + wire.offsets[r]), end - begin,
                    wire_, segment.data() + begin);
    }
  }

  // The first half of the 16-bit exchange of `segment` over `group`: its chunks to the wire and the
  // all-to-all of the chunks. Called with mutex_ held.
  WireExchange* start_wire_exchange(std::span<const float> segment, const WireGroup& group,
                                    std::size_t buffer, MPI_Request& request) {
    // The i-th segment of a step reuses the i-th exchange's buffers: no allocation after the first step.
    while (wires_.size() <= buffer) wires_.push_back(std::make_unique<WireExchange>());
    WireExchange* wire = wires_[buffer].get();
    wire->offsets.clear();
    wire->counts.clear();
    wire->received_counts.clear();
    wire->received_offsets.clear();
    const std::size_t n = segment.size();
    const auto ranks = static_cast<std::size_t>(group.size);
    wire->values_count = n;
    std::size_t words = 0;
    for (std::size_t r = 0; r < ranks; ++r) {
      const auto [begin, end] = chunk(n, r, ranks);
      wire->offsets.push_back(checked_count(words));
      wire->counts.push_back(checked_count(wire_words(end - begin)));
      words += wire_words(end - begin);
    }
    wire->values.resize(words);
    for (std::size_t r = 0; r < ranks; ++r) {
      const auto [begin, end] = chunk(n, r, ranks);
      encode_values(segment.subspan(begin, end - begin),
                    reinterpret_cast<unsigned char*>(wire->values.data() + wire->offsets[r]), wire_);
    }
    const int mine = wire->counts[static_cast<std::size_t>(group.rank)];
    wire->received.resize(ranks * static_cast<std::size_t>(mine));
    for (std::size_t r = 0; r < ranks; ++r) {
      wire->received_counts.push_back(mine);
      wire->received_offsets.push_back(checked_count(r * static_cast<std::size_t>(mine)));
    }
    DDP_CHECK_MPI(MPI_Ialltoallv(wire->values.data(), wire->counts.data(), wire->offsets.data(), MPI_UINT16_T,
                                 wire->received.data(), wire->received_counts.data(),
                                 wire->received_offsets.data(), MPI_UINT16_T, group.exchange, &request));
    return wire;
  }

  // The second half, once the all-to-all completed: this rank's chunk summed in float, in the group's rank
  // order, scaled by 1/size of the whole job and put on the wire once, then the all-gather of every chunk's
  // average. Called with mutex_ held.
  void start_wire_gather(WireExchange& wire, const WireGroup& group, MPI_Request& request) {
    const auto me = static_cast<std::size_t>(group.rank);
    const auto mine = static_cast<std::size_t>(wire.counts[me]);
    const auto [begin, end] = chunk(wire.values_count, me, static_cast<std::size_t>(group.size));
    const std::size_t n = end - begin;
    const float scale = 1.0f / static_cast<float>(size_);
    sums_.assign(n, 0.0f);
    decoded_.resize(n);
    for (std::size_t r = 0; r < static_cast<std::size_t>(group.size); ++r) {
      decode_values(reinterpret_cast<const unsigned char*>(wire.received.data() + r * mine), n, wire_,
                    decoded_.data());
      for (std::size_t i = 0; i < n; ++i) sums_[i] += decoded_[i];
    }
    for (float& x : sums_) x *= scale;
    wire.averages.resize(mine);
    encode_values(sums_, reinterpret_cast<unsigned char*>(wire.averages.data()), wire_);
    // From a buffer of its own, not MPI_IN_PLACE: Open MPI 4.1's non-blocking all-gatherv in place failed
    // with MPI_ERR_TRUNCATE and corrupted the heap at three ranks.
    DDP_CHECK_MPI(MPI_Iallgatherv(wire.averages.data(), wire.counts[me], MPI_UINT16_T, wire.values.data(),
                                  wire.counts.data(), wire.offsets.data(), MPI_UINT16_T, group.gather,
                                  &request));
  }

  void unpack_rows(const RowsTarget& target, float scale) const {
    for (std::size_t i = 0; i < target.rows.size(); ++i) {
      float* row = target.matrix.data() + static_cast<std::size_t>(target.rows[i]) * target.width;
      const float* summed = packed_.data() + i * target.width;
      for (std::size_t j = 0; j < target.width; ++j) row[j] = summed[j] * scale;
    }
  }

  static int checked_count(std::size_t n) {
    DDP_CHECK(n <= static_cast<std::size_t>(INT32_MAX));
    return static_cast<int>(n);
  }

  // The progress thread: while reductions are pending, test them every progress_period_ (MPI moves them on
  // each call); otherwise wait for start_average().
  void make_progress() {
    std::unique_lock lock(mutex_);
    while (!stopping_) {
      const bool active = std::any_of(pending_.begin(), pending_.end(),
                                      [](const Pending& p) { return p.request != MPI_REQUEST_NULL; });
      if (!active) {
        work_.wait(lock);
        continue;
      }
      complete_some(/*wait=*/false);
      lock.unlock();
      std::this_thread::sleep_for(progress_period_);
      lock.lock();
    }
  }

  // Tests (or waits for) the pending reductions; those that completed get their span on the timeline, one
  // track per bucket. False once none is left. Called with mutex_ held.
  bool complete_some(bool wait) {
    requests_.clear();
    for (const Pending& p : pending_) requests_.push_back(p.request);
    indices_.resize(requests_.size());
    int completed = 0;
    const int n = static_cast<int>(requests_.size());
    DDP_CHECK_MPI(wait ? MPI_Waitsome(n, requests_.data(), &completed, indices_.data(), MPI_STATUSES_IGNORE)
                       : MPI_Testsome(n, requests_.data(), &completed, indices_.data(), MPI_STATUSES_IGNORE));
    if (completed == MPI_UNDEFINED) return false;  // no active request left
    const auto now = timeline::Clock::now();
    for (int i = 0; i < completed; ++i) {
      const auto bucket = static_cast<std::size_t>(indices_[static_cast<std::size_t>(i)]);
      Pending& p = pending_[bucket];
      p.request = MPI_REQUEST_NULL;
      const Stage done = stages_[p.stages_started - 1];
      if (done == Stage::kWireAllGather || done == Stage::kLeadersWireAllGather) {
        read_wire(*p.wire, p.segment);  // the averages, final, back to float
        p.wire = nullptr;
      }
      if (p.stages_started < stages_.size()) continue;  // its next stage starts below
      if (timeline::enabled()) {
        timeline::record("all-reduce bucket", p.started, now,
                         timeline::track("all-reduce bucket", static_cast<int>(bucket)),
                         static_cast<int64_t>(p.segment.size()));
      }
    }
    start_ready_stages();
    return true;
  }

  // Short against a step (tens of milliseconds), long enough that the polls cost the computing core little.
  // DDPTRAIN_MPI_PROGRESS_US overrides it (0: no progress thread), for measuring the choice on a cluster.
  static std::chrono::microseconds progress_period() {
    const char* text = std::getenv("DDPTRAIN_MPI_PROGRESS_US");
    if (text == nullptr || *text == '\0') return std::chrono::microseconds{200};
    char* end = nullptr;
    const long value = std::strtol(text, &end, 10);
    if (*end != '\0' || value < 0 || value > 1000000) {
      throw UserError(std::string("DDPTRAIN_MPI_PROGRESS_US = ") + text +
                      ": expected microseconds from 0 (no progress thread) to 1000000");
    }
    return std::chrono::microseconds{value};
  }

  MPI_Comm comm_ = MPI_COMM_NULL;
  // The hierarchy (top of the file): this rank's node, the same for the broadcasts, and the node leaders
  // (null where it does not apply).
  MPI_Comm node_comm_ = MPI_COMM_NULL;
  MPI_Comm broadcast_comm_ = MPI_COMM_NULL;
  MPI_Comm leaders_comm_ = MPI_COMM_NULL;
  MPI_Comm rows_node_comm_ = MPI_COMM_NULL;     // union_of_rows's, inside the node
  MPI_Comm rows_leaders_comm_ = MPI_COMM_NULL;  // and across the leaders
  WireGroup flat_wire_;                         // a 16-bit wire over every rank (flat path)
  WireGroup leaders_wire_;     // a 16-bit wire across the node leaders (the hierarchy, on a leader)
  std::vector<Stage> stages_;  // this rank's, for every segment
  bool leader_ = false;        // this rank leads its node
  int node_size_ = 1;
  std::vector<std::vector<float>> gathered_;  // a leader's: per segment in flight, every node rank's copy
  std::vector<std::unique_ptr<WireExchange>> wires_;  // per segment in flight, reused step after step
  int rank_ = 0;
  int size_ = 1;
  bool progress_thread_allowed_ = false;
  const WireFormat wire_;  // comm.compression
  const std::chrono::microseconds progress_period_;
  std::vector<float> sums_, decoded_;  // start_wire_gather's scratch
  std::thread progress_;
  std::shared_ptr<std::mutex> lock_;  // the HostGroup's (see the top of the file)
  std::mutex& mutex_;                 // *lock_: pending_, and every MPI call on comm_
  std::condition_variable work_;
  bool stopping_ = false;
  std::vector<Pending> pending_;
  std::vector<MPI_Request> requests_;  // scratch of complete_some()
  std::vector<int> indices_;
  std::vector<float> packed_;  // the rows of start_average_rows() in flight, reused
};

}  // namespace

namespace {
void check_options(const MpiReducerOptions& options) {
  if (options.compression != "none" && options.compression != "bf16" && options.compression != "fp16") {
    throw UserError("comm.compression = " + options.compression + ": expected none, fp16 or bf16");
  }
  if (options.hierarchy != "auto" && options.hierarchy != "off")
    throw UserError("comm.hierarchy = " + options.hierarchy + ": expected auto or off");
}
}  // namespace

MpiHierarchy mpi_hierarchy(const HostGroup& group, const MpiReducerOptions& options) {
  check_options(options);
  if (group.size() == 1) return {};
  std::lock_guard lock(*group.call_lock());
  NodeLayout layout = find_nodes(group.mpi_comm(), options.test_node);
  DDP_CHECK_MPI(MPI_Comm_free(&layout.node));
  return {hierarchical(layout, options), layout.nodes, layout.largest_node};
}

std::unique_ptr<GradientReducer> make_mpi_reducer(const HostGroup& group, const MpiReducerOptions& options) {
  check_options(options);
  return std::make_unique<MpiReducer>(group, options);
}

}  // namespace ddp::comm
