#include "engine/base/runtime_library.h"

#include <dlfcn.h>

#include <stdexcept>
#include <utility>

namespace ddp::base {

RuntimeLibrary::RuntimeLibrary(std::vector<std::string> candidates) : candidates_(std::move(candidates)) {
  if (candidates_.empty()) throw std::invalid_argument("RuntimeLibrary: no library named");
  for (const std::string& candidate : candidates_) {
    if (candidate.empty()) continue;
    // RTLD_LOCAL: the library's symbols stay out of the global scope, where they could satisfy others' needs.
    handle_ = dlopen(candidate.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ != nullptr) {
      why_not_.clear();
      return;
    }
    // The first candidate's words say what is missing; a fallback's "no such file" adds nothing.
    if (why_not_.empty()) {
      const char* error = dlerror();
      why_not_ = candidate + " could not be loaded (" + (error != nullptr ? error : "no reason given") + ")";
    }
  }
}

RuntimeLibrary::~RuntimeLibrary() = default;

void* RuntimeLibrary::symbol(const char* symbol) const {
  return handle_ != nullptr ? dlsym(handle_, symbol) : nullptr;
}

}  // namespace ddp::base
