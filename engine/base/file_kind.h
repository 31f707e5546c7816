// What a path is, for the messages of the code that reads and writes users' files.
#pragma once

#include <filesystem>
#include <string>

namespace ddp {

// How a path that is no regular file is named in a message: "a directory", "a named pipe", "a device", "a
// socket"; "" for a regular file, a path that does not exist, or (with symlink_status) a symbolic link.
// Readers of datasets, checkpoints and archives refuse these (a named pipe would block them), and so do the
// writers that rename a finished file over their output, which would replace the node itself (/dev/null).
std::string special_file_kind(const std::filesystem::file_status& status);

// The kind of `path` (following links for inputs, `follow_links`; not for outputs, whose link the rename
// replaces), "" where it is a regular file or absent, or cannot be examined (the open that follows says why).
std::string special_file_kind(const std::string& path, bool follow_links);

}  // namespace ddp
