#include "models/onednn_lstm.h"

#include <omp.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <unordered_map>
#include <utility>
#include <vector>

namespace ddp::models {
namespace {

using dnnl::memory;
using tag = memory::format_tag;

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

std::string isa_name(dnnl::cpu_isa isa) {
  switch (isa) {
    case dnnl::cpu_isa::avx512_core_amx:
    case dnnl::cpu_isa::avx512_core_bf16:
    case dnnl::cpu_isa::avx512_core_vnni:
    case dnnl::cpu_isa::avx512_core:
      return "AVX-512";
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

// The primitives and buffers of one (batch, seq) shape.
class Shape {
 public:
  Shape(const dnnl::engine& engine, int batch, int seq, int input, int hidden)
      : t_(seq),
        b_(batch),
        in_(input),
        h_(hidden),
        src_layer_(f32({t_, b_, in_}, tag::tnc)),
        state_(f32({1, 1, b_, h_}, tag::ldnc)),
        user_w_layer_(f32({1, 1, in_, 4, h_}, tag::ldgoi)),
        user_w_iter_(f32({1, 1, h_, 4, h_}, tag::ldgoi)),
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
        fwd_w_layer_(forward_pd_.weights_layer_desc(), engine),
        fwd_w_iter_(forward_pd_.weights_iter_desc(), engine),
        bwd_w_layer_(backward_pd_.weights_layer_desc(), engine),
        bwd_w_iter_(backward_pd_.weights_iter_desc(), engine),
        diff_w_layer_(backward_pd_.diff_weights_layer_desc(), engine),
        diff_w_iter_(backward_pd_.diff_weights_iter_desc(), engine),
        workspace_(forward_pd_.workspace_desc(), engine),
        // The weights' reorders, made once: our [4H, in] layout into the formats the primitives chose, and
        // the gradients back.
        to_fwd_layer_(reorder(engine, user_w_layer_, forward_pd_.weights_layer_desc())),
        to_fwd_iter_(reorder(engine, user_w_iter_, forward_pd_.weights_iter_desc())),
        to_bwd_layer_(reorder(engine, user_w_layer_, backward_pd_.weights_layer_desc())),
        to_bwd_iter_(reorder(engine, user_w_iter_, backward_pd_.weights_iter_desc())),
        from_diff_layer_(reorder(engine, backward_pd_.diff_weights_layer_desc(), user_w_layer_)),
        from_diff_iter_(reorder(engine, backward_pd_.diff_weights_iter_desc(), user_w_iter_)) {}

  void forward(const dnnl::engine& engine, dnnl::stream& stream, const LstmLayerBuffers& in) {
    memory x(src_layer_, engine, const_cast<float*>(in.x));
    memory y(dst_layer_, engine, in.h);
    memory w_layer(user_w_layer_, engine, const_cast<float*>(in.w_ih));
    memory w_iter(user_w_iter_, engine, const_cast<float*>(in.w_hh));
    for (std::size_t j = 0; j < bias_.data.size(); ++j) bias_.data[j] = in.b_ih[j] + in.b_hh[j];
    to_fwd_layer_.execute(stream, w_layer, fwd_w_layer_.mem);
    to_fwd_iter_.execute(stream, w_iter, fwd_w_iter_.mem);
    forward_.execute(stream, shared_args(x, y, fwd_w_layer_.mem, fwd_w_iter_.mem));
    stream.wait();
  }

  void backward(const dnnl::engine& engine, dnnl::stream& stream, const LstmLayerBuffers& in,
                const LstmLayerGradients& out) {
    memory x(src_layer_, engine, const_cast<float*>(in.x));
    memory y(dst_layer_, engine, in.h);
    memory w_layer(user_w_layer_, engine, const_cast<float*>(in.w_ih));
    memory w_iter(user_w_iter_, engine, const_cast<float*>(in.w_hh));
    memory dy(dst_layer_, engine, const_cast<float*>(out.dh));
    memory dx(src_layer_, engine, out.dx);
    memory dw_layer(user_w_layer_, engine, out.dw_ih);
    memory dw_iter(user_w_iter_, engine, out.dw_hh);
    to_bwd_layer_.execute(stream, w_layer, bwd_w_layer_.mem);
    to_bwd_iter_.execute(stream, w_iter, bwd_w_iter_.mem);
    diff_w_layer_.zero();  // oneDNN adds into its weight and bias gradients
    diff_w_iter_.zero();
    diff_bias_.zero();
    std::unordered_map<int, memory> args = shared_args(x, y, bwd_w_layer_.mem, bwd_w_iter_.mem);
    args.insert({{DNNL_ARG_DIFF_SRC_LAYER, dx},
                 {DNNL_ARG_DIFF_SRC_ITER, diff_h0_.mem},
                 {DNNL_ARG_DIFF_SRC_ITER_C, diff_c0_.mem},
                 {DNNL_ARG_DIFF_WEIGHTS_LAYER, diff_w_layer_.mem},
                 {DNNL_ARG_DIFF_WEIGHTS_ITER, diff_w_iter_.mem},
                 {DNNL_ARG_DIFF_BIAS, diff_bias_.mem},
                 {DNNL_ARG_DIFF_DST_LAYER, dy},
                 {DNNL_ARG_DIFF_DST_ITER, zero_diff_state_.mem},
                 {DNNL_ARG_DIFF_DST_ITER_C, zero_diff_state_.mem}});
    backward_.execute(stream, args);
    from_diff_layer_.execute(stream, diff_w_layer_.mem, dw_layer);
    from_diff_iter_.execute(stream, diff_w_iter_.mem, dw_iter);
    stream.wait();
    std::copy(diff_bias_.data.begin(), diff_bias_.data.end(), out.db_ih);
    std::copy(diff_bias_.data.begin(), diff_bias_.data.end(), out.db_hh);
  }

 private:
  // What forward and backward both take: the input and output, the weights in the primitive's format, the
  // zero initial states, the bias, the final states and the workspace.
  std::unordered_map<int, memory> shared_args(const memory& x, const memory& y, const memory& w_layer,
                                              const memory& w_iter) {
    return {{DNNL_ARG_SRC_LAYER, x},
            {DNNL_ARG_SRC_ITER, zero_state_.mem},
            {DNNL_ARG_SRC_ITER_C, zero_state_.mem},
            {DNNL_ARG_WEIGHTS_LAYER, w_layer},
            {DNNL_ARG_WEIGHTS_ITER, w_iter},
            {DNNL_ARG_BIAS, bias_.mem},
            {DNNL_ARG_DST_LAYER, y},
            {DNNL_ARG_DST_ITER, last_h_.mem},
            {DNNL_ARG_DST_ITER_C, last_c_.mem},
            {DNNL_ARG_WORKSPACE, workspace_.mem}};
  }

  static dnnl::reorder reorder(const dnnl::engine& engine, const memory::desc& from, const memory::desc& to) {
    return dnnl::reorder(dnnl::reorder::primitive_desc(engine, from, engine, to));
  }
  dnnl::lstm_forward::primitive_desc make_forward(const dnnl::engine& engine) const {
    const memory::desc any_layer = f32({1, 1, in_, 4, h_}, tag::any);
    const memory::desc any_iter = f32({1, 1, h_, 4, h_}, tag::any);
    const dnnl::lstm_forward::desc desc(dnnl::prop_kind::forward_training,
                                        dnnl::rnn_direction::unidirectional_left2right, src_layer_, state_,
                                        state_, any_layer, any_iter, bias_md_, dst_layer_, state_, state_);
    return dnnl::lstm_forward::primitive_desc(desc, engine);
  }
  dnnl::lstm_backward::primitive_desc make_backward(const dnnl::engine& engine) const {
    const memory::desc any_layer = f32({1, 1, in_, 4, h_}, tag::any);
    const memory::desc any_iter = f32({1, 1, h_, 4, h_}, tag::any);
    const dnnl::lstm_backward::desc desc(
        dnnl::prop_kind::backward, dnnl::rnn_direction::unidirectional_left2right, src_layer_, state_, state_,
        any_layer, any_iter, bias_md_, dst_layer_, state_, state_, src_layer_, state_, state_, any_layer,
        any_iter, bias_md_, dst_layer_, state_, state_);
    return dnnl::lstm_backward::primitive_desc(desc, engine, forward_pd_);
  }

  memory::dim t_, b_, in_, h_;
  memory::desc src_layer_, state_, user_w_layer_, user_w_iter_, bias_md_, dst_layer_;
  dnnl::lstm_forward::primitive_desc forward_pd_;
  dnnl::lstm_backward::primitive_desc backward_pd_;
  dnnl::lstm_forward forward_;
  dnnl::lstm_backward backward_;
  Owned zero_state_, zero_diff_state_, last_h_, last_c_, diff_h0_, diff_c0_, bias_, diff_bias_;
  Owned fwd_w_layer_, fwd_w_iter_, bwd_w_layer_, bwd_w_iter_, diff_w_layer_, diff_w_iter_, workspace_;
  dnnl::reorder to_fwd_layer_, to_fwd_iter_, to_bwd_layer_, to_bwd_iter_, from_diff_layer_, from_diff_iter_;
};

class Layer final : public OnednnLstmLayer {
 public:
  Layer() : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {}

  void forward(const LstmLayerBuffers& buffers) override {
    shape(buffers).forward(engine_, stream_, buffers);
  }
  void backward(const LstmLayerBuffers& buffers, const LstmLayerGradients& gradients) override {
    shape(buffers).backward(engine_, stream_, buffers, gradients);
  }

 private:
  // The primitives of a shape, made at its first use (the training batch, then the last evaluation batch).
  Shape& shape(const LstmLayerBuffers& b) {
    const auto key = std::make_pair(b.batch, b.seq);
    auto found = shapes_.find(key);
    if (found == shapes_.end())
      found = shapes_.emplace(key, std::make_unique<Shape>(engine_, b.batch, b.seq, b.input, b.hidden)).first;
    return *found->second;
  }

  dnnl::engine engine_;
  dnnl::stream stream_;
  std::map<std::pair<int, int>, std::unique_ptr<Shape>> shapes_;
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

void set_onednn_threads(int threads) {
  if (threads > 0) omp_set_num_threads(threads);
}

std::unique_ptr<OnednnLstmLayer> make_onednn_lstm_layer() {
  return std::make_unique<Layer>();
}

}  // namespace ddp::models
