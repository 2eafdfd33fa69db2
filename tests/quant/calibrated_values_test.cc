// Weights other than the ones calibration saw. The ranges recorded downstream of a parameter
// describe the values it had while calibrating; convert quantizes the weights it finds, so weights
// loaded after calibrating (or other weights than a quant-state file was calibrated with) ran int8
// with every activation range after them stale: no error, relative error 0.35 on the probe below.
// convert now raises UsageError naming them. Values that varied while calibrating (a training
// loop's weights, a mask set before each call) are not checked; the same values written again
// (a checkpoint reloaded) are not a change.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/quant/quant_test_util.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using json = nlohmann::json;
using testing::sqnr_of;

// An int8 linear after a parameter read as an activation: both kinds of parameter.
struct ParamAddThenLinear : nn::CallableModule<ParamAddThenLinear> {
  ParamAddThenLinear() {
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(16, 16));
    fc2 = register_module("fc2", std::make_shared<nn::LinearImpl>(16, 8));
    p = register_parameter("p", randn({4, 16}, 9));
  }
  Tensor forward(const Tensor& x) { return (*fc2)(relu((*fc)(x + p))); }
  std::shared_ptr<nn::LinearImpl> fc, fc2;
  Tensor p;
};

// The model with the layers' weights drawn from generator seed `seed` (p is the same in all).
std::unique_ptr<ParamAddThenLinear> make(uint64_t seed) {
  manual_seed(seed);
  return std::make_unique<ParamAddThenLinear>();
}

std::map<std::string, Tensor> weights_of(const nn::Module& m) {
  std::map<std::string, Tensor> sd;
  for (const auto& [k, t] : m.state_dict()) sd[k] = t.clone();
  return sd;
}

std::vector<Tensor> batches() { return testing::random_batches(4, 50, {4, 16}); }

constexpr const char* kChanged = " other values than calibration saw (written after the last calibrating call, or not "
                                 "the weights the loaded quant-state file was calibrated with)";

TEST(CalibratedValues, WeightsLoadedAfterCalibratingRaiseAtConvert) {
  auto m = make(20), other = make(21);
  const auto xs = batches();
  prepare(*m, {xs[0]});
  for (const Tensor& x : xs) (*m)(x);
  m->load_state_dict(weights_of(*other));
  EXPECT_THROW_MSG(convert(*m), UsageError,
                   std::string("convert: parameters \"fc.weight\", \"fc.bias\", \"fc2.weight\" and 1 more hold") + kChanged);
  EXPECT_FALSE(is_converted(*m));
  // What the check prevents: converting anyway (the ranges of m's old weights, other's weights).
  auto stale = make(20);
  prepare(*stale, {xs[0]});
  for (const Tensor& x : xs) (*stale)(x);
  model_quant_state(*stale).calibrated_values().clear();  // as before the check
  stale->load_state_dict(weights_of(*other));
  convert(*stale);
  const double err = testing::relative_error((*stale)(xs[1]), (*other)(xs[1]));
  EXPECT_GT(err, 0.2);  // 0.35
}

TEST(CalibratedValues, OneParameterIsNamedAndCalibratingAgainConverts) {
  auto m = make(20), ref = make(20);
  const auto xs = batches();
  prepare(*m, {xs[0]});
  for (const Tensor& x : xs) (*m)(x);
  m->p.mul_(3.0);
  ref->p.mul_(3.0);
  EXPECT_THROW_MSG(convert(*m), UsageError, std::string("convert: parameter \"p\" holds") + kChanged +
                                                ": the int8 ranges after it describe the old values. Load the weights "
                                                "first, then calibrate");
  // Still calibrating: calls after the write see the new values (p varied while calibrating).
  for (const Tensor& x : xs) (*m)(x);
  convert(*m);
  EXPECT_GT(sqnr_of((*ref)(xs[1]), (*m)(xs[1])), 25.0);
}

TEST(CalibratedValues, TheSameValuesWrittenAgainAreNotAChange) {
  auto m = make(20), plain = make(20);
  const auto xs = batches();
  for (auto* model : {m.get(), plain.get()}) {
    prepare(*model, {xs[0]});
    for (const Tensor& x : xs) (*model)(x);
  }
  m->load_state_dict(weights_of(*plain));  // a checkpoint of the same weights, reloaded
  m->fc->weight.copy_(plain->fc->weight);
  convert(*m);
  convert(*plain);
  testing::expect_equal((*m)(xs[2]), (*plain)(xs[2]), "reloaded");
}

// Calibration inside a training loop: the weights change between calibrating calls, and the
// optimizer's step after the last call is part of what calibration already saw vary.
TEST(CalibratedValues, WeightsThatVariedWhileCalibratingAreNotChecked) {
  auto m = make(20);
  const auto xs = batches();
  prepare(*m, {xs[0]});
  for (const Tensor& x : xs) {
    (*m)(x);
    m->fc->weight.mul_(0.99);  // the step
    m->p.add_(0.01);
  }
  convert(*m);
  EXPECT_TRUE(is_converted(*m));
  // Buffers and weights never written while calibrating are still checked.
  auto n = make(20);
  prepare(*n, {xs[0]});
  for (const Tensor& x : xs) {
    (*n)(x);
    n->p.add_(0.01);
  }
  n->fc2->weight.mul_(2.0);
  EXPECT_THROW_MSG(convert(*n), UsageError, "convert: parameter \"fc2.weight\" holds");
}

// Prepare's example run is not calibration: weights loaded after it are the calibrated ones.
TEST(CalibratedValues, WeightsLoadedBeforeCalibratingAreTheCalibratedOnes) {
  auto m = make(20), other = make(21);
  const auto xs = batches();
  prepare(*m, {xs[0]});
  m->load_state_dict(weights_of(*other));
  for (const Tensor& x : xs) (*m)(x);
  convert(*m);
  EXPECT_GT(sqnr_of((*other)(xs[1]), (*m)(xs[1])), 25.0);
}

// The deploy flow: a quant-state file says which values it was calibrated with.
struct Saved {
  std::string path;
  json doc;
};

Saved calibrated_file(const std::string& name) {
  auto m = make(20);
  const auto xs = batches();
  prepare(*m, {xs[0]});
  for (const Tensor& x : xs) (*m)(x);
  Saved s{testing::temp_file(name), json()};
  save_quant_state(*m, s.path);
  s.doc = json::parse(testing::read_text(s.path));
  return s;
}

TEST(CalibratedValues, AFileCalibratedWithOtherWeightsRaisesAtConvert) {
  const Saved saved = calibrated_file("calibrated_values.qstate.json");
  ASSERT_TRUE(saved.doc.contains("calibrated_values"));
  EXPECT_EQ(saved.doc["calibrated_values"].size(), 5u);  // fc, fc2 weights and biases, p
  const auto xs = batches();
  auto deploy = [&](uint64_t weights_seed, const std::string& path) {
    auto m = make(99);
    prepare(*m, {xs[0]});
    m->load_state_dict(weights_of(*make(weights_seed)));
    load_quant_state(*m, path);
    return m;
  };
  auto wrong = deploy(21, saved.path);
  EXPECT_THROW_MSG(convert(*wrong), UsageError, std::string(" hold") + kChanged);
  auto right = deploy(20, saved.path);
  convert(*right);
  EXPECT_GT(sqnr_of((*make(20))(xs[1]), (*right)(xs[1])), 25.0);
  // Files without the hashes (older ones) are not checked.
  json old = saved.doc;
  old.erase("calibrated_values");
  const std::string old_path = testing::temp_file("calibrated_values_old.qstate.json");
  testing::write_text(old_path, old.dump(1));
  auto unchecked = deploy(21, old_path);
  convert(*unchecked);
  EXPECT_TRUE(is_converted(*unchecked));
}

TEST(CalibratedValues, BadEntriesInAFileAreRefused) {
  const Saved saved = calibrated_file("calibrated_values_bad.qstate.json");
  const auto xs = batches();
  auto load = [&](const json& doc) {
    const std::string path = testing::temp_file("calibrated_values_edited.qstate.json");
    testing::write_text(path, doc.dump(1));
    auto m = make(20);
    prepare(*m, {xs[0]});
    load_quant_state(*m, path);
  };
  json unknown = saved.doc;
  unknown["calibrated_values"]["fc3.weight"] = "0x0123456789abcdef";
  EXPECT_THROW_MSG(load(unknown), StateMismatchError,
                   "the file has calibrated values of \"fc3.weight\", the model has no such parameter or buffer");
  json short_hash = saved.doc;
  short_hash["calibrated_values"]["p"] = "0x1234";
  EXPECT_THROW_MSG(load(short_hash), FileFormatError, "a calibrated value's hash \"0x1234\" is not \"0x\" followed by 16 hex digits");
  json number = saved.doc;
  number["calibrated_values"]["p"] = 7;
  EXPECT_THROW_MSG(load(number), FileFormatError, "a calibrated value's hash must be a string");
  json array = saved.doc;
  array["calibrated_values"] = json::array({"p"});
  EXPECT_THROW_MSG(load(array), FileFormatError, "calibrated_values must be an object");
}

// A file round-trips its hashes: saved again after loading, the same text.
TEST(CalibratedValues, AFileSavedAgainAfterLoadingIsTheSame) {
  const Saved saved = calibrated_file("calibrated_values_rt.qstate.json");
  auto m = make(20);
  prepare(*m, {batches()[0]});
  load_quant_state(*m, saved.path);
  const std::string again = testing::temp_file("calibrated_values_rt2.qstate.json");
  save_quant_state(*m, again);
  EXPECT_EQ(testing::read_text(again), testing::read_text(saved.path));
}

TEST(CalibratedValues, MergingAReplicaCalibratedWithOtherWeightsRaises) {
  const auto xs = batches();
  auto a = make(20), same = make(20), other = make(21);
  for (auto* m : {a.get(), same.get(), other.get()}) {
    prepare(*m, {xs[0]});
    for (const Tensor& x : xs) (*m)(x);
  }
  EXPECT_THROW_MSG(merge_calibration(*a, *other), StateMismatchError,
                   "the replica was calibrated with other values of \"fc.bias\" than this model; replicas must hold "
                   "the same weights");
  merge_calibration(*a, *same);  // nothing changed by the refused merge
  convert(*a);
  EXPECT_GT(sqnr_of((*make(20))(xs[1]), (*a)(xs[1])), 25.0);
}

// Calls that observe nothing (observers disabled: an evaluation between loading weights and
// converting) do not make a write look like something calibration saw vary.
TEST(CalibratedValues, CallsWithObserversDisabledDoNotHideAWrite) {
  auto m = make(20), other = make(21);
  const auto xs = batches();
  prepare(*m, {xs[0]});
  for (const Tensor& x : xs) (*m)(x);
  m->load_state_dict(weights_of(*other));
  disable_observers(*m);
  (*m)(xs[0]);  // evaluating the fp32 model with the new weights
  EXPECT_THROW_MSG(convert(*m), UsageError, "convert: parameters \"fc.weight\"");
  // Weights loaded around unobserved calls before calibrating are the calibrated ones.
  auto n = make(20);
  prepare(*n, {xs[0]});
  disable_observers(*n);
  (*n)(xs[0]);
  n->load_state_dict(weights_of(*other));
  enable_observers(*n);
  for (const Tensor& x : xs) (*n)(x);
  n->fc2->weight.mul_(3.0);
  EXPECT_THROW_MSG(convert(*n), UsageError, "convert: parameter \"fc2.weight\" holds");
}

// A buffer the application fills through a pointer it took once: no write is versioned, and
// calibration saw its values change call by call. Not a change at convert.
struct RawBuffer : nn::CallableModule<RawBuffer> {
  RawBuffer() {
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(16, 8));
    offset = register_buffer("offset", zeros({4, 16}));
    raw = offset.mutable_data<float>();
  }
  Tensor forward(const Tensor& x) { return (*fc)(x + offset); }
  std::shared_ptr<nn::LinearImpl> fc;
  Tensor offset;
  float* raw;
};

TEST(CalibratedValues, ABufferWrittenThroughAnEarlierPointerIsNotAChange) {
  RawBuffer m;
  const auto xs = batches();
  prepare(m, {xs[0]});
  for (size_t i = 0; i < xs.size(); ++i) {
    for (int k = 0; k < 64; ++k) m.raw[k] = 0.1f * static_cast<float>(i);
    m(xs[i]);
  }
  convert(m);
  EXPECT_TRUE(is_converted(m));
}

// Dynamic quantization takes its ranges per call: nothing depends on the calibrated values.
TEST(CalibratedValues, ADynamicOnlyModelIsNotChecked) {
  auto m = make(20), other = make(21);
  const auto xs = batches();
  prepare(*m, {xs[0]}, default_dynamic_qconfig_mapping());
  for (const Tensor& x : xs) (*m)(x);
  m->load_state_dict(weights_of(*other));
  convert(*m);
  EXPECT_GT(sqnr_of((*other)(xs[1]), (*m)(xs[1])), 25.0);
  // After convert, a dynamic linear whose weights are written still runs int8 (its ranges are
  // per call), and does not raise under strict_paths.
  auto s = make(20);
  prepare(*s, {xs[0]}, default_dynamic_qconfig_mapping());
  ConvertOptions o;
  o.strict_paths = true;
  convert(*s, o);
  s->fc2->weight.mul_(2.0);
  auto ref = make(20);
  ref->fc2->weight.mul_(2.0);
  EXPECT_GT(sqnr_of((*ref)(xs[1]), (*s)(xs[1])), 25.0);
  EXPECT_EQ(uncalibrated_ops(*s), 0);
}

// Three parameters as views of one storage (a packed q, k, v): each part is covered.
struct PackedViews : nn::CallableModule<PackedViews> {
  PackedViews() {
    const Tensor packed = randn({3, 16}, 31);
    q = register_parameter("q", packed.narrow(0, 0, 1));
    k = register_parameter("k", packed.narrow(0, 1, 1));
    v = register_parameter("v", packed.narrow(0, 2, 1));
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(16, 8));
  }
  Tensor forward(const Tensor& x) { return (*fc)(x * q + k * v); }
  Tensor q, k, v;
  std::shared_ptr<nn::LinearImpl> fc;
};

TEST(CalibratedValues, EveryViewOfASharedStorageIsCovered) {
  PackedViews m;
  const auto xs = batches();
  prepare(m, {xs[0]});
  for (const Tensor& x : xs) m(x);
  m.v.mul_(4.0);  // not the largest registration, nor the first
  EXPECT_THROW(convert(m), UsageError);
}

// A buffer set before each call (a mask), calibrated by replicas making one call each: each saw
// one value, the merge saw it vary. Nor does a file saying so make a deployed copy's next mask a
// change after convert.
struct MaskedLinear : nn::CallableModule<MaskedLinear> {
  MaskedLinear() {
    fc = register_module("fc", std::make_shared<nn::LinearImpl>(16, 8));
    mask = register_buffer("mask", ones({4, 16}));
  }
  Tensor forward(const Tensor& x) { return (*fc)(x * mask); }
  std::shared_ptr<nn::LinearImpl> fc;
  Tensor mask;
};

TEST(CalibratedValues, AMaskSetBeforeEachCallVariesAcrossReplicasAndFiles) {
  const auto xs = batches();
  std::vector<Tensor> masks;
  for (const Tensor& r : testing::random_batches(4, 51, {4, 16})) masks.push_back(tanh(r) * 0.5 + 0.5);
  std::vector<std::unique_ptr<MaskedLinear>> replicas;
  for (size_t i = 0; i < xs.size(); ++i) {
    manual_seed(22);
    replicas.push_back(std::make_unique<MaskedLinear>());
    MaskedLinear& r = *replicas.back();
    prepare(r, {xs[0]});
    r.mask.copy_(masks[i]);
    r(xs[i]);
  }
  for (size_t i = 1; i < replicas.size(); ++i) merge_calibration(*replicas[0], *replicas[i]);
  EXPECT_EQ(model_quant_state(*replicas[0]).varied_values().count("mask"), 1u);
  EXPECT_EQ(model_quant_state(*replicas[0]).calibrated_values().count("mask"), 0u);
  EXPECT_EQ(model_quant_state(*replicas[0]).calibrated_values().count("fc.weight"), 1u);
  const std::string path = testing::temp_file("masked.qstate.json");
  save_quant_state(*replicas[0], path);
  manual_seed(22);
  MaskedLinear deployed;
  manual_seed(22);
  MaskedLinear ref;
  prepare(deployed, {xs[0]});
  load_quant_state(deployed, path);
  convert(deployed);
  for (size_t i = 0; i < xs.size(); ++i) {
    deployed.mask.copy_(masks[i]);
    ref.mask.copy_(masks[i]);
    const Tensor got = deployed(xs[i]);
    EXPECT_GT(sqnr_of(ref(xs[i]), got), 25.0);
    EXPECT_GT(testing::relative_error(got, ref(xs[i])), 1e-4);  // int8
  }
  EXPECT_EQ(uncalibrated_ops(deployed), 0);
}

}  // namespace
}  // namespace dbrq

namespace dbrq {
namespace {

// Replicas prepared with other qconfigs observe with other observers: their statistics cannot be
// merged, and must not be dropped without a word.
TEST(MergeCalibration, AReplicaWithOtherObserversIsRefused) {
  const auto xs = batches();
  auto a = make(20), r = make(20);
  prepare(*a, {xs[0]});
  prepare(*r, {xs[0]},
          QConfigMapping().set_global(QConfig::make(ObserverSpec::min_max(), ObserverSpec::per_channel_min_max())));
  for (const Tensor& x : xs) (*a)(x), (*r)(x);
  EXPECT_THROW(merge_calibration(*a, *r), StateMismatchError);
}

}  // namespace
}  // namespace dbrq
