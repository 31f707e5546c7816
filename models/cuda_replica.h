// The classifier on a GPU: cuDNN's LSTM (cudnnRNNForward, cudnnRNNBackwardData_v8,
// cudnnRNNBackwardWeights_v8) between CUDA kernels for the embedding, the dense layer and sigmoid + BCE.
// Parameters and gradients are two flat device buffers in the canonical layout (param_layout.h); cuDNN's
// weight space is mapped to and from it with cudnnGetRNNWeightParams, so checkpoints and host copies are the
// same as the CPU replica's.
//
// CMake compiles lstm_classifier_cuda.cu in a CUDA build and cuda_replica_none.cpp otherwise (whose factory
// throws a UserError saying so).
#pragma once

#include <memory>

#include "models/replica.h"

namespace ddp::models {

// A replica on CUDA device `device` (an ordinal after CUDA_VISIBLE_DEVICES), computing on a stream of its
// own.
std::unique_ptr<Replica> make_cuda_replica(const ModelShape& shape, int device);

}  // namespace ddp::models
