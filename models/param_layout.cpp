#include "models/param_layout.h"

#include <stdexcept>

namespace ddp::models {

std::size_t ParamTensor::size() const {
  std::size_t n = 1;
  for (int64_t d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

std::string cell_name(Cell cell) {
  return cell == Cell::kLstm ? "lstm" : "gru";
}

Cell parse_cell(const std::string& name) {
  if (name == "lstm") return Cell::kLstm;
  if (name == "gru") return Cell::kGru;
  throw std::invalid_argument("unknown cell '" + name + "' (expected lstm or gru)");
}

std::string ModelShape::tensor_prefix(int layer, int direction) const {
  return cell_name(cell) + ".l" + std::to_string(layer) + (direction == 0 ? "" : "_reverse");
}

long double parameter_count(const ModelShape& s) {
  const long double directions = s.directions();
  const long double hidden = s.hidden;
  const long double gate_rows = s.gates() * hidden;
  const long double width = directions * hidden;
  const long double outputs = s.outputs();
  // The embedding; the first layer reads it, each other the layer below's directions; the dense layer.
  return static_cast<long double>(s.vocab_size) * s.embedding_dim +
         directions * gate_rows * (s.embedding_dim + hidden + 2) +
         (s.layers - 1.0L) * directions * gate_rows * (width + hidden + 2) + outputs * width + outputs;
}

std::string describe(const ModelShape& shape) {
  std::string text = shape.bidirectional ? "bidirectional " : "";
  text += shape.cell == Cell::kLstm ? "LSTM" : "GRU";
  if (shape.layers > 1) text += ", " + std::to_string(shape.layers) + " layers";
  if (shape.classes != 2) text += ", " + std::to_string(shape.classes) + " classes";
  return text;
}

ParamLayout::ParamLayout(const ModelShape& shape) : shape_(shape) {
  if (shape.vocab_size <= 0 || shape.embedding_dim <= 0 || shape.hidden <= 0 || shape.layers <= 0) {
    throw std::invalid_argument("ParamLayout: every dimension of the model must be positive");
  }
  if (shape.classes < 2) throw std::invalid_argument("ParamLayout: a classifier needs at least 2 classes");
  const int64_t vocab = shape.vocab_size;
  const int64_t embed = shape.embedding_dim;
  const int64_t hidden = shape.hidden;
  const int64_t gate_rows = shape.gates() * hidden;
  const int64_t width = shape.output_width();
  auto add_tensor = [this](std::string name, std::vector<int64_t> dims) {
    ParamTensor t{std::move(name), total_, std::move(dims)};
    total_ += t.size();
    tensors_.push_back(std::move(t));
  };
  auto add_segment = [this](std::string name, std::size_t begin) {
    segments_.push_back(ParamSegment{std::move(name), begin, total_ - begin});
  };

  add_tensor("embedding", {vocab, embed});
  add_segment("embedding", 0);
  for (int l = 0; l < shape.layers; ++l) {
    const std::size_t begin = total_;
    const int64_t in = l == 0 ? embed : width;
    for (int d = 0; d < shape.directions(); ++d) {
      const std::string prefix = shape.tensor_prefix(l, d) + ".";
      add_tensor(prefix + "w_ih", {gate_rows, in});
      add_tensor(prefix + "w_hh", {gate_rows, hidden});
      add_tensor(prefix + "b_ih", {gate_rows});
      add_tensor(prefix + "b_hh", {gate_rows});
    }
    add_segment(shape.tensor_prefix(l, 0), begin);
  }
  const std::size_t dense_begin = total_;
  if (shape.outputs() == 1) {
    add_tensor("dense.w", {width});
  } else {
    add_tensor("dense.w", {shape.outputs(), width});
  }
  add_tensor("dense.b", {shape.outputs()});
  add_segment("dense", dense_begin);
}

const ParamTensor& ParamLayout::tensor(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return t;
  }
  throw std::out_of_range("no parameter tensor named '" + name + "'");
}

std::vector<std::size_t> ParamLayout::reduction_order(bool embedding_early) const {
  std::vector<std::size_t> order{segments_.size() - 1};  // dense
  if (embedding_early) order.push_back(0);
  for (std::size_t layer = segments_.size() - 2; layer >= 2; --layer) order.push_back(layer);
  if (!embedding_early) order.push_back(0);
  order.push_back(1);  // the first layer
  return order;
}

std::size_t ParamLayout::segment_index(std::size_t offset) const {
  for (std::size_t i = 0; i < segments_.size(); ++i) {
    if (segments_[i].offset == offset) return i;
  }
  throw std::out_of_range("no parameter segment starts at offset " + std::to_string(offset));
}

}  // namespace ddp::models
