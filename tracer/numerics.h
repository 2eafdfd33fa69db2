// Numeric comparison of a converted model against its fp32 original, op by op: when int8 accuracy
// disappoints, this shows which layer is to blame.
//
//   auto ref = build_model();  ref->load_state_dict(w);  ref->eval();          // fp32
//   auto q = build_model();    q->load_state_dict(w);    q->eval();
//   dbrq::prepare(*q, {x});  calibrate(*q);  dbrq::convert(*q);
//   dbrq::NumericReport r = dbrq::compare_numerics(*ref, *q, {{x1}, {x2}});
//   std::cout << r.to_table();                      // worst op first
//   dbrq::write_text_file("report.html", r.to_html("ResNet-18"));
//
// Each quantized op (or fused chain) of the converted model is matched with the same op of the
// fp32 model: the j-th call of a module in the int8 model with its j-th call in the fp32 model,
// and within the two calls op k with op k, when both ran the same quantizeable ops (kind and
// layer). Where they did not (the int8 model took another branch, e.g. on a value near a
// threshold, or called the module another number of times), that call's ops are not compared and
// the call is counted in `diverged_calls`. Each op's output is compared with the fp32 output: SQNR
// in dB (10 log10(sum ref^2 / sum (ref - q)^2)), max absolute error, and the quantization
// parameters used; an op run in a loop accumulates over its iterations. For each module with more
// than one path, each path the compared calls took is reported with its calls and the SQNR of the
// module's outputs on those calls. The fp32 model must be the same architecture, unprepared.
// Only the comparing thread's calls are probed: the converted model may keep serving other
// threads meanwhile (one comparison at a time per model).
#pragma once

#include <string>
#include <vector>

#include "runtime/module.h"

namespace dbrq {

struct OpNumerics {
  std::string module_fqn;  // the module whose seen op this is
  int index = 0;           // the op's index in that module
  std::string op;          // "conv2d+batch_norm+relu"
  std::string fqn;         // the layer, or the module for functional ops
  std::string qparams;     // of the op's output
  double sqnr_db = 0.0;    // +inf when identical
  double max_abs_error = 0.0;
  int64_t elements = 0;    // compared, over all inputs
  int64_t runs = 0;        // times it ran (a loop runs it once per iteration)
};

// One control-flow path of a module (see AutoQuantizationState::paths).
struct PathNumerics {
  std::string module_fqn;
  int path = -1;             // index in the module's paths(); -1: a path no call took before the comparison
  std::string ops;           // its ops, "mean conv2d+relu conv2d"
  int64_t calls = 0;         // compared calls of the module that took it
  int64_t calls_before = 0;  // calls that took it before the comparison (calibration and use)
  double sqnr_db = 0.0;      // of the module's outputs on those calls; NaN ("n/a") when its outputs
                             // exist only inside its caller's fused kernel (fusion across modules)
  double max_abs_error = 0.0;
};

struct NumericReport {
  std::vector<OpNumerics> ops;      // worst SQNR first
  std::vector<PathNumerics> paths;  // of modules with several paths, by module then path
  double output_sqnr_db = 0.0;      // the model's outputs
  double output_max_abs_error = 0.0;
  int batches = 0;
  int64_t diverged_calls = 0;       // module calls whose ops did not pair up with the fp32 model's
  int64_t uncalibrated_ops = 0;     // op runs on paths never calibrated (fp32)

  std::string to_table() const;
  std::string to_csv() const;        // the ops
  std::string paths_to_csv() const;  // the paths
  // A self-contained HTML page (inline CSS and SVG bar chart of SQNR per op; no external assets).
  std::string to_html(const std::string& title) const;
};

// `inputs`: one tensor list per call (the tensors forward takes, 1 to 4 of them).
NumericReport compare_numerics(nn::Module& float_model, nn::Module& quantized_model,
                               const std::vector<std::vector<Tensor>>& inputs);

// SQNR in dB of `actual` against `reference` (f32 or quantized; +inf when equal).
double sqnr_db(const Tensor& reference, const Tensor& actual);

// Writes text to a file; throws IOError.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace dbrq
