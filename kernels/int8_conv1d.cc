// Int8 conv1d: QConv2d with H = 1 (kernels/int8.h).
#include "core/op_shapes.h"
#include "kernels/int8.h"

namespace dbrq::kernels {

QConv1d::QConv1d(QConv1dOptions o) : params_(o.params) {
  check_float("quantized conv1d", "weight", o.weight);
  DBRQ_ENSURE(o.weight.dim() == 3, ShapeError, "quantized conv1d: weight must be 3-D (out_channels, "
              "in_channels/groups, kL), got sizes ", o.weight.shape_string());
  weight_ = o.weight;
  QConvOptions c;
  static_cast<QWeightedOptions&>(c) = std::move(o);
  c.weight = unit_height_view(contiguous(c.weight));
  c.params = conv1d_as_conv2d(params_);
  conv_ = std::make_unique<QConv2d>(std::move(c));
  qweight_ = drop_unit_height(conv_->quantized_weight());
}

QConv1d::~QConv1d() = default;

std::string QConv1d::describe() const {
  std::string s = conv_->describe();  // "int8 conv2d [K, C, 1, kL]+relu ..."
  const std::string from = "int8 conv2d " + conv_->options().weight.shape_string();
  if (s.rfind(from, 0) == 0) s = "int8 conv1d " + weight_.shape_string() + s.substr(from.size());
  return s;
}

Tensor QConv1d::empty_output(const Tensor& x) const {
  conv1d_geometry(x, weight_, Tensor(), params_);
  return drop_unit_height(conv_->empty_output(unit_height_view(x)));
}

Tensor QConv1d::run(const Tensor& x, const Tensor* residual, const Tensor* out) const {
  DBRQ_ENSURE(x.defined() && x.dtype() == DType::kU8 && x.is_quantized(), DTypeError,
              "quantized conv1d: int8 input must be a per-tensor quantized u8 tensor, got ",
              x.defined() ? dtype_name(x.dtype()) : "undefined");
  conv1d_geometry(x, weight_, Tensor(), params_);
  Tensor res4, out4;
  if (residual != nullptr) {
    DBRQ_ENSURE(residual->dim() == 3, ShapeError, "quantized conv1d + add: residual must be 3-D, got sizes ",
                residual->shape_string());
    res4 = unit_height_view(*residual);
  }
  if (out != nullptr) out4 = unit_height_view(*out);
  return drop_unit_height(conv_->run(unit_height_view(x), residual ? &res4 : nullptr, out ? &out4 : nullptr));
}

}  // namespace dbrq::kernels
