#!/usr/bin/env bash
# --log.timeline: a 2-rank all-reduce run and a 3-rank parameter-server run each write one Chrome trace that
# loads as JSON, has a process per rank and the spans of a step, and whose spans nest on every track (what
# chrome://tracing and Perfetto need to draw them).
#   bash tests/cli/timeline.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$1
python=python3
"$python" -c 'import json' || { echo "FAIL: $python is missing"; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
cd "$work"
"$ddptrain" prepare synthetic --output data.h5 --train 1000 --test 200 --vocab 300 --maxlen 20 --seed 3 >/dev/null
common=(--data.path data.h5 --model.embedding_dim 16 --model.hidden 16 --train.epochs 2 --log.progress lines)
[ "${common[6]}" = --train.epochs ] || { echo "FAIL: the resumed run below replaces common's 7th word"; exit 1; }

check() {  # trace, ranks, expected span names...
  "$python" - "$@" <<'PY'
import collections, json, sys
path, ranks, expected = sys.argv[1], int(sys.argv[2]), set(sys.argv[3:])
events = json.load(open(path))
spans = [e for e in events if e.get("ph") == "X"]
pids = {e["pid"] for e in spans}
assert pids == set(range(ranks)), f"processes {sorted(pids)}, expected ranks 0..{ranks - 1}"
names = {m["pid"]: m["args"]["name"] for m in events if m.get("name") == "process_name"}
assert set(names) == pids, f"process names for {sorted(names)}"
for pid in pids:
    mine = {e["name"] for e in spans if e["pid"] == pid}
    # Rank 0 alone writes checkpoints; a parameter server (the last rank of the 3-rank run) serves.
    serves = ranks == 3 and pid == ranks - 1
    want = {"server update"} if serves else expected - ({"checkpoint"} if pid != 0 else set())
    missing = want - mine
    assert not missing, f"rank {pid} lacks spans {sorted(missing)}"
tracks = collections.defaultdict(list)
for e in spans:
    assert e["dur"] >= 0 and e["ts"] >= 0, f"negative time in {e}"
    tracks[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
for key, items in tracks.items():
    items.sort(key=lambda s: (s[0], -s[1]))
    open_spans = []
    for begin, end, name in items:
        while open_spans and open_spans[-1][1] <= begin + 1e-3:
            open_spans.pop()
        if open_spans:
            assert end <= open_spans[-1][1] + 1e-3, f"track {key}: {name} overlaps {open_spans[-1][2]}"
        open_spans.append((begin, end, name))
print(f"{path}: {len(spans)} spans on {len(tracks)} tracks of {ranks} ranks")
PY
}

mpirun -np 2 "$ddptrain" "${common[@]}" --comm.backend mpi --checkpoint.dir ar --log.timeline ar.json >ar.txt 2>&1 ||
  { echo "FAIL: all-reduce run"; cat ar.txt; exit 1; }
check ar/ar.json 2 "data wait" "HDF5 read" forward backward "all-reduce bucket" "reduction wait" optimizer \
  evaluation checkpoint step "embedding lookup" "recurrent layers" "dense layer" "recurrent layers backward" \
  "embedding gradient"
ls ./*.part ar/*.part 2>/dev/null && { echo "FAIL: part files left behind"; exit 1; }
[ ! -e ar.json ] || { echo "FAIL: a relative log.timeline went outside checkpoint.dir"; exit 1; }

mpirun -np 3 "$ddptrain" "${common[@]}" --comm.backend ps --comm.ps_servers 1 --checkpoint.dir ps \
  --log.timeline ps.json >ps.txt 2>&1 || { echo "FAIL: parameter-server run"; cat ps.txt; exit 1; }
check ps/ps.json 3 "data wait" "HDF5 read" forward backward "push/pull" evaluation checkpoint step

mpirun -np 2 "$ddptrain" "${common[@]}" --comm.backend ps --comm.ps_servers 0 --checkpoint.dir colocated \
  --log.timeline colocated.json >colocated.txt 2>&1 || { echo "FAIL: colocated run"; cat colocated.txt; exit 1; }
check colocated/colocated.json 2 "data wait" "HDF5 read" forward backward "reduce-scatter, update, all-gather" \
  evaluation checkpoint step

# A path that cannot be written is refused before training, on every rank, with exit 2.
status=0
mpirun -np 2 "$ddptrain" "${common[@]}" --checkpoint.dir bad --log.timeline /nonexistent/dir/t.json >bad.txt 2>&1 ||
  status=$?
[ "$status" -eq 2 ] || { echo "FAIL: unwritable timeline gave exit $status"; cat bad.txt; exit 1; }
grep -q "log.timeline = /nonexistent/dir/t.json" bad.txt || { echo "FAIL: no message naming the key"; cat bad.txt; exit 1; }

# An error after the timeline started (a new run into a used directory) ends with its one line and exit 2,
# not an abort, and leaves no part file.
status=0
"$ddptrain" "${common[@]}" --checkpoint.dir ar --log.timeline again.json >again.txt 2>&1 || status=$?
[ "$status" -eq 2 ] || { echo "FAIL: an error with a timeline gave exit $status"; cat again.txt; exit 1; }
grep -q "terminate called" again.txt && { echo "FAIL: the timeline's thread aborted the process"; cat again.txt; exit 1; }
ls ar/*.part 2>/dev/null && { echo "FAIL: part files left behind by the error"; exit 1; }

# A second run refused by the run directory's lock touches none of the first run's timeline files.
mpirun -np 2 "$ddptrain" "${common[@]}" --comm.backend mpi --checkpoint.dir busy \
  --train.straggle_ms 250 --log.timeline trace.json >busy.txt 2>&1 &
first=$!
for _ in $(seq 600); do
  [ -s busy/config.ini ] && break
  sleep 0.05
done
status=0
mpirun -np 2 "$ddptrain" "${common[@]}" --checkpoint.dir busy --resume auto --log.timeline trace.json \
  >second.txt 2>&1 || status=$?
if [ "$status" -ne 2 ] || ! grep -q "another run is using this directory" second.txt; then
  echo "FAIL: the second run was not refused by the lock (exit $status)"
  cat second.txt
  exit 1
fi
wait "$first" || { echo "FAIL: the first run failed"; cat busy.txt; exit 1; }
check busy/trace.json 2 forward backward step
cp busy/trace.json first-part.json

# Resumed with the timeline on: the new part's trace takes the name, the first part's is kept beside it.
mpirun -np 2 "$ddptrain" "${common[@]:0:6}" --train.epochs 3 "${common[@]:8}" --comm.backend mpi --checkpoint.dir busy --resume \
  --log.timeline trace.json >resumed.txt 2>&1 || { echo "FAIL: the resumed run"; cat resumed.txt; exit 1; }
grep -qF "timeline: busy/trace.json (the earlier trace there is now busy/trace.1.json)" resumed.txt ||
  { echo "FAIL: the kept trace is not said"; cat resumed.txt; exit 1; }
cmp -s busy/trace.1.json first-part.json || { echo "FAIL: the first part's trace was not kept as it was"; exit 1; }
check busy/trace.json 2 forward backward step

# A run that crashed leaves its part files; the run that resumes keeps them under a number of their own.
for rank in 0 1; do echo "events of a crashed rank $rank" >"busy/trace.json.rank$rank.part"; done
mpirun -np 2 "$ddptrain" "${common[@]:0:6}" --train.epochs 4 "${common[@]:8}" --comm.backend mpi --checkpoint.dir busy --resume \
  --log.timeline trace.json >after-crash.txt 2>&1 || { echo "FAIL: the run after a crash"; cat after-crash.txt; exit 1; }
for rank in 0 1; do
  [ "$(cat "busy/trace.2.json.rank$rank.part" 2>/dev/null)" = "events of a crashed rank $rank" ] ||
    { echo "FAIL: the crashed run's part of rank $rank was not kept"; ls busy; exit 1; }
done
grep -qF "timeline: busy/trace.json (the earlier trace there is now busy/trace.3.json)" after-crash.txt ||
  { echo "FAIL: the earlier trace took a crashed run's number"; cat after-crash.txt; ls busy; exit 1; }
check busy/trace.json 2 forward backward step

# A fresh run that replaces the run (checkpoint.overwrite) takes its earlier traces and part files with it;
# a file of another name stays.
echo "not a trace" >busy/trace.notes
mpirun -np 2 "$ddptrain" "${common[@]:0:6}" --train.epochs 1 "${common[@]:8}" --comm.backend mpi --checkpoint.dir busy \
  --checkpoint.overwrite true --log.timeline trace.json >overwrite.txt 2>&1 ||
  { echo "FAIL: the run that replaces the run"; cat overwrite.txt; exit 1; }
leftover=$(find busy -maxdepth 1 -name 'trace.[0-9]*.json*')
[ -z "$leftover" ] || { echo "FAIL: the replaced run's traces stayed: $leftover"; ls busy; exit 1; }
[ -f busy/trace.notes ] || { echo "FAIL: a file of another name was removed"; exit 1; }
check busy/trace.json 2 forward backward step
echo PASS
