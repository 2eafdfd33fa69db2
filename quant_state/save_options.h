// Options of dbrq::save_quant_state (tracer/quantize.h); the format is described in
// quant_state/serialization.h.
#pragma once

namespace dbrq {

// The version of the quant-state document save_quant_state writes.
inline constexpr int kQuantStateVersion = 3;  // 2: records with portable identity; 3: pass-through ops pass on their source

struct SaveQuantStateOptions {
  // Also store observer statistics (histograms, running ranges) so calibration can continue
  // after loading. Without them the file holds the final parameters only.
  bool include_observer_stats = false;
};

}  // namespace dbrq
