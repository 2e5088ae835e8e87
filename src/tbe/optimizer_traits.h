// The optimizers as traits: one struct per OptimizerType (one per row of kOptimizerSpecs, in enum
// order), which the backends' updates are written against once - the CPU row loop, the CUDA warp and
// block update (update_row) and the CUDA lane groups (group_update_row). EMBSCALE_HD, so both backends
// share them; the rules they call are in optimizer.h, the facts they read in optimizer_table.h.
//
// A trait holds:
//   state        kMomentum1 / kMomentum2: the layout of TbeBackwardArgs::momentum1 / momentum2, from
//                its table row. A row-wise buffer (at most one) is the row's state, handed to row_terms
//                (row_state picks it); the element-wise ones are the element's, handed to apply.
//   per-row      kReduction: what the row must be reduced to before its elements are updated (none;
//   terms        kSumSqGrad: the sum over the row of row_sq_term(g, w); kSumSqGradAndWeight: that and
//                the sum of w^2, LARS's), as RowSums; row_terms turns them into the row's scalars
//                (RowTerms) and updates the row-wise state in place.
//   apply        the new fp32 value of one weight from its clipped gradient, the row's scalars and the
//                element's state (updated in place); with kTrustRatio (LAMB's), the element's direction
//                r instead, the new value being trust_step(w, r, ratio) once the row's
//                ratio = trust_ratio(sum of w^2, sum of r^2) is known.
//   post-step    renormalises(p): whether the updated row is then rescaled to max_norm (the table's
//                max_norm column: row-wise Adagrad), by max_norm_factor of its sum of squares.
// Dense is kNone, dense-gradient mode: no update (kDense), the backends write the summed gradient.
//
// visit_optimizer(type, f) calls f(Trait{}) for the trait of a run-time type (host and device);
// TraitOf<type> is the trait of a compile-time one.
//
// Adding an optimizer: its value in OptimizerType (tbe.h, embscale_c.h), its row in kOptimizerSpecs,
// and its trait here, added to Traits (its rules in optimizer.h). The backends need no change.
#pragma once

#include "core/hd.h"
#include "embscale/tbe.h"
#include "tbe/optimizer.h"
#include "tbe/optimizer_table.h"

namespace embscale {
namespace opt {

// The reduction over the row that an optimizer's per-row terms need.
enum class RowReduction : int {
  kNone = 0,
  kSumSqGrad = 1,           // sum over d of row_sq_term(g[d], w[d]) (in each backend's fixed order)
  kSumSqGradAndWeight = 2,  // that, and the sum over d of w[d]^2
};

// A row's sums (the reduction a trait asks for); those it does not ask for stay 0.
struct RowSums {
  float grad = 0.0f;    // sum over d of row_sq_term(g[d], w[d])
  float weight = 0.0f;  // kSumSqGradAndWeight: sum over d of w[d]^2 (the weights before the update)
};

// A row's scalars (row_terms), the same type for every optimizer so that a backend may compute them in
// one visit and apply them in another. Each trait says which it sets; the others keep these values.
struct RowTerms {
  float mult = 0.0f;   // row-wise Adagrad: lr / (sqrt(m) + eps); LARS-SGD: the row's rate (lars_rate)
  float corr = 1.0f;   // row-wise Adagrad: the factor on w (weight decay)
  float denom = 1.0f;  // partial row-wise Adam and LAMB: sqrt(v / (1 - beta2^step)) + eps
};

// What a trait takes from its table row: its type, its state buffers and whether it supports max_norm.
template <OptimizerType T>
struct TableFacts {
  static constexpr OptimizerType kType = T;
  static constexpr StateLayout kMomentum1 = kOptimizerSpecs[static_cast<int>(T)].momentum1.layout;
  static constexpr StateLayout kMomentum2 = kOptimizerSpecs[static_cast<int>(T)].momentum2.layout;
  static constexpr bool kElementM1 = kMomentum1 == StateLayout::kElementwise;
  static constexpr bool kElementM2 = kMomentum2 == StateLayout::kElementwise;
  static constexpr bool kRowState = kMomentum1 == StateLayout::kRowwise || kMomentum2 == StateLayout::kRowwise;
  static constexpr bool kMaxNorm = kOptimizerSpecs[static_cast<int>(T)].max_norm;
  static constexpr bool kTrustRatio = false;  // LAMB's traits say true (apply gives the direction)
  static_assert(!(kMomentum1 == StateLayout::kRowwise && kMomentum2 == StateLayout::kRowwise),
                "at most one row-wise state buffer (row_state)");
  static_assert(!kMaxNorm || !(kElementM1 || kElementM2),
                "max_norm recomputes a row's new values after its norm (CUDA update_row), which an "
                "element-wise state would not survive");

  // The row-wise state buffer (one float per row) of momentum1 / momentum2, null if none.
  EMBSCALE_HD static float* row_state(float* m1, float* m2) {
    return kMomentum1 == StateLayout::kRowwise ? m1 : kMomentum2 == StateLayout::kRowwise ? m2 : nullptr;
  }
  // Post-step: whether the updated row is rescaled by max_norm_factor of its sum of squares.
  EMBSCALE_HD static bool renormalises(const OptimizerParams& p) { return kMaxNorm && p.max_norm > 0.0f; }
};

// ---- the traits ------------------------------------------------------------------------------------

// Dense-gradient mode (none): no update; the backends write the row's unclipped gradient sum.
struct Dense : TableFacts<OptimizerType::kNone> {
  static constexpr bool kDense = true;
  static constexpr RowReduction kReduction = RowReduction::kNone;
};

struct Sgd : TableFacts<OptimizerType::kSgd> {
  static constexpr bool kDense = false;
  static constexpr RowReduction kReduction = RowReduction::kNone;
  EMBSCALE_HD static float apply(float w, float g, const RowTerms&, float*, float*, const OptimizerParams& p,
                                 const AdamCorrections&) {
    return sgd_apply(w, g, p);
  }
};

struct RowwiseAdagrad : TableFacts<OptimizerType::kRowwiseAdagrad> {
  static constexpr bool kDense = false;
  static constexpr RowReduction kReduction = RowReduction::kSumSqGrad;
  // state: the row's m (momentum1), updated in place.
  EMBSCALE_HD static RowTerms row_terms(float* state, const RowSums& s, int D, const OptimizerParams& p,
                                        const AdamCorrections&) {
    RowTerms t;
    t.mult = rowwise_adagrad_multiplier(state, s.grad, D, p);
    t.corr = rowwise_adagrad_correction(t.mult, p);
    return t;
  }
  EMBSCALE_HD static float apply(float w, float g, const RowTerms& t, float*, float*, const OptimizerParams&,
                                 const AdamCorrections&) {
    return rowwise_adagrad_apply(w, g, t.mult, t.corr);
  }
};

struct Adam : TableFacts<OptimizerType::kAdam> {
  static constexpr bool kDense = false;
  static constexpr RowReduction kReduction = RowReduction::kNone;
  // m1, m2: the element's first and second moments, updated in place.
  EMBSCALE_HD static float apply(float w, float g, const RowTerms&, float* m1, float* m2, const OptimizerParams& p,
                                 const AdamCorrections& c) {
    return adam_apply(w, g, m1, m2, p, c);
  }
};

// The partial row-wise forms' second moment: one v per row, from the row's squared gradient sum; its
// denominator is the row's term of apply.
struct RowwiseSecondMoment {
  static constexpr RowReduction kReduction = RowReduction::kSumSqGrad;
  // state: the row's v (momentum2), updated in place.
  EMBSCALE_HD static RowTerms row_terms(float* state, const RowSums& s, int D, const OptimizerParams& p,
                                        const AdamCorrections& c) {
    RowTerms t;
    t.denom = partial_rowwise_adam_denominator(state, s.grad, D, p, c);
    return t;
  }
};

struct PartialRowwiseAdam : TableFacts<OptimizerType::kPartialRowwiseAdam>, RowwiseSecondMoment {
  static constexpr bool kDense = false;
  // m1: the element's first moment, updated in place.
  EMBSCALE_HD static float apply(float w, float g, const RowTerms& t, float* m1, float*, const OptimizerParams& p,
                                 const AdamCorrections& c) {
    return partial_rowwise_adam_apply(w, g, m1, t.denom, p, c);
  }
};

struct Adagrad : TableFacts<OptimizerType::kAdagrad> {
  static constexpr bool kDense = false;
  static constexpr RowReduction kReduction = RowReduction::kNone;
  // m1: the element's sum of squared gradients, updated in place.
  EMBSCALE_HD static float apply(float w, float g, const RowTerms&, float* m1, float*, const OptimizerParams& p,
                                 const AdamCorrections&) {
    return adagrad_apply(w, g, m1, p);
  }
};

struct Lamb : TableFacts<OptimizerType::kLamb> {
  static constexpr bool kDense = false;
  static constexpr RowReduction kReduction = RowReduction::kNone;
  static constexpr bool kTrustRatio = true;
  // The element's direction; m1, m2: its moments, updated in place.
  EMBSCALE_HD static float apply(float w, float g, const RowTerms&, float* m1, float* m2, const OptimizerParams& p,
                                 const AdamCorrections& c) {
    return lamb_direction(w, g, m1, m2, p, c);
  }
};

struct PartialRowwiseLamb : TableFacts<OptimizerType::kPartialRowwiseLamb>, RowwiseSecondMoment {
  static constexpr bool kDense = false;
  static constexpr bool kTrustRatio = true;
  // The element's direction; m1: its first moment, updated in place.
  EMBSCALE_HD static float apply(float w, float g, const RowTerms& t, float* m1, float*, const OptimizerParams& p,
                                 const AdamCorrections& c) {
    return partial_rowwise_lamb_direction(w, g, m1, t.denom, p, c);
  }
};

struct LarsSgd : TableFacts<OptimizerType::kLarsSgd> {
  static constexpr bool kDense = false;
  static constexpr RowReduction kReduction = RowReduction::kSumSqGradAndWeight;
  // No row-wise state (state is null): the row's rate from its norms.
  EMBSCALE_HD static RowTerms row_terms(float*, const RowSums& s, int, const OptimizerParams& p,
                                        const AdamCorrections&) {
    RowTerms t;
    t.mult = lars_rate(s.weight, s.grad, p);
    return t;
  }
  // m1: the element's velocity, updated in place.
  EMBSCALE_HD static float apply(float w, float g, const RowTerms& t, float* m1, float*, const OptimizerParams& p,
                                 const AdamCorrections&) {
    return lars_sgd_apply(w, g, m1, t.mult, p);
  }
};

// ---- the list, the visit ---------------------------------------------------------------------------

template <typename... Ts>
struct TraitList {};

// Every trait, in the table's (and the enum's) order.
using Traits = TraitList<Dense, Sgd, RowwiseAdagrad, Adam, PartialRowwiseAdam, Adagrad, Lamb, PartialRowwiseLamb,
                         LarsSgd>;

template <typename... Ts>
constexpr bool traits_follow_table(TraitList<Ts...>) {
  int i = 0;
  bool ok = sizeof...(Ts) == static_cast<size_t>(kNumOptimizers);
  ((ok = ok && static_cast<int>(Ts::kType) == i++), ...);
  return ok;
}
static_assert(traits_follow_table(Traits{}), "Traits: one trait per row of kOptimizerSpecs, in its order");

// The trait of a compile-time type: the list's entry at the type's index.
template <int I, typename List>
struct NthTrait;
template <typename First, typename... Rest>
struct NthTrait<0, TraitList<First, Rest...>> {
  using type = First;
};
template <int I, typename First, typename... Rest>
struct NthTrait<I, TraitList<First, Rest...>> {
  using type = typename NthTrait<I - 1, TraitList<Rest...>>::type;
};
template <OptimizerType T>
using TraitOf = typename NthTrait<static_cast<int>(T), Traits>::type;

// f(Trait{}) for the trait of t; every call of f returns the same type. A compare per trait, in list
// order (a switch once compiled); a t outside the enum, which the API layer refuses, calls nothing and
// gives a value-initialised result. (The exec-check pragma lets host code pass a host-only f; device
// code passes device or host-device ones.)
#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename F, typename First, typename... Rest>
EMBSCALE_HD auto visit_trait_list(OptimizerType t, F&& f, TraitList<First, Rest...>) {
  if (t == First::kType) return f(First{});
  if constexpr (sizeof...(Rest) == 0) {
    return decltype(f(First{}))();
  } else {
    return visit_trait_list(t, static_cast<F&&>(f), TraitList<Rest...>{});
  }
}

#if defined(__CUDACC__)
#pragma nv_exec_check_disable
#endif
template <typename F>
EMBSCALE_HD auto visit_optimizer(OptimizerType t, F&& f) {
  return visit_trait_list(t, static_cast<F&&>(f), Traits{});
}

// Run-time questions of the backends, answered by the trait.
EMBSCALE_HD bool dense_mode(OptimizerType t) {
  return visit_optimizer(t, [](auto o) { return decltype(o)::kDense; });
}
EMBSCALE_HD RowReduction row_reduction(OptimizerType t) {
  return visit_optimizer(t, [](auto o) { return decltype(o)::kReduction; });
}
EMBSCALE_HD bool trust_ratio_step(OptimizerType t) {
  return visit_optimizer(t, [](auto o) { return decltype(o)::kTrustRatio; });
}
EMBSCALE_HD bool renormalises(const OptimizerParams& p) {
  return visit_optimizer(p.type, [&](auto o) { return decltype(o)::renormalises(p); });
}

}  // namespace opt
}  // namespace embscale
