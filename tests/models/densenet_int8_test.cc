// The zoo's DenseNet (golden weights, tests/models/golden/densenet.safetensors) converted to int8.
// Its dense layers are bn -> relu -> conv on a cat: before issue 12 every such batch norm (and the
// relu after it) stayed fp32 between a dequantize and a quantize. Now each runs int8: folded into
// the conv before it (norm0, norm2), or on its own with its relu fused (norm1, transition norms,
// norm5).
#include <gtest/gtest.h>

#include <iostream>
#include <map>
#include <string>

#include "dbrq.h"
#include "samples/zoo/zoo.h"
#include "tests/test_util.h"

namespace {

using dbrq::Tensor;

TEST(DenseNetInt8, EveryBatchNormRunsInt8) {
  const auto golden = dbrq::load_safetensors("tests/models/golden/densenet.safetensors");
  dbrq::NamedTensors weights;
  for (const auto& [k, t] : golden) {
    if (k != "input" && k != "output") weights.emplace_back(k, t);
  }
  zoo::DenseNet ref(zoo::densenet_config(zoo::Variant::kTiny)), m(zoo::densenet_config(zoo::Variant::kTiny));
  ref.load_state_dict(weights);
  m.load_state_dict(weights);
  ref.eval();
  m.eval();
  const Tensor x = dbrq::randn({4, 3, 32, 32}, 1);
  const Tensor expected = ref(x);
  dbrq::prepare(m, {x});
  for (uint64_t s = 0; s < 8; ++s) m(dbrq::randn({4, 3, 32, 32}, 100 + s));
  dbrq::convert(m);

  int bn_alone = 0, bn_relu = 0, bn_folded = 0, fp32 = 0, total = 0;
  for (const dbrq::QuantizedOpInfo& op : dbrq::quantized_ops(m)) {
    ++total;
    if (op.executor.rfind("fp32", 0) == 0) {
      ++fp32;
      ADD_FAILURE() << op.fqn << " (" << op.op << ") stays fp32: " << op.executor;
    }
    if (op.kind != dbrq::OpKind::kBatchNorm) continue;
    if (op.role == "channel_affine") {
      (op.executor.find("relu fused") != std::string::npos ? bn_relu : bn_alone)++;
    } else if (op.executor.rfind("fused into conv2d", 0) == 0) {
      ++bn_folded;
    } else {
      ADD_FAILURE() << op.fqn << ": " << op.executor;
    }
  }
  // 2 blocks x 2 layers: norm1 + relu (4), transition1.norm + relu (1), norm5 + relu (1: its relu
  // is functional after the features module, in the root's forward, and fuses across the module
  // boundary, docs/architecture.md "Fusion across modules"); norm0 and the 4 norm2 follow their
  // conv and fold.
  EXPECT_EQ(bn_relu, 6);
  EXPECT_EQ(bn_alone, 0);
  EXPECT_EQ(bn_folded, 5);
  const double sqnr = dbrq::sqnr_db(expected, m(x));
  std::cout << "[ densenet ] " << total << " seen ops, " << fp32 << " fp32; int8 vs fp32 SQNR " << sqnr << " dB\n";
  EXPECT_GT(sqnr, 20.0);
}

}  // namespace
