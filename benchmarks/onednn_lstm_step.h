// The reference row of cpu_step_bench: one LSTM layer's training step (forward_training + backward) run by
// oneDNN's RNN primitive at the bench's shapes, timed alone. oneDNN is what PyTorch and TensorFlow use for
// the CPU's deep-learning kernels; its step is the bar the CPU replica's LSTM is measured against.
// CMake compiles onednn_lstm_step.cpp where oneDNN (Debian's libdnnl-dev) is found, else
// onednn_lstm_step_none.cpp, which says so.
#pragma once

#include <string>

struct OnednnLstmStep {
  bool available = false;
  std::string why_not;     // when not available
  std::string library;     // "oneDNN 2.6.3 (OpenMP, 1 thread)"
  double seconds = 0;      // mean over the timed steps
  double seconds_std = 0;  // standard deviation
};

// One layer of batch x seq steps of `input` features into `hidden` units, with explicit zero initial
// states, the gradient of the last time step's output only (the classifier's), weight and bias gradients
// zeroed before each step, and the weights reordered from the replica's [4H, in] layout every step (as a
// training step would, since they change). `threads`: oneDNN's OpenMP threads.
OnednnLstmStep time_onednn_lstm_step(int batch, int seq, int input, int hidden, int threads, int warmup,
                                     int steps);
