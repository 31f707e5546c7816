#include <omp.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "onednn_lstm_step.h"

namespace {

using dnnl::memory;
using tag = memory::format_tag;
using Clock = std::chrono::steady_clock;

memory::desc f32(const memory::dims& dims, tag format) {
  return memory::desc(dims, memory::data_type::f32, format);
}

// A buffer of `md`'s size (with random values) and a memory object over it.
struct Buffer {
  std::vector<float> data;
  memory mem;
  Buffer(const memory::desc& md, const dnnl::engine& engine, std::mt19937& rng, float scale) {
    data.resize(md.get_size() / sizeof(float));
    std::uniform_real_distribution<float> u(-scale, scale);
    for (float& x : data) x = u(rng);
    mem = memory(md, engine, data.data());
  }
  void zero() { std::memset(data.data(), 0, data.size() * sizeof(float)); }
};

std::string isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::avx512_core_amx:
      return "AVX-512 with AMX";
    case dnnl::cpu_isa::avx512_core_bf16:
      return "AVX-512 with BF16";
    case dnnl::cpu_isa::avx512_core_vnni:
      return "AVX-512 with VNNI";
    case dnnl::cpu_isa::avx512_core:
      return "AVX-512";
    case dnnl::cpu_isa::avx2_vnni:
      return "AVX2 with VNNI";
    case dnnl::cpu_isa::avx2:
      return "AVX2";
    case dnnl::cpu_isa::avx:
      return "AVX";
    case dnnl::cpu_isa::sse41:
      return "SSE4.1";
    default:
      return "ISA " + std::to_string(static_cast<int>(isa));
  }
}

}  // namespace

OnednnLstmStep time_onednn_lstm_step(int batch, int seq, int input, int hidden, int threads, int warmup,
                                     int steps) {
  omp_set_num_threads(threads);
  dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  dnnl::stream stream(engine);
  const memory::dim t = seq, b = batch, in = input, h = hidden;
  std::mt19937 rng(1);

  // The replica's layouts: time-major input and output; weights [4H, in] (ldgoi), one bias per gate row.
  const memory::desc src_layer = f32({t, b, in}, tag::tnc);
  const memory::desc state = f32({1, 1, b, h}, tag::ldnc);
  const memory::desc user_weights_layer = f32({1, 1, in, 4, h}, tag::ldgoi);
  const memory::desc user_weights_iter = f32({1, 1, h, 4, h}, tag::ldgoi);
  const memory::desc bias = f32({1, 1, 4, h}, tag::ldgo);
  const memory::desc dst_layer = f32({t, b, h}, tag::tnc);
  const memory::desc any_weights_layer = f32({1, 1, in, 4, h}, tag::any);
  const memory::desc any_weights_iter = f32({1, 1, h, 4, h}, tag::any);

  const dnnl::lstm_forward::desc forward_desc(
      dnnl::prop_kind::forward_training, dnnl::rnn_direction::unidirectional_left2right, src_layer, state,
      state, any_weights_layer, any_weights_iter, bias, dst_layer, state, state);
  const dnnl::lstm_forward::primitive_desc forward_pd(forward_desc, engine);
  const dnnl::lstm_backward::desc backward_desc(
      dnnl::prop_kind::backward, dnnl::rnn_direction::unidirectional_left2right, src_layer, state, state,
      any_weights_layer, any_weights_iter, bias, dst_layer, state, state, src_layer, state, state,
      any_weights_layer, any_weights_iter, bias, dst_layer, state, state);
  const dnnl::lstm_backward::primitive_desc backward_pd(backward_desc, engine, forward_pd);

  Buffer x(src_layer, engine, rng, 1.0f), zero_h(state, engine, rng, 0), zero_c(state, engine, rng, 0);
  zero_h.zero();
  zero_c.zero();
  Buffer w_layer(user_weights_layer, engine, rng, 0.1f), w_iter(user_weights_iter, engine, rng, 0.1f);
  Buffer bias_buffer(bias, engine, rng, 0.1f);
  Buffer fwd_w_layer(forward_pd.weights_layer_desc(), engine, rng, 0);
  Buffer fwd_w_iter(forward_pd.weights_iter_desc(), engine, rng, 0);
  Buffer bwd_w_layer(backward_pd.weights_layer_desc(), engine, rng, 0);
  Buffer bwd_w_iter(backward_pd.weights_iter_desc(), engine, rng, 0);
  Buffer y(dst_layer, engine, rng, 0), h_last(state, engine, rng, 0), c_last(state, engine, rng, 0);
  Buffer workspace(forward_pd.workspace_desc(), engine, rng, 0);
  Buffer dx(src_layer, engine, rng, 0), dh0(state, engine, rng, 0), dc0(state, engine, rng, 0);
  Buffer dw_layer(backward_pd.diff_weights_layer_desc(), engine, rng, 0);
  Buffer dw_iter(backward_pd.diff_weights_iter_desc(), engine, rng, 0);
  Buffer dbias(bias, engine, rng, 0);
  Buffer dy(dst_layer, engine, rng, 0), dh_last(state, engine, rng, 0), dc_last(state, engine, rng, 0);
  // The classifier's gradient reaches only the last step's output.
  dy.zero();
  for (std::size_t i = static_cast<std::size_t>((t - 1) * b * h); i < dy.data.size(); ++i) dy.data[i] = 0.01f;
  dh_last.zero();
  dc_last.zero();

  dnnl::reorder to_fwd_layer(w_layer.mem, fwd_w_layer.mem), to_fwd_iter(w_iter.mem, fwd_w_iter.mem);
  dnnl::reorder to_bwd_layer(w_layer.mem, bwd_w_layer.mem), to_bwd_iter(w_iter.mem, bwd_w_iter.mem);
  const dnnl::lstm_forward forward(forward_pd);
  const dnnl::lstm_backward backward(backward_pd);
  const std::unordered_map<int, memory> forward_args{{DNNL_ARG_SRC_LAYER, x.mem},
                                                     {DNNL_ARG_SRC_ITER, zero_h.mem},
                                                     {DNNL_ARG_SRC_ITER_C, zero_c.mem},
                                                     {DNNL_ARG_WEIGHTS_LAYER, fwd_w_layer.mem},
                                                     {DNNL_ARG_WEIGHTS_ITER, fwd_w_iter.mem},
                                                     {DNNL_ARG_BIAS, bias_buffer.mem},
                                                     {DNNL_ARG_DST_LAYER, y.mem},
                                                     {DNNL_ARG_DST_ITER, h_last.mem},
                                                     {DNNL_ARG_DST_ITER_C, c_last.mem},
                                                     {DNNL_ARG_WORKSPACE, workspace.mem}};
  std::unordered_map<int, memory> backward_args = forward_args;
  backward_args[DNNL_ARG_WEIGHTS_LAYER] = bwd_w_layer.mem;
  backward_args[DNNL_ARG_WEIGHTS_ITER] = bwd_w_iter.mem;
  backward_args.insert({{DNNL_ARG_DIFF_SRC_LAYER, dx.mem},
                        {DNNL_ARG_DIFF_SRC_ITER, dh0.mem},
                        {DNNL_ARG_DIFF_SRC_ITER_C, dc0.mem},
                        {DNNL_ARG_DIFF_WEIGHTS_LAYER, dw_layer.mem},
                        {DNNL_ARG_DIFF_WEIGHTS_ITER, dw_iter.mem},
                        {DNNL_ARG_DIFF_BIAS, dbias.mem},
                        {DNNL_ARG_DIFF_DST_LAYER, dy.mem},
                        {DNNL_ARG_DIFF_DST_ITER, dh_last.mem},
                        {DNNL_ARG_DIFF_DST_ITER_C, dc_last.mem}});

  std::vector<double> times;
  for (int i = 0; i < warmup + steps; ++i) {
    const auto start = Clock::now();
    to_fwd_layer.execute(stream, w_layer.mem, fwd_w_layer.mem);
    to_fwd_iter.execute(stream, w_iter.mem, fwd_w_iter.mem);
    forward.execute(stream, forward_args);
    to_bwd_layer.execute(stream, w_layer.mem, bwd_w_layer.mem);
    to_bwd_iter.execute(stream, w_iter.mem, bwd_w_iter.mem);
    dw_layer.zero();  // the weight and bias gradients accumulate
    dw_iter.zero();
    dbias.zero();
    backward.execute(stream, backward_args);
    stream.wait();
    if (i >= warmup) times.push_back(std::chrono::duration<double>(Clock::now() - start).count());
  }

  OnednnLstmStep result;
  result.available = true;
  const dnnl_version_t* version = dnnl::version();
  result.library = "oneDNN " + std::to_string(version->major) + "." + std::to_string(version->minor) + "." +
                   std::to_string(version->patch) + " (OpenMP, " + std::to_string(threads) + " thread" +
                   (threads == 1 ? "" : "s") + ", ISA up to " + isa_name(dnnl::get_effective_cpu_isa()) + ")";
  for (double s : times) result.seconds += s / static_cast<double>(times.size());
  for (double s : times) result.seconds_std += (s - result.seconds) * (s - result.seconds);
  result.seconds_std =
      std::sqrt(result.seconds_std / static_cast<double>(times.size() > 1 ? times.size() - 1 : 1));
  return result;
}
