// Runs one zoo model end to end on an example input and reports what it did.
//
//   bazel run -c opt //samples/demo                          # small_cnn
//   bazel run -c opt //samples/demo -- resnet18 --batch=4 --iters=20 --threads=2
//   bazel run -c opt //samples/demo -- bert_encoder --variant=tiny
//   bazel run //samples/demo -- --help
//
// Weights are PyTorch-style random initialization (seeded), so outputs are not meaningful yet;
// the point is the pipeline: build, eval(), example input, timed forward passes.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <string>
#include <vector>

#include "dbrq.h"
#include "samples/zoo/zoo.h"

namespace {

struct Options {
  std::string model = "small_cnn";
  zoo::Variant variant = zoo::Variant::kFull;
  int64_t batch = 1;
  int iters = 10;
  int threads = 0;  // 0: dbrq's default (all cores)
  uint64_t seed = 0;
};

void print_usage(std::ostream& os) {
  os << "usage: demo [MODEL] [--variant=full|tiny] [--batch=N] [--iters=N] [--threads=N] [--seed=N]\n"
     << "models:\n";
  for (const zoo::ModelSpec& s : zoo::model_registry()) {
    os << "  " << std::left << std::setw(14) << s.name << s.description << "\n";
  }
}

// Parses a positive integer flag value; exits with usage on garbage so typos do not go unnoticed.
int64_t parse_count(const std::string& flag, const std::string& value, int64_t min) {
  char* end = nullptr;
  const long long v = std::strtoll(value.c_str(), &end, 10);
  if (value.empty() || *end != '\0' || v < min) {
    std::cerr << "demo: " << flag << " needs an integer >= " << min << ", got \"" << value << "\"\n";
    print_usage(std::cerr);
    std::exit(2);
  }
  return v;
}

Options parse_args(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string flag = arg.substr(0, eq);
    const std::string value = eq == std::string::npos ? "" : arg.substr(eq + 1);
    if (arg == "--help" || arg == "-h") {
      print_usage(std::cout);
      std::exit(0);
    } else if (flag == "--model") {
      o.model = value;
    } else if (flag == "--variant") {
      o.variant = zoo::parse_variant(value);
    } else if (flag == "--batch") {
      o.batch = parse_count(flag, value, 1);
    } else if (flag == "--iters") {
      o.iters = static_cast<int>(parse_count(flag, value, 1));
    } else if (flag == "--threads") {
      o.threads = static_cast<int>(parse_count(flag, value, 1));
    } else if (flag == "--seed") {
      o.seed = static_cast<uint64_t>(parse_count(flag, value, 0));
    } else if (arg.rfind("--", 0) != 0) {
      o.model = arg;
    } else {
      std::cerr << "demo: unknown flag " << arg << "\n";
      print_usage(std::cerr);
      std::exit(2);
    }
  }
  return o;
}

double ms_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
}

std::string first_values(const dbrq::Tensor& t, size_t n) {
  const std::vector<float> v = t.to_vector<float>();
  std::string s;
  for (size_t i = 0; i < std::min(n, v.size()); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
  return s + (v.size() > n ? ", ..." : "");
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const Options o = parse_args(argc, argv);
    if (o.threads > 0) dbrq::set_num_threads(o.threads);
    const zoo::ModelSpec& spec = zoo::find_model(o.model);

    dbrq::manual_seed(o.seed);
    auto start = std::chrono::steady_clock::now();
    std::shared_ptr<dbrq::nn::Module> model = spec.make(o.variant);
    model->eval();
    const double build_ms = ms_since(start);

    const dbrq::Tensor input = spec.example_input(o.variant, o.batch, o.seed);
    std::cout << "model:       " << spec.name << " (" << zoo::variant_name(o.variant) << "): " << spec.description
              << "\n"
              << "parameters:  " << zoo::parameter_count(*model) << " in " << model->named_parameters().size()
              << " tensors (built in " << build_ms << " ms)\n"
              << "input:       " << input.shape_string() << " " << dbrq::dtype_name(input.dtype()) << "\n"
              << "threads:     " << dbrq::get_num_threads() << "\n";

    // The first call pays for primitive creation; report it apart from the steady state.
    start = std::chrono::steady_clock::now();
    dbrq::Tensor output = spec.run(*model, input);
    const double first_ms = ms_since(start);
    std::vector<double> times;
    for (int i = 0; i < o.iters; ++i) {
      start = std::chrono::steady_clock::now();
      output = spec.run(*model, input);
      times.push_back(ms_since(start));
    }
    std::sort(times.begin(), times.end());
    double total = 0;
    for (double t : times) total += t;

    std::cout << "output:      " << output.shape_string() << " " << dbrq::dtype_name(output.dtype()) << " ["
              << first_values(output, 5) << "]\n"
              << "latency:     first " << first_ms << " ms; over " << o.iters << " runs: mean " << total / o.iters
              << " ms, median " << times[times.size() / 2] << " ms, min " << times.front() << " ms\n";
    return 0;
  } catch (const dbrq::Error& e) {
    std::cerr << "demo: " << e.what() << "\n";
    return 1;
  }
}
