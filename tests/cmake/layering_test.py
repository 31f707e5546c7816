#!/usr/bin/env python3
"""The layers the build enforces (CMakeLists.txt, ARCHITECTURE.md, "Folders and libraries"): a file of each library is compiled, with
that library's own compile command from compile_commands.json, against an include it may use (which must
compile) and against includes that run upward or sideways (which must not be found).

  layering_test.py BUILD_DIR SOURCE_DIR
"""
import json
import os
import shlex
import subprocess
import sys
import tempfile

# A source file of each library, what it may include, and what it must not reach.
CASES = [
    ("engine/base/errors.cpp", "engine/base/timeline.h",
     ["io/dataset.h", "models/replica.h", "comm/gradient_reducer.h", "engine/trainer.h", "engine/app/commands.h",
      "engine/optimizer/optimizer.h"]),
    ("engine/optimizer/optimizer.cpp", "engine/base/parallel_loops.h",
     ["io/dataset.h", "models/replica.h", "comm/gradient_reducer.h", "engine/config.h", "engine/trainer.h"]),
    ("io/dataset.cpp", "engine/base/errors.h",
     ["models/replica.h", "comm/gradient_reducer.h", "engine/trainer.h", "engine/config.h", "engine/app/commands.h"]),
    ("models/param_layout.cpp", "engine/base/errors.h",
     ["io/dataset.h", "comm/gradient_reducer.h", "engine/optimizer/optimizer.h", "engine/app/commands.h"]),
    ("comm/ps_service.cpp", "engine/optimizer/optimizer.h",
     ["io/dataset.h", "models/replica.h", "engine/trainer.h", "engine/app/commands.h"]),
    ("comm/mpi_reducer.cpp", "engine/base/timeline.h",
     ["io/dataset.h", "models/replica.h", "engine/trainer.h", "engine/app/commands.h"]),
    ("engine/trainer.cpp", "io/dataset.h", ["engine/app/commands.h", "engine/app/learning_curves.h"]),
    ("engine/app/check_env.cpp", "engine/trainer.h", []),
]


def compile_command(entries, source):
    for entry in entries:
        if entry["file"].endswith("/" + source):
            words = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
            return words, entry["directory"]
    sys.exit(f"FAIL: {source} is not in compile_commands.json")


def compiles(words, directory, include):
    """Whether a file holding `#include "include"` compiles with `words` (the source and output replaced)."""
    with tempfile.TemporaryDirectory() as scratch:
        probe = os.path.join(scratch, "probe.cpp")
        with open(probe, "w") as out:
            out.write(f'#include "{include}"\n')
        command, skip = [], False
        for word in words:
            if skip:
                skip = False
                continue
            if word in ("-o", "-c"):
                skip = True
                continue
            command.append(word)
        command += ["-fsyntax-only", probe]
        result = subprocess.run(command, cwd=directory, capture_output=True, text=True)
        return result.returncode == 0, result.stderr


def main():
    build = sys.argv[1]
    with open(os.path.join(build, "compile_commands.json")) as f:
        entries = json.load(f)
    failures = 0
    for source, allowed, forbidden in CASES:
        words, directory = compile_command(entries, source)
        ok, errors = compiles(words, directory, allowed)
        if not ok:
            print(f"FAIL: {source}'s library cannot include {allowed}:\n{errors}")
            failures += 1
        for include in forbidden:
            ok, errors = compiles(words, directory, include)
            # gcc says "No such file or directory", clang "file not found".
            if ok or ("No such file or directory" not in errors and "file not found" not in errors):
                print(f"FAIL: {source}'s library reaches {include}" + ("" if ok else f":\n{errors}"))
                failures += 1
            else:
                print(f"ok: {source}'s library does not reach {include}")
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
