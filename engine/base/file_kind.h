// What a path is, for the messages of the code that reads and writes users' files.
#pragma once

#include <string>

namespace ddp {

// How `path` is named in a message where it is no regular file: "a directory", "a named pipe", "a device", "a
// socket"; "" where it is a regular file, does not exist or cannot be examined (the open that follows says
// why), and, without `follow_links` (outputs, whose link the rename replaces), where it is a symbolic link.
// Readers of datasets, checkpoints and archives refuse these (a named pipe would block them), and so do the
// writers that rename a finished file over their output, which would replace the node itself (/dev/null).
std::string special_file_kind(const std::string& path, bool follow_links);

}  // namespace ddp
