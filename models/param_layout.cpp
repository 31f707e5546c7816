#include "models/param_layout.h"

#include <stdexcept>

namespace ddp::models {

std::size_t ParamTensor::size() const {
  std::size_t n = 1;
  for (int64_t d : shape) n *= static_cast<std::size_t>(d);
  return n;
}

ParamLayout::ParamLayout(const ModelShape& shape) : shape_(shape) {
  if (shape.vocab_size <= 0 || shape.embedding_dim <= 0 || shape.hidden <= 0 || shape.layers <= 0) {
    throw std::invalid_argument("ParamLayout: every dimension of the model must be positive");
  }
  const int64_t vocab = shape.vocab_size;
  const int64_t embed = shape.embedding_dim;
  const int64_t hidden = shape.hidden;
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
    const std::string prefix = "lstm.l" + std::to_string(l) + ".";
    const int64_t in = l == 0 ? embed : hidden;
    add_tensor(prefix + "w_ih", {4 * hidden, in});
    add_tensor(prefix + "w_hh", {4 * hidden, hidden});
    add_tensor(prefix + "b_ih", {4 * hidden});
    add_tensor(prefix + "b_hh", {4 * hidden});
    add_segment("lstm.l" + std::to_string(l), begin);
  }
  const std::size_t dense_begin = total_;
  add_tensor("dense.w", {hidden});
  add_tensor("dense.b", {1});
  add_segment("dense", dense_begin);
}

const ParamTensor& ParamLayout::tensor(const std::string& name) const {
  for (const auto& t : tensors_) {
    if (t.name == name) return t;
  }
  throw std::out_of_range("no parameter tensor named '" + name + "'");
}

}  // namespace ddp::models
