#!/usr/bin/env bash
# How long `ddptrain prepare text` takes on an aclImdb-sized folder: 50,000 generated reviews of about 1 KB
# (12,500 per split and label), once with a warm page cache (the files were just written) and, if run as root,
# once after dropping the caches.
#   bash benchmarks/prepare_text_bench.sh [build-dir] [scratch-dir]
set -euo pipefail
build=${1:-build}
scratch=${2:-/tmp/ddptrain-text-bench}
corpus=$scratch/aclImdb
if [ ! -d "$corpus/test/neg" ]; then
  mkdir -p "$scratch"
  python3 - "$corpus" <<'PY'
import os, random, sys
root = sys.argv[1]
rng = random.Random(1)
words = ["film", "movie", "great", "awful", "plot", "actor", "scene", "boring", "loved", "hated", "the", "a",
         "and", "it", "was", "story", "director", "music", "ending", "funny"] + [f"word{i}" for i in range(30000)]
for split in ("train", "test"):
    for label in ("pos", "neg"):
        folder = os.path.join(root, split, label)
        os.makedirs(folder, exist_ok=True)
        for i in range(12500):
            text = " ".join(rng.choice(words) if rng.random() < 0.5 else words[rng.randrange(20)]
                            for _ in range(180))
            with open(os.path.join(folder, f"{i}_{rng.randrange(1, 11)}.txt"), "w") as f:
                f.write(text[:1100] + "<br /><br />" + text[1100:1200])
PY
fi
echo "corpus: $(find "$corpus" -type f | wc -l) files, $(du -sh "$corpus" | cut -f1)"
run() {
  /usr/bin/time -f "$1: %e s wall, %M KiB peak RSS" "$build"/ddptrain prepare text --input "$corpus" \
    --output "$scratch/text.h5" --progress none >/dev/null
}
run "warm cache"
if [ "$(id -u)" -eq 0 ] && sync && echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then
  run "cold cache"
else
  echo "cold cache: skipped (needs root and a writable /proc/sys/vm/drop_caches)"
fi
