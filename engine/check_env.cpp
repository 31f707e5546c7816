#include "engine/commands.h"
#include "engine/errors.h"

namespace ddp::engine {

int check_env_command(const std::vector<std::string>&) {
  throw UserError("check-env: not implemented yet");
}

}  // namespace ddp::engine
