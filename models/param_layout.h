// The canonical flat layout of the classifier's parameters.
//
// Every replica (CPU and cuDNN), the optimizer, the communicator and the checkpoint see the parameters
// as one contiguous float buffer in this order (gradients use the same layout in a second buffer):
//
//   embedding                [V, E]        row v is the vector of token v
//   for layer l = 0..L-1, and in it for direction d = forward, then reverse (bidirectional only):
//     (in_0 = E; in_l = D for l > 0, where D = H unidirectional, 2H bidirectional)
//     <cell>.l<l><s>.w_ih    [G*H, in_l]   input weights, gate blocks of H rows in cuDNN's order
//     <cell>.l<l><s>.w_hh    [G*H, H]      recurrent weights, same gate order
//     <cell>.l<l><s>.b_ih    [G*H]         input bias (cuDNN keeps two biases per gate)
//     <cell>.l<l><s>.b_hh    [G*H]         recurrent bias
//   dense.w                  [D]           two classes: Dense(1) kernel, then sigmoid
//                            [K, D]        K > 2 classes: Dense(K) kernel, then softmax
//   dense.b                  [1] or [K]
//
// <cell> is lstm (G = 4 gates i, f, g, o) or gru (G = 3 gates r, z, n); <s> is "" for the forward
// direction and "_reverse" for the reverse one. All matrices are row-major. This is PyTorch's nn.LSTM and
// nn.GRU layout (weight_ih_l{k}[_reverse], ...), and the order in which cudnnGetRNNWeightParams enumerates
// pseudo-layers (layer * directions + direction) and, in each, its linear layer ids: gate g's block of
// w_ih is id g, of w_hh id G + g (biases alike). The cells:
//   LSTM: i = s(.), f = s(.), g = tanh(.), o = s(.),  c' = f*c + i*g,  h' = o*tanh(c')
//   GRU:  r = s(W_ir x + b_ir + W_hr h + b_hr),  z = s(W_iz x + b_iz + W_hz h + b_hz),
//         n = tanh(W_in x + b_in + r * (W_hn h + b_hn)),  h' = (1 - z)*n + z*h   (cuDNN's and PyTorch's:
//         the reset gate multiplies the recurrent product, bias included)
// The dense layer reads the top layer's last step forward, then (bidirectional) the reverse direction's
// last step, which is the sequence's first (its first real token with model.mask_padding).
//
// Gradients become ready in reverse order of the buffer (dense, top layer, ..., embedding), so the
// "segments" below, read back to front, are the natural all-reduce buckets; a layer's segment holds both of
// its directions.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddp::models {

enum class Cell { kLstm, kGru };

// "lstm" or "gru"; parse_cell throws std::invalid_argument for another name.
std::string cell_name(Cell cell);
Cell parse_cell(const std::string& name);

struct ModelShape {
  int vocab_size = 0;
  int embedding_dim = 128;
  int hidden = 128;
  int layers = 1;
  Cell cell = Cell::kLstm;
  bool bidirectional = false;
  int classes = 2;  // 2: one logit and a sigmoid; more: one logit per class and a softmax

  int directions() const { return bidirectional ? 2 : 1; }
  int gates() const { return cell == Cell::kLstm ? 4 : 3; }
  // Width of a layer's output (the next layer's input and the dense layer's): directions x hidden.
  int output_width() const { return directions() * hidden; }
  // Logits per sample.
  int outputs() const { return classes == 2 ? 1 : classes; }
  // "lstm.l0" or "gru.l1_reverse": the tensor name prefix of a layer's direction.
  std::string tensor_prefix(int layer, int direction) const;
  bool operator==(const ModelShape&) const = default;
};

// The parameters `shape` has, counted in long double: a shape from a file or a typo may overflow size_t.
long double parameter_count(const ModelShape& shape);

// "LSTM", "bidirectional GRU, 2 layers", with the classes when more than two: for logs and messages.
std::string describe(const ModelShape& shape);

struct ParamTensor {
  std::string name;            // e.g. "lstm.l0.w_ih"
  std::size_t offset = 0;      // in floats from the start of the flat buffer
  std::vector<int64_t> shape;  // row-major
  std::size_t size() const;
};

// A contiguous range of the flat buffer whose gradients become ready together during backward.
struct ParamSegment {
  std::string name;  // "embedding", "lstm.l0" (or gru.l0), ..., "dense"
  std::size_t offset = 0;
  std::size_t size = 0;
};

class ParamLayout {
 public:
  explicit ParamLayout(const ModelShape& shape);

  const ModelShape& shape() const { return shape_; }
  std::size_t total_size() const { return total_; }
  const std::vector<ParamTensor>& tensors() const { return tensors_; }
  // In buffer order: embedding, <cell>.l0, ..., <cell>.l<L-1>, dense.
  const std::vector<ParamSegment>& segments() const { return segments_; }
  // Throws std::out_of_range for an unknown name.
  const ParamTensor& tensor(const std::string& name) const;
  // The position in segments() of the segment that starts at `offset`; throws std::out_of_range for none.
  std::size_t segment_index(std::size_t offset) const;
  // The order the gradient reductions of a step start in, the same on every rank of a job (collectives pair
  // up by order), as positions in segments(); both start with the dense layer (backward's first). A job with
  // a GPU rank (`embedding_early`) then takes the embedding, as a rule the largest bucket, which the cuDNN
  // replica finishes right after cuDNN's data backward so that it travels while the weight gradients are
  // computed, then the recurrent layers from the top. An all-CPU job takes them as the CPU replica finishes
  // them: the layers from the top down to the second, the embedding, the first layer.
  std::vector<std::size_t> reduction_order(bool embedding_early) const;

 private:
  ModelShape shape_;
  std::vector<ParamTensor> tensors_;
  std::vector<ParamSegment> segments_;
  std::size_t total_ = 0;
};

}  // namespace ddp::models
