#include "tests/reliability/reliability_util.h"

#include <cstring>

namespace dbrq::testing {

bool bit_identical(const Tensor& a, const Tensor& b) {
  if (a.dtype() != b.dtype() || a.sizes() != b.sizes()) return false;
  const Tensor ca = a.contiguous(), cb = b.contiguous();
  return ca.nbytes() == 0 || std::memcmp(ca.data_ptr(), cb.data_ptr(), ca.nbytes()) == 0;
}

bool operator==(const ObserverRecord& a, const ObserverRecord& b) {
  return a.slot == b.slot && a.describe == b.describe && a.stats.fields == b.stats.fields &&
         a.stats.num_batches == b.stats.num_batches && a.stats.nan_count == b.stats.nan_count &&
         a.stats.inf_count == b.stats.inf_count && a.stats.mask_count == b.stats.mask_count;
}

std::vector<ObserverRecord> observer_stats(const nn::Module& model) {
  ModelQuantState& m = model_quant_state(model);
  std::vector<ObserverRecord> out;
  for (int s : observer_roots(model)) {
    const Observer& o = *m.slot(s).observer;
    out.push_back({s, o.describe(), o.stats()});
  }
  return out;
}

}  // namespace dbrq::testing
