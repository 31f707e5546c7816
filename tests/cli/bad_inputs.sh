#!/usr/bin/env bash
# Inputs a user mistypes or a machine refuses: each ends with exit 2 and a line naming the key, value or file,
# never a crash, an allocation that fails minutes later, or a partial file left behind.
#   bash tests/cli/bad_inputs.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$1
# shellcheck source=tests/cli/lib/cli_test.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib/cli_test.sh"
enter_scratch_dir

"$ddptrain" prepare synthetic --output d.h5 --train 200 --test 50 --vocab 100 --maxlen 10 --seed 1 >/dev/null
for split in train test; do
  for class in neg pos; do
    mkdir -p "corpus/$split/$class" && echo "a $class review" >"corpus/$split/$class/1.txt"
  done
done
echo "keep me" >corpus/train/pos/9.txt
small=(--data.path d.h5 --model.embedding_dim 8 --train.epochs 1)

# Keys past any sensible bound, or not finite.
expect_user_error "threads" "train.threads = 100000" "$ddptrain" "${small[@]}" --train.threads 100000
expect_user_error "prefetch" "data.prefetch = 100000000" "$ddptrain" "${small[@]}" --data.prefetch 100000000
expect_user_error "infinite learning rate" "train.learning_rate = inf: is no number a float holds" \
  "$ddptrain" "${small[@]}" --train.learning_rate inf
expect_user_error "learning rate past float" "train.learning_rate" "$ddptrain" "${small[@]}" --train.learning_rate 1e39
expect_user_error "epsilon below float" "train.epsilon" "$ddptrain" "${small[@]}" --train.epsilon 1e-50
expect_user_error "hidden" "model.hidden = 100000" "$ddptrain" "${small[@]}" --model.hidden 100000
expect_user_error "layers" "model.layers = 1000" "$ddptrain" "${small[@]}" --model.layers 1000
expect_user_error "a precision no replica has" "model.precision = fp64: expected fp32, tf32, bf16 or fp16" \
  "$ddptrain" "${small[@]}" --model.precision fp64
# tf32 (bf16, fp16) is a GPU's arithmetic: a CPU run trains in float32 and its start log says so.
"$ddptrain" "${small[@]}" --model.hidden 8 --checkpoint.dir tf32 --model.precision tf32 >tf32_out.txt 2>tf32_err.txt ||
  fail "tf32 on the CPU: exit status $?" tf32_out.txt tf32_err.txt
grep -qF "tf32 recurrent math on GPU ranks (CPU ranks compute in float32)" tf32_out.txt tf32_err.txt ||
  fail "tf32 on the CPU: the start log does not say it is a GPU's" tf32_out.txt tf32_err.txt
expect_user_error "a model too large for a rank" "parameters, more than" \
  "$ddptrain" --data.path d.h5 --model.embedding_dim 30000 --model.hidden 30000 --train.epochs 1
# Fewer parameters than a rank can index, more than this node can hold with Adam (2e9 x 37 bytes = 74 GB):
# refused before anything is allocated, not killed by the kernel once the pages are touched.
if [ "$(awk '/^MemAvailable:/ {print $2}' /proc/meminfo)" -lt 70000000 ]; then
  "$ddptrain" prepare synthetic --output wide.h5 --train 20 --test 10 --vocab 10000000 --maxlen 8 >/dev/null
  expect_user_error "a model larger than the node's memory" "2e+09 parameters need about 7" \
    "$ddptrain" --data.path wide.h5 --model.embedding_dim 200 --train.epochs 1
fi
expect_user_error "a directory as --config" "is a directory" "$ddptrain" --config .
expect_user_error "prepare --maxlen" "--maxlen must be from 8 to" \
  "$ddptrain" prepare synthetic --output big.h5 --maxlen 2147483647
expect_user_error "prepare imdb-npz --vocab" "--vocab must be from 3 to" \
  "$ddptrain" prepare imdb-npz --input absent.npz --output big.h5 --vocab 2147483647
expect_user_error "a negative seed" "--seed must be 0 or more, got '-1'" \
  "$ddptrain" prepare synthetic --output neg.h5 --seed -1
expect_user_error "a negative seed after =" "--seed must be 0 or more" \
  "$ddptrain" prepare text --input . --output neg.h5 --seed=-5
printf '[train]\nseed = -1\n' >negative_seed.ini
expect_user_error "a negative seed in a config" "negative_seed.ini: train.seed must be 0 or more, got '-1'" \
  "$ddptrain" --config negative_seed.ini "${small[@]}"
expect_user_error "a negative seed on the command line" "--train.seed must be 0 or more" \
  "$ddptrain" "${small[@]}" --train.seed -7

# A binary file as --config: one line naming it, its bytes escaped, never a raw control byte or a byte that
# is no UTF-8 on a terminal (well-formed UTF-8 among the bytes, a letter of any script, may stay as it is).
head -c 4096 "$ddptrain" >binary.ini
expect_user_error "a binary config" "binary.ini: " "$ddptrain" --config binary.ini
tr -d '\n' <bad_err.txt | LC_ALL=C grep -q '[[:cntrl:]]' && fail "a binary config: raw control bytes in the message" bad_err.txt
iconv -f UTF-8 -t UTF-8 bad_err.txt >/dev/null 2>&1 || fail "a binary config: bytes that are no UTF-8 in the message" bad_err.txt
[ "$(wc -c <bad_err.txt)" -lt 400 ] || fail "a binary config: the message is not short" bad_err.txt

# A config saved with a UTF-8 byte order mark reads as without one.
printf '\xEF\xBB\xBF[train]\nepochs = 1\n' >bom.ini
"$ddptrain" --config bom.ini --data.path d.h5 --model.embedding_dim 8 --model.hidden 8 --checkpoint.dir bom \
  >bom.txt 2>&1 || fail "a config with a byte order mark was refused" bom.txt

# A file-size limit (as a full disk): the write fails with one line, and no partial file stays. ddptrain
# ignores SIGXFSZ itself, so a plain `ulimit -f` fails the write instead of killing the process.
status=0
(
  ulimit -f 1000
  exec "$ddptrain" prepare synthetic --output huge.h5 --train 1000000 --test 10
) >huge.txt 2>huge_err.txt || status=$?
[ "$status" -eq 2 ] || fail "a write past the file-size limit: exit $status, expected 2" huge.txt huge_err.txt
[ "$(wc -l <huge_err.txt)" -eq 1 ] || fail "a failed write: not one line" huge_err.txt
grep -q "huge.h5.tmp: cannot write" huge_err.txt || fail "no line naming the file" huge_err.txt
ls huge.h5* 2>/dev/null && fail "a partial file was left behind"

# The same for a checkpoint: the resumed run cannot write its next one, says so in one line and exits 2, and
# the last good last.h5 stays as it was (a failed write is never renamed over it). The checkpoint (24 MB)
# is larger than the limit, which MPI's start-up files stay under.
big=(--data.path d.h5 --model.embedding_dim 8 --model.hidden 700 --checkpoint.dir full)
"$ddptrain" "${big[@]}" --train.epochs 1 >full.txt 2>&1 || fail "the first epoch" full.txt
cp full/last.h5 last-good.h5
status=0
(
  trap '' XFSZ
  ulimit -f 16000
  exec "$ddptrain" "${big[@]}" --train.epochs 2 --resume last
) >full2.txt 2>full2_err.txt || status=$?
[ "$status" -eq 2 ] || fail "a checkpoint past the file-size limit: exit $status, expected 2" full2.txt full2_err.txt
[ "$(wc -l <full2_err.txt)" -eq 1 ] || fail "a failed checkpoint: not one line" full2_err.txt
grep -q "full/last.h5.tmp: cannot write .*; full/last.h5 is unchanged" full2_err.txt || fail "no line naming the file" full2_err.txt
cmp -s full/last.h5 last-good.h5 || fail "the failed checkpoint changed last.h5"
ls full/*.tmp 2>/dev/null && fail "a partial checkpoint was left behind"

# Files that are not plain files: a named pipe or a device as an input ends at once (a reader would block on
# the pipe), and as an output is refused, never replaced by the rename that finishes the file.
mkfifo pipe.h5
expect_user_error "a named pipe as data.path" "pipe.h5: is a named pipe, not an HDF5 file" \
  timeout 60 "$ddptrain" --data.path pipe.h5 --train.epochs 1
expect_user_error "a named pipe as the checkpoint" "pipe.h5: is a named pipe" \
  timeout 60 "$ddptrain" evaluate --checkpoint pipe.h5 --data d.h5
expect_user_error "a named pipe as --input" "pipe.h5: is a named pipe" \
  timeout 60 "$ddptrain" prepare imdb-npz --input pipe.h5 --output npz.h5
expect_user_error "a named pipe as --output" "pipe.h5: not a plain file (a named pipe)" \
  "$ddptrain" prepare synthetic --output pipe.h5 --train 20 --test 5
[ -p pipe.h5 ] || fail "prepare replaced the named pipe it was given as --output"
ln -s /dev/null null.h5
"$ddptrain" prepare synthetic --output null.h5 --train 20 --test 5 >/dev/null 2>&1 || fail "a link as --output"
[ -c /dev/null ] || fail "/dev/null is no longer a device"
# --output replaces an earlier dataset only (and says so), never a file of another kind, and names a file.
echo "my notes" >notes.txt
expect_user_error "a text file as --output" "--output notes.txt is a file but no dataset" \
  "$ddptrain" prepare synthetic --output notes.txt --train 20 --test 5
[ "$(cat notes.txt)" = "my notes" ] || fail "prepare replaced a text file"
cp d.h5 replaced.h5
"$ddptrain" prepare synthetic --output replaced.h5 --train 20 --test 5 >replaced.txt 2>&1 ||
  fail "prepare over an earlier dataset" replaced.txt
grep -qF "note: replaced the dataset replaced.h5 held before" replaced.txt ||
  fail "replacing a dataset is not said" replaced.txt
# A preparer that fails leaves the earlier dataset as it was, and says nothing of replacing it.
cp d.h5 kept.h5
expect_user_error "a failing prepare over an earlier dataset" "--train and --test must be positive" \
  "$ddptrain" prepare synthetic --output kept.h5 --train 0 --test 5
cmp -s d.h5 kept.h5 || fail "a failed prepare changed the earlier dataset"
! grep -q "replaced" bad_out.txt || fail "a failed prepare said it replaced the dataset" bad_out.txt
expect_user_error "a folder's name as --output" "--output new_folder/ names a folder" \
  "$ddptrain" prepare synthetic --output new_folder/ --train 20 --test 5
[ -e new_folder ] && fail "a refused --output left a folder behind"
expect_user_error "a named pipe as log.timeline" "log.timeline = $PWD/pipe.h5: not a plain file (a named pipe)" \
  "$ddptrain" "${small[@]}" --checkpoint.dir tl --log.timeline "$PWD/pipe.h5"
# log.timeline naming the run's own checkpoint, its data or anything but an earlier trace is refused.
cp d.h5 d-copy.h5
expect_user_error "log.timeline over the dataset" "is no trace of an earlier run" \
  "$ddptrain" "${small[@]}" --checkpoint.dir tl --log.timeline "$PWD/d.h5"
cmp -s d.h5 d-copy.h5 || fail "log.timeline replaced the dataset"
"$ddptrain" "${small[@]}" --checkpoint.dir tl --log.timeline trace.json >tl.txt 2>&1 || fail "a timeline" tl.txt
"$ddptrain" "${small[@]}" --checkpoint.dir tl --log.timeline trace.json --checkpoint.overwrite true >tl2.txt 2>&1 ||
  fail "a timeline over an earlier trace" tl2.txt
expect_user_error "log.timeline over last.h5" "is no trace of an earlier run" \
  "$ddptrain" "${small[@]}" --checkpoint.dir tl --log.timeline last.h5 --checkpoint.overwrite true

# prepare never writes over its input.
expect_user_error "prepare text writing among its documents" "among the documents" \
  "$ddptrain" prepare text --input corpus --output corpus/train/pos/9.txt
[ "$(cat corpus/train/pos/9.txt)" = "keep me" ] || fail "prepare text replaced a document"

expect_user_error "prepare text with an empty --output" "prepare text: --output is empty" \
  "$ddptrain" prepare text --input corpus --output ""

# Output that cannot be written (a full disk, a closed stdout) is an error, not a success with the
# predictions or the report lost.
status=0
"$ddptrain" evaluate --checkpoint bom/best.h5 --data d.h5 >/dev/full 2>full_out_err.txt || status=$?
if [ "$status" -ne 2 ] || ! grep -qF "cannot write the output to stdout (No space left on device)" full_out_err.txt; then
  fail "evaluate into /dev/full: exit $status" full_out_err.txt
fi
status=0
"$ddptrain" prepare synthetic --output closed.h5 --train 50 --test 10 >&- 2>closed_err.txt || status=$?
if [ "$status" -ne 2 ] || ! grep -qF "cannot write the output to stdout (Bad file descriptor)" closed_err.txt; then
  fail "prepare with stdout closed: exit $status" closed_err.txt
fi

# The commands that run as one process, started as two by mpirun (the train command's prefix pasted): the
# first does the work and says so; the second does nothing, rather than writing the same file at once.
mpirun -np 2 "$ddptrain" prepare synthetic --output twice.h5 --train 50 --test 10 >twice.txt 2>twice_err.txt ||
  fail "prepare under mpirun -np 2" twice.txt twice_err.txt
[ "$(grep -c "^wrote twice.h5" twice.txt)" -eq 1 ] || fail "prepare under mpirun -np 2 did not run once" twice.txt
grep -qF "note: ddptrain prepare runs as one process; the launcher started 2, and rank 1 does nothing" \
  twice_err.txt || fail "prepare under mpirun -np 2: no note" twice_err.txt

# The wire the chosen backend uses is said on the backend line.
"$ddptrain" "${small[@]}" --checkpoint.dir fp16 --comm.compression fp16 >fp16.txt 2>&1 || fail "fp16 on MPI" fp16.txt
grep -q "^backend mpi: .*, gradients as fp16, scaled per chunk (averaged in float)$" fp16.txt ||
  fail "comm.compression = fp16 on the MPI all-reduce is not said" fp16.txt
mpirun -np 2 "$ddptrain" "${small[@]}" --checkpoint.dir fp16-ps --comm.backend ps --comm.compression fp16 \
  >fp16-ps.txt 2>&1 || fail "fp16 under the parameter server" fp16-ps.txt
grep -q "^backend ps: .*; gradients reduce-scattered and updates all-gathered as fp16 scaled per message" fp16-ps.txt ||
  fail "comm.compression = fp16 under the parameter server is not said" fp16-ps.txt

# An empty value of a true/false key is not true.
printf '[checkpoint]\noverwrite =\n' >empty-bool.ini
expect_user_error "an empty boolean in a config" "empty-bool.ini: checkpoint.overwrite must be true or false" \
  "$ddptrain" --config empty-bool.ini "${small[@]}"
expect_user_error "an empty boolean on the command line" "--model.mask_padding must be true or false" \
  "$ddptrain" "${small[@]}" --model.mask_padding ""

# A shard smaller than a batch under every backend, including the default on two ranks (the colocated
# parameter server) and a dedicated server: the reason on one line, exit 2, no crash.
for layout in "2 auto" "2 mpi" "3 ps --comm.ps_servers 1"; do
  read -r ranks backend servers <<<"$layout"
  name="shard-$ranks-$backend"
  status=0
  # shellcheck disable=SC2086 # $servers is zero or two words
  mpirun -np "$ranks" "$ddptrain" "${small[@]}" --train.batch_size 128 --comm.backend "$backend" $servers \
    --checkpoint.dir "$name" >"$name.txt" 2>&1 || status=$?
  [ "$status" -eq 2 ] || fail "$layout, a shard smaller than a batch: exit $status" "$name.txt"
  grep -q "fewer than 2 .* x train.batch_size 128" "$name.txt" || fail "$layout: no line naming train.batch_size" \
    "$name.txt"
  grep -qi "segmentation\|signal" "$name.txt" && fail "$layout: a rank crashed" "$name.txt"
done
# Datasets a user writes with h5py: what is wrong, or cannot be read here, is said in their terms.
tiny=(--model.embedding_dim 8 --train.epochs 1 --train.batch_size 4)
if /usr/bin/python3 -c 'import h5py' 2>/dev/null; then
  /usr/bin/python3 - <<'PY'
import h5py, numpy as np
rng = np.random.default_rng(1)
def write(path, x_dtype="i4", y_dtype="u1", compression=None, val_rows=None, train_rows=40):
    with h5py.File(path, "w") as f:
        f.attrs["vocab_size"] = 50
        f.attrs["maxlen"] = 6
        for split, rows in (("train", train_rows), ("test", 10), ("val", val_rows)):
            if rows is None:
                continue
            f.create_dataset(split + "/x", data=rng.integers(0, 50, (rows, 6)).astype(x_dtype),
                             compression=compression, chunks=(max(rows, 1), 6) if compression else None)
            f.create_dataset(split + "/y", data=(rng.integers(0, 2, rows)).astype(y_dtype))
write("lzf.h5", compression="lzf")
write("int64.h5", x_dtype="i8")
write("bool.h5", y_dtype="bool")
write("empty-val.h5", val_rows=0)
write("empty-train.h5", train_rows=0)
write("plain.h5")
with h5py.File("unfilled.h5", "w") as f:  # created for 120 rows, 40 written
    f.attrs["vocab_size"] = 50
    f.attrs["maxlen"] = 6
    for split in ("train", "test"):
        x = f.create_dataset(split + "/x", shape=(120, 6), dtype="i4", chunks=(16, 6))
        y = f.create_dataset(split + "/y", shape=(120,), dtype="u1", chunks=(16,))
        x[:40] = rng.integers(1, 50, (40, 6))
        y[:40] = rng.integers(0, 2, 40)
PY
  "$ddptrain" "${tiny[@]}" --data.path unfilled.h5 --checkpoint.dir unfilled >unfilled.txt 2>&1 ||
    fail "a dataset with unfilled rows" unfilled.txt
  grep -q "^note: 80 of the 120 rows of unfilled.h5 /train hold no token" unfilled.txt ||
    fail "rows never written are not noted" unfilled.txt
  expect_user_error "an LZF-compressed dataset" \
    "lzf.h5: dataset /train/x is stored with the filter 'lzf' (id 32000), which this HDF5 library does not have" \
    "$ddptrain" "${tiny[@]}" --data.path lzf.h5
  expect_user_error "int64 tokens" "int64.h5: dataset /train/x must be int32 [N, maxlen], found int64 [40, 6] (with numpy: x.astype(np.int32))" \
    "$ddptrain" "${tiny[@]}" --data.path int64.h5
  expect_user_error "bool labels" "bool.h5: dataset /train/y must be uint8 [N], found bool [40]" \
    "$ddptrain" "${tiny[@]}" --data.path bool.h5
  expect_user_error "an empty /val" "empty-val.h5: /val has no rows" \
    "$ddptrain" "${tiny[@]}" --data.path empty-val.h5 --data.validation val
  expect_user_error "an empty /train" "empty-train.h5: /train has no rows to train on" \
    "$ddptrain" "${tiny[@]}" --data.path empty-train.h5
  # A checkpoint whose vocabulary's string references are damaged (one byte of the heap index of word 3):
  # libhdf5 1.10 reads out of bounds there and faults; the run must end as for any damaged file.
  "$ddptrain" prepare text --input corpus --output text.h5 --vocab 20 --maxlen 8 >/dev/null
  "$ddptrain" --data.path text.h5 --checkpoint.dir textrun --model.embedding_dim 8 --model.hidden 8 \
    --train.epochs 1 --train.batch_size 1 --data.validation test >textrun.txt 2>&1 ||
    fail "training on a text corpus" textrun.txt
  /usr/bin/python3 - <<'PY'
import h5py, shutil
shutil.copy("textrun/best.h5", "heap.h5")
with h5py.File("heap.h5", "r") as f:
    offset = f["vocab"].id.get_offset()  # variable-length references: length 4, heap address 8, index 4
with open("heap.h5", "r+b") as f:
    f.seek(offset + 16 * 3 + 15)
    byte = f.read(1)[0]
    f.seek(offset + 16 * 3 + 15)
    f.write(bytes([byte ^ 0xFF]))
PY
  for command in "predict --text pos" "evaluate --data text.h5"; do
    status=0
    # shellcheck disable=SC2086 # the subcommand and its option
    "$ddptrain" $command --checkpoint heap.h5 >heap.txt 2>heap_err.txt || status=$?
    [ "$status" -eq 2 ] || fail "$command on a checkpoint with a damaged vocabulary: exit $status" heap_err.txt
    if [ "$(wc -l <heap_err.txt)" -ne 1 ] || ! grep -q "^ddptrain: error: heap.h5: " heap_err.txt; then
      fail "$command on a checkpoint with a damaged vocabulary: not one line naming it" heap_err.txt
    fi
  done
  # Held open for writing by another process (a notebook): its HDF5 lock keeps readers out.
  /usr/bin/python3 -c 'import h5py, sys, time; f = h5py.File("plain.h5", "a"); print("open", flush=True); time.sleep(60)' >holder.txt &
  holder=$!
  for _ in $(seq 100); do grep -q open holder.txt && break; sleep 0.1; done
  expect_user_error "a file open for writing elsewhere" "plain.h5: is open for writing in another process" \
    "$ddptrain" "${tiny[@]}" --data.path plain.h5
  kill "$holder"
  wait "$holder" 2>/dev/null || true
else
  skip_missing --part python3-h5py "datasets written with h5py: python3-h5py is not installed"
fi
echo "PASS: bad keys, a byte order mark, a failed write, files that are not plain, a small shard, h5py datasets"
