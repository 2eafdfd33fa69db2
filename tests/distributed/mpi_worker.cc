// The program tests/distributed/mpi_test.cc runs under mpirun (and once without MPI, as the
// single-process reference): calibrates a zoo model on a data set, distributed or not, saves the
// quant state, converts, and writes the converted model's output on fixed inputs to
// OUT.rank<r>.bin so the test can check that every rank converted identically.
//
//   mpi_worker --model=small_cnn|resnet18|if_else --observer=minmax|histogram --items=N --batch=B
//              --out=STATE.json [--single] [--digits=DATA.safetensors --weights=W.safetensors]
//              [--fail_rank=R]      rank R's data has the wrong shape: the model throws on it
//              [--missing_rank=R]   rank R's shard file does not exist (an unreadable shard)
//              [--hang_rank=R]      rank R never finishes calibrating (caught by --timeout)
//              [--die_rank=R]       rank R exits (code 7) without MPI_Finalize while calibrating
//              [--timeout=S] [--reduction=tree|gather]
//              [--repeat=N]      calibrate N times on the same Comm (a failing run does not end
//                                the worker; exit 1 when any failed)
// if_else (tests/quant/control_flow_models.h) branches on the input's mean: item i has a positive
// mean for even i, a negative one for odd i, so with 2 ranks each rank sees only one branch.
// OUT.uncalibrated.rank<r> then holds dbrq::uncalibrated_ops after running both branches.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <memory>
#include <string>
#include <thread>

#include "dbrq.h"
#include "distributed/calibrate.h"
#include "samples/demo/pipeline.h"
#include "samples/zoo/zoo.h"
#include "tests/quant/control_flow_models.h"

namespace {

std::map<std::string, std::string> parse(int argc, char** argv) {
  std::map<std::string, std::string> a;
  for (int i = 1; i < argc; ++i) {
    std::string s = argv[i];
    if (s.rfind("--", 0) != 0) continue;
    const size_t eq = s.find('=');
    a[s.substr(2, eq == std::string::npos ? std::string::npos : eq - 2)] = eq == std::string::npos ? "1" : s.substr(eq + 1);
  }
  return a;
}

int flag_int(const std::map<std::string, std::string>& a, const std::string& k, int def) {
  auto it = a.find(k);
  return it == a.end() ? def : std::stoi(it->second);
}

// The zoo's interface for a model that is not in the zoo.
const zoo::ModelSpec& if_else_spec() {
  static const zoo::ModelSpec* spec = [] {
    auto* s = new zoo::ModelSpec(zoo::find_model("small_cnn"));
    s->name = "if_else";
    s->make = [](zoo::Variant) -> std::shared_ptr<dbrq::nn::Module> {
      dbrq::manual_seed(11);
      return std::make_shared<dbrq::control_flow_models::IfElse>();
    };
    s->example_input = [](zoo::Variant, int64_t batch, uint64_t seed) {
      return dbrq::control_flow_models::signed_input({batch, 3, 6, 6}, seed, seed % 2 == 0 ? 1.0 : -1.0);
    };
    s->run = [](dbrq::nn::Module& m, const dbrq::Tensor& x) {
      return (*static_cast<dbrq::control_flow_models::IfElse*>(&m))(x);
    };
    return s;
  }();
  return *spec;
}

struct Job {
  const zoo::ModelSpec* spec = nullptr;
  zoo::Variant variant = zoo::Variant::kTiny;
  std::string weights;
  pipeline::Dataset digits;
  bool have_digits = false;
  int64_t batch = 4;
  int64_t items = 8;

  dbrq::Tensor input(int64_t i) const {
    if (have_digits) return digits.input_batch(i, batch);
    return spec->example_input(variant, batch, static_cast<uint64_t>(1000 + i));  // if_else: sign of i
  }
  std::shared_ptr<dbrq::nn::Module> build() const {
    if (spec->name == "if_else") return spec->make(variant);
    return pipeline::build_model(*spec, variant, weights, 7);
  }
};

void write_outputs(const Job& job, dbrq::nn::Module& model, const std::string& path) {
  std::ofstream f(path, std::ios::binary);
  for (int64_t i = 0; i < 2; ++i) {  // items 0 and 1: both branches of if_else
    const dbrq::Tensor y = job.spec->run(model, job.input(i)).contiguous();
    const std::vector<float> v = y.to_vector<float>();
    f.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(float)));
  }
  std::ofstream(path + ".uncalibrated") << dbrq::uncalibrated_ops(model);
}

}  // namespace

int main(int argc, char** argv) {
  const auto a = parse(argc, argv);
  Job job;
  job.spec = a.at("model") == "if_else" ? &if_else_spec() : &zoo::find_model(a.at("model"));
  job.batch = flag_int(a, "batch", 4);
  job.items = flag_int(a, "items", 8);
  if (a.count("digits")) {
    job.digits = pipeline::load_dataset(a.at("digits"));
    job.have_digits = true;
    job.weights = a.at("weights");
  }
  const std::string out = a.at("out");
  const dbrq::QConfigMapping mapping = pipeline::qconfig_mapping_for(a.count("observer") ? a.at("observer") : "minmax");

  if (a.count("single")) {  // the reference: one process, every item in order
    auto model = job.build();
    dbrq::prepare(*model, {job.input(0)}, mapping);
    for (int64_t i = 0; i < job.items; ++i) job.spec->run(*model, job.input(i));
    dbrq::save_quant_state(*model, out);
    dbrq::convert(*model);
    write_outputs(job, *model, out + ".rank0.bin");
    return 0;
  }

  dbrq::distributed::MpiSession mpi(&argc, &argv);
  std::unique_ptr<dbrq::distributed::Comm> comm_ptr;
  int failed = 0;
  for (int rep = 0; rep < flag_int(a, "repeat", 1); ++rep) try {
    if (comm_ptr == nullptr) comm_ptr = std::make_unique<dbrq::distributed::Comm>(flag_int(a, "timeout", 60));
    dbrq::distributed::Comm& comm = *comm_ptr;
    const int rank = comm.rank();
    std::shared_ptr<dbrq::nn::Module> model;
    dbrq::distributed::Replica replica;
    replica.prepare = [&]() -> dbrq::nn::Module& {
      if (flag_int(a, "missing_rank", -1) == rank) {
        pipeline::load_dataset(out + ".no_such_shard.safetensors");  // throws IOError
      }
      model = job.build();
      dbrq::prepare(*model, {job.input(0)}, mapping);
      return *model;
    };
    replica.calibrate = [&](dbrq::nn::Module& m, dbrq::distributed::Shard& shard) {
      for (int64_t i : shard.items(job.items)) {
        if (shard.stop_requested()) return;
        if (flag_int(a, "die_rank", -1) == rank) std::_Exit(7);
        if (flag_int(a, "hang_rank", -1) == rank) {
          for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
        }
        dbrq::Tensor x = job.input(i);
        if (flag_int(a, "fail_rank", -1) == rank) x = x.narrow(1, 0, 1).repeat({1, 2, 1, 1});  // wrong channel count
        job.spec->run(m, x);
      }
    };
    dbrq::distributed::DistributedOptions options;
    options.save_path = out;
    if (a.count("reduction") && a.at("reduction") == "gather") options.reduction = dbrq::distributed::Reduction::kGather;
    const dbrq::distributed::ReductionStats st = dbrq::distributed::calibrate(comm, replica, options);
    dbrq::convert(*model);
    write_outputs(job, *model, out + ".rank" + std::to_string(rank) + ".bin");
    std::cout << "rank " << rank << " ok: stats " << st.stats_bytes << " bytes, gathered " << st.gathered_bytes
              << " bytes, reduction " << st.reduction_ms() << " ms" << std::endl;
  } catch (const std::exception& e) {
    const std::string line = std::string("mpi_worker: error: ") + e.what() + "\n";
    std::fwrite(line.data(), 1, line.size(), stderr);  // one write: ranks share the pipe
    std::fflush(stderr);
    if (comm_ptr == nullptr) return 1;
    ++failed;
  }
  return failed > 0 ? 1 : 0;
}
