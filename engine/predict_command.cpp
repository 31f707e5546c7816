#include "engine/commands.h"
#include "engine/errors.h"

namespace ddp::engine {

int predict_command(const std::vector<std::string>&) {
  throw UserError("predict: not implemented yet");
}
int evaluate_command(const std::vector<std::string>&) {
  throw UserError("evaluate: not implemented yet");
}

}  // namespace ddp::engine
