// A program built by its own CMake project against an installed dbrq (find_package(dbrq) and
// dbrq::dbrq; see CMakeLists.txt): builds a small CNN, prepares, calibrates and converts it, and
// checks the int8 model against its fp32 self. Prints one PASS / FAIL line per check and
// "N passed, M failed"; exits 1 when a check fails.
#include <cmath>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"

namespace {

// conv -> BN -> ReLU -> conv -> ReLU, a residual add, global average pool, linear.
struct TinyNet : dbrq::nn::CallableModule<TinyNet> {
  TinyNet() {
    conv1 = register_module("conv1", std::make_shared<dbrq::nn::Conv2dImpl>(dbrq::nn::Conv2dOptions(3, 16, 3).padding(1)));
    bn1 = register_module("bn1", std::make_shared<dbrq::nn::BatchNorm2dImpl>(16));
    conv2 = register_module("conv2", std::make_shared<dbrq::nn::Conv2dImpl>(dbrq::nn::Conv2dOptions(16, 16, 3).padding(1)));
    relu = register_module("relu", std::make_shared<dbrq::nn::ReLUImpl>());
    fc = register_module("fc", std::make_shared<dbrq::nn::LinearImpl>(16, 10));
  }

  dbrq::Tensor forward(const dbrq::Tensor& x) {
    dbrq::Tensor y = (*relu)((*bn1)((*conv1)(x)));
    y = y + (*relu)((*conv2)(y));
    y = dbrq::adaptive_avg_pool2d(y, {1, 1}).flatten(1);
    return (*fc)(y);
  }

  std::shared_ptr<dbrq::nn::Conv2dImpl> conv1, conv2;
  std::shared_ptr<dbrq::nn::BatchNorm2dImpl> bn1;
  std::shared_ptr<dbrq::nn::ReLUImpl> relu;
  std::shared_ptr<dbrq::nn::LinearImpl> fc;
};

int passed = 0, failed = 0;

void check(const std::string& name, bool ok, const std::string& detail) {
  std::cout << (ok ? "PASS " : "FAIL ") << name << ": " << detail << "\n";
  (ok ? passed : failed)++;
}

}  // namespace

int main() {
  try {
    dbrq::manual_seed(0);
    auto net = std::make_shared<TinyNet>();
    net->eval();
    std::vector<dbrq::Tensor> calib, test;
    for (int i = 0; i < 16; ++i) calib.push_back(dbrq::randn({4, 3, 16, 16}, /*seed=*/100 + i));
    for (int i = 0; i < 4; ++i) test.push_back(dbrq::randn({4, 3, 16, 16}, /*seed=*/200 + i));

    std::vector<dbrq::Tensor> fp32;
    for (const auto& x : test) fp32.push_back((*net)(x).clone());

    // A typed error crosses the installed library: convert needs a prepared model.
    bool typed = false;
    try {
      dbrq::convert(*net);
    } catch (const dbrq::UsageError& e) {
      typed = std::string(e.what()).find("convert") != std::string::npos;
    }
    check("convert_unprepared_throws_usage_error", typed, "dbrq::UsageError naming convert");

    dbrq::prepare(*net, {calib[0]}, dbrq::default_qconfig_mapping("onednn"));
    for (const auto& x : calib) (*net)(x);
    dbrq::convert(*net);

    int int8_ops = 0, ops = 0;
    for (const dbrq::QuantizedOpInfo& op : dbrq::quantized_ops(*net)) {
      ++ops;
      if (op.executor.rfind("int8", 0) == 0) ++int8_ops;
    }
    check("runs_int8", int8_ops >= 3,
          std::to_string(int8_ops) + " of " + std::to_string(ops) + " recorded ops run an int8 executor (want >= 3: two convs, linear)");

    // Int8 against fp32: close (SQNR), yet not the fp32 result itself (the int8 path really ran).
    double worst_sqnr = INFINITY;
    bool differs = false;
    for (size_t i = 0; i < test.size(); ++i) {
      const dbrq::Tensor q = (*net)(test[i]);
      if (q.shape_string() != fp32[i].shape_string()) {
        check("int8_shape", false, "int8 output " + q.shape_string() + " vs fp32 " + fp32[i].shape_string());
        continue;
      }
      worst_sqnr = std::min(worst_sqnr, dbrq::sqnr_db(fp32[i], q));
      const std::vector<float> a = q.to_vector<float>(), b = fp32[i].to_vector<float>();
      for (size_t k = 0; k < a.size(); ++k) differs = differs || a[k] != b[k];
    }
    check("int8_close_to_fp32", worst_sqnr >= 20.0,
          "worst SQNR " + std::to_string(worst_sqnr) + " dB over " + std::to_string(test.size()) + " batches (want >= 20)");
    check("int8_not_fp32", differs, differs ? "int8 outputs differ from fp32 (quantized)" : "bit-identical to fp32");
  } catch (const dbrq::Error& e) {
    check("no_exception", false, e.what());
  }
  std::cout << passed << " passed, " << failed << " failed\n";
  return failed == 0 ? 0 : 1;
}
