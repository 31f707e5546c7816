// The canonical flat layout of the classifier's parameters.
//
// Every replica (CPU and cuDNN), the optimizer, the communicator and the checkpoint see the parameters
// as one contiguous float buffer in this order (gradients use the same layout in a second buffer):
//
//   embedding            [V, E]        row v is the vector of token v
//   for layer l = 0..L-1 (in_0 = E, in_l = H for l > 0):
//     lstm.l<l>.w_ih     [4H, in_l]    input weights, gate blocks of H rows in cuDNN order i, f, g, o
//     lstm.l<l>.w_hh     [4H, H]       recurrent weights, same gate order
//     lstm.l<l>.b_ih     [4H]          input bias (cuDNN keeps two biases per gate)
//     lstm.l<l>.b_hh     [4H]          recurrent bias
//   dense.w              [H]           Dense(1) kernel
//   dense.b              [1]
//
// All matrices are row-major. This is also PyTorch's nn.LSTM layout (weight_ih_l{k}, weight_hh_l{k}, ...),
// and each gate block is exactly the matrix cuDNN's cudnnGetRNNWeightParams returns for linear layer id
// gate (input) or 4 + gate (recurrent). The gates are
//   i = sigmoid(.), f = sigmoid(.), g = tanh(.), o = sigmoid(.),  c' = f*c + i*g,  h' = o*tanh(c').
//
// Gradients become ready in reverse order of the buffer (dense, top LSTM layer, ..., embedding), so the
// "segments" below, read back to front, are the natural all-reduce buckets.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::models {

struct ModelShape {
  int vocab_size = 0;
  int embedding_dim = 128;
  int hidden = 128;
  int layers = 1;

  bool operator==(const ModelShape&) const = default;
};

struct ParamTensor {
  std::string name;            // e.g. "lstm.l0.w_ih"
  std::size_t offset = 0;      // in floats from the start of the flat buffer
  std::vector<int64_t> shape;  // row-major
  std::size_t size() const;
};

// A contiguous range of the flat buffer whose gradients become ready together during backward.
struct ParamSegment {
  std::string name;  // "embedding", "lstm.l0", ..., "dense"
  std::size_t offset = 0;
  std::size_t size = 0;
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelShape& shape);

  const ModelShape& shape() const { return shape_; }
  std::size_t total_size() const { return total_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  // In buffer order: embedding, lstm.l0, ..., lstm.l<L-1>, dense.
  const std::vector<ParamSegment>& segments() const { return segments_; }
  // Throws std::out_of_range for an unknown name.
  const ParamTensor& tensor(const std::string& name) const;

 private:
  ModelShape shape_;
  std::vector<ParamTensor> tensors_;
  std::vector<ParamSegment> segments_;
  std::size_t total_ = 0;
};

}  // namespace ddp::models
