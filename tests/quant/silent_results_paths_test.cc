// Regression tests for silent wrong results on models with several paths (issue 11), found by
// review: a fused follower shared by two bases of which one runs fp32, an input observer that a
// branch found late started empty, an uncalibrated op handing on a calibrated record's identity,
// and a cat union hiding a path whose observer saw nothing. Each compares the converted model with
// the fp32 model (or expects the documented error).
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using Conv2d = nn::Conv2dImpl;
using Linear = nn::LinearImpl;
using testing::sqnr_of;

Tensor scaled(uint64_t seed, const std::vector<int64_t>& sizes, double mul, double add) {
  return randn(sizes, seed) * mul + add;
}

// ---- one relu record after two calls of one batch norm, one with an int8 input, one fp32 ----

// The batch norm module is one record per input kind (u8 after the pool, f32 from the model's
// input); the relu after it is one record for both (same producer tag). The chain bn -> relu was
// fused with the first base; the second base runs fp32 (its input is never int8), yet its output
// was marked as the chain's inner tensor and the relu passed it on untouched: no relu at all.
// (testing::SharedBn, tests/quant/quant_test_util.h)

TEST(PathsAfterConvert, AFollowerSharedWithAnFp32BaseStillComputes) {
  manual_seed(11);
  testing::SharedBn ref;
  testing::randomize_bn(*ref.bn, 3);
  ref.eval();
  manual_seed(11);
  testing::SharedBn m;
  testing::randomize_bn(*m.bn, 3);
  m.eval();
  const auto xs = testing::random_batches(4, 30, {1, 4, 8, 8});
  prepare(m, {xs[0]});
  for (const Tensor& x : xs) m(x);
  convert(m);
  for (const Tensor& x : xs) {
    const std::vector<Tensor> want = ref(x), got = m(x);
    ASSERT_EQ(got.size(), 2u);
    EXPECT_GT(sqnr_of(got[0], want[0]), 25.0);
    EXPECT_GT(sqnr_of(got[1], want[1]), 25.0);
    const std::vector<float> v = testing::values(got[1]);
    EXPECT_GE(*std::min_element(v.begin(), v.end()), 0.f) << "the relu after the fp32 batch norm did not run";
  }
}

// ---- a branch found late: the consumer after both branches ----

// y = relu(a(x)) or relu(b(x)), then head(y). Both relus have one tag, so head is one record with
// one input origin until branch b appears; then head's input gets an observer of its own, which
// saw only the calls made after that. Converted, branch a's values were requantized into branch
// b's range (clipped), no error.
struct LateBranch : nn::CallableModule<LateBranch> {
  LateBranch() {
    a = register_module("a", std::make_shared<Linear>(16, 16));
    b = register_module("b", std::make_shared<Linear>(16, 16));
    head = register_module("head", std::make_shared<Linear>(16, 8));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = mean(x).item<float>() > 0 ? relu((*a)(x)) : relu((*b)(x));
    return (*head)(y);
  }
  std::shared_ptr<Linear> a, b, head;
};

// Calibrated on the same 8 calls of branch a and 2 of branch b, b's last (`late`) or among a's
// (`mixed`): the late model must do as well on branch a as the mixed one (it gave 1.0-1.4 dB
// against 23-40 dB).
TEST(PathsAfterConvert, ABranchFoundLateKeepsTheRangesOfTheOneBefore) {
  manual_seed(12);
  LateBranch ref;
  std::vector<std::unique_ptr<LateBranch>> models;
  for (int late = 0; late < 2; ++late) {
    manual_seed(12);
    models.push_back(std::make_unique<LateBranch>());
    LateBranch& m = *models.back();
    prepare(m, {scaled(1, {4, 16}, 4, 3)});
    std::vector<Tensor> calls;
    for (uint64_t i = 0; i < 8; ++i) calls.push_back(scaled(10 + i, {4, 16}, 4, 3));  // branch a, wide
    for (uint64_t i = 0; i < 2; ++i) {
      const Tensor b = scaled(20 + i, {4, 16}, 0.2, -0.3);  // branch b, narrow
      if (late == 1) {
        calls.push_back(b);
      } else {
        calls.insert(calls.begin() + 4 * i + i + 1, b);
      }
    }
    for (const Tensor& x : calls) m(x);
    convert(m);
  }
  LateBranch &mixed = *models[0], &late = *models[1];
  for (uint64_t i = 0; i < 4; ++i) {
    const Tensor big = scaled(30 + i, {4, 16}, 4, 3), small = scaled(40 + i, {4, 16}, 0.2, -0.3);
    const Tensor want_a = ref(big), want_b = ref(small);
    EXPECT_GT(sqnr_of(late(big), want_a), sqnr_of(mixed(big), want_a) - 1.0) << "branch a, input " << i;
    EXPECT_GT(sqnr_of(late(small), want_b), 20.0) << "branch b, input " << i;
  }
  EXPECT_EQ(uncalibrated_ops(late), 0);
  EXPECT_EQ(uncalibrated_ops(mixed), 0);
}

// Replicas: one took branch a on wide inputs only, the other branch a on narrow inputs and then
// branch b. Merged (either way round), head's input observer held only the second replica's
// statistics: the wide values were clipped (2-5 dB against 36-39 dB for one process on both
// shards). The first replica's values, in its observer of a's output, are now merged in. With
// the second replica on branch b alone it was worse (0.6-1.4 dB).
TEST(PathsAfterConvert, AReplicaThatTookOneBranchKeepsItsRanges) {
  for (int mode = 0; mode < 4; ++mode) {
    const int into_first = mode % 2;
    const bool b_only = mode >= 2;  // the second replica took only branch b
    manual_seed(16);
    LateBranch ref;
    std::vector<std::unique_ptr<LateBranch>> ms;
    for (int i = 0; i < 3; ++i) {
      manual_seed(16);
      ms.push_back(std::make_unique<LateBranch>());
      prepare(*ms.back(), {scaled(1, {4, 16}, 4, 3)});
    }
    LateBranch &whole = *ms[0], &r1 = *ms[1], &r2 = *ms[2];
    std::vector<Tensor> s1, s2;
    for (uint64_t i = 0; i < 4; ++i) s1.push_back(scaled(10 + i, {4, 16}, 8, 6));       // a, wide
    for (uint64_t i = 0; i < (b_only ? 0 : 4); ++i) s2.push_back(scaled(20 + i, {4, 16}, 1, 1));  // a, narrow
    for (uint64_t i = 0; i < 2; ++i) s2.push_back(scaled(30 + i, {4, 16}, 0.2, -0.3));  // b
    for (const Tensor& x : s1) r1(x), whole(x);
    for (const Tensor& x : s2) r2(x), whole(x);
    LateBranch& merged = into_first == 1 ? r1 : r2;
    merge_calibration(merged, into_first == 1 ? r2 : r1);
    convert(whole);
    convert(merged);
    for (uint64_t i = 0; i < 3; ++i) {
      const Tensor big = scaled(40 + i, {4, 16}, 8, 6), small = scaled(50 + i, {4, 16}, 0.2, -0.3);
      EXPECT_GT(sqnr_of(merged(big), ref(big)), sqnr_of(whole(big), ref(big)) - 1.0) << mode << " " << i;
      EXPECT_GT(sqnr_of(merged(small), ref(small)), 15.0) << mode << " " << i;
    }
    EXPECT_EQ(uncalibrated_ops(merged), 0);
  }
}

// ---- an op on a path never calibrated hands its result to a calibrated record ----

// Only branch a was calibrated (narrow inputs); after convert branch b runs fp32 (uncalibrated),
// but its relu has the calibrated relu's tag, so head found its calibrated record and quantized
// b's wide output into a's range: clipped, though the path was reported as running fp32.
// Calibrated on branch a only (narrow inputs), then run on a wide input taking branch b: the
// whole path after b must run fp32 (counted), matching the fp32 twin; branch a still runs int8.
template <typename M>
void expect_uncalibrated_branch_runs_fp32(uint64_t seed) {
  manual_seed(seed);
  M ref;
  manual_seed(seed);
  auto m = std::make_unique<M>();
  prepare(*m, {scaled(1, {4, 16}, 0.2, 0.3)});
  for (uint64_t i = 0; i < 6; ++i) (*m)(scaled(10 + i, {4, 16}, 0.2, 0.3));  // branch a only
  convert(*m);
  const int64_t before = uncalibrated_ops(*m);
  const Tensor wide = scaled(50, {4, 16}, 6, -4);  // branch b, never calibrated
  EXPECT_GT(sqnr_of((*m)(wide), ref(wide)), 40.0) << "an uncalibrated path runs fp32 to the end";
  EXPECT_GT(uncalibrated_ops(*m), before);
  const Tensor narrow = scaled(51, {4, 16}, 0.2, 0.3);  // the calibrated path still runs int8
  const int64_t after = uncalibrated_ops(*m);
  EXPECT_GT(sqnr_of((*m)(narrow), ref(narrow)), 20.0);
  EXPECT_EQ(uncalibrated_ops(*m), after);
}

TEST(PathsAfterConvert, AnUncalibratedOpsResultIsNotTakenForACalibratedOne) {
  expect_uncalibrated_branch_runs_fp32<LateBranch>(13);
}

// The same through an fp32 op between the paths (a flatten of b's output, then a reshape back)
// and through a module boundary (the branch inside a child): everything computed from an
// uncalibrated value runs fp32 too.
struct Branches : nn::CallableModule<Branches> {
  Branches() {
    a = register_module("a", std::make_shared<Linear>(16, 16));
    b = register_module("b", std::make_shared<Linear>(16, 16));
  }
  Tensor forward(const Tensor& x) {
    return mean(x).item<float>() > 0 ? (*a)(x) : softmax((*b)(x), 1) * 0.0 + (*b)(x) * 10.0;
  }
  std::shared_ptr<Linear> a, b;
};

struct JoinsAcrossAModule : nn::CallableModule<JoinsAcrossAModule> {
  JoinsAcrossAModule() {
    branches = register_module("branches", std::make_shared<Branches>());
    head = register_module("head", std::make_shared<Linear>(16, 8));
  }
  Tensor forward(const Tensor& x) { return (*head)(relu((*branches)(x).flatten(1).reshape({-1, 16}))); }
  std::shared_ptr<Branches> branches;
  std::shared_ptr<Linear> head;
};

TEST(PathsAfterConvert, AValueFromAnUncalibratedPathRunsFp32AcrossModulesAndFp32Ops) {
  expect_uncalibrated_branch_runs_fp32<JoinsAcrossAModule>(15);
}

// ---- a path taken once, behind a cat ----

// y = a(x) or b(x), then cat({y, c(x)}): branch b taken on one calibrating call only. Its output
// observer saw nothing (a path taken once is not calibrated: NotCalibratedError), but the cat
// united that observer with c's, which had data, so convert passed and b ran int8 in c's range.
struct BranchIntoCat : nn::CallableModule<BranchIntoCat> {
  BranchIntoCat() {
    a = register_module("a", std::make_shared<Linear>(16, 16));
    b = register_module("b", std::make_shared<Linear>(16, 16));
    c = register_module("c", std::make_shared<Linear>(16, 16));
    head = register_module("head", std::make_shared<Linear>(32, 8));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = mean(x).item<float>() > 0 ? (*a)(x) : (*b)(x) * 20.0;
    return (*head)(cat({y, (*c)(x)}, 1));
  }
  std::shared_ptr<Linear> a, b, c, head;
};

TEST(PathsAfterConvert, APathTakenOnceBehindACatIsNotCalibratedOrIsRight) {
  manual_seed(14);
  BranchIntoCat ref;
  manual_seed(14);
  BranchIntoCat m;
  prepare(m, {scaled(1, {4, 16}, 1, 2)});
  for (uint64_t i = 0; i < 4; ++i) m(scaled(10 + i, {4, 16}, 1, 2));  // branch a
  m(scaled(20, {4, 16}, 1, -2));                                       // branch b, once
  bool raised = false;
  try {
    convert(m);
  } catch (const NotCalibratedError&) {
    raised = true;
  }
  if (!raised) {
    const Tensor x = scaled(21, {4, 16}, 1, -2);
    EXPECT_GT(sqnr_of(m(x), ref(x)), 20.0) << "branch b converted without its range";
  }
}

}  // namespace
}  // namespace dbrq
