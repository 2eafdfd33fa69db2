#include "runtime/init.h"

#include <cmath>

#include "core/error.h"
#include "runtime/ops.h"

namespace dbrq::nn::init {
namespace {

uint64_t seed_from(Generator* generator) {
  return generator != nullptr ? generator->next_seed() : detail::next_init_seed();
}

void check_target(const Tensor& t, const char* fn) {
  DBRQ_ENSURE(t.defined(), ValueError, fn, ": the tensor is undefined");
  DBRQ_ENSURE(!t.is_quantized(), DTypeError, fn, ": cannot initialize a quantized tensor (",
              dtype_name(t.dtype()), "); initialize the f32 parameter before convert");
  DBRQ_ENSURE(t.dtype() == DType::kF32, DTypeError, fn, ": expected an f32 tensor, got ", dtype_name(t.dtype()));
}

int64_t fan_for(const Tensor& t, const std::string& mode, const char* fn) {
  DBRQ_ENSURE(mode == kFanIn || mode == kFanOut, ValueError, fn, ": mode must be \"fan_in\" or \"fan_out\", got \"",
              mode, "\"");
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  const int64_t fan = mode == kFanIn ? fan_in : fan_out;
  DBRQ_ENSURE(fan > 0, ValueError, fn, ": ", mode, " of a tensor of sizes ", t.shape_string(), " is 0");
  return fan;
}

}  // namespace

double calculate_gain(const std::string& nonlinearity, double param) {
  if (nonlinearity == kLinear || nonlinearity == kSigmoid || nonlinearity == "conv1d" || nonlinearity == kConv2d ||
      nonlinearity == "conv3d" || nonlinearity == "conv_transpose1d" || nonlinearity == "conv_transpose2d" ||
      nonlinearity == "conv_transpose3d") {
    return 1.0;
  }
  if (nonlinearity == kTanh) return 5.0 / 3.0;
  if (nonlinearity == kReLU) return std::sqrt(2.0);
  if (nonlinearity == kLeakyReLU) return std::sqrt(2.0 / (1.0 + param * param));
  if (nonlinearity == kSELU) return 3.0 / 4.0;
  DBRQ_THROW(ValueError, "calculate_gain: unsupported nonlinearity \"", nonlinearity,
             "\" (linear, conv1d/2d/3d, conv_transpose1d/2d/3d, sigmoid, tanh, relu, leaky_relu, selu)");
}

std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& t) {
  DBRQ_ENSURE(t.defined() && t.dim() >= 2, ValueError,
              "fan in and fan out can not be computed for a tensor with fewer than 2 dimensions (sizes ",
              t.defined() ? t.shape_string() : "undefined", ")");
  int64_t receptive = 1;
  for (int64_t d = 2; d < t.dim(); ++d) receptive *= t.size(d);
  return {t.size(1) * receptive, t.size(0) * receptive};
}

Tensor& uniform_(Tensor& t, double a, double b, Generator* generator) {
  check_target(t, "uniform_");
  DBRQ_ENSURE(a <= b, ValueError, "uniform_: a (", a, ") must be <= b (", b, ")");
  const uint64_t seed = seed_from(generator);  // drawn either way: later draws do not depend on a == b
  if (a == b) return t.fill_(a);  // an empty interval (xavier_uniform_ with gain 0): PyTorch fills with a
  return t.copy_(rand_uniform(t.sizes(), a, b, seed));
}

Tensor& normal_(Tensor& t, double mean, double std, Generator* generator) {
  check_target(t, "normal_");
  DBRQ_ENSURE(std >= 0.0, ValueError, "normal_: std must be >= 0, got ", std);
  return t.copy_(randn(t.sizes(), seed_from(generator)).mul(std).add(mean));
}

Tensor& constant_(Tensor& t, double value) {
  check_target(t, "constant_");
  return t.fill_(value);
}

Tensor& zeros_(Tensor& t) { return constant_(t, 0.0); }
Tensor& ones_(Tensor& t) { return constant_(t, 1.0); }

Tensor& xavier_uniform_(Tensor& t, double gain, Generator* generator) {
  check_target(t, "xavier_uniform_");
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  DBRQ_ENSURE(fan_in + fan_out > 0, ValueError, "xavier_uniform_: tensor of sizes ", t.shape_string(), " is empty");
  const double a = gain * std::sqrt(6.0 / static_cast<double>(fan_in + fan_out));
  return uniform_(t, -a, a, generator);
}

Tensor& xavier_normal_(Tensor& t, double gain, Generator* generator) {
  check_target(t, "xavier_normal_");
  const auto [fan_in, fan_out] = calculate_fan_in_and_fan_out(t);
  DBRQ_ENSURE(fan_in + fan_out > 0, ValueError, "xavier_normal_: tensor of sizes ", t.shape_string(), " is empty");
  return normal_(t, 0.0, gain * std::sqrt(2.0 / static_cast<double>(fan_in + fan_out)), generator);
}

Tensor& kaiming_uniform_(Tensor& t, double a, const std::string& mode, const std::string& nonlinearity,
                         Generator* generator) {
  check_target(t, "kaiming_uniform_");
  const int64_t fan = fan_for(t, mode, "kaiming_uniform_");
  const double bound = std::sqrt(3.0) * calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan));
  return uniform_(t, -bound, bound, generator);
}

Tensor& kaiming_normal_(Tensor& t, double a, const std::string& mode, const std::string& nonlinearity,
                        Generator* generator) {
  check_target(t, "kaiming_normal_");
  const int64_t fan = fan_for(t, mode, "kaiming_normal_");
  return normal_(t, 0.0, calculate_gain(nonlinearity, a) / std::sqrt(static_cast<double>(fan)), generator);
}

}  // namespace dbrq::nn::init
