#include "core/op_shapes.h"

#include <algorithm>

namespace dbrq {

void check_defined(const char* op, const char* arg, const Tensor& t) {
  DBRQ_ENSURE(t.defined(), ValueError, op, ": ", arg, " is an undefined tensor");
}

void check_dtype(const char* op, const char* arg, const Tensor& t, DType expected) {
  check_defined(op, arg, t);
  DBRQ_ENSURE(t.dtype() == expected, DTypeError, op, ": ", arg, " must have dtype ", dtype_name(expected), ", got ",
              dtype_name(t.dtype()));
}

void check_float(const char* op, const char* arg, const Tensor& t) { check_dtype(op, arg, t, DType::kF32); }

namespace {

std::string pair_str(const std::array<int64_t, 2>& v) { return absl::StrCat("(", v[0], ", ", v[1], ")"); }

}  // namespace

ConvGeometry conv2d_geometry(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dParams& p) {
  check_defined("conv2d", "input", x);
  check_defined("conv2d", "weight", w);
  DBRQ_ENSURE(x.dim() == 4, ShapeError, "conv2d: input must be 4-D (N, C, H, W), got sizes ", x.shape_string());
  DBRQ_ENSURE(w.dim() == 4, ShapeError, "conv2d: weight must be 4-D (out_channels, in_channels/groups, kH, kW), got sizes ",
              w.shape_string());
  DBRQ_ENSURE(p.groups >= 1, ValueError, "conv2d: groups must be >= 1, got ", p.groups);
  for (int i = 0; i < 2; ++i) {
    DBRQ_ENSURE(p.stride[i] >= 1, ValueError, "conv2d: stride must be >= 1, got ", pair_str(p.stride));
    DBRQ_ENSURE(p.padding[i] >= 0, ValueError, "conv2d: padding must be >= 0, got ", pair_str(p.padding));
    DBRQ_ENSURE(p.dilation[i] >= 1, ValueError, "conv2d: dilation must be >= 1, got ", pair_str(p.dilation));
  }
  ConvGeometry g;
  g.n = x.size(0);
  g.c = x.size(1);
  g.h = x.size(2);
  g.w = x.size(3);
  g.k = w.size(0);
  g.r = w.size(2);
  g.s = w.size(3);
  g.groups = p.groups;
  DBRQ_ENSURE(g.k % p.groups == 0, ShapeError, "conv2d: out_channels (", g.k, ") must be divisible by groups (",
              p.groups, ")");
  DBRQ_ENSURE(w.size(1) * p.groups == g.c, ShapeError, "conv2d: input has ", g.c,
              " channels but the weight expects in_channels/groups * groups = ", w.size(1), " * ", p.groups, " = ",
              w.size(1) * p.groups, " (input sizes ", x.shape_string(), ", weight sizes ", w.shape_string(), ")");
  if (b.defined()) {
    DBRQ_ENSURE(b.dim() == 1 && b.size(0) == g.k, ShapeError, "conv2d: bias must have sizes [", g.k, "], got ",
                b.shape_string());
  }
  const int64_t eff_r = (g.r - 1) * p.dilation[0] + 1, eff_s = (g.s - 1) * p.dilation[1] + 1;
  const int64_t ph = g.h + 2 * p.padding[0], pw = g.w + 2 * p.padding[1];
  DBRQ_ENSURE(ph >= eff_r && pw >= eff_s, ShapeError, "conv2d: padded input ", ph, "x", pw,
              " is smaller than the dilated kernel ", eff_r, "x", eff_s, " (input sizes ", x.shape_string(), ")");
  g.oh = (ph - eff_r) / p.stride[0] + 1;
  g.ow = (pw - eff_s) / p.stride[1] + 1;
  return g;
}

PoolGeometry pool2d_geometry(const char* op, const Tensor& x, const Pool2dParams& p) {
  check_defined(op, "input", x);
  DBRQ_ENSURE(x.dim() == 4, ShapeError, op, ": input must be 4-D (N, C, H, W), got sizes ", x.shape_string());
  PoolGeometry g;
  g.n = x.size(0);
  g.c = x.size(1);
  g.h = x.size(2);
  g.w = x.size(3);
  const int64_t in[2] = {g.h, g.w};
  int64_t out[2], pad_end[2];
  for (int i = 0; i < 2; ++i) {
    DBRQ_ENSURE(p.kernel_size[i] >= 1, ValueError, op, ": kernel_size must be >= 1, got ", pair_str(p.kernel_size));
    DBRQ_ENSURE(p.stride[i] >= 1, ValueError, op, ": stride must be >= 1, got ", pair_str(p.stride));
    DBRQ_ENSURE(p.dilation[i] >= 1, ValueError, op, ": dilation must be >= 1, got ", pair_str(p.dilation));
    DBRQ_ENSURE(p.padding[i] >= 0 && p.padding[i] * 2 <= p.kernel_size[i], ValueError, op,
                ": padding must be >= 0 and at most half the kernel size, got padding ", pair_str(p.padding),
                " for kernel_size ", pair_str(p.kernel_size));
    const int64_t eff_k = (p.kernel_size[i] - 1) * p.dilation[i] + 1;
    const int64_t span = in[i] + 2 * p.padding[i] - eff_k;
    DBRQ_ENSURE(span >= 0, ShapeError, op, ": input sizes ", x.shape_string(), " are smaller than the kernel ",
                pair_str(p.kernel_size), " plus padding");
    int64_t o = (p.ceil_mode ? (span + p.stride[i] - 1) / p.stride[i] : span / p.stride[i]) + 1;
    // PyTorch: the last window must start inside the input or the left padding.
    if (p.ceil_mode && (o - 1) * p.stride[i] >= in[i] + p.padding[i]) --o;
    out[i] = o;
    pad_end[i] = (o - 1) * p.stride[i] + eff_k - in[i] - p.padding[i];
  }
  g.oh = out[0];
  g.ow = out[1];
  g.pad_bottom = pad_end[0];
  g.pad_right = pad_end[1];
  return g;
}

int64_t linear_rows(const Tensor& x) {
  int64_t m = 1;
  for (int64_t d = 0; d + 1 < x.dim(); ++d) m *= x.size(d);
  return m;
}

DimVector linear_output_sizes(const Tensor& x, const Tensor& w, const Tensor& b) {
  check_defined("linear", "input", x);
  check_defined("linear", "weight", w);
  DBRQ_ENSURE(x.dim() >= 1, ShapeError, "linear: input must have at least 1 dim, got sizes ", x.shape_string());
  DBRQ_ENSURE(w.dim() == 2, ShapeError, "linear: weight must be 2-D (out_features, in_features), got sizes ",
              w.shape_string());
  DBRQ_ENSURE(x.size(-1) == w.size(1), ShapeError, "linear: input has ", x.size(-1),
              " features in its last dim but the weight expects in_features = ", w.size(1), " (input sizes ",
              x.shape_string(), ", weight sizes ", w.shape_string(), ")");
  if (b.defined()) {
    DBRQ_ENSURE(b.dim() == 1 && b.size(0) == w.size(0), ShapeError, "linear: bias must have sizes [", w.size(0),
                "], got ", b.shape_string());
  }
  DimVector out(x.sizes().begin(), x.sizes().end());
  out.back() = w.size(0);
  return out;
}

DimVector broadcast_shapes(const char* op, IntArrayRef a, IntArrayRef b) {
  const size_t n = std::max(a.size(), b.size());
  DimVector out(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t da = i < n - a.size() ? 1 : a[i - (n - a.size())];
    const int64_t db = i < n - b.size() ? 1 : b[i - (n - b.size())];
    DBRQ_ENSURE(da == db || da == 1 || db == 1, ShapeError, op, ": sizes ", shape_to_string(a), " and ",
                shape_to_string(b), " cannot be broadcast together (dim ", i, ": ", da, " vs ", db, ")");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

MatmulShapes matmul_shapes(IntArrayRef a, IntArrayRef b) {
  DBRQ_ENSURE(!a.empty() && !b.empty(), ShapeError, "matmul: both arguments need at least 1 dim, got sizes ",
              shape_to_string(a), " and ", shape_to_string(b));
  MatmulShapes s;
  s.a.assign(a.begin(), a.end());
  s.b.assign(b.begin(), b.end());
  if (s.a.size() == 1) {
    s.a.insert(s.a.begin(), 1);
    s.squeeze_m = true;
  }
  if (s.b.size() == 1) {
    s.b.push_back(1);
    s.squeeze_n = true;
  }
  DBRQ_ENSURE(s.a.back() == s.b[s.b.size() - 2], ShapeError, "matmul: inner dims differ: sizes ", shape_to_string(a),
              " and ", shape_to_string(b), " (", s.a.back(), " vs ", s.b[s.b.size() - 2], ")");
  const DimVector batch = broadcast_shapes("matmul (batch dims)", IntArrayRef(s.a.data(), s.a.size() - 2),
                                           IntArrayRef(s.b.data(), s.b.size() - 2));
  auto promote = [&](DimVector& v) { v.insert(v.begin(), batch.size() - (v.size() - 2), 1); };
  promote(s.a);
  promote(s.b);
  DBRQ_ENSURE(s.a.size() <= static_cast<size_t>(kMaxDims), ShapeError, "matmul: too many dims");
  s.out = batch;
  s.out.push_back(s.a[s.a.size() - 2]);
  s.out.push_back(s.b.back());
  return s;
}

DimVector infer_reshape(IntArrayRef target, int64_t numel, IntArrayRef from) {
  DimVector out(target.begin(), target.end());
  int64_t known = 1;
  int infer = -1;
  for (size_t i = 0; i < out.size(); ++i) {
    if (out[i] == -1) {
      DBRQ_ENSURE(infer < 0, ValueError, "reshape: only one dim may be -1, got ", shape_to_string(target));
      infer = static_cast<int>(i);
    } else {
      DBRQ_ENSURE(out[i] >= 0, ValueError, "reshape: invalid size ", out[i], " in ", shape_to_string(target));
      known *= out[i];
    }
  }
  if (infer >= 0) {
    DBRQ_ENSURE(known != 0 && numel % known == 0, ShapeError, "reshape: cannot reshape sizes ", shape_to_string(from),
                " (", numel, " elements) into ", shape_to_string(target));
    out[infer] = numel / known;
  } else {
    DBRQ_ENSURE(known == numel, ShapeError, "reshape: cannot reshape sizes ", shape_to_string(from), " (", numel,
                " elements) into ", shape_to_string(target), " (", known, " elements)");
  }
  return out;
}

DimVector cat_output_sizes(absl::Span<const Tensor* const> tensors, int64_t dim) {
  DBRQ_ENSURE(!tensors.empty(), ValueError, "cat: needs at least one tensor");
  const Tensor& first = *tensors[0];
  check_defined("cat", "tensors[0]", first);
  const int64_t d = first.wrap_dim(dim);
  DimVector out(first.sizes().begin(), first.sizes().end());
  out[d] = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = *tensors[i];
    DBRQ_ENSURE(t.defined(), ValueError, "cat: tensors[", i, "] is undefined");
    DBRQ_ENSURE(t.dtype() == first.dtype(), DTypeError, "cat: tensors[", i, "] has dtype ", dtype_name(t.dtype()),
                " but tensors[0] has ", dtype_name(first.dtype()));
    DBRQ_ENSURE(t.dim() == first.dim(), ShapeError, "cat: tensors[", i, "] has sizes ", t.shape_string(),
                " but tensors[0] has ", first.shape_string());
    for (int64_t k = 0; k < t.dim(); ++k) {
      DBRQ_ENSURE(k == d || t.size(k) == first.size(k), ShapeError, "cat: tensors[", i, "] has sizes ",
                  t.shape_string(), " but tensors[0] has ", first.shape_string(), "; only dim ", d, " may differ");
    }
    out[d] += t.size(d);
  }
  return out;
}

}  // namespace dbrq

namespace dbrq {

ConvGeometry conv_transpose2d_geometry(const Tensor& x, const Tensor& w, const Tensor& b,
                                       const ConvTranspose2dParams& p) {
  const char* op = "conv_transpose2d";
  check_defined(op, "input", x);
  check_defined(op, "weight", w);
  DBRQ_ENSURE(x.dim() == 4, ShapeError, op, ": input must be 4-D (N, C, H, W), got sizes ", x.shape_string());
  DBRQ_ENSURE(w.dim() == 4, ShapeError, op,
              ": weight must be 4-D (in_channels, out_channels/groups, kH, kW), got sizes ", w.shape_string());
  DBRQ_ENSURE(p.groups >= 1, ValueError, op, ": groups must be >= 1, got ", p.groups);
  for (int i = 0; i < 2; ++i) {
    DBRQ_ENSURE(p.stride[i] >= 1, ValueError, op, ": stride must be >= 1, got ", pair_str(p.stride));
    DBRQ_ENSURE(p.padding[i] >= 0, ValueError, op, ": padding must be >= 0, got ", pair_str(p.padding));
    DBRQ_ENSURE(p.dilation[i] >= 1, ValueError, op, ": dilation must be >= 1, got ", pair_str(p.dilation));
    DBRQ_ENSURE(p.output_padding[i] >= 0 && (p.output_padding[i] < p.stride[i] || p.output_padding[i] < p.dilation[i]),
                ValueError, op, ": output_padding must be >= 0 and smaller than either stride or dilation, got ",
                "output_padding ", pair_str(p.output_padding), ", stride ", pair_str(p.stride), ", dilation ",
                pair_str(p.dilation));
  }
  ConvGeometry g;
  g.n = x.size(0);
  g.c = x.size(1);
  g.h = x.size(2);
  g.w = x.size(3);
  g.k = w.size(1) * p.groups;
  g.r = w.size(2);
  g.s = w.size(3);
  g.groups = p.groups;
  DBRQ_ENSURE(w.size(0) == g.c, ShapeError, op, ": input has ", g.c, " channels but the weight expects ", w.size(0),
              " (weight sizes ", w.shape_string(), " are (in_channels, out_channels/groups, kH, kW))");
  DBRQ_ENSURE(g.c % p.groups == 0, ShapeError, op, ": in_channels (", g.c, ") must be divisible by groups (", p.groups,
              ")");
  if (b.defined()) {
    DBRQ_ENSURE(b.dim() == 1 && b.size(0) == g.k, ShapeError, op, ": bias must have sizes [", g.k, "], got ",
                b.shape_string());
  }
  const int64_t in[2] = {g.h, g.w}, k[2] = {g.r, g.s};
  int64_t out[2];
  for (int i = 0; i < 2; ++i) {
    out[i] = (in[i] - 1) * p.stride[i] - 2 * p.padding[i] + p.dilation[i] * (k[i] - 1) + p.output_padding[i] + 1;
  }
  DBRQ_ENSURE(out[0] >= 1 && out[1] >= 1, ShapeError, op, ": output size ", out[0], "x", out[1],
              " is too small (input sizes ", x.shape_string(), ", weight sizes ", w.shape_string(), ", padding ",
              pair_str(p.padding), ")");
  g.oh = out[0];
  g.ow = out[1];
  return g;
}

}  // namespace dbrq

namespace dbrq {

ConvGeometry conv1d_geometry(const Tensor& x, const Tensor& w, const Tensor& b, const Conv1dParams& p) {
  const char* op = "conv1d";
  check_defined(op, "input", x);
  check_defined(op, "weight", w);
  DBRQ_ENSURE(x.dim() == 3, ShapeError, op, ": input must be 3-D (N, C, L), got sizes ", x.shape_string());
  DBRQ_ENSURE(w.dim() == 3, ShapeError, op, ": weight must be 3-D (out_channels, in_channels/groups, kL), got sizes ",
              w.shape_string());
  DBRQ_ENSURE(p.groups >= 1, ValueError, op, ": groups must be >= 1, got ", p.groups);
  DBRQ_ENSURE(p.stride >= 1, ValueError, op, ": stride must be >= 1, got ", p.stride);
  DBRQ_ENSURE(p.padding >= 0, ValueError, op, ": padding must be >= 0, got ", p.padding);
  DBRQ_ENSURE(p.dilation >= 1, ValueError, op, ": dilation must be >= 1, got ", p.dilation);
  ConvGeometry g;
  g.n = x.size(0);
  g.c = x.size(1);
  g.h = 1;
  g.w = x.size(2);
  g.k = w.size(0);
  g.r = 1;
  g.s = w.size(2);
  g.groups = p.groups;
  DBRQ_ENSURE(g.k % p.groups == 0, ShapeError, op, ": out_channels (", g.k, ") must be divisible by groups (", p.groups,
              ")");
  DBRQ_ENSURE(w.size(1) * p.groups == g.c, ShapeError, op, ": input has ", g.c,
              " channels but the weight expects in_channels/groups * groups = ", w.size(1), " * ", p.groups, " = ",
              w.size(1) * p.groups, " (input sizes ", x.shape_string(), ", weight sizes ", w.shape_string(), ")");
  if (b.defined()) {
    DBRQ_ENSURE(b.dim() == 1 && b.size(0) == g.k, ShapeError, op, ": bias must have sizes [", g.k, "], got ",
                b.shape_string());
  }
  const int64_t eff = (g.s - 1) * p.dilation + 1, padded = g.w + 2 * p.padding;
  DBRQ_ENSURE(padded >= eff, ShapeError, op, ": padded input length ", padded, " is smaller than the dilated kernel ",
              eff, " (input sizes ", x.shape_string(), ")");
  g.oh = 1;
  g.ow = (padded - eff) / p.stride + 1;
  return g;
}

Pool2dParams pool1d_params(const char* op, const Tensor& x, int64_t kernel_size, int64_t stride, int64_t padding,
                           int64_t dilation, bool ceil_mode, bool count_include_pad) {
  check_defined(op, "input", x);
  DBRQ_ENSURE(x.dim() == 3, ShapeError, op, ": input must be 3-D (N, C, L), got sizes ", x.shape_string());
  DBRQ_ENSURE(kernel_size >= 1, ValueError, op, ": kernel_size must be >= 1, got ", kernel_size);
  DBRQ_ENSURE(stride >= 1, ValueError, op, ": stride must be >= 1, got ", stride);
  DBRQ_ENSURE(dilation >= 1, ValueError, op, ": dilation must be >= 1, got ", dilation);
  DBRQ_ENSURE(padding >= 0 && padding * 2 <= kernel_size, ValueError, op,
              ": padding must be >= 0 and at most half the kernel size, got padding ", padding, " for kernel_size ",
              kernel_size);
  const int64_t eff = (kernel_size - 1) * dilation + 1;
  DBRQ_ENSURE(x.size(2) + 2 * padding >= eff, ShapeError, op, ": padded input length ", x.size(2) + 2 * padding,
              " is smaller than the (dilated) kernel ", eff, " (input sizes ", x.shape_string(), ")");
  Pool2dParams p;
  p.kernel_size = {1, kernel_size};
  p.stride = {1, stride};
  p.padding = {0, padding};
  p.dilation = {1, dilation};
  p.ceil_mode = ceil_mode;
  p.count_include_pad = count_include_pad;
  return p;
}

}  // namespace dbrq
