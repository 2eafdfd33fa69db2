// Module tree tests: registration of children, parameters and buffers; fully qualified names from
// named_modules / named_parameters / named_buffers / state_dict over Sequential, ModuleList and
// ModuleDict; find_module; train()/eval() and Dropout; load_state_dict (strict errors, non-strict
// reports, dtype conversion, writes into existing storage); pretty printing; forward_unary; layer
// option validation; PyTorch-like default initialization and manual_seed.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "dbrq.h"
#include "tests/test_util.h"

namespace dbrq {
namespace {

using BatchNorm2d = nn::BatchNorm2dImpl;
using Conv2d = nn::Conv2dImpl;
using Linear = nn::LinearImpl;
using nn::LoadReport;
using nn::Module;
using ModuleDict = nn::ModuleDictImpl;
using ModuleList = nn::ModuleListImpl;
using ReLU = nn::ReLUImpl;
using Sequential = nn::SequentialImpl;
using testing::expect_equal;

std::vector<std::string> names_of(const NamedTensors& named) {
  std::vector<std::string> out;
  for (const auto& [n, t] : named) out.push_back(n);
  return out;
}

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Module*>>& named) {
  std::vector<std::string> out;
  for (const auto& [n, m] : named) out.push_back(n);
  return out;
}

// A plain user module with its own parameter and buffer.
struct Block : nn::CallableModule<Block> {
  explicit Block(int64_t c) {
    conv = register_module("conv", std::make_shared<Conv2d>(c, c, 3, 1, 1));
    act = register_module("act", std::make_shared<ReLU>());
  }
  Tensor forward(const Tensor& x) { return (*act)((*conv)(x)) + x; }
  std::shared_ptr<Conv2d> conv;
  std::shared_ptr<ReLU> act;
};

// Three levels: Net -> {Sequential, ModuleList of Blocks, ModuleDict of Linears} -> layers.
struct Net : nn::CallableModule<Net> {
  Net() {
    features = register_module("features", std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
                                               std::make_shared<Conv2d>(3, 4, 3, 1, 1),
                                               std::make_shared<BatchNorm2d>(4), std::make_shared<ReLU>()}));
    blocks = register_module("blocks", std::make_shared<ModuleList>());
    blocks->push_back(std::make_shared<Block>(4));
    blocks->push_back(std::make_shared<Block>(4));
    heads = register_module("heads", std::make_shared<ModuleDict>());
    heads->insert("cls", std::make_shared<Linear>(4, 3));
    heads->insert("box", std::make_shared<Linear>(4, 2, /*bias=*/false));
    // Registered after the children: PyTorch still lists a module's own tensors first.
    scale = register_parameter("scale", ones({1}));
    step = register_buffer("step", zeros(IntArrayRef{}, DType::kS64));
  }
  Tensor forward(const Tensor& x) {
    Tensor y = (*features)(x);
    for (const auto& b : *blocks) y = b->forward_unary(y);
    y = mean(y, {2, 3});
    return (*heads)["cls"]->forward_unary(y) * scale;
  }
  std::shared_ptr<Sequential> features;
  std::shared_ptr<ModuleList> blocks;
  std::shared_ptr<ModuleDict> heads;
  Tensor scale, step;
};

// A copy of every tensor of a state dict (values, not shared storage).
NamedTensors snapshot(const NamedTensors& sd) {
  NamedTensors out;
  for (const auto& [n, t] : sd) out.emplace_back(n, t.clone());
  return out;
}

void expect_same_values(const NamedTensors& actual, const NamedTensors& expected) {
  ASSERT_EQ(names_of(actual), names_of(expected));
  for (size_t i = 0; i < actual.size(); ++i) expect_equal(actual[i].second, expected[i].second, actual[i].first);
}

// ---------------------------------------------------------------------------------------------
// registration

TEST(ModuleRegistration, RegisterModuleReturnsTypedPointerAndKeepsOrder) {
  struct M : nn::CallableModule<M> {
    Tensor forward(const Tensor& x) { return x; }
  };
  auto m = std::make_shared<M>();
  auto lin = std::make_shared<Linear>(2, 3);
  std::shared_ptr<Linear> got = m->register_module("b", lin);
  EXPECT_EQ(got, lin);
  m->register_module("a", std::make_shared<ReLU>());
  ASSERT_EQ(m->named_children().size(), 2u);
  EXPECT_EQ(m->named_children()[0].first, "b");
  EXPECT_EQ(m->named_children()[1].first, "a");
  EXPECT_EQ(m->child("b"), lin);
  EXPECT_EQ(m->child("zzz"), nullptr);
  EXPECT_EQ(m->children().size(), 2u);
  EXPECT_EQ(m->type_name(), "M");
  EXPECT_FALSE(m->is_leaf());
  EXPECT_TRUE(lin->is_leaf());
}

TEST(ModuleRegistration, RegisterParameterAndBufferShareStorageAndReplace) {
  auto m = std::make_shared<Sequential>();
  Tensor w = from_vector<float>({1, 2, 3});
  Tensor got = m->register_parameter("w", w);
  EXPECT_EQ(got.storage(), w.storage());
  m->register_parameter("v", zeros({2}));
  m->register_buffer("b", ones({1}));
  // Replacing keeps the position and the count.
  Tensor w2 = from_vector<float>({7, 8});
  Tensor got2 = m->register_parameter("w", w2);
  EXPECT_EQ(got2.storage(), w2.storage());
  auto params = m->named_parameters();
  ASSERT_EQ(names_of(params), (std::vector<std::string>{"w", "v"}));
  EXPECT_EQ(params[0].second.storage(), w2.storage());
  m->register_buffer("b", full({3}, 5.0));
  auto buffers = m->named_buffers();
  ASSERT_EQ(names_of(buffers), (std::vector<std::string>{"b"}));
  EXPECT_EQ(buffers[0].second.numel(), 3);
  EXPECT_EQ(m->parameters_map().size(), 2u);
  EXPECT_EQ(m->buffers_map().size(), 1u);
}

TEST(ModuleRegistration, BadNamesThrowValueError) {
  auto m = std::make_shared<Sequential>();
  EXPECT_THROW_MSG(m->register_module("a.b", std::make_shared<ReLU>()), ValueError, "must not contain '.'");
  EXPECT_THROW_MSG(m->register_module("", std::make_shared<ReLU>()), ValueError, "must be non-empty");
  EXPECT_THROW_MSG(m->register_parameter("w.x", zeros({1})), ValueError, "parameter name \"w.x\"");
  EXPECT_THROW_MSG(m->register_buffer(".", zeros({1})), ValueError, "buffer name \".\"");
  EXPECT_THROW_MSG(m->register_module("n", std::shared_ptr<ReLU>()), ValueError, "module is null");
  EXPECT_TRUE(m->named_children().empty());
  EXPECT_TRUE(m->named_parameters().empty());
  EXPECT_TRUE(m->named_buffers().empty());
}

TEST(ModuleRegistration, DuplicateChildNameThrows) {
  auto seq = std::make_shared<Sequential>();
  seq->push_back("x", std::make_shared<ReLU>());
  EXPECT_THROW_MSG(seq->push_back("x", std::make_shared<ReLU>()), ValueError,
                   "a child named \"x\" already exists in Sequential");
  EXPECT_EQ(seq->size(), 1u);
  auto dict = std::make_shared<ModuleDict>();
  dict->insert("k", std::make_shared<ReLU>());
  EXPECT_THROW_MSG(dict->insert("k", std::make_shared<ReLU>()), ValueError, "already exists in ModuleDict");
}

TEST(ModuleRegistration, ModuleCannotContainItself) {
  auto seq = std::make_shared<Sequential>();
  EXPECT_THROW_MSG(seq->push_back("me", seq), ValueError, "cannot contain itself");
}

TEST(ModuleRegistration, ReplaceModule) {
  auto net = std::make_shared<Net>();
  auto fresh = std::make_shared<Linear>(4, 3);
  net->heads->replace_module("cls", fresh);
  EXPECT_EQ((*net->heads)["cls"], fresh);
  EXPECT_EQ(net->heads->keys(), (std::vector<std::string>{"cls", "box"}));
  EXPECT_THROW_MSG(net->heads->replace_module("nope", fresh), IndexError, "ModuleDict has no child named \"nope\"");
  EXPECT_THROW_MSG(net->heads->replace_module("cls", nullptr), ValueError, "module is null");
}

TEST(ModuleRegistration, ContainerAccessErrors) {
  auto net = std::make_shared<Net>();
  EXPECT_EQ(net->features->size(), 3u);
  EXPECT_NE(net->features->at<Conv2d>(0), nullptr);
  EXPECT_THROW_MSG(net->features->at<Linear>(0), ValueError, "Sequential::at(0): child is a Conv2d, not a Linear");
  EXPECT_THROW_MSG((*net->features)[3], IndexError, "index 3 is out of range for 3 modules");
  EXPECT_EQ(net->blocks->size(), 2u);
  EXPECT_NE(net->blocks->at<Block>(1), nullptr);
  EXPECT_THROW_MSG(net->blocks->at<Conv2d>(1), ValueError, "ModuleList::at(1): child is a Block");
  EXPECT_THROW_MSG((*net->blocks)[2], IndexError, "ModuleList: index 2 is out of range for 2 modules");
  EXPECT_TRUE(net->heads->contains("box"));
  EXPECT_FALSE(net->heads->contains("nope"));
  EXPECT_THROW_MSG((*net->heads)["nope"], IndexError, "no module under key \"nope\"");
}

TEST(ModuleRegistration, TypeNamesDropNamespacesAndTemplateArguments) {
  auto net = std::make_shared<Net>();
  EXPECT_EQ(net->type_name(), "Net");
  EXPECT_EQ(nn::detail::demangle_type_name(typeid(std::vector<int>).name()), "vector");
  EXPECT_EQ(net->blocks->at<Block>(0)->type_name(), "Block");
  EXPECT_EQ(net->blocks->type_name(), "ModuleList");
  EXPECT_EQ(net->heads->type_name(), "ModuleDict");
}

// ---------------------------------------------------------------------------------------------
// fully qualified names

TEST(ModuleNames, NamedModulesDepthFirstInRegistrationOrder) {
  auto net = std::make_shared<Net>();
  const std::vector<std::string> expected = {
      "",         "features",      "features.0",   "features.1", "features.2",    "blocks",
      "blocks.0", "blocks.0.conv", "blocks.0.act", "blocks.1",   "blocks.1.conv", "blocks.1.act",
      "heads",    "heads.cls",     "heads.box"};
  auto named = net->named_modules();
  EXPECT_EQ(names_of(named), expected);
  EXPECT_EQ(named[0].second, net.get());
  EXPECT_EQ(named[7].second, net->blocks->at<Block>(0)->conv.get());
  EXPECT_EQ(named[7].second->type_name(), "Conv2d");

  auto prefixed = net->named_modules("model", /*include_self=*/false);
  ASSERT_EQ(prefixed.size(), expected.size() - 1);
  EXPECT_EQ(prefixed[0].first, "model.features");
  EXPECT_EQ(prefixed.back().first, "model.heads.box");
  EXPECT_EQ(names_of(net->named_modules("", false)).front(), "features");
}

TEST(ModuleNames, NamedParametersBuffersAndStateDict) {
  auto net = std::make_shared<Net>();
  EXPECT_EQ(
      names_of(net->named_parameters()),
      (std::vector<std::string>{"scale", "features.0.weight", "features.0.bias", "features.1.weight", "features.1.bias",
                                "blocks.0.conv.weight", "blocks.0.conv.bias", "blocks.1.conv.weight",
                                "blocks.1.conv.bias", "heads.cls.weight", "heads.cls.bias", "heads.box.weight"}));
  EXPECT_EQ(names_of(net->named_parameters(/*recurse=*/false)), (std::vector<std::string>{"scale"}));
  EXPECT_EQ(names_of(net->named_buffers()),
            (std::vector<std::string>{"step", "features.1.running_mean", "features.1.running_var",
                                      "features.1.num_batches_tracked"}));
  EXPECT_EQ(names_of(net->named_buffers(false)), (std::vector<std::string>{"step"}));
  // PyTorch's state_dict order: each module's parameters, then its buffers, then its children.
  EXPECT_EQ(names_of(net->state_dict()),
            (std::vector<std::string>{"scale", "step", "features.0.weight", "features.0.bias", "features.1.weight",
                                      "features.1.bias", "features.1.running_mean", "features.1.running_var",
                                      "features.1.num_batches_tracked", "blocks.0.conv.weight", "blocks.0.conv.bias",
                                      "blocks.1.conv.weight", "blocks.1.conv.bias", "heads.cls.weight",
                                      "heads.cls.bias", "heads.box.weight"}));
  // Entries share storage with the modules' tensors.
  auto sd = net->state_dict();
  EXPECT_EQ(sd[2].second.storage(), net->features->at<Conv2d>(0)->weight.storage());
  EXPECT_EQ(sd[1].second.dtype(), DType::kS64);
  EXPECT_EQ(sd[8].second.dim(), 0);
}

TEST(ModuleNames, FindModule) {
  auto net = std::make_shared<Net>();
  EXPECT_EQ(net->find_module(""), net.get());
  EXPECT_EQ(net->find_module("features"), net->features.get());
  EXPECT_EQ(net->find_module("features.1"), (*net->features)[1].get());
  EXPECT_EQ(net->find_module("blocks.1.conv"), net->blocks->at<Block>(1)->conv.get());
  EXPECT_EQ(net->find_module("heads.box"), (*net->heads)["box"].get());
  EXPECT_EQ(net->find_module("nope"), nullptr);
  EXPECT_EQ(net->find_module("blocks.2"), nullptr);
  EXPECT_EQ(net->find_module("blocks.1.conv.weight"), nullptr);  // a parameter, not a module
  EXPECT_EQ(net->find_module("blocks..conv"), nullptr);
  EXPECT_EQ(net->find_module("blocks."), nullptr);
  EXPECT_EQ(net->find_module(".blocks"), nullptr);
  // Every name named_modules reports resolves back to its module.
  for (auto& [name, m] : net->named_modules()) EXPECT_EQ(net->find_module(name), m) << name;
}

// ---------------------------------------------------------------------------------------------
// train / eval

TEST(ModuleTraining, TrainAndEvalRecurse) {
  auto net = std::make_shared<Net>();
  for (auto& [name, m] : net->named_modules()) EXPECT_TRUE(m->is_training()) << name;
  net->eval();
  for (auto& [name, m] : net->named_modules()) EXPECT_FALSE(m->is_training()) << name;
  net->blocks->train();
  EXPECT_FALSE(net->is_training());
  EXPECT_TRUE(net->find_module("blocks.1.act")->is_training());
  EXPECT_FALSE(net->find_module("features.0")->is_training());
  net->train(false);
  EXPECT_FALSE(net->find_module("blocks.1.act")->is_training());
}

TEST(ModuleTraining, DropoutOnlyActsInTraining) {
  auto seq = std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{std::make_shared<nn::DropoutImpl>(0.5)});
  Tensor x = ones({2000});
  Tensor y = (*seq)(x);  // modules start in training mode, like PyTorch
  int64_t zeros_count = 0;
  for (float v : y.to_vector<float>()) {
    ASSERT_TRUE(v == 0.f || v == 2.f) << v;  // kept values are scaled by 1/(1-p)
    zeros_count += v == 0.f;
  }
  EXPECT_GT(zeros_count, 800);
  EXPECT_LT(zeros_count, 1200);
  EXPECT_EQ(x.to_vector<float>(), std::vector<float>(2000, 1.f));  // input untouched
  seq->eval();
  expect_equal((*seq)(x), x, "eval dropout");
  seq->train();
  auto zero_p = std::make_shared<nn::DropoutImpl>(0.0);
  expect_equal((*zero_p)(x), x, "p=0 dropout");
  auto all = std::make_shared<nn::DropoutImpl>(1.0);
  expect_equal((*all)(x), zeros({2000}), "p=1 dropout");
  EXPECT_EQ(std::make_shared<nn::DropoutImpl>(0.25)->to_string(), "Dropout(p=0.25)");
}

// ---------------------------------------------------------------------------------------------
// load_state_dict

TEST(LoadStateDict, StrictRoundTripBetweenModels) {
  manual_seed(1);
  auto a = std::make_shared<Net>();
  manual_seed(2);
  auto b = std::make_shared<Net>();
  a->eval();
  b->eval();
  Tensor x = randn({1, 3, 5, 5}, 7);
  // Different seeds: different outputs.
  EXPECT_GT(testing::relative_error((*a)(x), (*b)(x)), 1e-3);
  LoadReport r = b->load_state_dict(a->state_dict());
  EXPECT_TRUE(r.ok());
  expect_same_values(b->state_dict(), a->state_dict());
  expect_equal((*b)(x), (*a)(x), "outputs after loading");
  // The map overload works the same way.
  std::map<std::string, Tensor> as_map;
  for (auto& [n, t] : a->state_dict()) as_map[n] = t;
  auto c = std::make_shared<Net>();
  EXPECT_TRUE(c->load_state_dict(as_map).ok());
  expect_same_values(c->state_dict(), a->state_dict());
}

TEST(LoadStateDict, StrictMissingKeysListedAndNothingModified) {
  auto net = std::make_shared<Net>();
  const NamedTensors before = snapshot(net->state_dict());
  NamedTensors sd;
  for (auto& [n, t] : net->state_dict()) {
    if (n == "features.1.running_var" || n == "heads.box.weight") continue;
    sd.emplace_back(n, full(t.sizes(), 0.5, t.dtype()));
  }
  EXPECT_THROW_MSG(net->load_state_dict(sd), StateDictError, "missing keys [features.1.running_var, heads.box.weight]");
  expect_same_values(net->state_dict(), before);
}

TEST(LoadStateDict, StrictUnexpectedKeysListedAndNothingModified) {
  auto net = std::make_shared<Net>();
  const NamedTensors before = snapshot(net->state_dict());
  NamedTensors sd;
  for (auto& [n, t] : net->state_dict()) sd.emplace_back(n, full(t.sizes(), 0.5, t.dtype()));
  sd.emplace_back("heads.extra.weight", zeros({2}));
  sd.emplace_back("bogus", zeros({1}));
  EXPECT_THROW_MSG(net->load_state_dict(sd), StateDictError, "unexpected keys [heads.extra.weight, bogus]");
  expect_same_values(net->state_dict(), before);
}

TEST(LoadStateDict, StrictMissingAndUnexpectedInOneMessage) {
  auto lin = std::make_shared<Linear>(2, 3);
  NamedTensors sd = {{"weight", zeros({3, 2})}, {"bais", zeros({3})}};
  try {
    lin->load_state_dict(sd);
    ADD_FAILURE() << "expected StateDictError";
  } catch (const StateDictError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("into Linear"), std::string::npos) << msg;
    EXPECT_NE(msg.find("missing keys [bias]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("unexpected keys [bais]"), std::string::npos) << msg;
  }
  EXPECT_NE(lin->weight.to_vector<float>(), std::vector<float>(6, 0.f));
}

TEST(LoadStateDict, StrictShapeMismatchListsEveryNameAndNothingModified) {
  auto net = std::make_shared<Net>();
  const NamedTensors before = snapshot(net->state_dict());
  NamedTensors sd;
  for (auto& [n, t] : net->state_dict()) {
    if (n == "features.0.weight") {
      sd.emplace_back(n, zeros({4, 3, 5, 5}));
    } else if (n == "heads.cls.bias") {
      sd.emplace_back(n, zeros({4}));
    } else if (n == "heads.cls.weight") {
      sd.emplace_back(n, Tensor());
    } else {
      sd.emplace_back(n, full(t.sizes(), 0.5, t.dtype()));
    }
  }
  try {
    net->load_state_dict(sd);
    ADD_FAILURE() << "expected ShapeError";
  } catch (const ShapeError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("features.0.weight: expected [4, 3, 3, 3], got [4, 3, 5, 5]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("heads.cls.bias: expected [3], got [4]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("heads.cls.weight: expected [3, 4], got undefined"), std::string::npos) << msg;
  }
  expect_same_values(net->state_dict(), before);
}

// A tensor of another shape throws even when not strict, as PyTorch's (it was skipped, the old
// values kept, and listed only in a report the caller may ignore), and nothing is loaded.
TEST(LoadStateDict, NonStrictShapeMismatchThrowsAndNothingModified) {
  auto net = std::make_shared<Net>();
  const NamedTensors before = snapshot(net->state_dict());
  NamedTensors sd = {{"heads.cls.weight", full({3, 4}, 0.25)},
                     {"heads.cls.bias", full({5}, 1.0)},  // wrong shape
                     {"not.there", zeros({1})}};
  EXPECT_THROW_MSG(net->load_state_dict(sd, /*strict=*/false), ShapeError,
                   "load_state_dict(strict=false) into Net: shape mismatch for [heads.cls.bias: expected [3], got [5]]");
  expect_same_values(net->state_dict(), before);
}

TEST(LoadStateDict, NonStrictLoadsWhatMatchesAndReports) {
  auto net = std::make_shared<Net>();
  const NamedTensors before = snapshot(net->state_dict());
  NamedTensors sd = {{"heads.cls.weight", full({3, 4}, 0.25)},
                     {"features.1.running_mean", full({4}, -1.0)},
                     {"not.there", zeros({1})}};
  LoadReport r = net->load_state_dict(sd, /*strict=*/false);
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.unexpected_keys, std::vector<std::string>{"not.there"});
  EXPECT_EQ(r.missing_keys.size(), before.size() - 2);
  EXPECT_EQ(r.missing_keys.front(), "scale");
  EXPECT_EQ(r.missing_keys.back(), "heads.box.weight");
  auto cls = std::dynamic_pointer_cast<Linear>((*net->heads)["cls"]);
  expect_equal(cls->weight, full({3, 4}, 0.25), "loaded weight");
  expect_equal(net->features->at<BatchNorm2d>(1)->running_mean, full({4}, -1.0), "loaded buffer");
  // Everything else is untouched.
  for (size_t i = 0; i < before.size(); ++i) {
    const std::string& n = before[i].first;
    if (n == "heads.cls.weight" || n == "features.1.running_mean") continue;
    expect_equal(net->state_dict()[i].second, before[i].second, n);
  }
}

TEST(LoadStateDict, ConvertsDtypes) {
  auto bn = std::make_shared<BatchNorm2d>(3);
  // bf16 into f32, s32 into f32, f32 into the s64 counter.
  Tensor w_bf16 = from_vector<float>({1.5f, -2.0f, 0.15625f}).to(DType::kBF16);
  ASSERT_EQ(w_bf16.dtype(), DType::kBF16);
  NamedTensors sd = {{"weight", w_bf16},
                     {"bias", from_vector<int32_t>({1, -2, 3})},
                     {"running_mean", from_vector<float>({0.5f, 0.25f, 0.125f})},
                     {"running_var", from_vector<int64_t>({4, 5, 6})},
                     {"num_batches_tracked", full(IntArrayRef{}, 12.0)}};
  EXPECT_TRUE(bn->load_state_dict(sd).ok());
  EXPECT_EQ(bn->weight.dtype(), DType::kF32);
  EXPECT_EQ(bn->weight.to_vector<float>(), (std::vector<float>{1.5f, -2.0f, 0.15625f}));
  EXPECT_EQ(bn->bias.to_vector<float>(), (std::vector<float>{1.f, -2.f, 3.f}));
  EXPECT_EQ(bn->running_var.to_vector<float>(), (std::vector<float>{4.f, 5.f, 6.f}));
  EXPECT_EQ(bn->num_batches_tracked.dtype(), DType::kS64);
  EXPECT_EQ(bn->num_batches_tracked.item<int64_t>(), 12);
}

// F16 arrives through safetensors (dbrq has no f16 tensors) and lands in f32 parameters.
TEST(LoadStateDict, LoadsF16SafetensorsIntoF32) {
  // 1.0, -0.5, 2.0, 0.25, 65504, -3 as IEEE half.
  const uint16_t w[] = {0x3c00, 0xb800, 0x4000, 0x3400, 0x7bff, 0xc200};
  const uint16_t b[] = {0x3e00, 0x0000, 0x8000};  // 1.5, 0, -0
  const std::string header = R"({"bias":{"dtype":"F16","shape":[3],"data_offsets":[12,18]},)"
                             R"("weight":{"dtype":"F16","shape":[3,2],"data_offsets":[0,12]}})";
  std::string bytes(8, '\0');
  bytes[0] = static_cast<char>(header.size());
  bytes += header;
  bytes.append(reinterpret_cast<const char*>(w), sizeof(w));
  bytes.append(reinterpret_cast<const char*>(b), sizeof(b));
  auto lin = std::make_shared<Linear>(2, 3);
  EXPECT_TRUE(lin->load_state_dict(parse_safetensors(bytes)).ok());
  EXPECT_EQ(lin->weight.to_vector<float>(), (std::vector<float>{1.f, -0.5f, 2.f, 0.25f, 65504.f, -3.f}));
  EXPECT_EQ(lin->bias.to_vector<float>(), (std::vector<float>{1.5f, 0.f, -0.f}));
  EXPECT_TRUE(std::signbit(lin->bias.to_vector<float>()[2]));
}

TEST(LoadStateDict, WritesIntoExistingStorage) {
  auto conv = std::make_shared<Conv2d>(1, 2, 1);
  Tensor held = conv->weight;  // a copy held elsewhere (e.g. by a prepacking cache)
  Tensor held_param = conv->named_parameters()[0].second;
  const void* data_before = conv->weight.data_ptr();
  const auto storage_before = conv->weight.storage();
  const uint64_t version_before = storage_before->version();
  LoadReport r = conv->load_state_dict(NamedTensors{{"weight", from_vector<float>({3.f, 4.f}, {2, 1, 1, 1})},
                                                    {"bias", from_vector<float>({-1.f, 1.f})}});
  EXPECT_TRUE(r.ok());
  EXPECT_EQ(conv->weight.data_ptr(), data_before);
  EXPECT_EQ(conv->weight.storage(), storage_before);
  EXPECT_GT(storage_before->version(), version_before);  // caches of prepacked weights see the write
  EXPECT_EQ(held.to_vector<float>(), (std::vector<float>{3.f, 4.f}));
  EXPECT_EQ(held_param.to_vector<float>(), (std::vector<float>{3.f, 4.f}));
  EXPECT_EQ(conv->bias.to_vector<float>(), (std::vector<float>{-1.f, 1.f}));
  // And the layer computes with them: 1x1 conv of a ones input.
  Tensor y = (*conv)(ones({1, 1, 1, 1}));
  EXPECT_EQ(y.to_vector<float>(), (std::vector<float>{2.f, 5.f}));
}

TEST(LoadStateDict, NotSeenByAnInterceptor) {
  // Loading is not part of the model's computation: an active interceptor sees no ops.
  struct Counting : Interceptor {
    int ops = 0;
    Tensor on_op(const OpCall& c) override {
      ++ops;
      return c.run(c);
    }
    void on_module_enter(Module&, absl::Span<Tensor* const>) override {}
    void on_module_exit(Module&, absl::Span<Tensor* const>) override {}
    void on_module_unwind(Module&) noexcept override {}
  } counting;
  auto lin = std::make_shared<Linear>(2, 1);
  InterceptorScope scope(&counting);
  lin->load_state_dict(NamedTensors{{"weight", ones({1, 2})}, {"bias", zeros({1})}});
  EXPECT_EQ(counting.ops, 0);
  EXPECT_EQ(lin->weight.to_vector<float>(), (std::vector<float>{1.f, 1.f}));
}

// ---------------------------------------------------------------------------------------------
// printing

TEST(ModulePrinting, TreeWithExtraRepr) {
  struct Small : nn::CallableModule<Small> {
    Small() {
      features = register_module(
          "features", std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
                          std::make_shared<Conv2d>(nn::Conv2dOptions(3, 8, 3).stride(2).padding(1).bias(false)),
                          std::make_shared<BatchNorm2d>(8), std::make_shared<ReLU>()}));
      head = register_module("head", std::make_shared<Linear>(8, 2));
    }
    Tensor forward(const Tensor& x) { return (*head)((*features)(x)); }
    std::shared_ptr<Sequential> features;
    std::shared_ptr<Linear> head;
  };
  auto m = std::make_shared<Small>();
  const std::string expected =
      "Small(\n"
      "  (features): Sequential(\n"
      "    (0): Conv2d(3, 8, kernel_size=(3, 3), stride=(2, 2), padding=(1, 1), bias=False)\n"
      "    (1): BatchNorm2d(8, eps=1e-05)\n"
      "    (2): ReLU()\n"
      "  )\n"
      "  (head): Linear(in_features=8, out_features=2, bias=True)\n"
      ")";
  EXPECT_EQ(m->to_string(), expected);
  std::ostringstream os;
  os << *m;
  EXPECT_EQ(os.str(), expected);
}

TEST(ModulePrinting, LayerExtraRepr) {
  EXPECT_EQ(Conv2d(4, 8, 3).to_string(), "Conv2d(4, 8, kernel_size=(3, 3), stride=(1, 1))");
  EXPECT_EQ(Conv2d(nn::Conv2dOptions(4, 8, {1, 3}).dilation(2).groups(4)).to_string(),
            "Conv2d(4, 8, kernel_size=(1, 3), stride=(1, 1), dilation=(2, 2), groups=4)");
  EXPECT_EQ(Linear(3, 5, false).to_string(), "Linear(in_features=3, out_features=5, bias=False)");
  EXPECT_EQ(BatchNorm2d(16, 1e-3).to_string(), "BatchNorm2d(16, eps=0.001)");
  EXPECT_EQ(nn::MaxPool2dImpl(3, 2, 1).to_string(),
            "MaxPool2d(kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=False)");
  EXPECT_EQ(nn::AdaptiveAvgPool2dImpl(1).to_string(), "AdaptiveAvgPool2d(output_size=(1, 1))");
  EXPECT_EQ(nn::LayerNormImpl(6).to_string(), "LayerNorm((6,), eps=1e-05)");
  EXPECT_EQ(nn::EmbeddingImpl(10, 4).to_string(), "Embedding(10, 4)");
  EXPECT_EQ(Sequential().to_string(), "Sequential()");
  EXPECT_EQ(ModuleList().to_string(), "ModuleList()");
}

// ---------------------------------------------------------------------------------------------
// forward_unary

struct TwoInputs : nn::CallableModule<TwoInputs> {
  Tensor forward(const Tensor& a, const Tensor& b) { return a + b; }
};

struct ReturnsPair : nn::CallableModule<ReturnsPair> {
  std::vector<Tensor> forward(const Tensor& a) { return {a, a}; }
};

struct ByValue : nn::CallableModule<ByValue> {
  Tensor forward(Tensor a) { return a * 2.0; }
};

TEST(ForwardUnary, WorksForSingleTensorForwards) {
  auto m = std::make_shared<ByValue>();
  Module& base = *m;
  expect_equal(base.forward_unary(ones({2})), full({2}, 2.0), "by-value forward");
  auto relu = std::make_shared<ReLU>();
  expect_equal(static_cast<Module&>(*relu).forward_unary(from_vector<float>({-1, 2})), from_vector<float>({0, 2}),
               "relu");
}

TEST(ForwardUnary, ThrowsForOtherSignatures) {
  EXPECT_THROW_MSG(std::make_shared<TwoInputs>()->forward_unary(ones({1})), ValueError,
                   "TwoInputs cannot be called with a single tensor");
  EXPECT_THROW_MSG(std::make_shared<ReturnsPair>()->forward_unary(ones({1})), ValueError,
                   "ReturnsPair cannot be called with a single tensor");
  EXPECT_THROW_MSG(std::make_shared<ModuleList>()->forward_unary(ones({1})), ValueError,
                   "ModuleList cannot be called with a single tensor");
  EXPECT_THROW_MSG(std::make_shared<ModuleDict>()->forward_unary(ones({1})), ValueError, "ModuleDict cannot be called");
  // Sequential surfaces the error of a child it cannot call.
  auto seq = std::make_shared<Sequential>(
      std::vector<std::shared_ptr<Module>>{std::make_shared<ReLU>(), std::make_shared<TwoInputs>()});
  EXPECT_THROW_MSG((*seq)(ones({1})), ValueError, "TwoInputs cannot be called with a single tensor");
  // The direct call still works.
  expect_equal((*std::make_shared<TwoInputs>())(ones({1}), ones({1})), full({1}, 2.0), "two inputs");
}

TEST(ForwardUnary, SequentialChainsChildren) {
  auto seq = std::make_shared<Sequential>(std::vector<std::pair<std::string, std::shared_ptr<Module>>>{
      {"double", std::make_shared<ByValue>()}, {"relu", std::make_shared<ReLU>()}});
  EXPECT_EQ(seq->named_children()[0].first, "double");
  expect_equal((*seq)(from_vector<float>({-1, 3})), from_vector<float>({0, 6}), "sequential");
  seq->push_back(std::make_shared<ByValue>());
  EXPECT_EQ(seq->named_children()[2].first, "2");
  expect_equal((*seq)(from_vector<float>({-1, 3})), from_vector<float>({0, 12}), "sequential");
  expect_equal((*std::make_shared<Sequential>())(ones({2})), ones({2}), "empty sequential");
}

// ---------------------------------------------------------------------------------------------
// layer options

TEST(LayerOptions, InvalidOptionsThrowValueError) {
  EXPECT_THROW_MSG(Conv2d(6, 8, 3, 1, 0, 1, /*groups=*/4), ValueError,
                   "Conv2d: in_channels (6) and out_channels (8) must be divisible by groups (4)");
  EXPECT_THROW_MSG(Conv2d(4, 6, 3, 1, 0, 1, /*groups=*/4), ValueError, "must be divisible by groups (4)");
  EXPECT_THROW_MSG(Conv2d(4, 4, 3, 1, 0, 1, /*groups=*/0), ValueError, "must be divisible by groups (0)");
  EXPECT_THROW_MSG(Conv2d(0, 4, 3), ValueError, "in_channels and out_channels must be >= 1, got 0 and 4");
  EXPECT_THROW_MSG(Conv2d(nn::Conv2dOptions(2, 2, {3, 0})), ValueError, "kernel_size must be >= 1, got (3, 0)");
  EXPECT_THROW_MSG(Linear(-1, 4), ValueError, "Linear: feature counts must be >= 0, got -1 and 4");
  EXPECT_THROW_MSG(BatchNorm2d(0), ValueError, "BatchNorm2d: num_features must be >= 1, got 0");
  EXPECT_THROW_MSG(nn::BatchNorm1dImpl(-3), ValueError, "BatchNorm1d: num_features must be >= 1, got -3");
  EXPECT_THROW_MSG(nn::LayerNormImpl(std::vector<int64_t>{}), ValueError, "normalized_shape must not be empty");
  EXPECT_THROW_MSG(nn::EmbeddingImpl(0, 4), ValueError, "Embedding: num_embeddings and embedding_dim must be >= 1");
  EXPECT_THROW_MSG(nn::MaxPool2dImpl(0), ValueError, "MaxPool2d: kernel_size must be >= 1, got 0");
  EXPECT_THROW_MSG(nn::AvgPool2dImpl(2, -1), ValueError, "AvgPool2d: stride must be >= 0");
  EXPECT_THROW_MSG(nn::DropoutImpl(1.5), ValueError, "Dropout: probability must be in [0, 1], got 1.5");
  EXPECT_THROW_MSG(nn::DropoutImpl(-0.1), ValueError, "Dropout: probability must be in [0, 1]");
}

TEST(LayerOptions, OptionsAreApplied) {
  Conv2d conv(nn::Conv2dOptions(4, 8, 3).stride(2).padding(1).dilation(1).groups(2).bias(false));
  EXPECT_EQ(conv.weight.sizes(), (IntArrayRef{8, 2, 3, 3}));
  EXPECT_FALSE(conv.bias.defined());
  EXPECT_EQ(conv.params().stride, (std::array<int64_t, 2>{2, 2}));
  EXPECT_EQ(conv.params().padding, (std::array<int64_t, 2>{1, 1}));
  EXPECT_EQ(conv.params().groups, 2);
  EXPECT_EQ(names_of(conv.named_parameters()), std::vector<std::string>{"weight"});
  Tensor y = conv(randn({1, 4, 8, 8}, 3));
  EXPECT_EQ(y.sizes(), (IntArrayRef{1, 8, 4, 4}));
  nn::MaxPool2dImpl pool(3);  // stride defaults to the kernel size
  EXPECT_EQ(pool.params().stride, (std::array<int64_t, 2>{3, 3}));
  nn::BatchNorm2dImpl bn(5, 1e-3, /*affine=*/false);
  EXPECT_TRUE(bn.named_parameters().empty());
  EXPECT_EQ(names_of(bn.named_buffers()),
            (std::vector<std::string>{"running_mean", "running_var", "num_batches_tracked"}));
  EXPECT_DOUBLE_EQ(bn.eps(), 1e-3);
  EXPECT_EQ(bn.num_features(), 5);
}

// ---------------------------------------------------------------------------------------------
// initialization

void expect_uniform_within(const Tensor& t, double bound, const std::string& what) {
  const std::vector<float> v = t.to_vector<float>();
  ASSERT_FALSE(v.empty()) << what;
  double lo = 1e9, hi = -1e9, sum = 0;
  for (float x : v) {
    lo = std::min<double>(lo, x);
    hi = std::max<double>(hi, x);
    sum += x;
  }
  EXPECT_GE(lo, -bound) << what;
  EXPECT_LE(hi, bound) << what;
  if (v.size() >= 100) {
    // Spread over the interval, not collapsed near zero.
    EXPECT_LT(lo, -0.8 * bound) << what;
    EXPECT_GT(hi, 0.8 * bound) << what;
    EXPECT_LT(std::abs(sum / v.size()), 0.15 * bound) << what;
  }
}

TEST(LayerInit, ConvAndLinearLikePyTorch) {
  Conv2d conv(8, 16, 3);  // fan_in 72
  expect_uniform_within(conv.weight, 1.0 / std::sqrt(72.0), "conv weight");
  expect_uniform_within(conv.bias, 1.0 / std::sqrt(72.0), "conv bias");
  Conv2d grouped(8, 16, 3, 1, 0, 1, /*groups=*/4);  // fan_in 2 * 9
  expect_uniform_within(grouped.weight, 1.0 / std::sqrt(18.0), "grouped conv weight");
  Linear lin(50, 40);
  expect_uniform_within(lin.weight, 1.0 / std::sqrt(50.0), "linear weight");
  expect_uniform_within(lin.bias, 1.0 / std::sqrt(50.0), "linear bias");
  Linear empty(0, 3);
  EXPECT_EQ(empty.weight.numel(), 0);
  expect_equal(empty.bias, zeros({3}), "zero fan-in bias");
}

TEST(LayerInit, NormAndEmbedding) {
  BatchNorm2d bn(4);
  expect_equal(bn.weight, ones({4}), "bn weight");
  expect_equal(bn.bias, zeros({4}), "bn bias");
  expect_equal(bn.running_mean, zeros({4}), "bn mean");
  expect_equal(bn.running_var, ones({4}), "bn var");
  EXPECT_EQ(bn.num_batches_tracked.dtype(), DType::kS64);
  EXPECT_EQ(bn.num_batches_tracked.dim(), 0);
  nn::LayerNormImpl ln(std::vector<int64_t>{2, 3});
  expect_equal(ln.weight, ones({2, 3}), "ln weight");
  nn::EmbeddingImpl emb(100, 50);  // N(0, 1)
  const std::vector<float> v = emb.weight.to_vector<float>();
  double mean_v = 0, sq = 0;
  for (float x : v) mean_v += x;
  mean_v /= v.size();
  for (float x : v) sq += (x - mean_v) * (x - mean_v);
  EXPECT_NEAR(mean_v, 0.0, 0.05);
  EXPECT_NEAR(std::sqrt(sq / v.size()), 1.0, 0.05);
}

TEST(LayerInit, ManualSeedIsDeterministic) {
  manual_seed(1234);
  auto a = std::make_shared<Net>();
  Linear a2(5, 5);
  manual_seed(1234);
  auto b = std::make_shared<Net>();
  Linear b2(5, 5);
  expect_same_values(b->state_dict(), a->state_dict());
  expect_equal(b2.weight, a2.weight, "second layer after the same seed");
  // Consecutive layers draw different values; a different seed gives different values.
  Linear c1(5, 5), c2(5, 5);
  EXPECT_NE(c1.weight.to_vector<float>(), c2.weight.to_vector<float>());
  manual_seed(4321);
  Linear d(5, 5);
  EXPECT_NE(d.weight.to_vector<float>(), a2.weight.to_vector<float>());
}

}  // namespace
}  // namespace dbrq
