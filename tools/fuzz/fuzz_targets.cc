#include "tools/fuzz/fuzz_targets.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string_view>

#include "tracer/internal.h"  // the quant-state reader and writer are the fuzzed internals

// A broken invariant in a target: report and abort, so libFuzzer (or the replay test) sees a crash.
#define DBRQ_FUZZ_CHECK(cond, ...)                                                                 \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      std::fprintf(stderr, "fuzz invariant failed: %s: %s\n", #cond, ::absl::StrCat(__VA_ARGS__).c_str()); \
      std::abort();                                                                                \
    }                                                                                              \
  } while (0)

namespace dbrq::fuzz {
namespace {

void fill(Tensor& t, const Tensor& src) {
  const std::vector<float> v = src.to_vector<float>();
  std::memcpy(t.mutable_data<float>(), v.data(), v.size() * sizeof(float));
}

}  // namespace

TinyNet::TinyNet() {
  conv = register_module("conv", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(3, 4, 3).padding(1).bias(false)));
  bn = register_module("bn", std::make_shared<nn::BatchNorm2dImpl>(4));
  relu = register_module("relu", std::make_shared<nn::ReLUImpl>());
  conv2 = register_module("conv2", std::make_shared<nn::Conv2dImpl>(nn::Conv2dOptions(4, 4, 3).padding(1)));
  fc = register_module("fc", std::make_shared<nn::LinearImpl>(64, 5));
}

Tensor TinyNet::forward(const Tensor& x) {
  Tensor y = (*relu)((*bn)((*conv)(x)));
  y = (*conv2)(y) + y;
  Tensor z = (*fc)(y.flatten(1));
  return z + sigmoid(z);
}

std::shared_ptr<TinyNet> make_tiny_net() {
  manual_seed(20240601);
  auto m = std::make_shared<TinyNet>();
  fill(m->bn->running_mean, rand_uniform({4}, -0.5, 0.5, 11));
  fill(m->bn->running_var, rand_uniform({4}, 0.5, 2.0, 12));
  fill(m->bn->weight, rand_uniform({4}, 0.5, 1.5, 13));
  fill(m->bn->bias, rand_uniform({4}, -0.3, 0.3, 14));
  m->eval();
  return m;
}

Tensor tiny_input(int64_t batch, uint64_t seed) { return randn({batch, 3, 4, 4}, seed); }

QConfigMapping tiny_mapping(int which) {
  switch (which) {
    case 1:
      return QConfigMapping()
          .set_global(QConfig::make(ObserverSpec::min_max(), ObserverSpec::per_channel_min_max()))
          .set_object_type(OpKind::kSigmoid, QConfig::make(ObserverSpec::fixed(1.f / 256.f, 0), ObserverSpec::per_channel_min_max()));
    case 2:
      return default_dynamic_qconfig_mapping();
    case 3: {
      ObserverSpec h = ObserverSpec::histogram();
      h.bins = 32;
      h.upsample_rate = 16;
      return QConfigMapping()
          .set_global(QConfig::make(h, ObserverSpec::per_channel_min_max()))
          .set_object_type(OpKind::kSigmoid, QConfig::make(ObserverSpec::fixed(1.f / 256.f, 0), ObserverSpec::per_channel_min_max()));
    }
    default:
      return default_qconfig_mapping("onednn");
  }
}

std::shared_ptr<TinyNet> prepared_tiny_net(int which) {
  auto m = make_tiny_net();
  prepare(*m, {tiny_input(2, 0)}, tiny_mapping(which));
  return m;
}

std::string tiny_quant_state(int which, bool include_observer_stats) {
  auto m = prepared_tiny_net(which);
  for (uint64_t s = 1; s <= 4; ++s) (*m)(tiny_input(2, s));
  SaveQuantStateOptions o;
  o.include_observer_stats = include_observer_stats;
  return quant_state_to_json(model_quant_state(*m), m->type_name(), o);
}

SafetensorsLimits fuzz_safetensors_limits() {
  SafetensorsLimits l;
  l.max_header_bytes = 4096;
  l.max_total_bytes = 1 << 16;
  l.max_tensors = 16;
  return l;
}

namespace {

std::string bytes_of(const Tensor& t) {
  return std::string(static_cast<const char*>(t.data_ptr()), t.nbytes());
}

void check_parsed(const NamedTensors& parsed, const SafetensorsLimits& limits, size_t input_size) {
  uint64_t total = 0;
  DBRQ_FUZZ_CHECK(parsed.size() <= limits.max_tensors, parsed.size(), " tensors");
  for (const auto& [name, t] : parsed) {
    DBRQ_FUZZ_CHECK(t.defined() && t.is_contiguous(), "tensor \"", name, "\" undefined or not contiguous");
    DBRQ_FUZZ_CHECK(!t.is_quantized(), "tensor \"", name, "\" has quantization parameters");
    total += t.nbytes();
  }
  // F16 is the only dtype that grows (to f32): at most twice the file's bytes.
  DBRQ_FUZZ_CHECK(total <= 2 * static_cast<uint64_t>(input_size), "tensors hold ", total, " bytes from a ",
                  input_size, "-byte file");
}

}  // namespace

void run_safetensors_input(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (const SafetensorsLimits& limits : {SafetensorsLimits{}, fuzz_safetensors_limits()}) {
    NamedTensors parsed;
    try {
      parsed = parse_safetensors(bytes, "<fuzz>", limits);
    } catch (const Error&) {
      continue;
    }
    check_parsed(parsed, limits, size);
    // What was read writes back and reads again identically.
    const std::string again = serialize_safetensors(parsed);
    NamedTensors reparsed;
    try {
      reparsed = parse_safetensors(again, "<reserialized>");
    } catch (const Error& e) {
      DBRQ_FUZZ_CHECK(false, "re-serialized tensors do not parse: ", e.what());
    }
    DBRQ_FUZZ_CHECK(reparsed.size() == parsed.size(), "round trip changed the tensor count");
    std::map<std::string, const Tensor*> by_name;
    for (const auto& [name, t] : reparsed) by_name[name] = &t;
    for (const auto& [name, t] : parsed) {
      auto it = by_name.find(name);
      DBRQ_FUZZ_CHECK(it != by_name.end(), "round trip lost \"", name, "\"");
      const Tensor& r = *it->second;
      DBRQ_FUZZ_CHECK(r.dtype() == t.dtype() && r.sizes() == t.sizes() && bytes_of(r) == bytes_of(t),
                      "round trip changed \"", name, "\"");
    }
  }
  // A model loading whatever parsed (non-strict: names, shapes and dtypes may all be wrong).
  NamedTensors parsed;
  try {
    parsed = parse_safetensors(bytes, "<fuzz>");
  } catch (const Error&) {
    return;
  }
  auto model = std::make_shared<TinyNet>();
  try {
    model->load_state_dict(parsed, /*strict=*/false);
  } catch (const Error&) {
  }
}

void run_quant_state_input(const uint8_t* data, size_t size) {
  // Reference models, never modified: documents are checked against them.
  static const std::vector<std::shared_ptr<TinyNet>> refs = [] {
    std::vector<std::shared_ptr<TinyNet>> v;
    for (int i = 0; i < kNumMappings; ++i) v.push_back(prepared_tiny_net(i));
    return v;
  }();
  static const Tensor input = tiny_input(2, 99);
  const std::string text(reinterpret_cast<const char*>(data), size);
  int accepted = -1;
  for (int i = 0; i < kNumMappings && accepted < 0; ++i) {
    try {
      check_quant_state(model_quant_state(*refs[i]), refs[i]->type_name(), text, "<fuzz>");
      accepted = i;
    } catch (const Error&) {
    }
  }
  if (accepted < 0) return;

  // Accepted by the check: loading into a fresh model must succeed, re-saving must give a document
  // that is accepted again, and convert + inference must not crash (they may throw dbrq errors
  // for parameters that cannot run).
  auto model = prepared_tiny_net(accepted);
  ModelQuantState& state = model_quant_state(*model);
  try {
    quant_state_from_json(state, model->type_name(), text, "<fuzz>");
  } catch (const Error& e) {
    DBRQ_FUZZ_CHECK(false, "check_quant_state accepted a document quant_state_from_json rejects: ", e.what());
  }
  SaveQuantStateOptions with_stats;
  with_stats.include_observer_stats = true;
  const std::string saved = quant_state_to_json(state, model->type_name(), with_stats);
  try {
    check_quant_state(model_quant_state(*refs[accepted]), refs[accepted]->type_name(), saved, "<re-saved>");
  } catch (const Error& e) {
    DBRQ_FUZZ_CHECK(false, "a loaded document saved again is rejected: ", e.what());
  }
  try {
    convert(*model);
  } catch (const Error&) {
    DBRQ_FUZZ_CHECK(!is_converted(*model), "convert threw but left the model converted");
    return;
  }
  try {
    const Tensor y = (*model)(input);
    DBRQ_FUZZ_CHECK(y.dtype() == DType::kF32 && y.dim() == 2 && y.size(0) == 2 && y.size(1) == 5,
                    "converted output is ", dtype_name(y.dtype()), " ", y.shape_string());
  } catch (const Error&) {
  }
}

}  // namespace dbrq::fuzz
