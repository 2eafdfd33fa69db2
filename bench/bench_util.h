// Helpers shared by the bench/ programs (not part of dbrq's API).
#ifndef DBRQ_BENCH_BENCH_UTIL_H_
#define DBRQ_BENCH_BENCH_UTIL_H_

#include <string>

#include "dbrq.h"

namespace bench {

// The value of `--name=value` on the command line (`--name` alone: "1"), or `fallback`.
inline std::string flag(int argc, char** argv, const std::string& name, const std::string& fallback) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind(prefix, 0) == 0) return a.substr(prefix.size());
    if (a == "--" + name) return "1";
  }
  return fallback;
}

// default_qconfig_mapping("onednn") with its global activation observer replaced by `kind`: an
// ObserverKind name ("Histogram", "Mse", "Percentile", ...; ValueError otherwise) or
// "Histogram+torch_edges" (PyTorch 1.13's HistogramObserver exactly, integer bin edges). "default"
// or "" keeps the mapping as it is.
inline dbrq::QConfigMapping default_mapping_with_observer(const std::string& kind) {
  dbrq::QConfigMapping m = dbrq::default_qconfig_mapping("onednn");
  if (kind.empty() || kind == "default") return m;
  const dbrq::QConfigPtr d = dbrq::default_qconfig("onednn");
  dbrq::ObserverSpec spec = d->activation;
  if (kind == "Histogram+torch_edges") {
    spec.kind = dbrq::ObserverKind::kHistogram;
    spec.torch_integer_edges = true;
  } else {
    spec.kind = dbrq::observer_kind_from_name(kind);
  }
  m.set_global(dbrq::QConfig::make(spec, d->weight));
  return m;
}

}  // namespace bench

#endif  // DBRQ_BENCH_BENCH_UTIL_H_
