// The optimizers' facts, one row per OptimizerType in enum order: the name, the state buffers it keeps
// (layout, and the name the Python package gives each) and the hyper-parameters it reads. The host
// checks and parse_optimizer (tbe_backward.cpp), the C API's optimizer range and its optimizer query
// (which the Python package reads instead of copying these facts) all come from this table, and so do
// the state layouts and max_norm support of the optimizers' traits (optimizer_traits.h), which the
// backends' updates are written against. Adding an optimizer: its enum value (tbe.h, embscale_c.h), its
// row here and its trait in optimizer_traits.h (with its rules in optimizer.h).
#pragma once

#include "embscale/tbe.h"

namespace embscale {
namespace opt {

// Where a state buffer's elements are (tbe.h): one float per row of the linearised tables
// ([total_rows()]) or one per weight ([num_weights()]). The values are the C API's
// EMBSCALE_STATE_* numbers and those of the public OptimizerStateLayout.
enum class StateLayout : int { kAbsent = 0, kRowwise = 1, kElementwise = 2 };
static_assert(static_cast<int>(StateLayout::kRowwise) == static_cast<int>(OptimizerStateLayout::kRowwise) &&
                  static_cast<int>(StateLayout::kElementwise) == static_cast<int>(OptimizerStateLayout::kElementwise),
              "StateLayout and OptimizerStateLayout share their values");

// How an optimizer applies weight_decay (the values of the public OptimizerWeightDecay and of the C API's
// EMBSCALE_WEIGHT_DECAY_*), FBGEMM's rules:
//   kNone       none (weight_decay must be 0 or weight_decay_mode none);
//   kByMode     as weight_decay_mode says: L2, decoupled, or none (a weight_decay is then ignored);
//   kDecoupled  by the optimizer's own decoupled rule whenever weight_decay != 0, whatever
//               weight_decay_mode says (FBGEMM's Adam, LAMB and LARS kernels take no mode; optimizer.h
//               has each rule).
enum class DecayRule : int { kNone = 0, kByMode = 1, kDecoupled = 2 };
static_assert(static_cast<int>(DecayRule::kByMode) == static_cast<int>(OptimizerWeightDecay::kByMode) &&
                  static_cast<int>(DecayRule::kDecoupled) == static_cast<int>(OptimizerWeightDecay::kDecoupled),
              "DecayRule and OptimizerWeightDecay share their values");

struct StateSpec {
  StateLayout layout;
  const char* name;  // the Python package's name of the buffer ("sum", "exp_avg", ...), "" if absent
};

struct OptimizerSpec {
  OptimizerType type;
  const char* name;        // optimizer_name()
  StateSpec momentum1;     // TbeBackwardArgs::momentum1
  StateSpec momentum2;     // TbeBackwardArgs::momentum2
  bool eps;                // reads eps (> 0)
  bool betas;              // reads beta1, beta2 (in [0, 1))
  DecayRule weight_decay;  // how it applies weight_decay
  bool max_norm;           // supports max_norm
  bool lars;               // reads eta (>= 0) and momentum (in [0, 1)): LARS-SGD
};

constexpr StateSpec kNoState{StateLayout::kAbsent, ""};

constexpr StateSpec kExpAvg{StateLayout::kElementwise, "exp_avg"};

inline constexpr OptimizerSpec kOptimizerSpecs[] = {
    // type, name, momentum1, momentum2, eps, betas, weight_decay, max_norm, lars
    {OptimizerType::kNone, "none", kNoState, kNoState, false, false, DecayRule::kNone, false, false},
    {OptimizerType::kSgd, "sgd", kNoState, kNoState, false, false, DecayRule::kNone, false, false},
    {OptimizerType::kRowwiseAdagrad, "rowwise_adagrad", {StateLayout::kRowwise, "sum"}, kNoState, true, false,
     DecayRule::kByMode, true, false},
    {OptimizerType::kAdam, "adam", kExpAvg, {StateLayout::kElementwise, "exp_avg_sq"}, true, true,
     DecayRule::kDecoupled, false, false},
    {OptimizerType::kPartialRowwiseAdam, "partial_rowwise_adam", kExpAvg, {StateLayout::kRowwise, "exp_avg_sq"},
     true, true, DecayRule::kDecoupled, false, false},
    {OptimizerType::kAdagrad, "adagrad", {StateLayout::kElementwise, "sum"}, kNoState, true, false,
     DecayRule::kNone, false, false},
    {OptimizerType::kLamb, "lamb", kExpAvg, {StateLayout::kElementwise, "exp_avg_sq"}, true, true,
     DecayRule::kDecoupled, false, false},
    {OptimizerType::kPartialRowwiseLamb, "partial_rowwise_lamb", kExpAvg, {StateLayout::kRowwise, "exp_avg_sq"},
     true, true, DecayRule::kDecoupled, false, false},
    {OptimizerType::kLarsSgd, "lars_sgd", {StateLayout::kElementwise, "momentum_buffer"}, kNoState, false, false,
     DecayRule::kDecoupled, false, true},
};
constexpr int kNumOptimizers = static_cast<int>(sizeof(kOptimizerSpecs) / sizeof(kOptimizerSpecs[0]));

constexpr bool rows_in_enum_order() {
  for (int i = 0; i < kNumOptimizers; ++i)
    if (static_cast<int>(kOptimizerSpecs[i].type) != i) return false;
  return true;
}
static_assert(rows_in_enum_order(), "kOptimizerSpecs: one row per OptimizerType, in enum order");

// The row of t, or null for a value outside the enum.
constexpr const OptimizerSpec* optimizer_spec(OptimizerType t) {
  const int i = static_cast<int>(t);
  return i >= 0 && i < kNumOptimizers ? &kOptimizerSpecs[i] : nullptr;
}

// How many state buffers of t hold one float per weight (0, 1 or 2; the CUDA backward's lane groups hold
// them in registers beside the weights).
constexpr int elementwise_state_buffers(OptimizerType t) {
  const OptimizerSpec* s = optimizer_spec(t);
  if (s == nullptr) return 0;
  return (s->momentum1.layout == StateLayout::kElementwise ? 1 : 0) +
         (s->momentum2.layout == StateLayout::kElementwise ? 1 : 0);
}
constexpr bool has_elementwise_state(OptimizerType t) { return elementwise_state_buffers(t) > 0; }

}  // namespace opt
}  // namespace embscale
