// The checkpoint loader (engine/checkpoint.h read_checkpoint) on mutated checkpoints: a valid checkpoint of a
// small model from the input (cell, directions, layers, classes, vocabulary), then the input deletes or
// replaces its attributes and datasets (other types, shapes, values) before the file is read back whole and
// as a model only, as `--resume`, `predict` and `evaluate` read it.
#include <hdf5.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "engine/checkpoint.h"
#include "io/tokenizer.h"
#include "models/param_layout.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

constexpr const char* kRootAttributes[] = {
    "format",        "vocab_size", "embedding_dim", "hidden",        "layers",        "cell",
    "bidirectional", "classes",    "mask_padding",  "epoch",         "step_in_epoch", "global_step",
    "seed",          "world_size", "batch_size",    "best_val_loss", "best_epoch",    "loss_sum",
    "correct",       "count",      "config",        "run_id",        "data_path",     "data_fingerprint",
    "data_plan",     "maxlen"};
constexpr const char* kOptimizerAttributes[] = {"name", "iterations", "buffers"};
constexpr const char* kDatasets[] = {"/params", "/optimizer/m", "/optimizer/v",     "/optimizer",
                                     "/vocab",  "/classes",     "/optimizer/params"};
const hid_t kFloatTypes[] = {H5T_IEEE_F32LE, H5T_IEEE_F64LE, H5T_IEEE_F32BE, H5T_STD_I32LE, H5T_STD_U8LE};

std::string pick_text(FuzzedDataProvider& in) {
  switch (in.ConsumeIntegralInRange<int>(0, 3)) {
    case 0:
      return in.PickValueInArray<std::string>({"ddptrain-checkpoint-1", "lstm", "gru", "adam", "sgd", "m,v",
                                               "m", "", ",", "m,,v", "params", "m,v,m", "../params",
                                               "/params", "x"});
    default:
      return in.ConsumeRandomLengthString(24);
  }
}

// Replaces (or deletes) one attribute or dataset of the open checkpoint.
void mutate(FuzzedDataProvider& in, ddp::fuzz::H5Builder& file, size_t parameters) {
  using ddp::fuzz::pick_int;
  const int what = in.ConsumeIntegralInRange<int>(0, 3);
  if (what <= 1) {
    const bool optimizer = what == 1;
    const std::string name =
        optimizer ? in.PickValueInArray(kOptimizerAttributes) : in.PickValueInArray(kRootAttributes);
    const hid_t loc = optimizer ? H5Gopen2(file.root(), "optimizer", H5P_DEFAULT) : file.root();
    if (loc < 0) return;
    switch (in.ConsumeIntegralInRange<int>(0, 3)) {
      case 0:
        H5Adelete(loc, name.c_str());
        break;
      case 1:
        file.string_attribute(loc, name, pick_text(in), in.ConsumeBool());
        break;
      default:
        file.int_attribute(in, loc, name, pick_int(in, 8));
        break;
    }
    if (optimizer) H5Gclose(loc);
    return;
  }
  const std::string path = in.PickValueInArray(kDatasets);
  if (H5Lexists(file.root(), path.c_str(), H5P_DEFAULT) > 0)
    H5Ldelete(file.root(), path.c_str(), H5P_DEFAULT);
  switch (in.ConsumeIntegralInRange<int>(0, 5)) {
    case 0:
      break;  // deleted
    case 1: {
      if (!file.parents(path)) break;
      const hid_t g = H5Gcreate2(file.root(), path.c_str(), H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
      if (g >= 0) H5Gclose(g);
      break;
    }
    case 2:
      file.strings(in, path, ddp::fuzz::pick_strings(in, in.ConsumeIntegralInRange<size_t>(0, 6)));
      break;
    default: {
      // The right size, one more or less, or a rank that is not 1.
      const int64_t delta = in.ConsumeIntegralInRange<int64_t>(-1, 1);
      const hsize_t n = static_cast<hsize_t>(std::max<int64_t>(0, static_cast<int64_t>(parameters) + delta));
      std::vector<hsize_t> dims = in.ConsumeIntegralInRange<int>(0, 5) == 0   ? std::vector<hsize_t>{n, 1}
                                  : in.ConsumeIntegralInRange<int>(0, 9) == 0 ? std::vector<hsize_t>{}
                                                                              : std::vector<hsize_t>{n};
      std::vector<int64_t> values{pick_int(in, 3), pick_int(in, 3)};
      file.numeric(in, path, dims, kFloatTypes, values);
      break;
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace ddp;
  FuzzedDataProvider in(data, size);
  models::ModelShape shape;
  shape.vocab_size = in.ConsumeIntegralInRange<int>(1, 6);
  shape.embedding_dim = in.ConsumeIntegralInRange<int>(1, 3);
  shape.hidden = in.ConsumeIntegralInRange<int>(1, 3);
  shape.layers = in.ConsumeIntegralInRange<int>(1, 2);
  shape.cell = in.ConsumeBool() ? models::Cell::kGru : models::Cell::kLstm;
  shape.bidirectional = in.ConsumeBool();
  shape.classes = in.ConsumeIntegralInRange<int>(2, 4);
  const models::ParamLayout layout(shape);
  std::vector<float> params(layout.total_size(), 0.25f);
  ddp::OptimizerState optimizer{3, {{"m", params}, {"v", params}}};
  engine::TrainingProgress progress;
  progress.epoch = 1;
  progress.batch_size = 2;
  engine::RunRecord run;
  run.run_id = "fuzz";
  run.maxlen = 4;
  if (in.ConsumeBool()) run.vocabulary = {"<pad>", "<start>", "<oov>", "good", "bad"};
  if (in.ConsumeBool()) run.class_names = fuzz::pick_strings(in, static_cast<size_t>(shape.classes));
  run.mask_padding = shape.bidirectional;
  const std::string path = fuzz::scratch_dir() / "checkpoint.h5";
  engine::write_checkpoint(path, shape, params, "adam", optimizer, progress, "[train]\nepochs = 1\n", run);
  {
    fuzz::H5Builder file(path, fuzz::H5Builder::kOpen);
    // Mostly an edit that drops the header's checksum, so that the checks behind it are reached too.
    if (in.ConsumeIntegralInRange<int>(0, 3) != 0) H5Adelete(file.root(), "header_checksum");
    const int mutations = in.ConsumeIntegralInRange<int>(0, 6);
    for (int i = 0; i < mutations; ++i) mutate(in, file, layout.total_size());
  }
  fuzz::expect_user_error([&] { engine::read_checkpoint(path, engine::CheckpointParts::kModel); });
  fuzz::expect_user_error([&] {
    const engine::Checkpoint c = engine::read_checkpoint(path);
    // What was read agrees with itself: the parameters fit the shape it names.
    if (c.params.size() != models::ParamLayout(c.shape).total_size()) __builtin_trap();
    if (c.has_vocabulary) io::read_vocabulary(path);
  });
  return 0;
}
