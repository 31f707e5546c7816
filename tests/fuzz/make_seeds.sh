#!/usr/bin/env bash
# make_seeds.sh: (re)writes the seed corpora under tests/fuzz/corpus/<target>/ from small valid inputs:
#   fuzz_npz         .npz files as numpy writes them (np.savez, np.savez_compressed; object arrays of lists
#                    as Keras' imdb.npz, integer arrays of each width) and bare .npy files (format 1.0, 2.0,
#                    Fortran order); needs /usr/bin/python3 with numpy (Debian: python3-numpy)
#   fuzz_text        short reviews: ASCII, UTF-8, Windows-1252 bytes, <br /> markup
#   fuzz_config      launch/configs/*.ini with two trailing bytes that choose "--config FILE" and no other
#                    argument (FuzzedDataProvider reads its choices from the end of the input)
#   fuzz_dataset,    the empty input: every choice of their builders then takes the schema's answer, so it is
#   fuzz_checkpoint  a valid file; plus a few fixed pseudo-random inputs near it
# The corpora the long runs grew are merged in by hand (-merge=1, see benchmarks/FUZZING.md).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
corpus=$here/corpus
mkdir -p "$corpus"/{fuzz_npz,fuzz_text,fuzz_config,fuzz_dataset,fuzz_checkpoint}

/usr/bin/python3 - "$corpus/fuzz_npz" <<'PY'
import io, os, sys
import numpy as np
out = sys.argv[1]
def save(name, data):
    with open(os.path.join(out, name), "wb") as f:
        f.write(data)
def npz(compressed=False, **arrays):
    buffer = io.BytesIO()
    (np.savez_compressed if compressed else np.savez)(buffer, **arrays)
    return buffer.getvalue()
def npy(array, version=None, allow_pickle=False):
    buffer = io.BytesIO()
    np.lib.format.write_array(buffer, array, version=version, allow_pickle=allow_pickle)
    return buffer.getvalue()
def lists(rows):
    x = np.empty(len(rows), dtype=object)
    for i, r in enumerate(rows):
        x[i] = list(r)
    return x
x_train = lists([[1, 14, 22], [], [5, 99, 2, 7]])
x_test = lists([[3], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]])
y_train = np.array([0, 1, 1], dtype=np.int64)
y_test = np.array([1, 0], dtype=np.int64)
save("keras_imdb.npz", npz(x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test))
save("keras_imdb_compressed.npz",
     npz(True, x_train=x_train, y_train=y_train, x_test=x_test, y_test=y_test))
save("int_arrays.npz", npz(x_train=np.arange(12, dtype=np.int32).reshape(3, 4), y_train=np.array([0, 1, 0], np.uint8),
                           x_test=np.arange(4, dtype=np.int16).reshape(1, 4), y_test=np.array([True])))
save("object_ints.npy", npy(np.array([1, 2, 3], dtype=object), allow_pickle=True))
save("lists.npy", npy(x_train, allow_pickle=True))
save("int64_v2.npy", npy(np.arange(6, dtype=np.int64).reshape(2, 3), version=(2, 0)))
save("uint16_fortran.npy", npy(np.asfortranarray(np.arange(6, dtype=np.uint16).reshape(2, 3))))
save("big_endian.npy", npy(np.arange(3, dtype=">i4")))
PY

printf 'A wonderful film. <br /><br />I loved it, don'"'"'t miss it!' >"$corpus/fuzz_text/ascii.txt"
printf 'Caf\xc3\xa9 cr\xc3\xa8me \xe2\x80\x94 \xce\x9a\xce\xb1\xce\xbb\xce\xae \xd0\x9f\xd1\x80\xd0\xb8\xd0\xb2\xd0\xb5\xd1\x82 \xe2\x80\x99quoted\xe2\x80\x99 na\xcc\x88ive' \
  >"$corpus/fuzz_text/utf8.txt"
printf 'caf\xe9 don\x92t \x93smart\x94 \x81\x8d\x8f\x90\x9d <BR >end' >"$corpus/fuzz_text/windows1252.txt"
printf 'truncated \xe2\x82 overlong \xc0\xaf surrogate \xed\xa0\x80 high \xf4\x90\x80\x80' >"$corpus/fuzz_text/invalid_utf8.txt"

for ini in "$root"/launch/configs/*.ini; do
  { cat "$ini"; printf '\x00\x01'; } >"$corpus/fuzz_config/$(basename "$ini")"
done
printf '[train]\nepochs = 2\nbatch_size=8\n[model]\ncell = gru\n\x00\x01' >"$corpus/fuzz_config/small.ini"

for target in fuzz_dataset fuzz_checkpoint; do
  : >"$corpus/$target/empty"
  for seed in 1 2 3; do
    /usr/bin/python3 -c "import random,sys; r=random.Random($seed); sys.stdout.buffer.write(bytes(r.choice([0,0,0,1,2,255]) for _ in range(400)))" \
      >"$corpus/$target/near_schema_$seed"
  done
done
du -sh "$corpus"
