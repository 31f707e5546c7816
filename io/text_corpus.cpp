#include "io/text_corpus.h"

#include "engine/errors.h"

namespace ddp::io {

std::string prepare_text(const TextCorpusOptions&) {
  throw UserError("prepare_text: not implemented yet");
}

}  // namespace ddp::io
