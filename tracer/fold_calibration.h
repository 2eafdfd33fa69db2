// Calibration of a weighted op whose fused chain folds a batch norm, as the chain will run after
// convert: the op computes with the folded weight and bias, and the batch norm passes that result
// on. PyTorch FX does the same (prepare_fx folds each batch norm into its conv or linear before
// calibrating), so the same observer kind sees the same values and gives the same parameters;
// observing the unfused conv -> batch_norm chain moved ranges by a few float ulps and flipped int8
// codes (tests/models/digits_residual_test.cc).
//
// Used by the interceptor on calibrating calls that feed observers:
//
//   Tensor out = observe ? run_observed(state, op, call) : run_fp32(call);
//
// The op itself still returns its own, unfolded result, so anything else that reads it (another
// branch's op, a view, the user's code) sees the true value; only the batch norm record the chain
// was folded for, receiving that very tensor, takes the folded value instead. The batch norm's
// statistics are the ones its record captured (they share storage with the layer's buffers); at
// the batch norm the call's statistics are checked against those (same storage, same version, same
// parameters), and if they differ the batch norm runs on the unfolded result as it is, so a
// mismatch never gives a wrong value. The base op computes twice on such calls (unfolded and
// folded). Everything is thread-local and dropped when the outermost call of the model ends or
// unwinds.
#pragma once

#include "quant_state/auto_quant_state.h"
#include "runtime/dispatcher.h"

namespace dbrq::tracer {

// `op` is the record of `call` in `s`. When `op` is the base of a fused chain whose next member
// folds (batch_norm) and whose statistics are known, runs the call as it is (*out) and with the
// folded weight and bias (kept for the batch norm), and returns true; otherwise returns false
// without running anything.
bool run_folded_base(const AutoQuantizationState& s, const SeenOpInfo& op, const OpCall& call, Tensor* out);

// `op` is the record of `call`. When the call's activation input is a folded result of this thread
// (run_folded_base) meant for `op`, sets *out to the value the chain has at `op` and returns true;
// otherwise returns false (run the op as it is).
bool take_folded(const SeenOpInfo& op, const OpCall& call, Tensor* out);

// What an observed calibrating call of `op` (its record in `s`) computes: the folded chain as
// above, and weighted ops in PyTorch 1.13's order of sums (OpDef::calibrate_run), so each observer
// sees exactly the values its PyTorch FX counterpart sees.
Tensor run_observed(const AutoQuantizationState& s, const SeenOpInfo& op, const OpCall& call);

// Forgets this thread's folded results (the outermost call ended or unwound).
void drop_folds_on_this_thread() noexcept;

}  // namespace dbrq::tracer
