// The run directory (checkpoint.dir) belongs to one run: its config.ini, metrics.jsonl, curves.svg,
// last.h5 and best.h5 all describe the same run, named by a run id that every metrics line and checkpoint
// carries. A new run refuses a directory that holds another run's files, unless told to continue it
// (--resume) or to replace it (checkpoint.overwrite), so nothing a run wrote is lost or mixed by accident.
#pragma once

#include <filesystem>
#include <string>
#include <vector>

namespace ddp::engine {

struct RunFiles {
  std::filesystem::path dir;
  std::string last() const { return (dir / "last.h5").string(); }
  std::string best() const { return (dir / "best.h5").string(); }
  std::string metrics() const { return (dir / "metrics.jsonl").string(); }
  std::string config() const { return (dir / "config.ini").string(); }
  std::string curves() const { return (dir / "curves.svg").string(); }
  // The files a run leaves behind once it has trained (config.ini alone, from a run that ended before its
  // first checkpoint, loses nothing when replaced).
  std::vector<std::string> results() const { return {last(), best(), metrics(), curves()}; }
};

// What a new run may do with the directory: `resume` is the --resume value (no, last or auto), `overwrite`
// checkpoint.overwrite. Returns whether the run continues last.h5. Throws UserError (one line naming the
// directory, what it holds and the ways out) when a fresh run would write over another run's results, or
// when --resume last finds nothing to resume. With `overwrite` the old results are removed first.
bool claim_run_directory(const RunFiles& files, const std::string& resume, bool overwrite);

// A new run's id: its UTC start time and a random suffix, "20261123T204512Z-3f9a".
std::string new_run_id();
// The current UTC time as ISO 8601, "2026-11-23T20:45:12Z".
std::string utc_timestamp();

// A relative path given for a run's output (log.timeline) lands inside the run directory; an absolute one
// stays where it is.
std::string inside_run_directory(const std::string& dir, const std::string& path);

}  // namespace ddp::engine
