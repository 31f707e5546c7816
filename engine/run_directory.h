// The run directory (checkpoint.dir) belongs to one run: its config.ini, metrics.jsonl, curves.svg,
// last.h5 and best.h5 all describe the same run, named by a run id that every metrics line and checkpoint
// carries. A new run refuses a directory that holds another run's files, unless told to continue it
// (--resume) or to replace it (checkpoint.overwrite), so nothing a run wrote is lost or mixed by accident.
#pragma once

#include <filesystem>
#include <memory>
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

// One run at a time in a directory: an advisory lock (flock) on DIR/.lock, held from before the directory is
// claimed until the run ends, so that a second run started in the same directory (a job submitted twice, a
// resume while the run still trains) ends with one error instead of mixing its files with the first's. The
// lock goes with the process, however it ends. Where the file system offers no locks the run goes on
// unlocked, saying so.
class RunDirectoryLock {
 public:
  // The directory's lock, taken (the directory made first) or, where this process holds it already (main()
  // takes it before the timeline writes into the directory), shared. Throws UserError naming the directory
  // and the run that holds it (its pid and host).
  static std::shared_ptr<RunDirectoryLock> hold(const RunFiles& files);
  explicit RunDirectoryLock(const RunFiles& files);
  ~RunDirectoryLock();
  RunDirectoryLock(const RunDirectoryLock&) = delete;
  RunDirectoryLock& operator=(const RunDirectoryLock&) = delete;

 private:
  int fd_ = -1;
};

// What a new run may do with the directory: `resume` is the --resume value (no, last or auto), `overwrite`
// checkpoint.overwrite. Returns whether the run continues last.h5. Throws UserError (one line naming the
// directory, what it holds and the ways out) when a fresh run would write over another run's results, or
// when --resume last finds nothing to resume. With `overwrite` the old results are removed first.
bool claim_run_directory(const RunFiles& files, const std::string& resume, bool overwrite);

// --resume last of a directory that does not exist: the same UserError, thrown before the directory's lock
// makes it, so that a mistyped path leaves nothing behind.
void refuse_resume_of_missing_directory(const RunFiles& files, const std::string& resume);

// A new run's id: its UTC start time and a random suffix, "20261123T204512Z-3f9a".
std::string new_run_id();
// The current UTC time as ISO 8601, "2026-11-23T20:45:12Z".
std::string utc_timestamp();

// A relative path given for a run's output (log.timeline) lands inside the run directory; an absolute one
// stays where it is.
std::string inside_run_directory(const std::string& dir, const std::string& path);

}  // namespace ddp::engine
