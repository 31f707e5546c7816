// Gradient exchange alone: the all-reduce backend against the parameter server (sync and async).
//
// No model runs. Every step a worker "computes" for a fixed --compute-ms (spinning on the clock, so that it
// holds a core as the CPU step does, or sleeping with --compute-kind sleep, as a rank whose step runs on an
// accelerator), the last worker also sleeps --straggle-ms (the artificial straggler), then the gradients (a
// fixed synthetic vector of --size floats) are exchanged and the update applied:
//   allreduce  every rank is a worker: GradientReducer::start_average/finish_average over the whole flat
//   vector,
//              then Adam over the full vector on every rank;
//   ps-sync    the last --servers ranks serve (PsRoles), the others push_pull the full vector; each server
//              applies Adam to its shard once per step (the workers' averaged gradients);
//   ps-async   as ps-sync with PsOptions::async and max_staleness --staleness: one Adam step per gradient.
//   colocated-collective  every rank trains and serves a shard (ShardedExchange): a reduce-scatter of the
//              gradients, Adam over the rank's shard, an all-gather of the shards;
//   colocated-p2p  the same exchange over the parameter server's point-to-point protocol in sync mode: every
//              rank's server on a thread of its own, its client pushing each shard to its owner.
//
// After --warmup steps the workers meet at a barrier and time --steps steps. Rank 0 prints:
//   updates/s    model updates applied per second: allreduce and ps-sync, steps per second (the slowest
//                worker's timed window); ps-async, gradients applied per second on the servers, from the
//                servers' own clocks (the timed updates over the time from the last warm-up update to the
//                last update; mean over servers);
//   gradients/s  worker gradients consumed per second (workers x steps over the slowest worker's window);
//   pace         the sum over workers of 1 / (the worker's mean step): the gradients per second the workers
//                sustain while all of them run (with a time budget rather than a fixed step count, fast
//                workers in async mode would keep this rate; the window above includes the tail after they
//                finish);
//   bytes/s      gradient bytes moved: every rank's bytes sent + received in the timed window, summed over
//                ranks, over the slowest worker's window. PS: counted from the messages the protocol sends
//                (a 16-byte PsHeader + the shard's floats per message, one kGrads and one kParams per worker,
//                server and step). All-reduce: an ESTIMATE from the ring algorithm, each rank sending
//                2 (n - 1) / n x size x 4 bytes per step and receiving as much (Open MPI may pick another
//                algorithm; shared-memory transports copy rather than send);
//   step         the mean wall time of a worker's step (compute + straggle + exchange + update), the mean of
//                the workers' means, with the fastest and the slowest worker's means, and the exchange part.
//
//   mpirun -np 3 --oversubscribe build/benchmarks/ps_bench --mode ps-async --straggle-ms 10 --compute-ms 20
#include <mpi.h>

#include <algorithm>
#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "comm/ps_protocol.h"
#include "comm/sharded_exchange.h"
#include "engine/optimizer/optimizer.h"

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

namespace {

double seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// A barrier that waits by polling with short sleeps, so that a rank that is done leaves the (oversubscribed)
// cores to the ranks still working instead of spinning inside MPI.
void polite_barrier(MPI_Comm comm) {
  MPI_Request request = MPI_REQUEST_NULL;
  MPI_Ibarrier(comm, &request);
  for (int done = 0;;) {
    MPI_Test(&request, &done, MPI_STATUS_IGNORE);
    if (done) return;
    std::this_thread::sleep_for(std::chrono::microseconds(50));
  }
}

// The synthetic compute of one step.
void compute(double ms, bool spin) {
  if (ms <= 0) return;
  const auto duration = std::chrono::duration<double, std::milli>(ms);
  if (!spin) {
    std::this_thread::sleep_for(duration);
    return;
  }
  const auto start = Clock::now();
  volatile double sink = 0;
  while (Clock::now() - start < duration) sink = sink + 1.0;
}

// What every rank reports to rank 0 (as doubles, gathered in one MPI_Gather).
struct RankReport {
  double is_worker = 0;
  double is_straggler = 0;
  double window_s = 0;       // worker: barrier after warm-up to the end of its last timed step
  double step_mean_s = 0;    // worker: mean step
  double step_std_s = 0;     // worker: standard deviation of its steps
  double exchange_s = 0;     // worker: mean exchange (+ local Adam for allreduce) per step
  double bytes = 0;          // bytes sent + received in the timed window
  double server_rate = 0;    // server: timed updates / (last update - last warm-up update)
  double server_busy_s = 0;  // server: time inside the ShardUpdate (Adam) during the timed updates
  double server_updates = 0;
  double server_max_gap = 0;
  static constexpr int kFields = 11;
};

struct Options {
  std::size_t size = 2692225;
  int steps = 50;
  int warmup = 5;
  std::string mode = "allreduce";
  double straggle_ms = 10;
  double compute_ms = 0;
  std::string compute_kind = "spin";
  int servers = 1;
  int staleness = 4;
};

struct WorkerTimes {
  std::vector<double> steps, exchanges;
  Clock::time_point start, end;
};

// A worker's loop: warm-up, barrier over `workers`, timed steps. `exchange` moves the gradients and updates.
template <typename Exchange>
WorkerTimes worker_loop(const Options& o, bool straggler, MPI_Comm workers, Exchange&& exchange) {
  WorkerTimes t;
  const bool spin = o.compute_kind == "spin";
  for (int i = 0; i < o.warmup + o.steps; ++i) {
    if (i == o.warmup) {
      polite_barrier(workers);
      t.start = Clock::now();
    }
    const auto begin = Clock::now();
    compute(o.compute_ms, spin);
    if (straggler && o.straggle_ms > 0)
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(o.straggle_ms));
    const auto exchange_begin = Clock::now();
    exchange();
    const auto end = Clock::now();
    if (i >= o.warmup) {
      t.steps.push_back(seconds(begin, end));
      t.exchanges.push_back(seconds(exchange_begin, end));
    }
  }
  t.end = Clock::now();
  return t;
}

void fill_worker_report(RankReport& r, const WorkerTimes& t, bool straggler) {
  r.is_worker = 1;
  r.is_straggler = straggler ? 1 : 0;
  r.window_s = seconds(t.start, t.end);
  const double n = static_cast<double>(t.steps.size());
  for (double x : t.steps) r.step_mean_s += x / n;
  for (double x : t.exchanges) r.exchange_s += x / n;
  for (double x : t.steps) r.step_std_s += (x - r.step_mean_s) * (x - r.step_mean_s);
  r.step_std_s = std::sqrt(r.step_std_s / std::max(1.0, n - 1));
}

}  // namespace

int main(int argc, char** argv) {
  int threading = MPI_THREAD_SINGLE;  // as ddptrain asks; colocated-p2p's server thread needs it
  MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &threading);
  Options o;
  po::options_description desc("ps_bench");
  desc.add_options()("help", "this help")("size", po::value(&o.size)->default_value(o.size),
                                          "floats in the gradient / parameter vector")(
      "steps", po::value(&o.steps)->default_value(o.steps), "timed steps per worker")(
      "warmup", po::value(&o.warmup)->default_value(o.warmup), "warm-up steps per worker")(
      "mode", po::value(&o.mode)->default_value(o.mode),
      "allreduce | ps-sync | ps-async | colocated-collective | colocated-p2p")(
      "straggle-ms", po::value(&o.straggle_ms)->default_value(o.straggle_ms),
      "the last worker sleeps this long every step (0: no straggler)")(
      "compute-ms", po::value(&o.compute_ms)->default_value(o.compute_ms), "synthetic compute per step")(
      "compute-kind", po::value(&o.compute_kind)->default_value(o.compute_kind),
      "spin (holds a core, as a CPU step) | sleep (as an accelerator step)")(
      "servers", po::value(&o.servers)->default_value(o.servers), "parameter servers (the last ranks)")(
      "staleness", po::value(&o.staleness)->default_value(o.staleness), "ps-async: max_staleness");
  po::variables_map vm;
  try {
    // No guessing of abbreviated option names: a typo must not set another option.
    const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
    po::store(po::parse_command_line(argc, argv, desc, style), vm);
    po::notify(vm);
  } catch (const po::error& e) {
    std::cerr << "ps_bench: " << e.what() << "\n";
    MPI_Finalize();
    return 2;
  }
  int rank = 0, world = 1;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world);
  if (vm.count("help")) {
    if (rank == 0) std::cout << desc;
    MPI_Finalize();
    return 0;
  }
  const bool allreduce = o.mode == "allreduce";
  const bool ps = o.mode == "ps-sync" || o.mode == "ps-async";
  const bool colocated = o.mode == "colocated-collective" || o.mode == "colocated-p2p";
  std::string error;
  if (!allreduce && !ps && !colocated)
    error = "--mode must be allreduce, ps-sync, ps-async, colocated-collective or colocated-p2p";
  if (o.mode == "colocated-p2p" && threading < MPI_THREAD_MULTIPLE)
    error = "colocated-p2p needs MPI_THREAD_MULTIPLE";
  if (o.compute_kind != "spin" && o.compute_kind != "sleep") error = "--compute-kind must be spin or sleep";
  if (o.steps < 1 || o.warmup < 0 || o.size < 1) error = "--steps >= 1, --warmup >= 0, --size >= 1";
  if (ps && (o.servers < 1 || o.servers >= world))
    error = "ps modes need 1 <= --servers < ranks (at least one worker)";
  if (!error.empty()) {
    if (rank == 0) std::cerr << "ps_bench: " << error << "\n";
    MPI_Finalize();
    return 2;
  }

  const int servers = ps ? o.servers : 0;
  const int workers = world - servers;
  const bool is_server = rank >= workers;
  const bool straggler = !is_server && rank == workers - 1;
  MPI_Comm role_comm = MPI_COMM_NULL;  // the workers among themselves (and the servers among themselves)
  MPI_Comm_split(MPI_COMM_WORLD, is_server ? 1 : 0, rank, &role_comm);

  // Identical initial parameters everywhere; gradients differ per rank. Values do not matter to the timing.
  std::vector<float> params(o.size), grads(o.size);
  {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> u(-0.05f, 0.05f);
    for (float& p : params) p = u(rng);
    std::mt19937 grng(static_cast<unsigned>(rank) + 100);
    for (float& g : grads) g = 1e-3f * u(grng);
  }
  ddp::optim::OptimizerSettings adam_settings;  // Adam, lr 0.001 (Keras defaults)
  constexpr double kHeaderBytes = sizeof(ddp::comm::PsHeader);
  const double vector_bytes = 4.0 * static_cast<double>(o.size);

  RankReport report;
  if (allreduce) {
    ddp::comm::HostGroup group(MPI_COMM_WORLD);
    auto comm = ddp::comm::make_mpi_reducer(group);
    auto adam = ddp::optim::make_optimizer(adam_settings, o.size);
    const WorkerTimes t = worker_loop(o, straggler, role_comm, [&] {
      // Averaged in place, as the trainer's gradient buffer (re-averaging keeps the values bounded).
      comm->start_average(grads);
      comm->finish_average();
      adam->step(params, grads);
    });
    fill_worker_report(report, t, straggler);
    // Ring estimate: per step a rank sends 2 (n - 1) / n of the vector and receives as much.
    const double n = world;
    report.bytes = world > 1 ? 2.0 * (2.0 * (n - 1) / n * vector_bytes) * o.steps : 0.0;
    polite_barrier(MPI_COMM_WORLD);
  } else if (colocated) {
    const ddp::comm::PsRoles roles = ddp::comm::PsRoles::colocated_on(world);
    const std::size_t begin = roles.shard_begin(rank, o.size), end = roles.shard_end(rank, o.size);
    auto adam = ddp::optim::make_optimizer(adam_settings, end - begin);
    WorkerTimes t;
    if (o.mode == "colocated-collective") {
      ddp::comm::ShardedExchange exchange(MPI_COMM_WORLD, o.size);
      std::vector<float> shard_grads(end - begin);
      t = worker_loop(o, straggler, role_comm, [&] {
        exchange.reduce_scatter_average(grads, shard_grads);
        adam->step(std::span<float>(params).subspan(begin, end - begin), shard_grads);
        exchange.all_gather(params);
      });
    } else {
      ddp::comm::PsOptions ps_options;
      ps_options.servers = 0;
      const ddp::comm::PsChannels channels(MPI_COMM_WORLD, true, ps_options.timeout_s, "ps_bench");
      std::vector<float> shard(params.begin() + static_cast<std::ptrdiff_t>(begin),
                               params.begin() + static_cast<std::ptrdiff_t>(end));
      const ddp::comm::ShardUpdate update = [&](std::span<float> p, std::span<const float> g) {
        adam->step(p, g);
      };
      std::thread server(
          [&] { ddp::comm::run_parameter_server(channels, ps_options, o.size, shard, update); });
      {
        ddp::comm::ParameterClient client(channels, ps_options, o.size);
        t = worker_loop(o, straggler, role_comm, [&] { client.push_pull(grads, params); });
        client.finish();
      }
      server.join();
    }
    fill_worker_report(report, t, straggler);
    // Per step each rank sends (n - 1) / n of the vector and receives as much, twice (gradients to the
    // shards' owners, shards back): counted for p2p (headers left out), the same ESTIMATE for the
    // collectives.
    const double n = world;
    report.bytes = 2.0 * 2.0 * (n - 1) / n * vector_bytes * o.steps;
    polite_barrier(MPI_COMM_WORLD);
  } else {
    ddp::comm::PsOptions ps_options;
    ps_options.servers = servers;
    ps_options.async = o.mode == "ps-async";
    ps_options.max_staleness = o.staleness;
    const ddp::comm::PsRoles roles = ddp::comm::PsRoles::make(world, servers);
    if (is_server) {
      const int index = roles.server_index(rank);
      const std::size_t begin = roles.shard_begin(index, o.size), end = roles.shard_end(index, o.size);
      std::vector<float> shard(params.begin() + static_cast<std::ptrdiff_t>(begin),
                               params.begin() + static_cast<std::ptrdiff_t>(end));
      auto adam = ddp::optim::make_optimizer(adam_settings, shard.size());
      std::vector<Clock::time_point> stamps;
      std::vector<double> busy;
      stamps.reserve(static_cast<std::size_t>(workers) * static_cast<std::size_t>(o.warmup + o.steps) + 8);
      busy.reserve(stamps.capacity());
      const ddp::comm::ShardUpdate update = [&](std::span<float> p, std::span<const float> g) {
        const auto start = Clock::now();
        adam->step(p, g);
        stamps.push_back(Clock::now());
        busy.push_back(seconds(start, stamps.back()));
      };
      const ddp::comm::PsServerStats stats =
          ddp::comm::run_parameter_server(MPI_COMM_WORLD, ps_options, o.size, shard, update);
      // Updates per worker step: sync applies one per step (all workers' gradients), async one per gradient.
      const std::size_t per_round = ps_options.async ? static_cast<std::size_t>(workers) : 1;
      const std::size_t warm = per_round * static_cast<std::size_t>(o.warmup);
      const std::size_t total = stamps.size();
      // The timed updates over the time from the last warm-up update (or, without warm-up, the first
      // update) to the last one.
      const std::size_t first = warm > 0 ? warm - 1 : 0;
      if (total > first + 1)
        report.server_rate = static_cast<double>(total - 1 - first) / seconds(stamps[first], stamps.back());
      for (std::size_t i = warm; i < total; ++i) report.server_busy_s += busy[i];
      report.server_updates = static_cast<double>(stats.updates);
      report.server_max_gap = static_cast<double>(stats.max_gap);
      // Timed gradients received and replies sent: one each per worker step.
      const double shard_message = kHeaderBytes + 4.0 * static_cast<double>(shard.size());
      report.bytes = 2.0 * shard_message * workers * o.steps;
    } else {
      ddp::comm::ParameterClient client(MPI_COMM_WORLD, ps_options, o.size);
      client.pull(params);  // as the trainer does at the start; untimed
      const WorkerTimes t = worker_loop(o, straggler, role_comm, [&] { client.push_pull(grads, params); });
      client.finish();
      fill_worker_report(report, t, straggler);
      // Per step: one kGrads to and one kParams from every server, each a header plus its shard.
      report.bytes = 2.0 * (kHeaderBytes * servers + vector_bytes) * o.steps;
    }
    polite_barrier(MPI_COMM_WORLD);
  }

  std::vector<double> mine = {report.is_worker,      report.is_straggler,  report.window_s,
                              report.step_mean_s,    report.step_std_s,    report.exchange_s,
                              report.bytes,          report.server_rate,   report.server_busy_s,
                              report.server_updates, report.server_max_gap};
  std::vector<double> all(rank == 0 ? mine.size() * static_cast<std::size_t>(world) : 0);
  MPI_Gather(mine.data(), RankReport::kFields, MPI_DOUBLE, all.data(), RankReport::kFields, MPI_DOUBLE, 0,
             MPI_COMM_WORLD);

  if (rank == 0) {
    double window = 0, bytes = 0, step_sum = 0, step_fast = 1e300, step_slow = 0, exchange_sum = 0;
    double exchange_fast_sum = 0, rate_sum = 0, busy_sum = 0, gap = 0, std_sum = 0, pace = 0;
    int fast_workers = 0;
    for (int r = 0; r < world; ++r) {
      const double* x = all.data() + static_cast<std::size_t>(r) * RankReport::kFields;
      bytes += x[6];
      if (x[0] != 0) {
        window = std::max(window, x[2]);
        step_sum += x[3];
        pace += 1.0 / x[3];
        std_sum += x[4];
        step_fast = std::min(step_fast, x[3]);
        step_slow = std::max(step_slow, x[3]);
        exchange_sum += x[5];
        if (x[1] == 0 || o.straggle_ms <= 0) {
          exchange_fast_sum += x[5];
          ++fast_workers;
        }
      } else {
        rate_sum += x[7];
        busy_sum += x[8];
        gap = std::max(gap, x[10]);
      }
    }
    const double steps_per_s = o.steps / window;
    const double gradients_per_s = workers * o.steps / window;
    const double updates_per_s = o.mode == "ps-async" ? rate_sum / servers : steps_per_s;
    const bool has_straggler = o.straggle_ms > 0;
    std::printf("ps_bench: mode %s, %d ranks: %d worker(s)", o.mode.c_str(), world, workers);
    if (ps) std::printf(", %d server(s)", servers);
    if (o.mode == "ps-async") std::printf(", max_staleness %d", o.staleness);
    std::printf("; %zu floats (%.2f MB) per vector; %d timed steps after %d warm-up; compute %.1f ms (%s)",
                o.size, vector_bytes / 1e6, o.steps, o.warmup, o.compute_ms, o.compute_kind.c_str());
    if (has_straggler) {
      std::printf("; straggler: worker rank %d sleeps %.1f ms per step\n", workers - 1, o.straggle_ms);
    } else {
      std::printf("; no straggler\n");
    }
    std::printf("updates/s: %.2f (%s)\n", updates_per_s,
                o.mode == "ps-async" ? "gradients applied per second on the servers, servers' clocks"
                                     : "steps per second over the slowest worker's timed window");
    std::printf("gradients/s: %.2f (workers x steps over the slowest worker's window of %.3f s)\n",
                gradients_per_s, window);
    std::printf(
        "worker pace: %.2f gradients/s (sum over workers of 1 / its mean step: what they sustain while all "
        "are "
        "busy; the window above also holds the tail in which fast workers have finished)\n",
        pace);
    std::printf("bytes/s: %.3f GB/s sent+received summed over ranks (%s); %.2f MB per worker gradient\n",
                bytes / window / 1e9,
                allreduce ? "ESTIMATE: ring all-reduce, 2(n-1)/n x vector sent and as much received per rank"
                          : "counted from the protocol's messages",
                bytes / (workers * o.steps) / 1e6);
    std::printf(
        "worker step: mean %.2f ms (mean of per-worker std %.2f ms), fastest worker %.2f ms, slowest worker "
        "%.2f ms; exchange%s mean %.2f ms (%s %.2f ms)\n",
        1e3 * step_sum / workers, 1e3 * std_sum / workers, 1e3 * step_fast, 1e3 * step_slow,
        allreduce ? " + local Adam" : "", 1e3 * exchange_sum / workers,
        has_straggler ? "non-straggling workers" : "all workers",
        fast_workers > 0 ? 1e3 * exchange_fast_sum / fast_workers : 0.0);
    if (ps) {
      std::printf("servers: %.1f%% of the window in Adam (mean over servers), largest push gap %.0f\n",
                  100.0 * busy_sum / servers / window, gap);
    }
    std::printf(
        "RESULT mode=%s ranks=%d workers=%d compute_ms=%.1f straggle_ms=%.1f updates_per_s=%.2f "
        "gradients_per_s=%.2f pace_per_s=%.2f gbytes_per_s=%.3f step_ms=%.2f fastest_ms=%.2f slowest_ms=%.2f "
        "exchange_ms=%.2f\n",
        o.mode.c_str(), world, workers, o.compute_ms, o.straggle_ms, updates_per_s, gradients_per_s, pace,
        bytes / window / 1e9, 1e3 * step_sum / workers, 1e3 * step_fast, 1e3 * step_slow,
        1e3 * exchange_sum / workers);
  }
  MPI_Comm_free(&role_comm);
  MPI_Finalize();
  return 0;
}
