// CPU step benchmark at the IMDB shapes (default batch 32, seq 80, E = H = 128, vocab 20000, one LSTM layer).
//
// Under mpirun each rank runs one replica and the timed step is the trainer's (engine::AllReduceStep):
// forward + backward, gradient averaging over MPI, Adam. After a burn-in it prints the mean and standard
// deviation of the step time, the implied seconds per 25,000-sample epoch (each of W ranks does 25000 / (W x
// batch) steps), and the floor: the FLOPs of the step's matrix products divided by the sgemm rate this BLAS
// reaches on exactly those shapes, measured on every rank at once so that the floor sees the same core
// sharing as the step; and the reference: oneDNN's LSTM training step alone at the same shapes
// (the replica's oneDNN layer, models/onednn_lstm.h), where the build has oneDNN, timed in blocks of five
// between blocks of the step's own so that both meet the same load; and the physical floor:
// those FLOPs at the peak FMA rate of the rank's cores (peak_flops.h). Last, dense Adam's memory floor: the
// bytes its update must move (p, m and v of every parameter read and written) at the rate a loop with that
// traffic and almost no arithmetic reaches on the rank's threads, back to back (the arrays partly in the last
// level cache) and with the caches evicted before each pass, as in a step, where the recurrent layers' work
// runs between two updates.
//
// With --exchange colocated the timed step is instead the colocated parameter server's (the default of two or
// more CPU ranks under comm.backend = auto): forward + backward, a reduce-scatter of the gradients, each
// rank's Adam over its own shard, an all-gather of the updated shards; its parts are not timed apart.
//
//   mpirun -np 1 build/benchmarks/cpu_step_bench --threads 2
//   mpirun -np 2 build/benchmarks/cpu_step_bench --threads 1 [--exchange colocated]
#include <cblas.h>
#include <mpi.h>

#include <boost/program_options.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "comm/gradient_reducer.h"
#include "comm/host_group.h"
#include "comm/ps_service.h"
#include "engine/all_reduce_step.h"
#include "engine/base/parallel_loops.h"
#include "engine/optimizer/optimizer.h"
#include "engine/ps_updater.h"
#include "models/blas_threads.h"
#include "models/cpu_threads.h"
#include "models/initializers.h"
#include "models/onednn_lstm.h"
#include "models/replica.h"
#include "peak_flops.h"
#include "step_products.h"

namespace po = boost::program_options;
using Clock = std::chrono::steady_clock;

namespace {

struct Shapes {
  int batch = 32, seq = 80, embed = 128, hidden = 128, vocab = 20000, layers = 1;
  std::string cell = "lstm";
  bool bidirectional = false;
  int gates() const { return cell == "gru" ? 3 : 4; }
  int directions() const { return bidirectional ? 2 : 1; }
};

struct Stats {
  double mean = 0, stddev = 0;
};

Stats stats_of(const std::vector<double>& xs) {
  Stats s;
  if (xs.empty()) return s;
  for (double x : xs) s.mean += x;
  s.mean /= static_cast<double>(xs.size());
  for (double x : xs) s.stddev += (x - s.mean) * (x - s.mean);
  s.stddev = std::sqrt(s.stddev / static_cast<double>(xs.size() > 1 ? xs.size() - 1 : 1));
  return s;
}

// Seconds for one pass over the step's products with sgemm, averaged over `reps` passes after one warm-up
// pass.
double time_gemms(const std::vector<StepProduct>& list, int reps) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> u(-1, 1);
  std::size_t most = 0;
  for (const StepProduct& p : list) {
    const Product& gm = p.shape;
    most = std::max({most, std::size_t(gm.m) * gm.k, std::size_t(gm.k) * gm.n, std::size_t(gm.m) * gm.n});
  }
  std::vector<float> a(most), b(most), c(most);
  for (auto& x : a) x = u(rng);
  for (auto& x : b) x = u(rng);
  auto pass = [&] {
    for (const StepProduct& p : list) {
      const Product& gm = p.shape;
      for (int i = 0; i < p.count; ++i) {
        cblas_sgemm(CblasRowMajor, gm.trans_a ? CblasTrans : CblasNoTrans,
                    gm.trans_b ? CblasTrans : CblasNoTrans, gm.m, gm.n, gm.k, 1.0f, a.data(),
                    gm.trans_a ? gm.m : gm.k, b.data(), gm.trans_b ? gm.k : gm.n, 0.0f, c.data(), gm.n);
      }
    }
  };
  pass();
  const auto start = Clock::now();
  for (int r = 0; r < reps; ++r) pass();
  return std::chrono::duration<double>(Clock::now() - start).count() / reps;
}

// The reference row: oneDNN's LSTM training step alone (the replica's oneDNN layer, models/onednn_lstm.h)
// over every layer at these shapes, forward then backward, the gradient reaching the top layer's last step
// only. Its steps are timed in blocks between the step's own, so that both see the same hour of a shared
// machine.
class Reference {
 public:
  Reference(const Shapes& s, int threads) {
    why_not_ = ddp::models::onednn_missing();
    if (why_not_.empty() && s.bidirectional) why_not_ = "oneDNN's layer here runs one direction only";
    if (!why_not_.empty()) return;
    ddp::models::set_onednn_threads(threads);
    library_ = ddp::models::onednn_description();
    std::mt19937 rng(3);
    std::uniform_real_distribution<float> u(-0.1f, 0.1f);
    auto random = [&](std::size_t n) {
      std::vector<float> v(n);
      for (float& x : v) x = u(rng);
      return v;
    };
    const auto rows = static_cast<std::size_t>(s.seq) * s.batch, h = static_cast<std::size_t>(s.hidden);
    layers_.resize(static_cast<std::size_t>(s.layers));
    for (std::size_t l = 0; l < layers_.size(); ++l) {
      Layer& layer = layers_[l];
      const auto in = static_cast<std::size_t>(l == 0 ? s.embed : s.hidden);
      const auto gates = static_cast<std::size_t>(s.gates());
      layer.kernel = ddp::models::make_onednn_layer(ddp::models::parse_cell(s.cell));
      layer.x = random(rows * in);
      layer.y.resize(rows * h);
      layer.w_ih = random(gates * h * in);
      layer.w_hh = random(gates * h * h);
      layer.b_ih = random(gates * h);
      layer.b_hh = random(gates * h);
      layer.dy.assign(rows * h, 0.0f);
      const std::size_t first_with_gradient =
          l + 1 == layers_.size() ? rows - static_cast<std::size_t>(s.batch) : 0;
      for (std::size_t i = first_with_gradient * h; i < rows * h; ++i) layer.dy[i] = u(rng);
      layer.dx.resize(rows * in);
      layer.dw_ih.resize(layer.w_ih.size());
      layer.dw_hh.resize(layer.w_hh.size());
      layer.db_ih.resize(gates * h);
      layer.db_hh.resize(gates * h);
      layer.buffers = {s.batch,
                       s.seq,
                       static_cast<int>(in),
                       s.hidden,
                       layer.x.data(),
                       layer.y.data(),
                       layer.w_ih.data(),
                       layer.w_hh.data(),
                       layer.b_ih.data(),
                       layer.b_hh.data()};
      layer.gradients = {layer.dy.data(),    layer.dx.data(),    layer.dw_ih.data(),
                         layer.dw_hh.data(), layer.db_ih.data(), layer.db_hh.data()};
    }
  }
  // Empty where the build has oneDNN.
  const std::string& why_not() const { return why_not_; }
  const std::string& library() const { return library_; }

  // One training step of every layer; its seconds.
  double step_seconds() {
    const auto start = Clock::now();
    for (Layer& layer : layers_) layer.kernel->forward(layer.buffers);
    for (auto layer = layers_.rbegin(); layer != layers_.rend(); ++layer)
      layer->kernel->backward(layer->buffers, layer->gradients);
    return std::chrono::duration<double>(Clock::now() - start).count();
  }

 private:
  struct Layer {
    std::unique_ptr<ddp::models::OnednnLstmLayer> kernel;
    std::vector<float> x, y, w_ih, w_hh, b_ih, b_hh, dy, dx, dw_ih, dw_hh, db_ih, db_hh;
    ddp::models::LstmLayerBuffers buffers;
    ddp::models::LstmLayerGradients gradients;
  };
  std::string why_not_, library_;
  std::vector<Layer> layers_;
};

// Writes over twice the last level cache on the rank's threads, so that what runs next starts from memory.
class CacheEvictor {
 public:
  CacheEvictor() {
    const long cache = sysconf(_SC_LEVEL3_CACHE_SIZE);
    buffer_.resize(2 * static_cast<std::size_t>(cache > 0 ? cache : 32l << 20));
  }
  void operator()() {
    ddp::parallel_ranges(buffer_.size(), 64, 1 << 16, [&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; i += 64) buffer_[i] = static_cast<char>(buffer_[i] + 1);
    });
  }

 private:
  std::vector<char> buffer_;
};

// Seconds per pass of a loop with dense Adam's memory traffic over n parameters (p, m and v read and
// written; the touched rows' gradients, a few percent, not counted) and three multiplies instead of its
// square root and division, on the threads the optimizer uses. With `cold`, each pass follows a write over
// twice the last level cache, on the same threads, so that it starts from memory as the step's update does.
double time_adam_traffic(std::size_t n, int reps, bool cold, CacheEvictor& evict_caches) {
  std::vector<float> p_buffer(n, 1.0f), m_buffer(n, 0.5f), v_buffer(n, 0.25f);
  float* __restrict p = p_buffer.data();
  float* __restrict m = m_buffer.data();
  float* __restrict v = v_buffer.data();
  const auto pass = [&] {
    ddp::parallel_ranges(n, 16, 1 << 16, [&](std::size_t begin, std::size_t end) {
      for (std::size_t i = begin; i < end; ++i) {
        m[i] *= 0.9f;
        v[i] *= 0.999f;
        p[i] -= 1e-3f * m[i];
      }
    });
  };
  pass();
  double seconds = 0;
  for (int r = 0; r < reps; ++r) {
    if (cold) evict_caches();
    const auto start = Clock::now();
    pass();
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  return seconds / reps;
}

// Seconds per update of the step's own optimizer on the replica's buffers, from memory, with `rows` as the
// embedding's touched rows (the others decay without reading their gradient).
double time_update_from_memory(ddp::optim::Optimizer& optimizer, ddp::models::Replica& replica,
                               std::span<const int32_t> rows, int reps, CacheEvictor& evict_caches) {
  const ddp::models::ParamLayout& layout = replica.layout();
  const ddp::models::ParamTensor& embedding = layout.tensor("embedding");
  const ddp::optim::TouchedRows touched{embedding.offset, static_cast<std::size_t>(embedding.shape.at(1)),
                                        static_cast<std::size_t>(embedding.shape.at(0)), rows};
  double seconds = 0;
  for (int r = 0; r < reps; ++r) {
    evict_caches();
    const auto start = Clock::now();
    optimizer.step(replica.params(), replica.grads(), &touched);
    seconds += std::chrono::duration<double>(Clock::now() - start).count();
  }
  return seconds / reps;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  Shapes s;
  int warmup = 20, steps = 100, threads = 1;
  bool sparse = true, lazy = false, mask = false;
  std::string kernels = "auto";
  std::string exchange = "allreduce";
  po::options_description desc("cpu_step_bench");
  desc.add_options()("help", "this help")("batch", po::value(&s.batch)->default_value(s.batch),
                                          "batch per rank")("seq", po::value(&s.seq)->default_value(s.seq),
                                                            "sequence length")(
      "embed", po::value(&s.embed)->default_value(s.embed), "embedding width")(
      "hidden", po::value(&s.hidden)->default_value(s.hidden), "LSTM hidden size")(
      "vocab", po::value(&s.vocab)->default_value(s.vocab), "vocabulary")(
      "layers", po::value(&s.layers)->default_value(s.layers), "recurrent layers")(
      "cell", po::value(&s.cell)->default_value(s.cell), "lstm or gru")(
      "bidirectional", po::value(&s.bidirectional)->default_value(s.bidirectional), "both directions")(
      "mask", po::value(&mask)->default_value(mask), "model.mask_padding (the batches have no padding)")(
      "warmup", po::value(&warmup)->default_value(warmup), "burn-in steps")(
      "steps", po::value(&steps)->default_value(steps), "timed steps")(
      "threads", po::value(&threads)->default_value(threads), "compute threads per rank (train.threads)")(
      "sparse", po::value(&sparse)->default_value(sparse), "exchange only touched embedding rows")(
      "lazy", po::value(&lazy)->default_value(lazy), "lazy (row-wise) Adam on the embedding")(
      "kernels", po::value(&kernels)->default_value(kernels),
      "the recurrent kernels (model.cpu_kernels): auto, builtin, onednn, onednn_gemm or packed")(
      "exchange", po::value(&exchange)->default_value(exchange),
      "allreduce (the mpi backend) or colocated (the parameter server every rank serves a shard of)");
  po::variables_map vm;
  // No guessing of abbreviated option names: a typo must not set another option.
  const int style = po::command_line_style::default_style & ~po::command_line_style::allow_guessing;
  po::store(po::parse_command_line(argc, argv, desc, style), vm);
  po::notify(vm);
  if (vm.count("help")) {
    std::cout << desc;
    MPI_Finalize();
    return 0;
  }
  const bool colocated = exchange == "colocated";
  if (!colocated && exchange != "allreduce") {
    std::cerr << "cpu_step_bench: --exchange " << exchange << ": expected allreduce or colocated\n";
    MPI_Finalize();
    return 2;
  }
  auto comm = std::make_unique<ddp::comm::HostGroup>(MPI_COMM_WORLD);
  auto reducer = ddp::comm::make_mpi_reducer(*comm);
  const int rank = comm->rank(), world = comm->size();

  ddp::models::ModelShape shape{s.vocab, s.embed, s.hidden, s.layers};
  shape.cell = ddp::models::parse_cell(s.cell);
  shape.bidirectional = s.bidirectional;
  ddp::models::ModelOptions model_options;
  model_options.mask_padding = mask;
  // The rank's one pool, as ddptrain sizes it.
  const ddp::models::CpuKernels cpu_kernels =
      ddp::models::parse_cpu_kernels(kernels, shape, model_options, threads);
  const ddp::models::CpuThreadPlan plan = ddp::models::plan_cpu_threads(threads, cpu_kernels);
  auto replica = ddp::models::make_cpu_replica(shape, cpu_kernels, model_options);
  ddp::models::initialize_keras(replica->layout(), replica->params(), 1);
  ddp::optim::OptimizerSettings adam_settings;
  adam_settings.lazy_update = lazy;
  auto adam = ddp::optim::make_optimizer(adam_settings, replica->layout().total_size());
  ddp::engine::AllReduceStep step_runner(*replica, *reducer, *adam, sparse);
  // The colocated parameter server's step, as the trainer builds it (engine/training_job.cpp).
  std::unique_ptr<ddp::comm::ParameterService> service;
  std::unique_ptr<ddp::engine::Updater> ps_updater;
  if (colocated) {
    ddp::comm::PsOptions options;
    options.servers = 0;
    if (sparse) ddp::engine::exchange_embedding_rows(options, replica->layout(), s.batch, s.seq);
    service = ddp::comm::make_colocated_service(MPI_COMM_WORLD, options, replica->layout().total_size(),
                                                ddp::engine::shard_optimizers(adam_settings));
    ps_updater = ddp::engine::make_ps_updater(*replica, *service, adam_settings, /*colocated=*/true);
    ps_updater->distribute_start(replica->params(), nullptr);
    ps_updater->begin_steps();
  }
  std::mt19937_64 rng(static_cast<uint64_t>(rank) + 1);
  std::vector<int32_t> tokens(static_cast<std::size_t>(s.batch) * s.seq);
  std::vector<float> labels(static_cast<std::size_t>(s.batch));

  // The step and the library's LSTM step alone in alternating blocks, every rank at once (the same core
  // sharing as the step), so that a shared machine's slow minutes fall on both.
  Reference library(s, threads);
  constexpr int kBlock = 5;
  std::vector<double> times, library_times;
  double compute_s = 0, reduce_s = 0, optimizer_s = 0;
  for (int i = 0; i < warmup + steps; ++i) {
    for (auto& t : tokens) t = static_cast<int32_t>(rng() % static_cast<uint64_t>(s.vocab));
    for (auto& y : labels) y = static_cast<float>(rng() % 2);
    const auto start = Clock::now();
    if (colocated) {
      ps_updater->step({tokens.data(), labels.data(), s.batch, s.seq});
    } else {
      step_runner.run({tokens.data(), labels.data(), s.batch, s.seq});
    }
    const bool timed = i >= warmup;
    if (timed) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
    if (timed && !colocated) {
      compute_s += step_runner.last_timing().compute_s;
      reduce_s += step_runner.last_timing().reduce_s;
      optimizer_s += step_runner.last_timing().optimize_s;
    }
    const bool block_ends = (i + 1) % kBlock == 0 || i + 1 == warmup + steps;
    if (block_ends && library.why_not().empty()) {
      comm->barrier();
      for (int r = 0; r < kBlock; ++r) {
        const double seconds = library.step_seconds();
        if (timed) library_times.push_back(seconds);
      }
      comm->barrier();
    }
  }
  if (colocated) {
    ps_updater->end_steps();
    ps_updater->finish(replica->params());
  }
  // The slowest rank sets the pace of a synchronous step.
  std::vector<double> worst(times.size());
  MPI_Allreduce(times.data(), worst.data(), static_cast<int>(times.size()), MPI_DOUBLE, MPI_MAX,
                MPI_COMM_WORLD);
  const Stats step = stats_of(worst);
  Stats library_step = stats_of(library_times);
  MPI_Allreduce(MPI_IN_PLACE, &library_step.mean, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);

  const std::vector<StepProduct> gemms =
      step_products({s.batch, s.seq, s.embed, s.hidden, s.layers, s.gates(), s.directions()});
  const double flops = step_flops(gemms);
  comm->barrier();
  ddp::models::set_blas_threads(threads);  // the floor is the BLAS's sgemm on every thread of the rank
  double floor_s = time_gemms(gemms, 20);
  MPI_Allreduce(MPI_IN_PLACE, &floor_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  // The physical floor: the step's matrix-product FLOPs at the peak FMA rate of this rank's threads, every
  // rank measuring at once; the slowest rank's rate sets it.
  comm->barrier();
  PeakFlops peak = measure_peak_flops(threads, 0.5);
  MPI_Allreduce(MPI_IN_PLACE, &peak.gflops, 1, MPI_DOUBLE, MPI_MIN, MPI_COMM_WORLD);
  const double physical_floor_s = flops / (peak.gflops * 1e9);
  // Dense Adam's memory floor, every rank at once.
  comm->barrier();
  const std::size_t parameters = replica->layout().total_size();
  CacheEvictor evict_caches;
  double adam_floor_s = time_adam_traffic(parameters, 20, /*cold=*/false, evict_caches);
  MPI_Allreduce(MPI_IN_PLACE, &adam_floor_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  comm->barrier();
  double adam_cold_floor_s = time_adam_traffic(parameters, 20, /*cold=*/true, evict_caches);
  MPI_Allreduce(MPI_IN_PLACE, &adam_cold_floor_s, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  // The step's Adam alone from memory, with the last batch's touched rows and with none (one stream through
  // p, m and v: what the rows' scattered gradient reads add), interleaved.
  const std::vector<int32_t> last_rows(replica->touched_embedding_rows().begin(),
                                       replica->touched_embedding_rows().end());
  double update_rows_s = 0, update_no_rows_s = 0;
  if (sparse && !lazy && !colocated) {
    for (int r = 0; r < 10; ++r) {
      update_rows_s += time_update_from_memory(*adam, *replica, last_rows, 5, evict_caches) / 10;
      update_no_rows_s += time_update_from_memory(*adam, *replica, {}, 5, evict_caches) / 10;
    }
  }
  const double adam_bytes = 24.0 * static_cast<double>(parameters);

  if (rank == 0) {
    const double steps_per_epoch = std::ceil(25000.0 / (static_cast<double>(world) * s.batch));
    std::printf(
        "layout: %d rank(s) x %d thread(s) (one pool: %s); batch %d, seq %d, E %d, H %d, vocab %d, %s%s; "
        "%zu parameters; embedding exchange %s, Adam %s; kernels: %s\n",
        world, threads, plan.pool.c_str(), s.batch, s.seq, s.embed, s.hidden, s.vocab,
        ddp::models::describe(shape).c_str(), mask ? ", masked" : "", replica->layout().total_size(),
        sparse ? "sparse" : "dense", lazy ? "lazy" : "dense", replica->recurrent_kernels().c_str());
    std::printf(
        "step (%s): mean %.2f ms, std %.2f ms over %d steps after %d burn-in\n",
        colocated ? "fwd+bwd, colocated exchange with Adam on each rank's shard" : "fwd+bwd+allreduce+adam",
        1e3 * step.mean, 1e3 * step.stddev, steps, warmup);
    if (!colocated) {
      std::printf(
          "  rank 0's mean: forward+backward %.2f ms, waiting for the all-reduce %.2f ms, Adam %.2f ms\n",
          1e3 * compute_s / steps, 1e3 * reduce_s / steps, 1e3 * optimizer_s / steps);
    }
    std::printf("epoch of 25000 samples: %.0f steps per rank -> %.1f s\n", steps_per_epoch,
                steps_per_epoch * step.mean);
    std::printf(
        "GEMM floor: %.3f GFLOP per step at %.1f GFLOP/s (sgemm on these shapes) = %.2f ms/step -> %.1f s "
        "per epoch; step / floor = %.2fx\n",
        flops / 1e9, flops / floor_s / 1e9, 1e3 * floor_s, steps_per_epoch * floor_s, step.mean / floor_s);
    std::printf(
        "physical floor: %.3f GFLOP at %.1f GFLOP/s (an FMA-only %s kernel on %d thread(s) per rank) = %.2f "
        "ms/step; step / physical floor = %.2fx\n",
        flops / 1e9, peak.gflops, peak.isa.c_str(), threads, 1e3 * physical_floor_s,
        step.mean / physical_floor_s);
    if (library.why_not().empty() && colocated) {
      std::printf(
          "reference: %s, the RNN's training step alone (forward + backward on the replica's oneDNN "
          "layers): mean %.2f ms, std %.2f ms; step / reference = %.2fx\n",
          library.library().c_str(), 1e3 * library_step.mean, 1e3 * library_step.stddev,
          step.mean / library_step.mean);
    } else if (library.why_not().empty()) {
      std::printf(
          "reference: %s, the RNN's training step alone (forward + backward on the replica's oneDNN "
          "layers): "
          "mean %.2f ms, std %.2f ms; step / reference = %.2fx; forward+backward / reference = %.2fx\n",
          library.library().c_str(), 1e3 * library_step.mean, 1e3 * library_step.stddev,
          step.mean / library_step.mean, compute_s / steps / library_step.mean);
    } else {
      std::printf("reference: none, %s\n", library.why_not().c_str());
    }
    std::printf(
        "dense Adam's memory floor: %zu parameters x 24 bytes (p, m, v read and written) = %.1f MB at %.1f "
        "GB/s = %.2f ms/step back to back, at %.1f GB/s = %.2f ms/step from memory (caches evicted, as in "
        "the step)%s\n",
        parameters, adam_bytes / 1e6, adam_bytes / adam_floor_s / 1e9, 1e3 * adam_floor_s,
        adam_bytes / adam_cold_floor_s / 1e9, 1e3 * adam_cold_floor_s,
        lazy ? " (lazy Adam moves only the batch's rows)" : "");
    if (sparse && !lazy && !colocated) {
      std::printf(
          "the step's Adam alone from memory: %.2f ms with the last batch's %zu touched embedding rows, %.2f "
          "ms "
          "with none (%.2fx); %.2fx the floor from memory\n",
          1e3 * update_rows_s, last_rows.size(), 1e3 * update_no_rows_s, update_rows_s / update_no_rows_s,
          update_rows_s / adam_cold_floor_s);
    }
    if (library.why_not().empty() && !lazy && !colocated) {
      std::printf(
          "reference + dense Adam's memory floor from memory = %.2f ms = %.2fx the reference; the step's "
          "Adam "
          "= %.2fx that floor\n",
          1e3 * (library_step.mean + adam_cold_floor_s),
          (library_step.mean + adam_cold_floor_s) / library_step.mean,
          optimizer_s / steps / adam_cold_floor_s);
    }
  }
  ps_updater.reset();  // their communicators are freed before MPI_Finalize
  service.reset();
  reducer.reset();
  comm.reset();
  MPI_Finalize();
  return 0;
}
