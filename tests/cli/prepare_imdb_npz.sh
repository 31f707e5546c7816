#!/usr/bin/env bash
# `ddptrain prepare imdb-npz` against Keras: a tiny imdb.npz made by numpy as Keras' file is made (object
# arrays of lists of ints, int64 labels), converted by ddptrain and compared, every token and label, with a
# Python reference of keras.datasets.imdb.load_data + pad_sequences written from their conventions. Then
# malformed files must exit 2 with one line naming the file.
#   bash tests/cli/prepare_imdb_npz.sh path/to/ddptrain source-dir
set -euo pipefail
ddptrain=$1
python=/usr/bin/python3
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"
if ! "$python" -c 'import numpy' 2>/dev/null; then
  echo "FAIL: $python has no numpy (Debian/Ubuntu: apt-get install python3-numpy)"
  exit 1
fi
vocab=60
maxlen=12

# Keras' imdb.npz: np.savez of x_train, y_train, x_test, y_test. Word ids start at 1 (the most frequent
# word); some are >= vocab - 3, so they become the out-of-vocabulary id. Lengths cover empty, shorter than,
# exactly and longer than maxlen (with and without the start id). The same arrays also go into a deflated
# archive (np.savez_compressed).
"$python" - "$maxlen" <<'EOF'
import sys
import numpy as np

maxlen = int(sys.argv[1])
rng = np.random.default_rng(2024)

def make(n):
    x = np.empty(n, dtype=object)
    special = [0, 1, maxlen - 2, maxlen - 1, maxlen, maxlen + 1, 3 * maxlen]
    for i in range(n):
        length = special[i] if i < len(special) else int(rng.integers(0, 3 * maxlen))
        x[i] = [int(w) for w in rng.integers(1, 90, size=length)]
    y = rng.integers(0, 2, size=n).astype(np.int64)
    return x, y

x_train, y_train = make(53)
x_test, y_test = make(31)
np.savez("imdb.npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
np.savez_compressed("imdb_compressed.npz", x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test)
EOF

check() {  # check NPZ: convert it and compare with the reference
  local npz=$1 out=${1%.npz}.h5
  "$ddptrain" prepare imdb-npz --input "$npz" --output "$out" --vocab "$vocab" --maxlen "$maxlen" >out.txt 2>&1 ||
    { echo "FAIL: prepare imdb-npz $npz failed:"; cat out.txt; exit 1; }
  grep -q "53 train and 31 test samples, vocab $vocab, maxlen $maxlen" out.txt ||
    { echo "FAIL: unexpected summary:"; cat out.txt; exit 1; }
  for d in train/x train/y test/x test/y; do
    h5dump -d "/$d" -b LE -o "${d/\//_}.bin" "$out" >/dev/null
  done
  h5dump -a /vocab_size -a /maxlen -a /source "$out" >attributes.txt
  "$python" - "$npz" "$vocab" "$maxlen" <<'EOF'
import re
import sys
import numpy as np

path, num_words, maxlen = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
start_char, oov_char, index_from, seed = 1, 2, 3, 113

# keras.datasets.imdb.load_data(num_words=num_words), as its source does it:
with np.load(path, allow_pickle=True) as f:
    x_train, labels_train = f["x_train"], f["y_train"]
    x_test, labels_test = f["x_test"], f["y_test"]
rng = np.random.RandomState(seed)
indices = np.arange(len(x_train))
rng.shuffle(indices)
x_train, labels_train = x_train[indices], labels_train[indices]
indices = np.arange(len(x_test))
rng.shuffle(indices)  # the same RandomState, not re-seeded
x_test, labels_test = x_test[indices], labels_test[indices]
x_train = [[start_char] + [w + index_from for w in x] for x in x_train]
x_test = [[start_char] + [w + index_from for w in x] for x in x_test]
xs = [[w if 0 <= w < num_words else oov_char for w in x] for x in x_train + x_test]
x_train, x_test = xs[: len(x_train)], xs[len(x_train) :]

# keras.utils.pad_sequences(x, maxlen): padding and truncating 'pre', value 0, int32.
def pad_sequences(sequences):
    out = np.zeros((len(sequences), maxlen), dtype=np.int32)
    for i, s in enumerate(sequences):
        if len(s):
            kept = s[-maxlen:]
            out[i, -len(kept) :] = kept
    return out

expected = {"train_x": pad_sequences(x_train), "train_y": labels_train.astype(np.uint8),
            "test_x": pad_sequences(x_test), "test_y": labels_test.astype(np.uint8)}
assert any(len(s) < maxlen for s in x_train) and any(len(s) > maxlen for s in x_train)
assert (expected["train_x"] == oov_char).any(), "the data should exercise the out-of-vocabulary rule"
failed = False
for name, want in expected.items():
    got = np.fromfile(name + ".bin", dtype=want.dtype)
    if got.size != want.size or not np.array_equal(got.reshape(want.shape), want):
        failed = True
        print(f"FAIL: {path} /{name.replace('_', '/')} differs from Keras' conventions")
        print("expected:", want.tolist()[:4])
        print("got:     ", got.tolist()[: 4 * maxlen])
text = open("attributes.txt").read()
for name, value in (("vocab_size", num_words), ("maxlen", maxlen)):
    m = re.search(r'ATTRIBUTE "%s".*?\(0\): (\d+)' % name, text, re.S)
    if not m or int(m.group(1)) != value:
        failed = True
        print(f"FAIL: attribute {name} should be {value}:\n{text}")
source = f"keras imdb.npz {path} num_words={num_words} maxlen={maxlen} seed={seed}"
if source not in text:
    failed = True
    print(f"FAIL: attribute source should be '{source}':\n{text}")
sys.exit(1 if failed else 0)
EOF
  echo "ok: $npz matches load_data + pad_sequences token for token"
}
check imdb.npz
check imdb_compressed.npz

# Malformed files: exit 2, one line on stderr naming the file, no output left behind.
expect_bad() {  # expect_bad FILE WORDS...
  local file=$1 status=0
  shift
  "$ddptrain" prepare imdb-npz --input "$file" --output bad.h5 >bad_out.txt 2>bad_err.txt || status=$?
  [ "$status" -eq 2 ] || { echo "FAIL: $file: exit status $status, expected 2"; cat bad_out.txt bad_err.txt; exit 1; }
  [ "$(wc -l <bad_err.txt)" -eq 1 ] || { echo "FAIL: $file: expected one line on stderr:"; cat bad_err.txt; exit 1; }
  grep -q "$file: " bad_err.txt || { echo "FAIL: $file: the message does not name the file:"; cat bad_err.txt; exit 1; }
  for word in "$@"; do
    grep -q -- "$word" bad_err.txt || { echo "FAIL: $file: no '$word' in:"; cat bad_err.txt; exit 1; }
  done
  if [ -e bad.h5 ] || [ -e bad.h5.tmp ]; then echo "FAIL: $file: an output file was left behind"; exit 1; fi
  echo "ok: $(cat bad_err.txt)"
}
head -c "$(($(stat -c %s imdb.npz) / 2))" imdb.npz >truncated.npz
expect_bad truncated.npz "not a zip archive"
echo "a review, not an archive" >text.npz
expect_bad text.npz "not a zip archive"
expect_bad missing.npz "cannot open"
"$python" -c '
import numpy as np
x = np.empty(2, dtype=object); x[0] = [1, 2]; x[1] = [3]
np.savez("labels.npz", x_train=x, y_train=np.array([0, 3]), x_test=x, y_test=np.array([1, 0]))
np.savez("floats.npz", x_train=x, y_train=np.array([0.0, 1.0]), x_test=x, y_test=np.array([1, 0]))
np.savez("no_test.npz", x_train=x, y_train=np.array([0, 1]))
'
expect_bad labels.npz "y_train" "label of sample 1 is 3"
expect_bad floats.npz "y_train.npy" "unsupported dtype '<f8'"
expect_bad no_test.npz "missing array 'x_test'"
