// QuantRole: how an op takes part in int8 inference on a backend, and where its output's
// quantization parameters come from (its observer rule). Each op's role is in its OpDef
// (runtime/op_registry.h); BackendConfig and the recorded program carry it.
#pragma once

#include <cstdint>

namespace dbrq {

enum class QuantRole : uint8_t {
  kNone,          // not quantizeable: runs in fp32 (int8 inputs are dequantized); no observer
  kWeighted,      // conv2d, linear: u8 activation, s8 weights; a new output observer
  kMatmul,        // product of two activations; a new output observer
  kBinary,        // add, mul of two tensors: a new output observer; with a scalar: parameters derived
  kCat,           // one observer shared by every input and the output
  kShare,         // int8 passes through: the output shares its input's observer
  kLut,           // elementwise on u8 through a 256-entry table; a new output observer
  kFixedQParams,  // fixed output parameters (sigmoid, tanh, hardsigmoid, softmax)
  kChannelAffine, // per-channel multiply-add on u8 from the op's statistics (batch_norm on its own); a new
                  // output observer
  kNormalize,     // layer / group / instance norm on u8 (statistics of the codes, f32 weight and bias as
                  // the op receives them); a new output observer
};

// "fp32", "weighted", "matmul", "binary", "cat", "share", "lut", "fixed_qparams",
// "channel_affine", "normalize".
const char* quant_role_name(QuantRole r);

}  // namespace dbrq
