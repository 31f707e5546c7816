// The classifier on a GPU: cuDNN's LSTM (cudnnRNNForward, cudnnRNNBackwardData_v8,
// cudnnRNNBackwardWeights_v8) between CUDA kernels for the embedding, the dense layer and sigmoid + BCE.
// Parameters and gradients are two flat device buffers in the canonical layout (param_layout.h); cuDNN's
// weight space is mapped to and from it with cudnnGetRNNWeightParams, so checkpoints and host copies are the
// same as the CPU replica's.
//
// CMake compiles the replica (cudnn_replica.cuh: rnn_classifier_cuda.cu, cudnn_rnn_plan.cu,
// cudnn_batch_shapes.cu, with its kernels in classifier_kernels.cu) in a CUDA build and cuda_replica_none.cpp
// otherwise (whose factory throws a UserError saying so); rnn_algorithm.cpp in both.
#pragma once

#include <memory>
#include <string>

#include "models/replica.h"

namespace ddp::models {

// The cuDNN algorithm that runs the LSTM (model.cudnn_rnn_algo). The persistent kernels keep the recurrent
// weights on chip across time steps instead of launching kernels per step, which pays at small batches.
enum class RnnAlgorithm {
  kAuto,                 // persistent small-hidden for hidden <= 128 (as PyTorch), else standard
  kStandard,             // CUDNN_RNN_ALGO_STANDARD: kernels per layer and time step
  kPersistStaticSmallH,  // CUDNN_RNN_ALGO_PERSIST_STATIC_SMALL_H
  kPersistStatic,        // CUDNN_RNN_ALGO_PERSIST_STATIC
};

// "auto", "standard", "persist_small_h" or "persist_static"; anything else is a UserError naming `key`.
RnnAlgorithm parse_rnn_algorithm(const std::string& text, const std::string& key = "model.cudnn_rnn_algo");
std::string rnn_algorithm_name(RnnAlgorithm algorithm);

// A replica on CUDA device `device` (an ordinal after CUDA_VISIBLE_DEVICES), computing on a stream of its
// own. Under kAuto, a persistent algorithm that cuDNN turns down for a batch shape gives way to the standard
// one (said once on stderr); an algorithm asked for by name that cuDNN turns down is a UserError.
// The cuDNN replica runs every variant (LSTM and GRU, one or two directions, any layers, masked or not, two
// or more classes, dropout); a persistent algorithm named for a masked model is a UserError (per-sample
// lengths run on the standard one).
std::unique_ptr<Replica> make_cuda_replica(const ModelShape& shape, int device,
                                           RnnAlgorithm algorithm = RnnAlgorithm::kAuto,
                                           const ModelOptions& options = {});

}  // namespace ddp::models
