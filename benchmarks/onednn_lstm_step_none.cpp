#include "onednn_lstm_step.h"

OnednnLstmStep time_onednn_lstm_step(int, int, int, int, int, int, int) {
  OnednnLstmStep step;
  step.why_not = "built without oneDNN (install libdnnl-dev and configure again)";
  return step;
}
