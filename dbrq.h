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

#include "quant_state/auto_quant_state.h"
#include "quant_state/observers.h"
#include "quant_state/qconfig.h"
#include "quant_state/qparams.h"
#include "quant_state/serialization.h"
#include "runtime/dispatcher.h"
#include "core/error.h"
#include "core/logging.h"
#include "runtime/module.h"
#include "runtime/nn.h"
#include "runtime/ops.h"
#include "runtime/safetensors.h"
#include "core/storage.h"
#include "core/tensor.h"
#include "core/threading.h"
#include "tracer/numerics.h"
#include "tracer/quantize.h"
