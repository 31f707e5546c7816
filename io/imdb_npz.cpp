#include "io/imdb_npz.h"

#include "engine/errors.h"

namespace ddp::io {

std::string prepare_imdb_npz(const ImdbNpzOptions&) {
  throw UserError("prepare_imdb_npz: not implemented yet");
}

}  // namespace ddp::io
