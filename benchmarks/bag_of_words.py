# What a model blind to word order reaches on a dataset file: softmax regression on log word counts (300
# full-batch gradient steps), its train and test accuracy. Needs python3-h5py and python3-numpy.
#   build/ddptrain prepare synthetic --output topics.h5 --classes 5 --train 20000 --test 3000 --vocab 2000 \
#     --maxlen 40 --seed 1 --val-fraction 0.1
#   python3 benchmarks/bag_of_words.py topics.h5      # -> test acc 0.7433 (io/README.md, "Dataset schema")
import h5py, numpy as np, sys
f = h5py.File(sys.argv[1], "r")
V = int(f.attrs["vocab_size"]); K = int(f.attrs.get("num_classes", 2))
def bow(x):
    m = np.zeros((x.shape[0], V), np.float32)
    for i, row in enumerate(x):
        np.add.at(m[i], row[row > 0], 1.0)
    return np.log1p(m)
Xtr, ytr = bow(f["train/x"][()]), f["train/y"][()]
Xte, yte = bow(f["test/x"][()]), f["test/y"][()]
W = np.zeros((V, K), np.float32); b = np.zeros(K, np.float32)
Y = np.eye(K, dtype=np.float32)[ytr]
for it in range(300):
    z = Xtr @ W + b; z -= z.max(1, keepdims=True); p = np.exp(z); p /= p.sum(1, keepdims=True)
    g = (p - Y) / len(ytr)
    W -= 2.0 * (Xtr.T @ g + 1e-4 * W); b -= 2.0 * g.sum(0)
print("bag of words: train acc %.4f, test acc %.4f" % (((Xtr @ W + b).argmax(1) == ytr).mean(), ((Xte @ W + b).argmax(1) == yte).mean()))
