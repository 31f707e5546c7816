// What a GPU rank's start-up costs by model size: the self-check (engine/self_check.h) and the draw of the
// initial parameters (Keras's orthogonal matrices), which a run does beside it, one row per model.
//
// --device cuda checks the cuDNN replica at each model's run shapes, as a run does. --device cpu has the CPU
// replica stand in for the GPU on the slice alone (no run shapes: on a GPU those run on the device), which
// bounds the check's host side from above: the CPU references' work, which must not grow with the run's
// batch or sequence length, and the stand-in's, which a GPU does instead.
//
//   build/benchmarks/self_check_bench [--device cpu|cuda] [--gpu 0]
#include <boost/program_options.hpp>
#include <chrono>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/optimizer/optimizer.h"
#include "engine/self_check.h"
#include "models/cuda_replica.h"
#include "models/initializers.h"
#include "models/replica.h"

namespace po = boost::program_options;

namespace {

struct Model {
  const char* name;
  ddp::models::ModelShape shape;
  ddp::models::ModelOptions options;
  int batch;
  int seq;
};

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace

int main(int argc, char** argv) try {
  std::string device = "cpu";
  int gpu = 0;
  po::options_description options("self_check_bench");
  options.add_options()("help", "this text")("device", po::value(&device)->default_value(device),
                                             "cpu or cuda")("gpu", po::value(&gpu)->default_value(gpu),
                                                            "CUDA device ordinal");
  po::variables_map given;
  po::store(po::parse_command_line(argc, argv, options), given);
  po::notify(given);
  if (given.count("help") || (device != "cpu" && device != "cuda")) {
    std::cout << options;
    return given.count("help") ? 0 : 2;
  }
  using ddp::models::Cell;
  ddp::models::ModelOptions masked;
  masked.mask_padding = true;
  const std::vector<Model> models{
      {"E128 H128 L1 LSTM", {20000, 128, 128, 1}, {}, 32, 80},
      {"E256 H512 L2 LSTM", {20000, 256, 512, 2}, {}, 128, 200},
      {"E256 H1024 L2 LSTM", {20000, 256, 1024, 2}, {}, 512, 200},
      {"E256 H512 L2 bi GRU masked 3 cl.", {20000, 256, 512, 2, Cell::kGru, true, 3}, masked, 32, 200},
  };
  std::printf("%-34s %12s %10s %12s %s\n", "model", "run shape", "check_s", "init_s",
              "CPU reference batches");
  for (const Model& m : models) {
    std::unique_ptr<ddp::models::Replica> replica;
    std::vector<std::pair<int, int>> shapes;
    if (device == "cuda") {
      replica = ddp::models::make_cuda_replica(m.shape, gpu, ddp::models::RnnAlgorithm::kAuto, m.options);
      shapes = {{m.batch, m.seq}, {m.batch - 1, m.seq}};
      for (const auto& [batch, seq] : shapes)
        replica->settle_shape(batch, seq, replica->try_shape(batch, seq));
    } else {
      replica = ddp::models::make_cpu_replica(m.shape, ddp::models::CpuKernels::kBuiltin, m.options);
    }
    auto start = std::chrono::steady_clock::now();
    const ddp::engine::SelfCheckReport report =
        ddp::engine::check_gpu_replica(*replica, gpu, shapes, ddp::optim::OptimizerSettings{}, 1, m.options);
    const double check_s = seconds_since(start);
    if (!report.ok) {
      std::fprintf(stderr, "self_check_bench: %s: %s\n", m.name, report.failure.c_str());
      return 1;
    }
    const ddp::models::ParamLayout layout(m.shape);
    std::vector<float> params(layout.total_size());
    start = std::chrono::steady_clock::now();
    ddp::models::initialize_keras(layout, params, 1, {}, 4);  // as rank 0 draws them
    const double init_s = seconds_since(start);
    std::string batches;
    for (const auto& [rows, steps] : report.reference_batches) {
      if (!batches.empty()) batches += ' ';
      batches.append(std::to_string(rows)).append("x").append(std::to_string(steps));
    }
    const std::string run_shape = std::to_string(m.batch) + "x" + std::to_string(m.seq);
    std::printf("%-34s %12s %10.3f %12.3f %s\n", m.name,
                device == "cuda" ? run_shape.c_str() : "(slice only)", check_s, init_s, batches.c_str());
    std::fflush(stdout);
  }
  return 0;
} catch (const std::exception& e) {
  std::fprintf(stderr, "self_check_bench: %s\n", e.what());
  return 1;
}
