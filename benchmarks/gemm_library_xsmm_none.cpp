#include "gemm_libraries.h"

SgemmLibrary libxsmm_library() {
  return {"libxsmm", "not built in: CMake did not find libxsmm (Debian's libxsmm-dev)", false, {}, {}};
}
