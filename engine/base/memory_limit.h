// Sizes read from outside (a dataset's or checkpoint's attributes, an archive's headers, a file's length)
// checked against the node's memory before they are allocated: Linux grants the allocation and ends the
// process without a word once its pages are touched, so a damaged header must be refused up front.
#pragma once

#include <string>

namespace ddp {

// This node's physical memory in bytes; 0 where it cannot be read.
double node_memory_bytes();

// Memory the node can give without swapping (/proc/meminfo's MemAvailable: free memory plus caches it can
// drop); the physical memory where the kernel does not say, 0 where neither can be read.
double available_memory_bytes();

// Throws UserError "<what> needs N GB, more than this node's M GB of memory" when `bytes` exceed it.
void require_node_memory(double bytes, const std::string& what);

}  // namespace ddp
