// Which source a binary was built from, for --version and the reports users send back: a binary carried to a
// GPU node or a cluster says what it is, whatever checkout sits beside it.
#pragma once

namespace ddp {

// `git describe --always --dirty` of the source tree at build time ("a476abe", "a476abe-dirty"), or "unknown"
// where the tree was no git checkout. Written by engine/base/build_info.cmake on every build.
const char* build_commit();

}  // namespace ddp
