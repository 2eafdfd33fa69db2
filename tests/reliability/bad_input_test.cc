// The bad-input table: one row per way a user can hand dbrq something wrong, on a model in a given
// stage (fp32, prepared, calibrating, converted). Each row checks the exception type and message
// (or, for inputs that must work, the result), then that the model is still usable:
//
//   - no interceptor is left installed on the thread;
//   - the good input gives the bit-identical output it gave before the bad call;
//   - a prepared / calibrating model holds exactly the observer statistics of a twin that never
//     saw the bad call, and after both calibrate and convert the two give bit-identical outputs.
//
// Every row prints "[row] name | model | stage | type | message", so the table in
// docs/reliability.md can be refreshed from the test log.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <iostream>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "dbrq.h"
#include "samples/zoo/zoo.h"
#include "tests/reliability/reliability_util.h"

namespace dbrq {
namespace {

using testing::bit_identical;
using testing::observer_stats;

// ---- subjects --------------------------------------------------------------------------------

// Data-dependent control flow around quantizeable ops: recorded with batch 2 it runs fc1, fc2;
// batch 1 skips fc2 and batch 5 runs fc1 a second time.
struct Branchy : nn::CallableModule<Branchy> {
  Branchy() {
    fc1 = register_module("fc1", std::make_shared<nn::LinearImpl>(4, 4));
    fc2 = register_module("fc2", std::make_shared<nn::LinearImpl>(4, 4));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*fc1)(x);
    if (x.size(0) != 1) y = (*fc2)(y);
    if (x.size(0) > 4) y = (*fc1)(y);
    return y;
  }
  std::shared_ptr<nn::LinearImpl> fc1, fc2;
};

// conv -> add (fused through the sum post-op after convert) with a check in user code between
// the two, so an exception can cut a call short while the fused conv waits for its residual.
struct Residual : nn::CallableModule<Residual> {
  Residual() { conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(4, 4, 3).padding(1))); }
  Tensor forward(const Tensor& x) {
    Tensor y = (*conv)(x);
    DBRQ_ENSURE(x.size(0) != 3, ValueError, "Residual: batch size 3 is not supported");
    return y + x;
  }
  std::shared_ptr<nn::Conv2dImpl> conv;
};

enum class Subject { kSmallCnn, kResNet, kBert, kBranchy, kResidual };
enum class Stage { kFp32, kPrepared, kCalibrating, kConverted };

const char* subject_name(Subject s) {
  switch (s) {
    case Subject::kSmallCnn:
      return "SmallCnn";
    case Subject::kResNet:
      return "ResNet18 tiny";
    case Subject::kBert:
      return "BERT tiny";
    case Subject::kBranchy:
      return "Branchy";
    case Subject::kResidual:
      return "Residual";
  }
  return "?";
}

const char* stage_name(Stage s) {
  switch (s) {
    case Stage::kFp32:
      return "fp32";
    case Stage::kPrepared:
      return "prepared";
    case Stage::kCalibrating:
      return "calibrating";
    case Stage::kConverted:
      return "converted";
  }
  return "?";
}

std::shared_ptr<nn::Module> make_subject(Subject s) {
  manual_seed(7);
  std::shared_ptr<nn::Module> m;
  switch (s) {
    case Subject::kSmallCnn:
      m = zoo::make_model("small_cnn", zoo::Variant::kTiny);
      break;
    case Subject::kResNet:
      m = zoo::make_model("resnet18", zoo::Variant::kTiny);
      break;
    case Subject::kBert:
      m = zoo::make_model("bert_encoder", zoo::Variant::kTiny);
      break;
    case Subject::kBranchy:
      m = std::make_shared<Branchy>();
      break;
    case Subject::kResidual:
      m = std::make_shared<Residual>();
      break;
  }
  m->eval();
  return m;
}

// A good input of `batch` samples.
Tensor input_for(Subject s, int64_t batch, uint64_t seed) {
  switch (s) {
    case Subject::kSmallCnn:
      return zoo::find_model("small_cnn").example_input(zoo::Variant::kTiny, batch, seed);
    case Subject::kResNet:
      return randn({batch, 3, 32, 32}, seed);
    case Subject::kBert:
      return zoo::find_model("bert_encoder").example_input(zoo::Variant::kTiny, batch, seed);
    case Subject::kBranchy:
      return randn({batch, 4}, seed);
    case Subject::kResidual:
      return randn({batch, 4, 6, 6}, seed);
  }
  return Tensor();
}

Tensor run_subject(Subject s, nn::Module& m, const Tensor& x) {
  switch (s) {
    case Subject::kSmallCnn:
      return zoo::find_model("small_cnn").run(m, x);
    case Subject::kResNet:
      return zoo::find_model("resnet18").run(m, x);
    case Subject::kBert:
      return zoo::find_model("bert_encoder").run(m, x);
    case Subject::kBranchy:
      return static_cast<Branchy&>(m)(x);
    case Subject::kResidual:
      return static_cast<Residual&>(m)(x);
  }
  return Tensor();
}

// Brings a fresh model to `stage`: prepared on a batch of 2, calibrated on three batches. Branchy
// (whose quantizeable ops depend on the batch size) is prepared with strict control flow: a new
// path is its bad input.
void bring_to(Subject s, nn::Module& m, Stage stage) {
  if (stage == Stage::kFp32) return;
  PrepareOptions options;
  options.strict_control_flow = s == Subject::kBranchy;
  prepare(m, {input_for(s, 2, 1)}, default_qconfig_mapping(), BackendConfig::onednn(), options);
  if (stage == Stage::kPrepared) return;
  for (uint64_t seed : {101, 102, 103}) run_subject(s, m, input_for(s, 2, seed));
  if (stage == Stage::kCalibrating) return;
  convert(m);
}

// One row's model, its twin (same weights, same history, never sees the bad call) and a
// scratch directory.
struct Case {
  Subject subject;
  Stage stage;
  std::shared_ptr<nn::Module> model, twin;
  Tensor good, ref;  // a good input and the model's output for it before the bad call
  std::string dir;

  Tensor run(const Tensor& x) { return run_subject(subject, *model, x); }
  Tensor input(int64_t batch, uint64_t seed) const { return input_for(subject, batch, seed); }
  template <typename M>
  M& as() {
    return static_cast<M&>(*model);
  }
  std::string path(const std::string& name) const { return dir + "/" + name; }
};

std::string scratch_dir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t != nullptr ? t : "/tmp";
}

// ---- the table ---------------------------------------------------------------------------------

struct Expect {
  const char* type = nullptr;  // null: the call must succeed
  bool (*matches)(const std::exception&) = nullptr;
};
#define ERROR_OF(T) \
  Expect { #T, [](const std::exception& e) { return dynamic_cast<const T*>(&e) != nullptr; } }
const Expect kWorks{};

// What the usability check compares against the twin afterwards.
enum class Twin {
  kSame,      // the bad call must leave the observers exactly as the twin's
  kDiverges,  // the row feeds accepted data on purpose (its `after` checks it)
};

struct Row {
  std::string name;
  Subject subject;
  Stage stage;
  std::function<void(Case&)> bad;
  Expect expect;
  std::vector<std::string> message;  // substrings the message must contain
  std::function<void(Case&)> after = nullptr;
  Twin twin = Twin::kSame;
};

// Writes `bytes` to `path`.
void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << bytes;
}

// A quant-state file of another calibrated model.
std::string saved_quant_state(Subject s, const std::string& path, const QConfigMapping& mapping) {
  auto m = make_subject(s);
  prepare(*m, {input_for(s, 2, 1)}, mapping);
  run_subject(s, *m, input_for(s, 2, 101));
  save_quant_state(*m, path);
  return path;
}

Tensor with_nonfinite(Tensor x) {
  float* d = x.mutable_data<float>();
  d[3] = std::numeric_limits<float>::quiet_NaN();
  d[5] = std::numeric_limits<float>::infinity();
  d[7] = -std::numeric_limits<float>::infinity();
  return x;
}

const std::string kConv1 = "in module \"\" (SmallCnn), op 0 conv2d (conv1): ";

std::vector<Row> rows() {
  std::vector<Row> r;
  const auto cnn = Subject::kSmallCnn;

  // ---- wrong input rank / shape ----
  r.push_back({"wrong_rank_fp32", cnn, Stage::kFp32, [](Case& c) { c.run(randn({8, 8}, 1)); }, ERROR_OF(ShapeError),
               {"conv2d: input must be 4-D (N, C, H, W), got sizes [8, 8]"}});
  r.push_back({"wrong_rank_calibrating", cnn, Stage::kCalibrating, [](Case& c) { c.run(randn({1, 8, 8}, 1)); },
               ERROR_OF(ShapeError), {kConv1 + "conv2d: input must be 4-D (N, C, H, W), got sizes [1, 8, 8]"}});
  r.push_back({"wrong_rank_converted", cnn, Stage::kConverted, [](Case& c) { c.run(randn({8, 8}, 1)); },
               ERROR_OF(ShapeError), {kConv1 + "conv2d: input must be 4-D (N, C, H, W), got sizes [8, 8]"}});
  r.push_back({"wrong_channels_converted", cnn, Stage::kConverted, [](Case& c) { c.run(randn({1, 3, 8, 8}, 1)); },
               ERROR_OF(ShapeError),
               {kConv1 + "conv2d: input has 3 channels but the weight expects in_channels/groups * groups = 1 * 1 = 1"}});
  // Fails at the pool, after conv1 and conv2 fed their observers: the call's observations are undone.
  r.push_back({"image_too_small_calibrating", cnn, Stage::kCalibrating, [](Case& c) { c.run(randn({2, 1, 1, 1}, 1)); },
               ERROR_OF(ShapeError),
               {"in module \"\" (SmallCnn), op 6 max_pool2d (pool): max_pool2d: input sizes [2, 32, 1, 1] are smaller "
                "than the kernel (2, 2)"}});
  r.push_back({"image_too_small_converted", cnn, Stage::kConverted, [](Case& c) { c.run(randn({1, 1, 1, 1}, 1)); },
               ERROR_OF(ShapeError), {"in module \"\" (SmallCnn), op 6 max_pool2d (pool): max_pool2d: input sizes"}});
  // A prepared submodule called directly: the location is the nested block.
  r.push_back({"wrong_channels_nested_converted", Subject::kResNet, Stage::kConverted,
               [](Case& c) { (*c.as<zoo::ResNet18>().layer1)(randn({1, 5, 8, 8}, 1)); }, ERROR_OF(ShapeError),
               {"in module \"layer1.0\" (BasicBlock), op 0 conv2d (layer1.0.conv1): conv2d: input has 5 channels"}});
  r.push_back({"wrong_channels_nested_fp32", Subject::kResNet, Stage::kFp32,
               [](Case& c) { (*c.as<zoo::ResNet18>().layer1)(randn({1, 5, 8, 8}, 1)); }, ERROR_OF(ShapeError),
               {"conv2d: input has 5 channels"}});
  // A check in a user module's own forward (no op involved): the module names itself.
  r.push_back({"wrong_rank_user_check_converted", Subject::kBert, Stage::kConverted,
               [](Case& c) { c.run(zeros({16}, DType::kS64)); }, ERROR_OF(ShapeError),
               {"in module \"embeddings\" (BertEmbeddings): BertEmbeddings: input_ids must be [batch, seq], got [16]"}});
  r.push_back({"sequence_too_long_calibrating", Subject::kBert, Stage::kCalibrating,
               [](Case& c) { c.run(zeros({1, 500}, DType::kS64)); }, ERROR_OF(ShapeError),
               {"in module \"embeddings\" (BertEmbeddings): BertEmbeddings: sequence length 500 exceeds max_position"}});
  r.push_back({"token_id_out_of_range_converted", Subject::kBert, Stage::kConverted,
               [](Case& c) { c.run(full({1, 4}, 5000.0, DType::kS64)); }, ERROR_OF(IndexError),
               {"in module \"embeddings\" (BertEmbeddings), embedding (embeddings.word_embeddings, not quantized): "
                "embedding: "}});
  // An error in user code between a fused conv and its add (the conv waits for its residual).
  r.push_back({"user_error_inside_fused_chain_converted", Subject::kResidual, Stage::kConverted,
               [](Case& c) { c.run(c.input(3, 1)); }, ERROR_OF(ValueError),
               {"in module \"\" (Residual): Residual: batch size 3 is not supported"}});
  r.push_back({"user_error_inside_fused_chain_calibrating", Subject::kResidual, Stage::kCalibrating,
               [](Case& c) { c.run(c.input(3, 1)); }, ERROR_OF(ValueError),
               {"in module \"\" (Residual): Residual: batch size 3 is not supported"}});
  // A dim out of range in an eager op names the op.
  r.push_back({"dim_out_of_range_fp32", cnn, Stage::kFp32, [](Case& c) { softmax(c.ref, 5); }, ERROR_OF(IndexError),
               {"softmax: dim 5 is out of range for a 2-D tensor (valid: -2 to 1)"}});

  // ---- wrong dtype ----
  r.push_back({"wrong_dtype_fp32", cnn, Stage::kFp32, [](Case& c) { c.run(zeros({1, 1, 8, 8}, DType::kU8)); },
               ERROR_OF(DTypeError), {"conv2d: input must have dtype f32, got u8"}});
  r.push_back({"wrong_dtype_calibrating", cnn, Stage::kCalibrating,
               [](Case& c) { c.run(zeros({1, 1, 8, 8}, DType::kS64)); }, ERROR_OF(DTypeError),
               {kConv1 + "conv2d: input must have dtype f32, got s64"}});
  r.push_back({"wrong_dtype_converted", cnn, Stage::kConverted, [](Case& c) { c.run(zeros({1, 1, 8, 8}, DType::kS64)); },
               ERROR_OF(DTypeError), {kConv1 + "int8 op: input has dtype s64; expected f32 or a quantized u8 tensor"}});
  r.push_back({"float_token_ids_converted", Subject::kBert, Stage::kConverted,
               [](Case& c) { c.run(zeros({1, 4})); }, ERROR_OF(DTypeError),
               {"in module \"embeddings\" (BertEmbeddings), embedding (embeddings.word_embeddings, not quantized): "}});

  // ---- API order ----
  r.push_back({"convert_before_calibration", cnn, Stage::kPrepared, [](Case& c) { convert(*c.model); },
               ERROR_OF(NotCalibratedError),
               {"convert: no calibration data for tensor t", " used by conv2d (conv1) in module \"\", op 0: its Histogram "
                "observer saw nothing. Run the prepared model on calibration data"},
               [](Case& c) { EXPECT_FALSE(is_converted(*c.model)); }});
  r.push_back({"calibrate_after_convert", cnn, Stage::kConverted, [](Case& c) { enable_observers(*c.model); },
               ERROR_OF(UsageError),
               {"enable_observers: the model is already converted; calibration must happen before convert"}});
  r.push_back({"load_calibration_after_convert", cnn, Stage::kConverted,
               [](Case& c) { load_quant_state(*c.model, c.path("any.qstate.json")); }, ERROR_OF(UsageError),
               {"load_quant_state: the model is already converted"}});
  r.push_back({"merge_calibration_after_convert", cnn, Stage::kConverted,
               [](Case& c) {
                 auto replica = make_subject(c.subject);
                 bring_to(c.subject, *replica, Stage::kCalibrating);
                 merge_calibration(*c.model, *replica);
               },
               ERROR_OF(UsageError), {"merge_calibration: both models must be prepared and not yet converted"}});
  r.push_back({"convert_twice", cnn, Stage::kConverted, [](Case& c) { convert(*c.model); }, ERROR_OF(UsageError),
               {"convert: SmallCnn is already converted"}});

  // ---- calibration data ----
  r.push_back({"nan_inf_in_calibration_data", cnn, Stage::kCalibrating,
               [](Case& c) { c.run(with_nonfinite(c.input(2, 104))); }, kWorks, {},
               [](Case& c) {
                 // Skipped and counted; the model input's observer covers the finite values only.
                 ModelQuantState& m = model_quant_state(*c.model);
                 const SeenOpInfo& conv = quant_state_of(*c.model)->seen_ops()[0];
                 const Observer& in = m.observer(conv.input_observers[0]);
                 EXPECT_EQ(in.nan_count(), 1);
                 EXPECT_EQ(in.inf_count(), 2);
                 float lo = std::numeric_limits<float>::infinity(), hi = -lo;
                 for (uint64_t seed : {101, 102, 103, 104}) {
                   Tensor x = seed == 104 ? with_nonfinite(c.input(2, seed)) : c.input(2, seed);
                   for (float v : x.to_vector<float>()) {
                     if (std::isfinite(v)) lo = std::min(lo, v), hi = std::max(hi, v);
                   }
                 }
                 // (A histogram's range snaps to its bins as it grows, so it covers the data, a little wider.)
                 EXPECT_TRUE(std::isfinite(in.min_val()) && std::isfinite(in.max_val()));
                 EXPECT_LE(in.min_val(), lo);
                 EXPECT_GE(in.max_val(), hi);
                 EXPECT_LT(in.max_val() - in.min_val(), 1.1 * (hi - lo));
                 convert(*c.model);
                 for (float v : c.run(c.good).to_vector<float>()) EXPECT_TRUE(std::isfinite(v));
               },
               Twin::kDiverges});
  r.push_back({"only_nan_calibration_data", cnn, Stage::kPrepared,
               [](Case& c) {
                 c.run(full({2, 1, 8, 8}, std::numeric_limits<double>::quiet_NaN()));
                 convert(*c.model);
               },
               ERROR_OF(NotCalibratedError),
               {"used by conv2d (conv1) in module \"\", op 0: its Histogram observer saw no finite values (it skipped "
                "128 NaN and 0 Inf)"},
               nullptr, Twin::kDiverges});
  r.push_back({"empty_calibration", cnn, Stage::kPrepared,
               [](Case& c) {
                 for (int i = 0; i < 3; ++i) c.run(zeros({0, 1, 8, 8}));
                 convert(*c.model);
               },
               ERROR_OF(NotCalibratedError), {"its Histogram observer saw nothing"}});

  // ---- control flow (strict_control_flow; without it each is a new path) ----
  r.push_back({"control_flow_extra_op_calibrating", Subject::kBranchy, Stage::kCalibrating,
               [](Case& c) { c.run(c.input(5, 1)); }, ERROR_OF(ControlFlowError),
               {"control flow changed in module \"\" (Branchy): op 2 is linear (fc1) but the first run recorded only 2 "
                "quantizeable ops"}});
  r.push_back({"control_flow_missing_op_calibrating", Subject::kBranchy, Stage::kCalibrating,
               [](Case& c) { c.run(c.input(1, 1)); }, ERROR_OF(ControlFlowError),
               {"control flow changed in module \"\" (Branchy): this call ran 1 of the 2 recorded quantizeable ops; op 1 "
                "(linear (fc2)) did not run"}});
  r.push_back({"control_flow_extra_op_converted", Subject::kBranchy, Stage::kConverted,
               [](Case& c) { c.run(c.input(5, 1)); }, ERROR_OF(ControlFlowError),
               {"control flow changed in module \"\" (Branchy): op 2 is linear (fc1)"}});
  r.push_back({"control_flow_missing_op_converted", Subject::kBranchy, Stage::kConverted,
               [](Case& c) { c.run(c.input(1, 1)); }, ERROR_OF(ControlFlowError),
               {"this call ran 1 of the 2 recorded quantizeable ops"}});

  // ---- configuration ----
  r.push_back({"qconfig_mapping_unknown_module", cnn, Stage::kFp32,
               [](Case& c) {
                 QConfigMapping q = default_qconfig_mapping("onednn");
                 q.set_module_name("layer9.conv", nullptr);
                 prepare(*c.model, {c.good}, q);
               },
               ERROR_OF(ValueError),
               {"QConfigMapping names module(s) \"layer9.conv\" that do not exist in the model (SmallCnn)"},
               [](Case& c) {
                 EXPECT_FALSE(is_prepared(*c.model));
                 EXPECT_TRUE(bit_identical(c.run(c.good), c.ref));
                 prepare(*c.model, {c.good});  // a correct mapping still works
                 EXPECT_TRUE(is_prepared(*c.model));
               }});

  // ---- weights ----
  const auto drop_first = [](Case& c) {
    NamedTensors sd = c.model->state_dict();
    sd.erase(sd.begin());
    c.model->load_state_dict(sd);
  };
  const auto add_extra = [](Case& c) {
    NamedTensors sd = c.model->state_dict();
    sd.push_back({"head.weight", zeros({10, 64})});
    c.model->load_state_dict(sd);
  };
  const auto misshape = [](Case& c) {
    NamedTensors sd = c.model->state_dict();
    sd[0].second = zeros({16, 3, 3, 3});
    c.model->load_state_dict(sd);
  };
  r.push_back({"missing_weights_fp32", cnn, Stage::kFp32, drop_first, ERROR_OF(StateDictError),
               {"load_state_dict(strict) into SmallCnn: missing keys [conv1.weight]"}});
  r.push_back({"missing_weights_converted", cnn, Stage::kConverted, drop_first, ERROR_OF(StateDictError),
               {"missing keys [conv1.weight]"}});
  r.push_back({"unexpected_weights_fp32", cnn, Stage::kFp32, add_extra, ERROR_OF(StateDictError),
               {"load_state_dict(strict) into SmallCnn: unexpected keys [head.weight]"}});
  r.push_back({"misshaped_weights_fp32", cnn, Stage::kFp32, misshape, ERROR_OF(ShapeError),
               {"load_state_dict(strict) into SmallCnn: shape mismatch for [conv1.weight: expected [16, 1, 3, 3], got "
                "[16, 3, 3, 3]]"}});
  r.push_back({"misshaped_weights_converted", cnn, Stage::kConverted, misshape, ERROR_OF(ShapeError),
               {"shape mismatch for [conv1.weight"}});

  // ---- files ----
  r.push_back({"truncated_safetensors", cnn, Stage::kConverted,
               [](Case& c) {
                 const std::string bytes = serialize_safetensors(c.model->state_dict());
                 write_file(c.path("truncated.safetensors"), bytes.substr(0, bytes.size() - 100));
                 c.model->load_state_dict(load_safetensors(c.path("truncated.safetensors")));
               },
               ERROR_OF(FileFormatError), {"truncated.safetensors", "outside the data section", "(file truncated?)"}});
  r.push_back({"truncated_safetensors_header", cnn, Stage::kFp32,
               [](Case& c) {
                 write_file(c.path("short.safetensors"), std::string("\x10\x00\x00", 3));
                 c.model->load_state_dict(load_safetensors(c.path("short.safetensors")));
               },
               ERROR_OF(FileFormatError), {"short.safetensors", "shorter than the 8-byte header length"}});
  r.push_back({"malformed_safetensors_header", cnn, Stage::kConverted,
               [](Case& c) {
                 std::string bytes = serialize_safetensors(c.model->state_dict());
                 bytes[8] = '[';  // the JSON header must be an object
                 write_file(c.path("malformed.safetensors"), bytes);
                 c.model->load_state_dict(load_safetensors(c.path("malformed.safetensors")));
               },
               ERROR_OF(FileFormatError), {"malformed.safetensors"}});
  r.push_back({"missing_safetensors_file", cnn, Stage::kFp32,
               [](Case& c) { load_safetensors(c.path("does_not_exist.safetensors")); }, ERROR_OF(IOError),
               {"cannot open", "does_not_exist.safetensors"}});
  r.push_back({"quant_state_of_another_model", cnn, Stage::kPrepared,
               [](Case& c) {
                 load_quant_state(*c.model, saved_quant_state(Subject::kResNet, c.path("resnet.qstate.json"),
                                                           default_qconfig_mapping("onednn")));
               },
               ERROR_OF(StateMismatchError), {"resnet.qstate.json", "made for model ResNet18, this is SmallCnn"}});
  r.push_back({"quant_state_of_another_configuration", cnn, Stage::kCalibrating,
               [](Case& c) {
                 QConfigMapping q = default_qconfig_mapping("onednn");
                 q.set_module_name("fc", nullptr);  // fc stays fp32 there
                 load_quant_state(*c.model, saved_quant_state(Subject::kSmallCnn, c.path("cnn_fc_fp32.qstate.json"), q));
               },
               ERROR_OF(StateMismatchError), {"cnn_fc_fp32.qstate.json", "does not match this model"}});
  r.push_back({"malformed_quant_state", cnn, Stage::kCalibrating,
               [](Case& c) {
                 write_file(c.path("bad.qstate.json"), "{\"format\": \"dbrq.quant_state\", \"version\": 1, ");
                 load_quant_state(*c.model, c.path("bad.qstate.json"));
               },
               ERROR_OF(FileFormatError), {"bad.qstate.json"}});

  // ---- sizes that must work ----
  const auto zero_batch = [](Case& c) {
    const Tensor y = c.run(zeros({0, 1, 8, 8}));
    EXPECT_EQ(y.sizes(), IntArrayRef({0, 10}));
  };
  r.push_back({"zero_size_batch_fp32", cnn, Stage::kFp32, zero_batch, kWorks, {}});
  r.push_back({"zero_size_batch_calibrating", cnn, Stage::kCalibrating, zero_batch, kWorks, {}});
  r.push_back({"zero_size_batch_converted", cnn, Stage::kConverted, zero_batch, kWorks, {}});
  r.push_back({"batch_size_never_seen_converted", cnn, Stage::kConverted,
               [](Case& c) {
                 // Calibrated on batches of 2; a batch of 7 gives each sample what a batch of 1 gives it.
                 const Tensor x = c.input(7, 55);
                 const Tensor y = c.run(x);
                 ASSERT_EQ(y.sizes(), IntArrayRef({7, 10}));
                 for (int64_t i = 0; i < 7; ++i) {
                   EXPECT_TRUE(bit_identical(y.narrow(0, i, 1), c.run(x.narrow(0, i, 1).contiguous()))) << "sample " << i;
                 }
               },
               kWorks, {}});
  r.push_back({"batch_size_never_seen_resnet_converted", Subject::kResNet, Stage::kConverted,
               [](Case& c) { EXPECT_EQ(c.run(c.input(5, 55)).sizes(), IntArrayRef({5, 10})); }, kWorks, {}});
  r.push_back({"image_size_never_seen_converted", cnn, Stage::kConverted,
               [](Case& c) { EXPECT_EQ(c.run(randn({3, 1, 16, 12}, 5)).sizes(), IntArrayRef({3, 10})); }, kWorks, {}});
  r.push_back({"sequence_length_never_seen_converted", Subject::kBert, Stage::kConverted,
               [](Case& c) { EXPECT_EQ(c.run(zeros({3, 5}, DType::kS64)).sizes(), IntArrayRef({3, 5, 64})); }, kWorks,
               {}});
  return r;
}

// ---- the test ----------------------------------------------------------------------------------

class BadInput : public ::testing::TestWithParam<Row> {};

// The model's output for the good input, without feeding a calibrating model's observers.
Tensor run_quietly(Case& c) {
  const bool calibrating = is_prepared(*c.model) && !is_converted(*c.model);
  if (calibrating) disable_observers(*c.model);
  Tensor y = c.run(c.good);
  if (calibrating) enable_observers(*c.model);
  return y;
}

Case make_case(const Row& row) {
  Case c;
  c.subject = row.subject;
  c.stage = row.stage;
  c.dir = scratch_dir();
  c.model = make_subject(row.subject);
  bring_to(row.subject, *c.model, row.stage);
  if (row.stage == Stage::kPrepared || row.stage == Stage::kCalibrating) {
    c.twin = make_subject(row.subject);
    bring_to(row.subject, *c.twin, row.stage);
  }
  c.good = c.input(2, 42);
  c.ref = run_quietly(c);
  return c;
}

// Calibrates (two more batches) and converts a prepared model.
Tensor calibrate_convert_run(Case& c, nn::Module& m) {
  for (uint64_t seed : {201, 202}) run_subject(c.subject, m, c.input(2, seed));
  convert(m);
  return run_subject(c.subject, m, c.good);
}

TEST_P(BadInput, RaisesTheDocumentedErrorAndLeavesTheModelUsable) {
  const Row& row = GetParam();
  Case c = make_case(row);
  std::string what, type = "none";
  bool threw = false;
  try {
    row.bad(c);
  } catch (const std::exception& e) {
    threw = true;
    what = e.what();
    if (row.expect.type != nullptr && row.expect.matches(e)) type = row.expect.type;
    else type = std::string("unexpected exception (") + typeid(e).name() + ")";
  }
  std::cout << "[row] " << row.name << " | " << subject_name(row.subject) << " | " << stage_name(row.stage) << " | "
            << type << " | " << what << std::endl;
  if (row.expect.type == nullptr) {
    EXPECT_FALSE(threw) << "unexpected exception: " << what;
  } else {
    ASSERT_TRUE(threw) << "expected " << row.expect.type;
    EXPECT_EQ(type, row.expect.type) << "message: " << what;
    for (const std::string& s : row.message) {
      EXPECT_NE(what.find(s), std::string::npos) << "message: " << what << "\nexpected to contain: " << s;
    }
    // A location is added once, never twice.
    EXPECT_EQ(what.find("in module", what.find("in module") + 1), std::string::npos) << what;
  }
  if (::testing::Test::HasFatalFailure()) return;

  // Usable afterwards.
  EXPECT_EQ(current_interceptor(), nullptr);
  if (row.after) row.after(c);
  if (::testing::Test::HasFatalFailure()) return;
  const bool prepared = is_prepared(*c.model), converted = prepared && is_converted(*c.model);
  const bool same_stage = prepared == (c.stage != Stage::kFp32) && converted == (c.stage == Stage::kConverted);
  if (!same_stage) return;  // the row's `after` moved the model on (and checked it)
  // The same input gives the same output as before the bad call.
  EXPECT_TRUE(bit_identical(run_quietly(c), c.ref)) << "output changed after the bad call";
  if (c.twin == nullptr || row.twin == Twin::kDiverges || converted) return;
  // Prepared / calibrating: the observers are the twin's, and so is the converted model.
  EXPECT_TRUE(observer_stats(*c.model) == observer_stats(*c.twin)) << "the bad call changed the observers";
  const Tensor a = calibrate_convert_run(c, *c.model);
  const Tensor b = calibrate_convert_run(c, *c.twin);
  EXPECT_TRUE(bit_identical(a, b)) << "converted model differs from the twin's";
}

INSTANTIATE_TEST_SUITE_P(Table, BadInput, ::testing::ValuesIn(rows()),
                         [](const ::testing::TestParamInfo<Row>& info) { return info.param.name; });

// ---- user code that catches an error and goes on ---------------------------------------------

// A submodule that always fails (a dim out of range).
struct Broken : nn::CallableModule<Broken> {
  Tensor forward(const Tensor& x) { return x.flatten(5); }
};

// Catches the submodule's error inside its own forward and carries on with more quantizeable ops:
// the submodule's frame must be gone and this module's frame (and op cursor) intact.
struct Forgiving : nn::CallableModule<Forgiving> {
  Forgiving() {
    fc1 = register_module("fc1", std::make_shared<nn::LinearImpl>(4, 8));
    broken = register_module("broken", std::make_shared<Broken>());
    fc2 = register_module("fc2", std::make_shared<nn::LinearImpl>(8, 4));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = relu((*fc1)(x));
    try {
      (*broken)(y);
      failures_missed++;
    } catch (const Error& e) {
      last_error = e.what();
    }
    return (*fc2)(y);
  }
  std::shared_ptr<nn::LinearImpl> fc1, fc2;
  std::shared_ptr<Broken> broken;
  std::string last_error;
  int failures_missed = 0;
};

TEST(Recovery, AnErrorCaughtInsideForwardLeavesTheCallersFramesIntact) {
  manual_seed(3);
  auto model = std::make_shared<Forgiving>();
  model->eval();
  const Tensor x = randn({2, 4}, 1);
  const Tensor fp32 = (*model)(x);
  EXPECT_NE(model->last_error.find("flatten: dim 5 is out of range for a 2-D tensor"), std::string::npos)
      << model->last_error;
  prepare(*model, {x});
  // With observers off exactly fp32 (observing calls sum linear in PyTorch's order).
  disable_observers(*model);
  EXPECT_TRUE(bit_identical((*model)(x), fp32));
  enable_observers(*model);
  (*model)(x);
  // Located in the submodule ("in module \"broken\" (Broken), ...").
  EXPECT_NE(model->last_error.find("in module \"broken\" (Broken)"), std::string::npos) << model->last_error;
  for (uint64_t seed : {2, 3, 4}) (*model)(randn({2, 4}, seed));
  convert(*model);
  const Tensor a = (*model)(x);
  const Tensor b = (*model)(x);
  EXPECT_TRUE(bit_identical(a, b));
  EXPECT_EQ(model->failures_missed, 0);
  EXPECT_EQ(current_interceptor(), nullptr);
  // The converted model still computes the fp32 model's function.
  double max_err = 0.0;
  const std::vector<float> va = a.to_vector<float>(), vf = fp32.to_vector<float>();
  for (size_t i = 0; i < va.size(); ++i) max_err = std::max(max_err, static_cast<double>(std::abs(va[i] - vf[i])));
  EXPECT_LT(max_err, 0.1);
}

}  // namespace
}  // namespace dbrq
