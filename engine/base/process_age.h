// How long this process has existed: from its exec (the kernel's start time, /proc/self/stat), so that the
// dynamic loader's work counts; where /proc cannot tell, from this library's static initialization.
// metrics.jsonl's start_to_first_step_s reads it.
#pragma once

namespace ddp {

double seconds_since_process_start();

}  // namespace ddp
