#pragma once

#include <cstring>
#include <type_traits>

namespace dbrq {

template <typename T>
T Tensor::at(IntArrayRef index) const {
  const int64_t off = offset_of(index);
  return visit_dtype(dtype_, [&](auto tag) -> T {
    using S = decltype(tag);
    const S code = static_cast<const S*>(storage_->data())[off];
    // Quantized tensors read as real values, like PyTorch's item().
    if (is_quantized()) {
      const int64_t axis = qparams_->axis;
      return static_cast<T>(real_value(static_cast<int32_t>(code), axis < 0 ? 0 : wrap_index(index, axis)));
    }
    return static_cast<T>(code);
  });
}

template <typename T>
T Tensor::item() const {
  DBRQ_ENSURE(defined() && numel() == 1, ShapeError, "item(): tensor must have exactly one element, got sizes ",
              shape_string());
  if (is_quantized()) {
    return static_cast<T>(real_value(static_cast<int32_t>(value_at(0)), 0));
  }
  return static_cast<T>(value_at(0));
}

template <typename T>
std::vector<T> Tensor::to_vector() const {
  DBRQ_ENSURE(defined(), ValueError, "to_vector(): tensor is undefined");
  check_has_values();
  std::vector<T> out(static_cast<size_t>(numel()));
  // Quantized tensors give real values, as f32 tensors do (int_repr() for the codes).
  const bool real = is_quantized();
  const int64_t axis = real ? qparams_->axis : -1;
  visit_dtype(dtype_, [&](auto tag) {
    using S = decltype(tag);
    const S* base = static_cast<const S*>(storage_->data());
    int64_t idx[kMaxDims] = {};
    for (size_t i = 0; i < out.size(); ++i) {
      int64_t off = offset_;
      for (int d = 0; d < ndim_; ++d) off += idx[d] * strides_[d];
      out[i] = real ? static_cast<T>(real_value(static_cast<int32_t>(base[off]), axis < 0 ? 0 : idx[axis]))
                    : static_cast<T>(base[off]);
      for (int d = ndim_ - 1; d >= 0; --d) {
        if (++idx[d] < sizes_[d]) break;
        idx[d] = 0;
      }
    }
  });
  return out;
}

template <typename T>
Tensor from_vector(const std::vector<T>& values, IntArrayRef sizes) {
  Tensor t = Tensor::empty(sizes, DTypeOf<T>::value);
  DBRQ_ENSURE(static_cast<int64_t>(values.size()) == t.numel(), ShapeError, "from_vector: ", values.size(),
              " values do not fill sizes ", shape_to_string(sizes), " (", t.numel(), " elements)");
  if (!values.empty()) std::memcpy(t.mutable_data_ptr(), values.data(), values.size() * sizeof(T));
  return t;
}

}  // namespace dbrq
