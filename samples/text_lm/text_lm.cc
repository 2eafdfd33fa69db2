#include "samples/text_lm/text_lm.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <utility>

namespace text_lm {

using dbrq::Tensor;

zoo::DecoderConfig text_lm_config() {
  zoo::DecoderConfig c;
  c.vocab_size = 256;
  c.d_model = 128;
  c.num_layers = 4;
  c.num_heads = 4;
  c.d_ff = 512;
  c.max_positions = kTextLmContext;
  c.layer_norm_eps = 1e-5;
  return c;
}

double TextLmData::number(const std::string& key) const {
  auto it = metadata.find(key);
  DBRQ_ENSURE(it != metadata.end(), dbrq::ValueError, "text_lm: the golden file has no metadata \"", key, "\"");
  char* end = nullptr;
  const double v = std::strtod(it->second.c_str(), &end);
  DBRQ_ENSURE(end != it->second.c_str() && *end == '\0', dbrq::ValueError, "text_lm: metadata \"", key, "\" = \"",
              it->second, "\" is not a number");
  return v;
}

namespace {

Tensor find(const dbrq::NamedTensors& t, const std::string& name, const std::string& path) {
  for (const auto& [n, v] : t) {
    if (n == name) return v;
  }
  throw dbrq::FileFormatError("text_lm: " + path + " has no tensor \"" + name + "\"");
}

// u8 bytes -> s64 token ids of the same shape.
Tensor to_ids(const Tensor& bytes) { return dbrq::from_vector(bytes.to_vector<int64_t>(), bytes.sizes()); }

}  // namespace

TextLmData load_text_lm_data(const std::string& path) {
  const dbrq::NamedTensors t = dbrq::load_safetensors(path);
  TextLmData d;
  d.eval = to_ids(find(t, "eval", path));
  d.calib = to_ids(find(t, "calib", path));
  DBRQ_ENSURE(d.eval.dim() == 2 && d.eval.size(1) == kTextLmContext + 1, dbrq::FileFormatError, "text_lm: ", path,
              ": \"eval\" must be [W, ", kTextLmContext + 1, "], got ", d.eval.shape_string());
  DBRQ_ENSURE(d.calib.dim() == 2 && d.calib.size(1) == kTextLmContext, dbrq::FileFormatError, "text_lm: ", path,
              ": \"calib\" must be [N, ", kTextLmContext, "], got ", d.calib.shape_string());
  for (auto [name, dst] : {std::pair<const char*, std::vector<double>*>{"fp32_nll", &d.fp32_nll},
                           {"fx_nll", &d.fx_nll},
                           {"dynamic_nll", &d.dynamic_nll}}) {
    const Tensor nll = find(t, name, path);
    DBRQ_ENSURE(nll.dim() == 1 && nll.size(0) == d.eval.size(0), dbrq::FileFormatError, "text_lm: ", path, ": \"", name,
                "\" must be [", d.eval.size(0), "], got ", nll.shape_string());
    *dst = nll.to_vector<double>();
  }
  d.metadata = dbrq::load_safetensors_metadata(path);
  return d;
}

std::shared_ptr<zoo::DecoderLM> make_text_lm(const std::string& weights_path) {
  auto lm = std::make_shared<zoo::DecoderLM>(text_lm_config());
  lm->load_state_dict(dbrq::load_safetensors(weights_path));
  lm->eval();
  return lm;
}

std::vector<double> window_nll(dbrq::nn::Module& model, const Tensor& windows, int64_t first, int64_t count,
                               int64_t batch) {
  DBRQ_ENSURE(windows.defined() && windows.dim() == 2 && windows.size(1) == kTextLmContext + 1, dbrq::ShapeError,
              "text_lm: windows must be [W, ", kTextLmContext + 1, "], got ",
              windows.defined() ? windows.shape_string() : std::string("undefined"));
  const int64_t total = windows.size(0);
  if (count < 0) count = total - first;
  DBRQ_ENSURE(first >= 0 && count >= 0 && first + count <= total, dbrq::ValueError, "text_lm: windows [", first, ", ",
              first + count, ") are outside the ", total, " windows");
  DBRQ_ENSURE(batch >= 1, dbrq::ValueError, "text_lm: batch must be >= 1, got ", batch);
  const int64_t vocab = 256, ctx = kTextLmContext;
  std::vector<double> out;
  out.reserve(static_cast<size_t>(count));
  for (int64_t b = first; b < first + count; b += batch) {
    const int64_t n = std::min(batch, first + count - b);
    const Tensor w = windows.narrow(0, b, n);
    const std::vector<int64_t> ids = w.to_vector<int64_t>();
    const std::vector<Tensor> outs = model.forward_tensors({w.narrow(1, 0, ctx).contiguous()});
    DBRQ_ENSURE(!outs.empty() && outs[0].numel() == n * ctx * vocab, dbrq::ShapeError,
                "text_lm: the model's first output must be [", n, ", ", ctx, ", ", vocab, "] logits, got ",
                outs.empty() ? std::string("nothing") : outs[0].shape_string());
    const std::vector<float> logits = outs[0].to_vector<float>();
    for (int64_t i = 0; i < n; ++i) {
      double sum = 0.0;
      for (int64_t t = 0; t < ctx; ++t) {
        const float* row = logits.data() + (i * ctx + t) * vocab;
        double mx = row[0];
        for (int64_t v = 1; v < vocab; ++v) mx = std::max(mx, static_cast<double>(row[v]));
        double se = 0.0;
        for (int64_t v = 0; v < vocab; ++v) se += std::exp(static_cast<double>(row[v]) - mx);
        const int64_t target = ids[static_cast<size_t>(i * (ctx + 1) + t + 1)];
        sum += mx + std::log(se) - static_cast<double>(row[target]);
      }
      out.push_back(sum);
    }
  }
  return out;
}

double bits_per_char(const std::vector<double>& nll) {
  DBRQ_ENSURE(!nll.empty(), dbrq::ValueError, "text_lm: bits_per_char of no windows");
  double s = 0.0;
  for (double v : nll) s += v;
  return s / (static_cast<double>(kTextLmContext) * static_cast<double>(nll.size())) / std::log(2.0);
}

double bits_per_char(dbrq::nn::Module& model, const Tensor& windows, int64_t first, int64_t count, int64_t batch) {
  return bits_per_char(window_nll(model, windows, first, count, batch));
}

Tensor every_other(const Tensor& windows, int parity) {
  DBRQ_ENSURE(parity == 0 || parity == 1, dbrq::ValueError, "text_lm: parity must be 0 or 1, got ", parity);
  const std::vector<int64_t> v = windows.to_vector<int64_t>();
  const int64_t w = windows.size(0), cols = windows.size(1);
  std::vector<int64_t> out;
  for (int64_t r = parity; r < w; r += 2) out.insert(out.end(), v.begin() + r * cols, v.begin() + (r + 1) * cols);
  return dbrq::from_vector(out, {static_cast<int64_t>(out.size()) / cols, cols});
}

}  // namespace text_lm
