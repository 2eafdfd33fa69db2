// Parameter initialization, as libtorch's torch::nn::init: in-place fills of a parameter with
// PyTorch's formulas (fans, gains), from dbrq's seeded stream or an explicit Generator.
//
//   dbrq::manual_seed(0);                                        // the default stream
//   dbrq::nn::init::kaiming_normal_(conv->weight, 0.0, dbrq::nn::init::kFanOut, dbrq::nn::init::kReLU);
//   dbrq::nn::init::constant_(conv->bias, 0.0);
//   dbrq::Generator gen(42);                                     // a stream of its own
//   dbrq::nn::init::xavier_uniform_(linear->weight, 1.0, &gen);
//
// Each function writes through copy_ (so converted models re-pack changed weights) and returns its
// argument. Targets must be defined, floating point (f32) and not quantized (DTypeError).
#pragma once

#include <cstdint>
#include <string>
#include <utility>

#include "core/tensor.h"

namespace dbrq {

// A seeded source of random streams: every fill draws the next seed from it.
class Generator {
 public:
  explicit Generator(uint64_t seed) : state_(seed) {}
  uint64_t next_seed() { return state_ += 0x9E3779B97F4A7C15ULL; }

 private:
  uint64_t state_;
};

namespace detail {
// The next seed of the stream manual_seed() sets (the one default layer initialization uses).
uint64_t next_init_seed();
}  // namespace detail

namespace nn::init {

// PyTorch's names (libtorch: torch::kFanIn, torch::kReLU, ...).
inline constexpr const char* kFanIn = "fan_in";
inline constexpr const char* kFanOut = "fan_out";
inline constexpr const char* kLinear = "linear";
inline constexpr const char* kConv2d = "conv2d";
inline constexpr const char* kSigmoid = "sigmoid";
inline constexpr const char* kTanh = "tanh";
inline constexpr const char* kReLU = "relu";
inline constexpr const char* kLeakyReLU = "leaky_relu";
inline constexpr const char* kSELU = "selu";

// PyTorch's calculate_gain: 1 (linear, conv*, sigmoid), 5/3 (tanh), sqrt(2) (relu),
// sqrt(2 / (1 + param^2)) (leaky_relu, param = negative slope, default 0.01), 3/4 (selu).
// Unknown names throw ValueError.
double calculate_gain(const std::string& nonlinearity, double param = 0.01);
// (fan_in, fan_out) = (size(1), size(0)) times the receptive field (product of dims 2..). Fewer
// than 2 dims throws ValueError.
std::pair<int64_t, int64_t> calculate_fan_in_and_fan_out(const Tensor& tensor);

Tensor& uniform_(Tensor& tensor, double a = 0.0, double b = 1.0, Generator* generator = nullptr);
Tensor& normal_(Tensor& tensor, double mean = 0.0, double std = 1.0, Generator* generator = nullptr);
Tensor& constant_(Tensor& tensor, double value);
Tensor& zeros_(Tensor& tensor);
Tensor& ones_(Tensor& tensor);
// U(-a, a), a = gain * sqrt(6 / (fan_in + fan_out)).
Tensor& xavier_uniform_(Tensor& tensor, double gain = 1.0, Generator* generator = nullptr);
// N(0, std), std = gain * sqrt(2 / (fan_in + fan_out)).
Tensor& xavier_normal_(Tensor& tensor, double gain = 1.0, Generator* generator = nullptr);
// U(-b, b), b = sqrt(3) * gain / sqrt(fan), gain = calculate_gain(nonlinearity, a), fan by mode
// (kFanIn / kFanOut).
Tensor& kaiming_uniform_(Tensor& tensor, double a = 0.0, const std::string& mode = kFanIn,
                         const std::string& nonlinearity = kLeakyReLU, Generator* generator = nullptr);
// N(0, std), std = gain / sqrt(fan).
Tensor& kaiming_normal_(Tensor& tensor, double a = 0.0, const std::string& mode = kFanIn,
                        const std::string& nonlinearity = kLeakyReLU, Generator* generator = nullptr);

}  // namespace nn::init

// libtorch's spellings of the same names (torch::kFanOut, torch::kReLU), so that a port only
// changes the namespace.
using nn::init::kConv2d;
using nn::init::kFanIn;
using nn::init::kFanOut;
using nn::init::kLeakyReLU;
using nn::init::kLinear;
using nn::init::kReLU;
using nn::init::kSELU;
using nn::init::kSigmoid;
using nn::init::kTanh;

}  // namespace dbrq
