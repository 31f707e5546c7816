// ddptrain's command line:
//   ddptrain [train] --config FILE [--section.key VALUE ...]     data-parallel training, one MPI rank per
//   replica ddptrain prepare synthetic --output FILE [options]           make the embedded synthetic dataset
// Exit codes: 0 success, 1 internal error, 2 bad input (config, command line, data or checkpoint file).
#include <mpi.h>

#include <boost/program_options.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "comm/communicator.h"
#include "engine/config.h"
#include "engine/errors.h"
#include "engine/topology.h"
#include "engine/trainer.h"
#include "io/dataset.h"
#include "io/synthetic.h"
#include "models/blas_threads.h"

namespace po = boost::program_options;

namespace ddp {
namespace {

int prepare_synthetic(const std::vector<std::string>& args) {
  io::SyntheticOptions options;
  po::options_description desc("ddptrain prepare synthetic");
  desc.add_options()("help,h", "print this help")("output,o", po::value(&options.output)->required(),
                                                  "HDF5 file to write")(
      "train", po::value(&options.train)->default_value(options.train), "training samples")(
      "test", po::value(&options.test)->default_value(options.test), "test samples")(
      "vocab", po::value(&options.vocab)->default_value(options.vocab),
      "vocabulary size (token ids < vocab)")(
      "maxlen", po::value(&options.maxlen)->default_value(options.maxlen), "tokens per sample")(
      "seed", po::value(&options.seed)->default_value(options.seed), "random seed");
  po::variables_map vm;
  try {
    po::store(po::command_line_parser(args).options(desc).run(), vm);
    if (vm.count("help")) {
      std::cout << "Usage: ddptrain prepare synthetic --output FILE [options]\n" << desc;
      return kExitOk;
    }
    po::notify(vm);
  } catch (const po::error& e) {
    throw UserError(std::string("prepare synthetic: ") + e.what());
  }
  if (options.train < 1 || options.test < 1)
    throw UserError("prepare synthetic: --train and --test must be positive");
  io::write_synthetic(options);
  std::printf("wrote %s: %lld train and %lld test samples, vocab %d, maxlen %d, seed %llu\n",
              options.output.c_str(), static_cast<long long>(options.train),
              static_cast<long long>(options.test), options.vocab, options.maxlen,
              static_cast<unsigned long long>(options.seed));
  return kExitOk;
}

int prepare(const std::vector<std::string>& args) {
  if (args.empty() || args[0] == "--help" || args[0] == "-h") {
    std::printf(
        "Usage: ddptrain prepare synthetic --output FILE [--train N --test M --vocab V --maxlen T --seed "
        "S]\n");
    return args.empty() ? kExitUserError : kExitOk;
  }
  if (args[0] == "synthetic") return prepare_synthetic({args.begin() + 1, args.end()});
  throw UserError("prepare: unknown dataset kind '" + args[0] + "' (expected: synthetic)");
}

int train_command(const std::vector<std::string>& args, comm::Communicator& boot) {
  engine::ParsedConfig parsed;
  comm::agree_on_errors(boot, [&] { parsed = engine::parse_config(args); });
  if (parsed.action == engine::ConfigAction::kHelp) {
    if (boot.rank() == 0) std::cout << parsed.help;
    return kExitOk;
  }
  if (parsed.action == engine::ConfigAction::kVersion) {
    if (boot.rank() == 0) std::printf("ddptrain %s\n", DDPTRAIN_VERSION);
    return kExitOk;
  }
  const engine::Config& config = parsed.config;

  engine::Topology topology;
  comm::agree_on_errors(boot, [&] { topology = engine::discover_topology(MPI_COMM_WORLD, config.device); });
  const int threads = engine::blas_threads_for(topology, config.train.threads);
  const bool threads_set = models::set_blas_threads(threads);

  io::DatasetInfo data;
  comm::agree_on_errors(boot, [&] {
    data = io::inspect_dataset(config.data.path);
    if (!config.data.validate) return;
    // Each rank checks the rows it will read, so the file is scanned once in all.
    const io::Shard train_rows = io::shard_of(data.train_size, boot.rank(), boot.size(), /*cover_all=*/true);
    const io::Shard test_rows = io::shard_of(data.test_size, boot.rank(), boot.size(), /*cover_all=*/true);
    io::validate_rows(data, "train", train_rows.begin, train_rows.end);
    io::validate_rows(data, "test", test_rows.begin, test_rows.end);
  });

  if (boot.rank() == 0) {
    std::printf("ddptrain %s: %d rank(s)\n", DDPTRAIN_VERSION, boot.size());
    std::printf("BLAS %s: %d thread(s) per rank%s\n", models::blas_description().c_str(), threads,
                threads_set ? "" : " (set by the BLAS's own environment variable)");
    std::fflush(stdout);
  }
  engine::train(config, topology, data, MPI_COMM_WORLD);
  return kExitOk;
}

}  // namespace
}  // namespace ddp

int main(int argc, char** argv) {
  std::vector<std::string> args(argv + 1, argv + argc);
  if (!args.empty() && args[0] == "prepare") {
    try {
      return ddp::prepare({args.begin() + 1, args.end()});
    } catch (const ddp::UserError& e) {
      std::fprintf(stderr, "ddptrain: error: %s\n", e.what());
      return ddp::kExitUserError;
    }
  }
  if (!args.empty() && args[0] == "train") args.erase(args.begin());

  MPI_Init(&argc, &argv);
  int status = ddp::kExitOk;
  {
    auto boot = ddp::comm::make_mpi_communicator(MPI_COMM_WORLD);
    try {
      status = ddp::train_command(args, *boot);
    } catch (const ddp::UserError& e) {
      if (boot->rank() == 0) std::fprintf(stderr, "ddptrain: error: %s\n", e.what());
      status = ddp::kExitUserError;
    } catch (const std::exception& e) {
      ddp::fatal(std::string("unexpected error: ") + e.what(), __FILE__, __LINE__);
    }
  }
  MPI_Finalize();
  return status;
}
