// The ddptrain binary end to end on bad input: every case exits with code 2 and one line on stderr that names
// the file, key or value, and never crashes. Bad HDF5 files are made here with the HDF5 C API.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <sys/wait.h>

#include <fstream>
#include <sstream>

#include "tests/test_util.h"

namespace ddp {
namespace {

using ddp::testing::TempDir;

struct Outcome {
  int exit_code = -1;
  std::string err;
  std::string out;
};

Outcome run_ddptrain(const TempDir& dir, const std::string& args, const std::string& launcher = "") {
  const std::string out = dir.file("stdout.txt");
  const std::string err = dir.file("stderr.txt");
  // Open MPI unloads its plugins at MPI_Finalize, so in a sanitizer build the allocations it keeps cannot be
  // told apart from ddptrain's: leaks are checked by the unit tests themselves, which do not start MPI.
  const std::string env =
      "export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1 "
      "ASAN_OPTIONS=detect_leaks=0; ";
  const std::string command = env + launcher + " " + DDPTRAIN_BINARY + " " + args + " >" + out + " 2>" + err;
  const int status = std::system(command.c_str());
  Outcome o;
  o.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  std::stringstream e, s;
  e << std::ifstream(err).rdbuf();
  s << std::ifstream(out).rdbuf();
  o.err = e.str();
  o.out = s.str();
  return o;
}

// Lines of ddptrain's own (not the launcher's) messages.
int error_lines(const std::string& err) {
  int n = 0;
  std::istringstream in(err);
  for (std::string line; std::getline(in, line);) n += line.rfind("ddptrain:", 0) == 0 ? 1 : 0;
  return n;
}

void expect_user_error(const Outcome& o, const std::vector<std::string>& mentions) {
  EXPECT_EQ(o.exit_code, 2) << o.err;
  EXPECT_EQ(error_lines(o.err), 1) << o.err;
  EXPECT_EQ(o.err.find("fatal"), std::string::npos) << o.err;
  for (const std::string& m : mentions)
    EXPECT_NE(o.err.find(m), std::string::npos) << m << " not in: " << o.err;
}

// A small dataset in the documented schema, with hooks to break it.
struct FileSpec {
  int rows = 64;
  int maxlen = 8;
  int vocab = 50;
  hid_t x_type = H5T_NATIVE_INT32;
  bool x_rank_one = false;
  bool skip_test_y = false;
  bool skip_vocab_attr = false;
  int bad_token = 0;  // written at train/x[5, 3] when non-zero
  int bad_label = 0;  // written at train/y[7] when non-zero
};

void write_dataset(hid_t file, const char* name, hid_t type, std::vector<hsize_t> dims, const void* data,
                   hid_t mem_type) {
  hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t set = H5Dcreate2(file, name, type, space, H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(set, 0);
  ASSERT_GE(H5Dwrite(set, mem_type, H5S_ALL, H5S_ALL, H5P_DEFAULT, data), 0);
  H5Dclose(set);
  H5Sclose(space);
}

void write_attr(hid_t file, const char* name, int64_t value) {
  hid_t space = H5Screate(H5S_SCALAR);
  hid_t attr = H5Acreate2(file, name, H5T_NATIVE_INT64, space, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(attr, H5T_NATIVE_INT64, &value);
  H5Aclose(attr);
  H5Sclose(space);
}

std::string make_file(const TempDir& dir, const std::string& name, const FileSpec& spec) {
  const std::string path = dir.file(name);
  hid_t file = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  H5Gclose(H5Gcreate2(file, "train", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  H5Gclose(H5Gcreate2(file, "test", H5P_DEFAULT, H5P_DEFAULT, H5P_DEFAULT));
  std::vector<int32_t> x(static_cast<std::size_t>(spec.rows * spec.maxlen));
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<int32_t>(i % static_cast<std::size_t>(spec.vocab));
  std::vector<uint8_t> y(static_cast<std::size_t>(spec.rows));
  for (std::size_t i = 0; i < y.size(); ++i) y[i] = static_cast<uint8_t>(i % 2);
  std::vector<int32_t> train_x = x;
  std::vector<uint8_t> train_y = y;
  if (spec.bad_token) train_x[static_cast<std::size_t>(5 * spec.maxlen + 3)] = spec.bad_token;
  if (spec.bad_label) train_y[7] = static_cast<uint8_t>(spec.bad_label);
  const std::vector<hsize_t> x_dims = spec.x_rank_one
                                          ? std::vector<hsize_t>{x.size()}
                                          : std::vector<hsize_t>{hsize_t(spec.rows), hsize_t(spec.maxlen)};
  write_dataset(file, "/train/x", spec.x_type, x_dims, train_x.data(), H5T_NATIVE_INT32);
  write_dataset(file, "/train/y", H5T_NATIVE_UINT8, {hsize_t(spec.rows)}, train_y.data(), H5T_NATIVE_UINT8);
  write_dataset(file, "/test/x", H5T_NATIVE_INT32, {hsize_t(spec.rows), hsize_t(spec.maxlen)}, x.data(),
                H5T_NATIVE_INT32);
  if (!spec.skip_test_y) {
    write_dataset(file, "/test/y", H5T_NATIVE_UINT8, {hsize_t(spec.rows)}, y.data(), H5T_NATIVE_UINT8);
  }
  if (!spec.skip_vocab_attr) write_attr(file, "vocab_size", spec.vocab);
  write_attr(file, "maxlen", spec.maxlen);
  H5Fclose(file);
  return path;
}

std::string train_args(const TempDir& dir, const std::string& data) {
  return "--data.path " + data + " --checkpoint.dir " + dir.file("run") +
         " --model.embedding_dim 4 --model.hidden 4 --train.epochs 1 --train.batch_size 8 --log.progress "
         "lines";
}

TEST(Cli, HelpListsOptionsAndExitsZero) {
  TempDir dir;
  const Outcome o = run_ddptrain(dir, "--help");
  EXPECT_EQ(o.exit_code, 0);
  EXPECT_NE(o.out.find("--train.batch_size"), std::string::npos);
  EXPECT_NE(o.out.find("(=32)"), std::string::npos);
  // Numbers as written, not as the nearest 17 digits.
  EXPECT_NE(o.out.find("(=0.9)"), std::string::npos) << o.out;
  EXPECT_NE(o.out.find("(=1e-07)"), std::string::npos) << o.out;
  EXPECT_EQ(o.out.find("0000000"), std::string::npos) << o.out;
}

TEST(Cli, NoArgumentsShowsTheUsage) {
  TempDir dir;
  for (const std::string& args : {std::string(), std::string("train")}) {
    const Outcome o = run_ddptrain(dir, args);
    EXPECT_EQ(o.exit_code, 2) << args;
    EXPECT_EQ(o.err.rfind("Usage: ddptrain [train] --config FILE", 0), 0u) << o.err;
    EXPECT_NE(o.err.find("ddptrain check-env"), std::string::npos) << o.err;
    EXPECT_NE(o.err.find("ddptrain --help lists every key"), std::string::npos) << o.err;
    EXPECT_EQ(o.err.find("data.path"), std::string::npos) << o.err;
  }
  // Under mpirun, once (rank 0).
  const Outcome o = run_ddptrain(dir, "", "mpirun --allow-run-as-root --oversubscribe -np 2");
  EXPECT_EQ(o.exit_code, 2);
  EXPECT_EQ(o.err.find("Usage:"), o.err.rfind("Usage:")) << o.err;
}

TEST(Cli, AbbreviatedOptionsAreRefused) {
  TempDir dir;
  const std::string data = make_file(dir, "ok.h5", {});
  // Boost.Program_options would take a unique prefix for the whole name: --train.epochs,
  // --train.learning_rate.
  expect_user_error(run_ddptrain(dir, train_args(dir, data) + " --train.epoch 1"), {"'--train.epoch'"});
  expect_user_error(run_ddptrain(dir, train_args(dir, data) + " --train.learn 0.5"), {"'--train.learn'"});
  expect_user_error(run_ddptrain(dir, "check-env --dev cpu"), {"check-env", "'--dev'"});
  expect_user_error(run_ddptrain(dir, "prepare synthetic --out x.h5"), {"'--out'"});
}

TEST(Cli, BadConfigs) {
  TempDir dir;
  const std::string data = make_file(dir, "ok.h5", {});
  std::ofstream(dir.file("unknown.ini")) << "[train]\nbatch_sise = 3\n";
  expect_user_error(run_ddptrain(dir, "--config " + dir.file("unknown.ini") + " --data.path " + data),
                    {"unknown.ini", "train.batch_sise"});
  expect_user_error(run_ddptrain(dir, train_args(dir, data) + " --train.batch_size many"),
                    {"train.batch_size"});
  expect_user_error(run_ddptrain(dir, train_args(dir, data) + " --train.epochs 0"), {"train.epochs"});
  expect_user_error(run_ddptrain(dir, "--config " + dir.file("absent.ini")), {"absent.ini"});
  expect_user_error(run_ddptrain(dir, train_args(dir, data) + " --comm.backend carrier-pigeon"),
                    {"comm.backend", "carrier-pigeon"});
}

TEST(Cli, BadDataFiles) {
  TempDir dir;
  expect_user_error(run_ddptrain(dir, train_args(dir, dir.file("missing.h5"))), {"missing.h5"});
  std::ofstream(dir.file("text.h5")) << "this is not HDF5\n";
  expect_user_error(run_ddptrain(dir, train_args(dir, dir.file("text.h5"))), {"text.h5"});

  FileSpec no_y;
  no_y.skip_test_y = true;
  expect_user_error(run_ddptrain(dir, train_args(dir, make_file(dir, "no_y.h5", no_y))),
                    {"no_y.h5", "/test/y"});
  FileSpec float_x;
  float_x.x_type = H5T_NATIVE_FLOAT;
  expect_user_error(run_ddptrain(dir, train_args(dir, make_file(dir, "float_x.h5", float_x))),
                    {"float_x.h5", "/train/x"});
  FileSpec flat_x;
  flat_x.x_rank_one = true;
  expect_user_error(run_ddptrain(dir, train_args(dir, make_file(dir, "flat_x.h5", flat_x))),
                    {"flat_x.h5", "/train/x"});
  FileSpec no_vocab;
  no_vocab.skip_vocab_attr = true;
  expect_user_error(run_ddptrain(dir, train_args(dir, make_file(dir, "no_vocab.h5", no_vocab))),
                    {"no_vocab.h5", "vocab_size"});
  FileSpec big_token;
  big_token.bad_token = 50;
  expect_user_error(run_ddptrain(dir, train_args(dir, make_file(dir, "big_token.h5", big_token))),
                    {"big_token.h5", "/train/x", "50"});
  FileSpec negative_token;
  negative_token.bad_token = -4;
  expect_user_error(run_ddptrain(dir, train_args(dir, make_file(dir, "negative.h5", negative_token))),
                    {"negative.h5", "/train/x", "-4"});
  FileSpec bad_label;
  bad_label.bad_label = 2;
  expect_user_error(run_ddptrain(dir, train_args(dir, make_file(dir, "label.h5", bad_label))),
                    {"label.h5", "/train/y"});
  FileSpec tiny;
  tiny.rows = 5;
  expect_user_error(run_ddptrain(dir, train_args(dir, make_file(dir, "tiny.h5", tiny))),
                    {"tiny.h5", "/train"});
}

TEST(Cli, BadInputUnderMpirunEndsEveryRankWithOneMessage) {
  TempDir dir;
  FileSpec bad_label;
  bad_label.rows = 64;
  bad_label.bad_label = 3;  // row 7: in rank 0's shard
  const std::string data = make_file(dir, "label.h5", bad_label);
  const Outcome o =
      run_ddptrain(dir, train_args(dir, data), "mpirun --allow-run-as-root --oversubscribe -np 2");
  expect_user_error(o, {"label.h5", "/train/y"});
}

TEST(Cli, ParameterServerSetupErrors) {
  TempDir dir;
  const std::string data = make_file(dir, "ok.h5", {});
  expect_user_error(run_ddptrain(dir, train_args(dir, data) + " --comm.ps_servers -1"),
                    {"comm.ps_servers", "-1"});
  expect_user_error(run_ddptrain(dir, train_args(dir, data) + " --comm.ps_mode eventual"),
                    {"comm.ps_mode", "eventual"});
  // One rank: no worker is left beside a server.
  expect_user_error(run_ddptrain(dir, train_args(dir, data) + " --comm.backend ps --comm.ps_servers 1"),
                    {"comm.ps_servers = 1", "no worker"});
  // Agreed on by every rank of the job: one message, exit 2.
  expect_user_error(run_ddptrain(dir, train_args(dir, data) + " --comm.backend ps --comm.ps_servers 2",
                                 "mpirun --allow-run-as-root --oversubscribe -np 2"),
                    {"comm.ps_servers = 2 leaves no worker with 2 ranks"});
}

// An error the workers find after the dedicated server joined (the run directory holds another run) ends the
// job with the workers' one message: the server, told to abandon by rank 0 (or ended by mpirun, which aborts
// a job one of whose ranks exits non-zero), adds none.
TEST(Cli, DedicatedServerLeavesWithTheWorkersStartUpError) {
  TempDir dir;
  const std::string data = make_file(dir, "ok.h5", {});
  const std::string args =
      train_args(dir, data) + " --comm.backend ps --comm.ps_servers 1 --comm.timeout_s 600";
  const std::string mpirun = "mpirun --allow-run-as-root --oversubscribe -np 3";
  const Outcome first = run_ddptrain(dir, args, mpirun);
  ASSERT_EQ(first.exit_code, 0) << first.err;
  EXPECT_NE(first.out.find("parameter server 1/1, parameters [0, "), std::string::npos) << first.out;
  expect_user_error(run_ddptrain(dir, args, mpirun), {"holds another run"});
}

TEST(Cli, AutoUnderMpirunPicksTheParameterServerAndSaysWhy) {
  TempDir dir;
  const std::string data = make_file(dir, "ok.h5", {});
  const Outcome o =
      run_ddptrain(dir, train_args(dir, data), "mpirun --allow-run-as-root --oversubscribe -np 2");
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(
      o.out.find(
          "backend ps: 0 of 2 ranks on GPUs (auto: on CPU ranks every rank trains and serves, none idles); "
          "colocated: 2 ranks, each training and serving 1/2 "
          "of the parameters"),
      std::string::npos)
      << o.out;
  EXPECT_NE(o.out.find("Epoch 1/1"), std::string::npos) << o.out;
  const Outcome alone = run_ddptrain(dir, train_args(dir, data) + " --checkpoint.overwrite true");
  EXPECT_NE(alone.out.find("backend mpi: 0 of 1 ranks on GPUs, CPU all-reduce; a single rank trains alone"),
            std::string::npos)
      << alone.out;
}

TEST(Cli, ResumeWithoutCheckpoint) {
  TempDir dir;
  const std::string data = make_file(dir, "ok.h5", {});
  expect_user_error(run_ddptrain(dir, train_args(dir, data) + " --resume"), {"last.h5"});
}

TEST(Cli, TrainsOnGoodFile) {
  TempDir dir;
  const std::string data = make_file(dir, "ok.h5", {});
  const Outcome o = run_ddptrain(dir, train_args(dir, data));
  EXPECT_EQ(o.exit_code, 0) << o.err;
  EXPECT_NE(o.out.find("Epoch 1/1"), std::string::npos) << o.out;
  // The run directory's effective configuration, numbers as written.
  std::stringstream ini;
  ini << std::ifstream(dir.file("run/config.ini")).rdbuf();
  EXPECT_NE(ini.str().find("beta1 = 0.9\n"), std::string::npos) << ini.str();
  EXPECT_NE(ini.str().find("epsilon = 1e-07\n"), std::string::npos) << ini.str();
}

}  // namespace
}  // namespace ddp
