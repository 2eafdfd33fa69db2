// dbrq: define-by-run int8 quantization for eager C++ models on oneDNN.
//
//   #include "dbrq.h"   // Bazel target //:dbrq
//
//   auto model = std::make_shared<MyNet>();
//   model->load_state_dict(dbrq::load_safetensors("weights.safetensors"));
//   model->eval();
//   dbrq::prepare(*model, {example}, dbrq::default_qconfig_mapping("onednn"));
//   for (auto& batch : calibration) (*model)(batch);
//   dbrq::convert(*model);
//   dbrq::Tensor y = (*model)(x);   // int8 on oneDNN
//
// This is the one public header; everything a user needs is reachable from here.
#pragma once

// The public API, and nothing else: internals (the recorded program, observers' slots, executors,
// the op registry) are not reachable from here; tracer/introspection.h is the read-only view.
#include "core/dtype.h"
#include "core/error.h"
#include "core/logging.h"
#include "core/op_params.h"
#include "core/storage.h"
#include "core/tensor.h"
#include "core/threading.h"
#include "quant_state/observers.h"
#include "quant_state/qconfig.h"
#include "quant_state/qparams.h"
#include "quant_state/save_options.h"
#include "runtime/dispatcher.h"
#include "runtime/functional.h"
#include "runtime/init.h"
#include "runtime/module.h"
#include "runtime/nn.h"
#include "runtime/ops.h"
#include "runtime/safetensors.h"
#include "tracer/autotune.h"
#include "tracer/bias_correction.h"
#include "tracer/equalize.h"
#include "tracer/introspection.h"
#include "tracer/numerics.h"
#include "tracer/precision.h"
#include "tracer/onnx_export.h"
#include "tracer/quantize.h"
#include "tracer/smooth_quant.h"
