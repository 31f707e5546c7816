#include "models/onednn_lstm.h"

#include <omp.h>
#include <pthread.h>

#include <algorithm>
#include <csignal>
#include <cstring>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ddp::models {
namespace {

using dnnl::memory;
using tag = memory::format_tag;

// oneDNN 2.6's JIT GEMM kernels (AVX2 and AVX-512, also inside its RNN primitives) point the stack pointer
// into a heap buffer while they run (oneDNN issue 4845, fixed in 3.11): a signal handled in that moment
// writes its frame, about 3 KB with the AVX-512 state, over the heap below, and the process dies later in
// free() ("corrupted size vs. prev_size"). A preemption signal mid-step did that about once in a hundred
// stops here. So a thread holds asynchronous signals back while it runs oneDNN: one sent to the process
// goes to another thread (the stop handler only sets a flag), one sent to this thread waits until the call
// returns. Synchronous fault signals stay unblocked, as blocking them would not stop them anyway.
const sigset_t& asynchronous_signals() {
  static const sigset_t set = [] {
    sigset_t all;
    sigfillset(&all);
    for (const int fault : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGTRAP, SIGSYS, SIGABRT})
      sigdelset(&all, fault);
    return all;
  }();
  return set;
}

class AsynchronousSignalsHeldBack {
 public:
  AsynchronousSignalsHeldBack() { pthread_sigmask(SIG_BLOCK, &asynchronous_signals(), &previous_); }
  ~AsynchronousSignalsHeldBack() { pthread_sigmask(SIG_SETMASK, &previous_, nullptr); }
  AsynchronousSignalsHeldBack(const AsynchronousSignalsHeldBack&) = delete;
  AsynchronousSignalsHeldBack& operator=(const AsynchronousSignalsHeldBack&) = delete;

 private:
  sigset_t previous_;
};

memory::desc f32(const memory::dims& dims, tag format) {
  return memory::desc(dims, memory::data_type::f32, format);
}

// A buffer of floats sized for `md`, zeroed, with a memory object over it.
struct Owned {
  std::vector<float> data;
  memory mem;
  Owned(const memory::desc& md, const dnnl::engine& engine)
      : data(md.get_size() / sizeof(float), 0.0f), mem(md, engine, data.data()) {}
  void zero() { std::fill(data.begin(), data.end(), 0.0f); }
};

bool is_avx512(dnnl::cpu_isa isa) {
  return isa == dnnl::cpu_isa::avx512_core_amx || isa == dnnl::cpu_isa::avx512_core_bf16 ||
         isa == dnnl::cpu_isa::avx512_core_vnni || isa == dnnl::cpu_isa::avx512_core;
}

std::string isa_name(dnnl::cpu_isa isa) {
  if (is_avx512(isa)) return "AVX-512";
  switch (isa) {
    case dnnl::cpu_isa::avx2_vnni:
    case dnnl::cpu_isa::avx2:
      return "AVX2";
    case dnnl::cpu_isa::avx:
      return "AVX";
    case dnnl::cpu_isa::sse41:
      return "SSE4.1";
    default:
      return "its own ISA";
  }
}

// What differs between the LSTM and the GRU primitives: their classes, gate counts, the cell state an LSTM
// keeps beside h, and how our gate order and two biases map onto theirs.
struct LstmKind {
  using Forward = dnnl::lstm_forward;
  using Backward = dnnl::lstm_backward;
  static constexpr int kGates = 4;
  static constexpr bool kCellState = true;
};
// oneDNN's linear-before-reset GRU is cuDNN's (and ours): o = tanh(W_o x + b_o + r * (U_o h + b_u')). Its
// gates are u (our z), r, o (our n); its four biases u, r, o, u' are b_iz + b_hz, b_ir + b_hr, b_in and b_hn.
struct GruKind {
  using Forward = dnnl::lbr_gru_forward;
  using Backward = dnnl::lbr_gru_backward;
  static constexpr int kGates = 3;
  static constexpr bool kCellState = false;
};

// Our gate g in the primitive's order: the same for the LSTM (i, f, c~, o); for the GRU our r, z, n are its
// gates 1, 0, 2.
template <typename Kind>
constexpr int their_gate(int ours) {
  if constexpr (Kind::kGates == 3) return ours == 0 ? 1 : ours == 1 ? 0 : 2;
  return ours;
}

// `to` = `from` with its gate blocks (each `block` floats) put in the primitive's order, or back.
template <typename Kind>
void permute_gates(const float* from, float* to, std::size_t block, bool to_theirs) {
  for (int g = 0; g < Kind::kGates; ++g) {
    const int t = their_gate<Kind>(g);
    const std::size_t src = static_cast<std::size_t>(to_theirs ? g : t) * block;
    const std::size_t dst = static_cast<std::size_t>(to_theirs ? t : g) * block;
    std::copy(from + src, from + src + block, to + dst);
  }
}

// The primitives and buffers of one (batch, seq) shape.
template <typename Kind>
class Shape {
  static constexpr memory::dim kG = Kind::kGates;

 public:
  Shape(const dnnl::engine& engine, int batch, int seq, int input, int hidden, bool reverse)
      : reverse_(reverse),
        t_(seq),
        b_(batch),
        in_(input),
        h_(hidden),
        src_layer_(f32({t_, b_, in_}, tag::tnc)),
        state_(f32({1, 1, b_, h_}, tag::ldnc)),
        user_w_layer_(f32({1, 1, in_, kG, h_}, tag::ldgoi)),
        user_w_iter_(f32({1, 1, h_, kG, h_}, tag::ldgoi)),
        bias_md_(f32({1, 1, 4, h_}, tag::ldgo)),
        dst_layer_(f32({t_, b_, h_}, tag::tnc)),
        forward_pd_(make_forward(engine)),
        backward_pd_(make_backward(engine)),
        forward_(forward_pd_),
        backward_(backward_pd_),
        zero_state_(state_, engine),
        zero_diff_state_(state_, engine),
        last_h_(state_, engine),
        last_c_(state_, engine),
        diff_h0_(state_, engine),
        diff_c0_(state_, engine),
        bias_(bias_md_, engine),
        diff_bias_(bias_md_, engine),
        staged_w_layer_(user_w_layer_, engine),
        staged_w_iter_(user_w_iter_, engine),
        fwd_w_layer_(forward_pd_.weights_layer_desc(), engine),
        fwd_w_iter_(forward_pd_.weights_iter_desc(), engine),
        bwd_w_layer_(backward_pd_.weights_layer_desc(), engine),
        bwd_w_iter_(backward_pd_.weights_iter_desc(), engine),
        diff_w_layer_(backward_pd_.diff_weights_layer_desc(), engine),
        diff_w_iter_(backward_pd_.diff_weights_iter_desc(), engine),
        workspace_(forward_pd_.workspace_desc(), engine),
        // The weights' reorders, made once: our [G*H, in] layout into the formats the primitives chose, and
        // the gradients back.
        to_fwd_layer_(reorder(engine, user_w_layer_, forward_pd_.weights_layer_desc())),
        to_fwd_iter_(reorder(engine, user_w_iter_, forward_pd_.weights_iter_desc())),
        to_bwd_layer_(reorder(engine, user_w_layer_, backward_pd_.weights_layer_desc())),
        to_bwd_iter_(reorder(engine, user_w_iter_, backward_pd_.weights_iter_desc())),
        from_diff_layer_(reorder(engine, backward_pd_.diff_weights_layer_desc(), user_w_layer_)),
        from_diff_iter_(reorder(engine, backward_pd_.diff_weights_iter_desc(), user_w_iter_)) {}

  void forward(const dnnl::engine& engine, dnnl::stream& stream, const LstmLayerBuffers& in) {
    const AsynchronousSignalsHeldBack held_back;
    memory x(src_layer_, engine, const_cast<float*>(in.x));
    memory y(dst_layer_, engine, in.h);
    set_bias(in);
    stage_weights(engine, stream, in, to_fwd_layer_, fwd_w_layer_, to_fwd_iter_, fwd_w_iter_);
    forward_.execute(stream, shared_args(x, y, fwd_w_layer_.mem, fwd_w_iter_.mem));
    stream.wait();
  }

  void backward(const dnnl::engine& engine, dnnl::stream& stream, const LstmLayerBuffers& in,
                const LstmLayerGradients& out) {
    const AsynchronousSignalsHeldBack held_back;
    memory x(src_layer_, engine, const_cast<float*>(in.x));
    memory y(dst_layer_, engine, in.h);
    memory dy(dst_layer_, engine, const_cast<float*>(out.dh));
    memory dx(src_layer_, engine, out.dx);
    stage_weights(engine, stream, in, to_bwd_layer_, bwd_w_layer_, to_bwd_iter_, bwd_w_iter_);
    diff_w_layer_.zero();  // oneDNN adds into its weight and bias gradients
    diff_w_iter_.zero();
    diff_bias_.zero();
    std::unordered_map<int, memory> args = shared_args(x, y, bwd_w_layer_.mem, bwd_w_iter_.mem);
    args.insert({{DNNL_ARG_DIFF_SRC_LAYER, dx},
                 {DNNL_ARG_DIFF_SRC_ITER, diff_h0_.mem},
                 {DNNL_ARG_DIFF_WEIGHTS_LAYER, diff_w_layer_.mem},
                 {DNNL_ARG_DIFF_WEIGHTS_ITER, diff_w_iter_.mem},
                 {DNNL_ARG_DIFF_BIAS, diff_bias_.mem},
                 {DNNL_ARG_DIFF_DST_LAYER, dy},
                 {DNNL_ARG_DIFF_DST_ITER, zero_diff_state_.mem}});
    if constexpr (Kind::kCellState) {
      args.insert(
          {{DNNL_ARG_DIFF_SRC_ITER_C, diff_c0_.mem}, {DNNL_ARG_DIFF_DST_ITER_C, zero_diff_state_.mem}});
    }
    backward_.execute(stream, args);
    // The gradients back into our layout: straight for the LSTM, through the staging buffers and back into
    // our gate order for the GRU.
    const std::size_t h = static_cast<std::size_t>(h_);
    if constexpr (Kind::kGates == 4) {
      memory dw_layer(user_w_layer_, engine, out.dw_ih);
      memory dw_iter(user_w_iter_, engine, out.dw_hh);
      from_diff_layer_.execute(stream, diff_w_layer_.mem, dw_layer);
      from_diff_iter_.execute(stream, diff_w_iter_.mem, dw_iter);
      stream.wait();
      std::copy(diff_bias_.data.begin(), diff_bias_.data.end(), out.db_ih);
      std::copy(diff_bias_.data.begin(), diff_bias_.data.end(), out.db_hh);
    } else {
      from_diff_layer_.execute(stream, diff_w_layer_.mem, staged_w_layer_.mem);
      from_diff_iter_.execute(stream, diff_w_iter_.mem, staged_w_iter_.mem);
      stream.wait();
      permute_gates<Kind>(staged_w_layer_.data.data(), out.dw_ih, h * static_cast<std::size_t>(in_), false);
      permute_gates<Kind>(staged_w_iter_.data.data(), out.dw_hh, h * h, false);
      // Their bias gradients u, r, o, u' to our b_ih (r, z, n) and b_hh (r, z, and n's, which is u').
      const float* d = diff_bias_.data.data();
      for (std::size_t j = 0; j < h; ++j) {
        out.db_ih[j] = out.db_hh[j] = d[h + j];      // r
        out.db_ih[h + j] = out.db_hh[h + j] = d[j];  // z = u
        out.db_ih[2 * h + j] = d[2 * h + j];         // n's input side: o
        out.db_hh[2 * h + j] = d[3 * h + j];         // n's recurrent side: u'
      }
    }
  }

 private:
  void set_bias(const LstmLayerBuffers& in) {
    const std::size_t h = static_cast<std::size_t>(h_);
    float* b = bias_.data.data();
    if constexpr (Kind::kGates == 4) {
      for (std::size_t j = 0; j < 4 * h; ++j) b[j] = in.b_ih[j] + in.b_hh[j];
    } else {
      for (std::size_t j = 0; j < h; ++j) {
        b[j] = in.b_ih[h + j] + in.b_hh[h + j];  // u = z
        b[h + j] = in.b_ih[j] + in.b_hh[j];      // r
        b[2 * h + j] = in.b_ih[2 * h + j];       // o: n's input side
        b[3 * h + j] = in.b_hh[2 * h + j];       // u': n's recurrent side, inside r * (...)
      }
    }
  }

  // Our weights into the primitive's formats (for the GRU through staging buffers in its gate order).
  void stage_weights(const dnnl::engine& engine, dnnl::stream& stream, const LstmLayerBuffers& in,
                     dnnl::reorder& to_layer, Owned& layer, dnnl::reorder& to_iter, Owned& iter) {
    if constexpr (Kind::kGates == 4) {
      memory w_layer(user_w_layer_, engine, const_cast<float*>(in.w_ih));
      memory w_iter(user_w_iter_, engine, const_cast<float*>(in.w_hh));
      to_layer.execute(stream, w_layer, layer.mem);
      to_iter.execute(stream, w_iter, iter.mem);
    } else {
      const std::size_t h = static_cast<std::size_t>(h_);
      permute_gates<Kind>(in.w_ih, staged_w_layer_.data.data(), h * static_cast<std::size_t>(in_), true);
      permute_gates<Kind>(in.w_hh, staged_w_iter_.data.data(), h * h, true);
      to_layer.execute(stream, staged_w_layer_.mem, layer.mem);
      to_iter.execute(stream, staged_w_iter_.mem, iter.mem);
    }
  }

  // What forward and backward both take: the input and output, the weights in the primitive's format, the
  // zero initial states, the bias, the final states and the workspace.
  std::unordered_map<int, memory> shared_args(const memory& x, const memory& y, const memory& w_layer,
                                              const memory& w_iter) {
    std::unordered_map<int, memory> args{
        {DNNL_ARG_SRC_LAYER, x},           {DNNL_ARG_SRC_ITER, zero_state_.mem},
        {DNNL_ARG_WEIGHTS_LAYER, w_layer}, {DNNL_ARG_WEIGHTS_ITER, w_iter},
        {DNNL_ARG_BIAS, bias_.mem},        {DNNL_ARG_DST_LAYER, y},
        {DNNL_ARG_DST_ITER, last_h_.mem},  {DNNL_ARG_WORKSPACE, workspace_.mem}};
    if constexpr (Kind::kCellState) {
      args.insert({{DNNL_ARG_SRC_ITER_C, zero_state_.mem}, {DNNL_ARG_DST_ITER_C, last_c_.mem}});
    }
    return args;
  }

  static dnnl::reorder reorder(const dnnl::engine& engine, const memory::desc& from, const memory::desc& to) {
    return dnnl::reorder(dnnl::reorder::primitive_desc(engine, from, engine, to));
  }
  typename Kind::Forward::primitive_desc make_forward(const dnnl::engine& engine) const {
    const memory::desc any_layer = f32({1, 1, in_, kG, h_}, tag::any);
    const memory::desc any_iter = f32({1, 1, h_, kG, h_}, tag::any);
    const auto direction = this->direction();
    if constexpr (Kind::kCellState) {
      const typename Kind::Forward::desc desc(dnnl::prop_kind::forward_training, direction, src_layer_,
                                              state_, state_, any_layer, any_iter, bias_md_, dst_layer_,
                                              state_, state_);
      return typename Kind::Forward::primitive_desc(desc, engine);
    } else {
      const typename Kind::Forward::desc desc(dnnl::prop_kind::forward_training, direction, src_layer_,
                                              state_, any_layer, any_iter, bias_md_, dst_layer_, state_);
      return typename Kind::Forward::primitive_desc(desc, engine);
    }
  }
  typename Kind::Backward::primitive_desc make_backward(const dnnl::engine& engine) const {
    const memory::desc any_layer = f32({1, 1, in_, kG, h_}, tag::any);
    const memory::desc any_iter = f32({1, 1, h_, kG, h_}, tag::any);
    const auto direction = this->direction();
    if constexpr (Kind::kCellState) {
      const typename Kind::Backward::desc desc(dnnl::prop_kind::backward, direction, src_layer_, state_,
                                               state_, any_layer, any_iter, bias_md_, dst_layer_, state_,
                                               state_, src_layer_, state_, state_, any_layer, any_iter,
                                               bias_md_, dst_layer_, state_, state_);
      return typename Kind::Backward::primitive_desc(desc, engine, forward_pd_);
    } else {
      const typename Kind::Backward::desc desc(dnnl::prop_kind::backward, direction, src_layer_, state_,
                                               any_layer, any_iter, bias_md_, dst_layer_, state_, src_layer_,
                                               state_, any_layer, any_iter, bias_md_, dst_layer_, state_);
      return typename Kind::Backward::primitive_desc(desc, engine, forward_pd_);
    }
  }

  dnnl::rnn_direction direction() const {
    return reverse_ ? dnnl::rnn_direction::unidirectional_right2left
                    : dnnl::rnn_direction::unidirectional_left2right;
  }

  bool reverse_;
  memory::dim t_, b_, in_, h_;
  memory::desc src_layer_, state_, user_w_layer_, user_w_iter_, bias_md_, dst_layer_;
  typename Kind::Forward::primitive_desc forward_pd_;
  typename Kind::Backward::primitive_desc backward_pd_;
  typename Kind::Forward forward_;
  typename Kind::Backward backward_;
  Owned zero_state_, zero_diff_state_, last_h_, last_c_, diff_h0_, diff_c0_, bias_, diff_bias_;
  Owned staged_w_layer_, staged_w_iter_;  // the GRU's weights (or their gradients) in its gate order
  Owned fwd_w_layer_, fwd_w_iter_, bwd_w_layer_, bwd_w_iter_, diff_w_layer_, diff_w_iter_, workspace_;
  dnnl::reorder to_fwd_layer_, to_fwd_iter_, to_bwd_layer_, to_bwd_iter_, from_diff_layer_, from_diff_iter_;
};

template <typename Kind>
class Layer final : public OnednnLstmLayer {
 public:
  explicit Layer(bool reverse) : reverse_(reverse), engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  void forward(const LstmLayerBuffers& buffers) override {
    shape(buffers).forward(engine_, stream_, buffers);
  }
  void backward(const LstmLayerBuffers& buffers, const LstmLayerGradients& gradients) override {
    shape(buffers).backward(engine_, stream_, buffers, gradients);
  }

 private:
  // The primitives of a shape, made at its first use (the training batch, then the last evaluation batch).
  Shape<Kind>& shape(const LstmLayerBuffers& b) {
    const auto key = std::make_pair(b.batch, b.seq);
    auto found = shapes_.find(key);
    if (found == shapes_.end()) {
      found = shapes_
                  .emplace(key, std::make_unique<Shape<Kind>>(engine_, b.batch, b.seq, b.input, b.hidden,
                                                              reverse_))
                  .first;
    }
    return *found->second;
  }

  bool reverse_;
  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<std::pair<int, int>, std::unique_ptr<Shape<Kind>>> shapes_;
};

}  // namespace

std::string onednn_missing() {
  return "";
}

std::string onednn_description() {
  const dnnl_version_t* v = dnnl::version();
  const int threads = omp_get_max_threads();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." +
         std::to_string(v->patch) + " (" + isa_name(dnnl::get_effective_cpu_isa()) + ", " +
         std::to_string(threads) + " thread" + (threads == 1 ? "" : "s") + ")";
}

bool onednn_runs_avx512() {
  return is_avx512(dnnl::get_effective_cpu_isa());
}

void set_onednn_threads(int threads) {
  if (threads <= 0) return;
  omp_set_num_threads(threads);
  // OpenMP's other threads run oneDNN's kernels inside its parallel regions, where no guard of ours can
  // reach: they hold asynchronous signals back for good (the calling thread and the others take them).
#pragma omp parallel num_threads(threads)
  if (omp_get_thread_num() != 0) pthread_sigmask(SIG_BLOCK, &asynchronous_signals(), nullptr);
}

void onednn_sgemm(bool trans_a, bool trans_b, int m, int n, int k, float alpha, const float* a, int lda,
                  const float* b, int ldb, float beta, float* c, int ldc) {
  const AsynchronousSignalsHeldBack held_back;
  const dnnl_status_t status =
      dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (status != dnnl_success) {
    throw std::runtime_error("oneDNN's sgemm refused a " + std::to_string(m) + "x" + std::to_string(n) + "x" +
                             std::to_string(k) + " product (dnnl_status_t " + std::to_string(status) + ")");
  }
}

std::unique_ptr<OnednnLstmLayer> make_onednn_layer(Cell cell, bool reverse) {
  if (cell == Cell::kGru) return std::make_unique<Layer<GruKind>>(reverse);
  return std::make_unique<Layer<LstmKind>>(reverse);
}

}  // namespace ddp::models
