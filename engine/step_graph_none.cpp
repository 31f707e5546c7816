#include <stdexcept>

#include "engine/step_graph.h"

namespace ddp::engine {

std::unique_ptr<GraphRecorder> make_cuda_graph_recorder(void* /*stream*/) {
  throw std::logic_error("make_cuda_graph_recorder: this ddptrain was built without CUDA");
}

}  // namespace ddp::engine
