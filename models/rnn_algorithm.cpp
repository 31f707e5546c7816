#include <array>
#include <utility>

#include "engine/base/errors.h"
#include "models/cuda_replica.h"

namespace ddp::models {
namespace {

constexpr std::array<std::pair<RnnAlgorithm, const char*>, 4> kNames{{
    {RnnAlgorithm::kAuto, "auto"},
    {RnnAlgorithm::kStandard, "standard"},
    {RnnAlgorithm::kPersistStaticSmallH, "persist_small_h"},
    {RnnAlgorithm::kPersistStatic, "persist_static"},
}};

}  // namespace

RnnAlgorithm parse_rnn_algorithm(const std::string& text, const std::string& key) {
  for (const auto& [algorithm, name] : kNames) {
    if (text == name) return algorithm;
  }
  throw UserError(key + " = " + text + ": expected auto, standard, persist_small_h or persist_static");
}

std::string rnn_algorithm_name(RnnAlgorithm algorithm) {
  for (const auto& [candidate, name] : kNames) {
    if (candidate == algorithm) return name;
  }
  return "unknown";
}

}  // namespace ddp::models
