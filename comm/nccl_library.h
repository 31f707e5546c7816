// NCCL opens the first time the GPU path calls it, not when ddptrain starts: a build with CUDA runs on nodes
// without NCCL and names the missing library only when a GPU is asked for. nccl_library.cpp defines each NCCL
// function the code calls, forwarding to the library, and the build links those instead of libnccl: a call
// to a function not defined there fails to link.
#pragma once

#include <string>
#include <vector>

#include "engine/base/runtime_library.h"

namespace ddp::comm {

// NCCL, opened on the first call: whether it loaded, and if not why, naming the library.
const base::RuntimeLibrary& nccl_library();

// Where NCCL is looked for, in order: its soname (the loader's search), then the path the build found it at.
std::vector<std::string> nccl_library_names();

}  // namespace ddp::comm
