// The shared harness of the C API fuzzer (fuzz_capi.cpp, which describes the properties checked):
// status codes, the seeded generator, guarded buffers, one case with its expectations, and the
// argument generators and mutations every function family uses.
#pragma once

#include "embscale/embscale_c.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <cstdarg>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <limits>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define FUZZ_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define FUZZ_ASAN 1
#endif
#endif
#ifndef FUZZ_ASAN
#define FUZZ_ASAN 0
#endif

namespace fuzz {

// ---- status codes and enumerations, as the C API numbers them ---------------------------------------
enum Code { kOk = 0, kInvalidArgument = 1, kUnsupported = 2, kOutOfRange = 3, kWorkspaceTooSmall = 4,
            kBackendError = 5 };
enum DT { kF32 = 0, kF16 = 1, kBF16 = 2, kE4M3 = 3, kE5M2 = 4, kI32 = 5, kI64 = 6 };
constexpr int kNumDtypes = 7;
inline size_t dtype_size(int dt) {
  static const size_t kSizes[kNumDtypes] = {4, 2, 2, 1, 1, 4, 8};
  return dt >= 0 && dt < kNumDtypes ? kSizes[dt] : 1;
}
inline bool is_float(int dt) { return dt == kF32 || dt == kF16 || dt == kBF16; }
inline bool is_fp8(int dt) { return dt == kE4M3 || dt == kE5M2; }

// ---- random numbers ---------------------------------------------------------------------------------
inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed) {}
  uint64_t next() {
    s += 0x9e3779b97f4a7c15ull;
    return splitmix64(s);
  }
  uint64_t below(uint64_t n) { return n == 0 ? 0 : next() % n; }
  int64_t range(int64_t lo, int64_t hi) {  // inclusive
    return lo + static_cast<int64_t>(below(static_cast<uint64_t>(hi - lo) + 1));
  }
  bool chance(double p) { return static_cast<double>(next() >> 11) * 0x1.0p-53 < p; }
  template <typename T>
  T pick(std::initializer_list<T> l) {
    return *(l.begin() + below(l.size()));
  }
};

inline std::string fmt(const char* f, ...) {
  char buf[512];
  va_list ap;
  va_start(ap, f);
  vsnprintf(buf, sizeof buf, f, ap);
  va_end(ap);
  return buf;
}

// ---- buffers ----------------------------------------------------------------------------------------
// What a call may do to a buffer: inputs are never written; tables and optimizer state only by a call
// that succeeds; outputs and workspaces anything (within their bounds).
enum class Role { kInput, kTable, kState, kOutput, kScratch };

#if FUZZ_ASAN
constexpr size_t kGuard = 0;  // AddressSanitizer sees any access past the allocation itself
#else
constexpr size_t kGuard = 64;
#endif
constexpr unsigned char kGuardByte = 0xA5;

struct Buf {
  std::string name;
  Role role = Role::kOutput;
  size_t bytes = 0;
  size_t shift = 0;  // extra offset of the data pointer (a misaligned pointer)
  unsigned char* base = nullptr;
  std::vector<unsigned char> snap;
  unsigned char* p() const { return base + kGuard + shift; }
  ~Buf() { std::free(base); }
};

// ---- one case ---------------------------------------------------------------------------------------
// What a mutation implies for the outcome. kLabel: nothing by itself (a later verdict decides).
enum class Expect { kAny, kOk, kFail, kLabel };

struct Case {
  uint64_t seed = 0;
  int64_t index = 0;
  Rng rng{0};
  std::string op;
  std::vector<std::string> muts;  // mutations applied, for the report
  bool must_fail = false;
  bool must_ok = false;           // set by a case that models validity exactly
  int fail_code = -1;             // the code when exactly one mutation decides it
  int fail_votes = 0;
  std::deque<Buf> bufs;
  std::vector<std::string> failures;
  std::set<std::string> vocab;    // argument names a message may start with
  std::function<void(const std::string&)> announce;  // told the case's description before each call

  explicit Case(uint64_t s, int64_t k) : seed(s), index(k), rng(splitmix64(s ^ splitmix64(static_cast<uint64_t>(k)))) {}

  int unknown = 0;                // mutations whose outcome is not known (Expect::kAny)
  std::set<std::string> touched;  // arguments already mutated (each is mutated at most once a case)

  // Records a mutation; `e` says what it implies for the outcome (kOk: the call stays valid; kFail:
  // the library can tell it is wrong; kAny: either), `code` the specific status if any.
  void mut(const std::string& what, Expect e = Expect::kAny, int code = -1) {
    muts.push_back(what);
    if (e == Expect::kAny) ++unknown;
    if (e == Expect::kFail) {
      must_fail = true;
      ++fail_votes;
      fail_code = code;
    }
  }
  void fail(const std::string& why) { failures.push_back(why); }

  Buf* alloc(const std::string& name, size_t bytes, Role role, size_t shift = 0) {
    bufs.emplace_back();
    Buf& b = bufs.back();
    b.name = name;
    b.role = role;
    b.bytes = bytes;
    b.shift = shift;
    b.base = static_cast<unsigned char*>(std::malloc(bytes + shift + 2 * kGuard + 1));
    if (b.base == nullptr) {
      std::fprintf(stderr, "fuzz_capi: out of host memory (%zu bytes)\n", bytes);
      std::abort();
    }
    std::memset(b.base, kGuardByte, bytes + shift + 2 * kGuard + 1);
    for (size_t i = 0; i < bytes; ++i) b.p()[i] = static_cast<unsigned char>(rng.next());
    return &b;
  }
  // Called right before the library call: keeps byte copies and announces what is about to run.
  void snapshot();
  // After a call that returned rc: guards, inputs, and tables/state of a refused call.
  void check_buffers(int rc) {
    for (Buf& b : bufs) {
      if (kGuard > 0) {
        for (size_t i = 0; i < kGuard + b.shift; ++i)
          if (b.base[i] != kGuardByte) {
            fail(b.name + ": written before its start");
            break;
          }
        for (size_t i = 0; i < kGuard + 1; ++i)
          if (b.p()[b.bytes + i] != kGuardByte) {
            fail(b.name + ": written past its end (" + std::to_string(b.bytes) + " bytes)");
            break;
          }
      }
      const bool keep = b.role == Role::kInput || ((b.role == Role::kTable || b.role == Role::kState) && rc != kOk);
      if (keep && b.bytes > 0 && b.snap.size() == b.bytes && std::memcmp(b.snap.data(), b.p(), b.bytes) != 0)
        fail(b.name + (b.role == Role::kInput ? ": an input was written" : ": changed by a refused call"));
    }
  }
};

inline std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : "; ") + x;
  return s.empty() ? "valid" : s;
}

inline void Case::snapshot() {
  for (Buf& b : bufs) b.snap.assign(b.p(), b.p() + b.bytes);
  if (announce) announce(op + " [" + join(muts) + "]");
}

// The text before the first ':' of a message must contain one of the function's argument names.
inline bool names_argument(const std::string& msg, const std::set<std::string>& vocab) {
  const size_t colon = msg.find(':');
  if (colon == std::string::npos) return false;
  const std::string head = msg.substr(0, colon);
  std::string tok;
  for (size_t i = 0; i <= head.size(); ++i) {
    const char c = i < head.size() ? head[i] : ' ';
    if (std::isalnum(static_cast<unsigned char>(c)) || c == '_') {
      tok += c;
    } else {
      if (!tok.empty() && vocab.count(tok)) return true;
      tok.clear();
    }
  }
  return false;
}

// Told the status of every checked call (the driver tallies them per function).
inline std::function<void(const char* fn, int rc)> g_tally;

// Checks the outcome of one call of the case.
inline void check_call(Case& c, const char* fn, int rc) {
  if (g_tally) g_tally(fn, rc);
  const char* err = embscale_last_error();
  const std::string msg = err ? err : "";
  if (rc < kOk || rc > kBackendError) {
    c.fail(fmt("%s returned %d, not a documented status code", fn, rc));
  } else if (rc != kOk) {
    if (msg.empty()) c.fail(fmt("%s returned %d with an empty embscale_last_error()", fn, rc));
    else if (!names_argument(msg, c.vocab)) c.fail(fmt("%s: message names no argument: \"%s\"", fn, msg.c_str()));
  }
  if ((c.must_ok || (!c.must_fail && c.unknown == 0)) && rc != kOk) c.fail(fmt("%s: a valid call was refused (%d): %s", fn, rc, msg.c_str()));
  if (c.must_fail && rc == kOk) c.fail(fmt("%s: accepted an argument it can tell is wrong", fn));
  if (c.must_fail && c.fail_votes == 1 && c.unknown == 0 && c.fail_code >= 0 && rc != kOk && rc != c.fail_code)
    c.fail(fmt("%s returned %d, expected %d: %s", fn, rc, c.fail_code, msg.c_str()));
  c.check_buffers(rc);
}

// A call that must be refused (outside the case's own expectations): code and message.
inline void expect_refusal(Case& c, const char* fn, int rc) {
  const char* err = embscale_last_error();
  if (rc == kOk) c.fail(fmt("%s succeeded", fn));
  else if (rc < kOk || rc > kBackendError) c.fail(fmt("%s returned %d, not a documented status code", fn, rc));
  else if (err == nullptr || err[0] == '\0') c.fail(fmt("%s: empty embscale_last_error()", fn));
  else if (!names_argument(err, c.vocab)) c.fail(fmt("%s: message names no argument: \"%s\"", fn, err));
}

// Claims argument `what` for a mutation: false when an earlier mutation of this case changed it (a second
// one could undo the first, e.g. a bad value overwritten by a good one).
inline bool touch(Case& c, const std::string& what) { return c.touched.insert(what).second; }

// ---- shared argument generators ---------------------------------------------------------------------
const int32_t kBadEnums[] = {-1, 7, 99, 1000, INT32_MIN, INT32_MAX};
inline int32_t bad_enum(Case& c, int32_t first_bad) {
  const int32_t v = kBadEnums[c.rng.below(sizeof kBadEnums / sizeof kBadEnums[0])];
  return v >= 0 && v < first_bad ? first_bad : v;
}

// A CPU context, sometimes hostile. `ctx_ptr` is set to null for the null-context mutation.
struct Ctx {
  embscale_context c{};
  bool null = false;
  const embscale_context* ptr() const { return null ? nullptr : &c; }
};
// `tbe`: for ops of a TableBatchedEmbedding (created on the CPU), where a CUDA context is an argument
// that does not match the object rather than an unsupported backend.
inline void make_ctx(Case& c, Ctx* x, bool cuda_compiled, double p_mut = 0.08, bool tbe = false) {
  x->c.backend = 0;
  x->c.num_threads = static_cast<int32_t>(c.rng.range(0, 2));
  x->c.stream = nullptr;
  if (!c.rng.chance(p_mut)) return;
  switch (c.rng.below(5)) {
    case 0:
      x->null = true;
      c.mut("ctx=NULL", Expect::kFail, kInvalidArgument);
      break;
    case 1:
      x->c.backend = c.rng.pick<int32_t>({-1, 2, 7, INT32_MIN, INT32_MAX});
      c.mut(fmt("ctx.backend=%d", x->c.backend), Expect::kFail, kInvalidArgument);
      break;
    case 2:
      x->c.backend = 1;
      if (cuda_compiled) c.mut("ctx.backend=cuda(host pointers)");  // not run: see make_ctx's callers
      else c.mut("ctx.backend=cuda(not compiled)", Expect::kFail, tbe ? -1 : kUnsupported);
      break;
    case 3:
      x->c.num_threads = c.rng.pick<int32_t>({-1, -7, INT32_MIN});
      c.mut(fmt("ctx.num_threads=%d", x->c.num_threads), Expect::kFail, kInvalidArgument);
      break;
    default:
      // More threads than cores are fine up to 1024 (context.h); more are refused. An unchecked huge
      // count makes OpenMP try to start them all (and crash), so these stay rare.
      if (c.rng.chance(0.25)) {
        x->c.num_threads = c.rng.pick<int32_t>({1025, 1 << 20, INT32_MAX});
        c.mut(fmt("ctx.num_threads=%d", x->c.num_threads), Expect::kFail, kInvalidArgument);
      } else {
        x->c.num_threads = c.rng.pick<int32_t>({3, 8, 64, 1024});
        c.mut(fmt("ctx.num_threads=%d", x->c.num_threads), Expect::kOk);
      }
  }
}

// fp16 <-> fp32 (the conversion to fp16 truncates; it only makes moderate test values).
inline float half_to_float(uint16_t h) {
  const uint32_t s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
  float v;
  if (e == 0) {
    v = std::ldexp(static_cast<float>(m), -24);
  } else if (e == 31) {
    v = m ? NAN : INFINITY;
  } else {
    v = std::ldexp(static_cast<float>(m | 1024), static_cast<int>(e) - 25);
  }
  return s ? -v : v;
}
inline uint16_t float_to_half(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const int e = static_cast<int>((bits >> 23) & 255) - 127 + 15;
  if (e <= 0) return static_cast<uint16_t>(sign);
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(e) << 10) | ((bits >> 13) & 1023));
}
// Element i of a float tensor (fp32, fp16 or bf16) at p, as fp32.
inline float load_float(const void* p, int dt, int64_t i) {
  if (dt == kF32) {
    float v;
    std::memcpy(&v, static_cast<const char*>(p) + 4 * i, 4);
    return v;
  }
  uint16_t h;
  std::memcpy(&h, static_cast<const char*>(p) + 2 * i, 2);
  if (dt == kF16) return half_to_float(h);
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

// Fills n elements of dtype dt at p with values: mostly moderate, some special (inf, NaN, -0, huge).
inline void fill_values(Case& c, void* p, int dt, int64_t n, bool specials = true) {
  for (int64_t i = 0; i < n; ++i) {
    float v;
    const uint64_t k = specials ? c.rng.below(20) : 19;
    if (k == 0) v = INFINITY;
    else if (k == 1) v = -INFINITY;
    else if (k == 2) v = NAN;
    else if (k == 3) v = -0.0f;
    else if (k == 4) v = 3e38f;
    else if (k == 5) v = 1e-42f;
    else v = static_cast<float>(static_cast<double>(static_cast<int64_t>(c.rng.below(2000001)) - 1000000) * 1e-3);
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    if (dt == kF32) {
      std::memcpy(static_cast<char*>(p) + 4 * i, &v, 4);
    } else if (dt == kBF16) {
      const uint16_t h = static_cast<uint16_t>(bits >> 16);
      std::memcpy(static_cast<char*>(p) + 2 * i, &h, 2);
    } else if (dt == kF16) {
      // with specials any pattern (every fp16 value, NaNs included), else the value
      const uint16_t h = specials ? static_cast<uint16_t>(c.rng.next()) : float_to_half(v);
      std::memcpy(static_cast<char*>(p) + 2 * i, &h, 2);
    } else {
      const size_t es = dtype_size(dt);
      for (size_t b = 0; b < es; ++b) static_cast<unsigned char*>(p)[es * i + b] = static_cast<unsigned char>(c.rng.next());
    }
  }
}

// A tensor descriptor and the buffer behind it.
struct Tensor {
  embscale_tensor d{};
  bool null = false;      // pass NULL instead of the descriptor
  bool embedded = false;  // a field of an argument struct (no pointer of its own to make NULL)
  Buf* buf = nullptr;
  const embscale_tensor* ptr() const { return null ? nullptr : &d; }
  // Elements of the descriptor's shape; -1 when it is not a valid count (bad ndim, negative, overflow).
  int64_t numel() const {
    if (d.ndim < 1 || d.ndim > 4) return -1;
    int64_t n = 1;
    for (int i = 0; i < d.ndim; ++i)
      if (d.shape[i] < 0 || __builtin_mul_overflow(n, d.shape[i], &n)) return -1;
    return n;
  }
};

// A valid shape of ndim dimensions (1..4) and at most about max_numel elements (0 sometimes).
inline void random_shape(Case& c, embscale_tensor* d, int64_t max_numel) {
  d->ndim = static_cast<int32_t>(c.rng.range(1, 4));
  int64_t left = std::max<int64_t>(1, max_numel);
  for (int i = 0; i < 4; ++i) d->shape[i] = 0;
  for (int i = 0; i < d->ndim; ++i) {
    const int64_t hi = std::max<int64_t>(1, i + 1 == d->ndim ? left : std::min<int64_t>(left, 40));
    d->shape[i] = c.rng.chance(0.03) ? 0 : c.rng.range(1, hi);
    left = std::max<int64_t>(1, left / std::max<int64_t>(1, d->shape[i]));
  }
}
inline void set_shape(embscale_tensor* d, std::initializer_list<int64_t> s) {
  d->ndim = static_cast<int32_t>(s.size());
  int i = 0;
  for (int64_t v : s) d->shape[i++] = v;
  for (; i < 4; ++i) d->shape[i] = 0;
}

// Allocates the buffer of t's (valid) shape and fills it.
inline void materialise(Case& c, Tensor* t, const std::string& name, Role role, bool fill = true) {
  const int64_t n = t->numel();
  t->buf = c.alloc(name, static_cast<size_t>(n) * dtype_size(t->d.dtype), role);
  t->d.data = n > 0 || c.rng.chance(0.5) ? t->buf->p() : nullptr;  // an empty tensor's data may be NULL
  if (fill && n > 0) fill_values(c, t->buf->p(), t->d.dtype, n);
}

// How the library knows the length of an argument: not at all, fixed by the configuration (so another
// length is refused), or by a partner argument (the case compares the two after the mutations).
enum class Len { kUnchecked, kFixed, kPartner };

// How the library uses an argument's data pointer: required (NULL refused unless empty), optional
// (NULL: absent), or not at all (a size query). Present pointers that are used must be aligned.
enum class Data { kRequired, kOptional, kIgnored };

// Hostile mutations of one tensor argument. `dtype_ok(dt)` says which dtypes the argument accepts.
// Returns true when a mutation was applied.
inline bool mutate_tensor(Case& c, Tensor* t, const std::string& name, Role role, const std::function<bool(int)>& dtype_ok,
                   Len len, bool shape_free, Data data = Data::kRequired) {
  if (!touch(c, name)) return false;
  if (data == Data::kOptional && t->d.data == nullptr) return false;  // absent: nothing of it is looked at
  switch (c.rng.below(10)) {
    case 0:
      if (t->embedded) return false;
      t->null = true;
      c.mut(name + "=NULL", Expect::kFail, kInvalidArgument);
      return true;
    case 1:
      if (t->numel() <= 0) return false;
      t->d.data = nullptr;
      c.mut(name + ".data=NULL", data == Data::kRequired ? Expect::kFail : Expect::kAny, kInvalidArgument);
      return true;
    case 2:
      t->d.dtype = bad_enum(c, kNumDtypes);
      c.mut(fmt("%s.dtype=%d", name.c_str(), t->d.dtype), Expect::kFail, kInvalidArgument);
      return true;
    case 3: {  // a valid dtype of the wrong kind, same number of bytes behind it where possible
      std::vector<int> wrong;
      for (int dt = 0; dt < kNumDtypes; ++dt)
        if (!dtype_ok(dt) && dtype_size(dt) <= dtype_size(t->d.dtype)) wrong.push_back(dt);
      if (wrong.empty()) return false;
      t->d.dtype = wrong[c.rng.below(wrong.size())];
      c.mut(fmt("%s.dtype=%d(wrong kind)", name.c_str(), t->d.dtype), Expect::kFail, kInvalidArgument);
      return true;
    }
    case 4:
      t->d.ndim = c.rng.pick<int32_t>({0, 5, -1, 100, INT32_MIN});
      c.mut(fmt("%s.ndim=%d", name.c_str(), t->d.ndim), Expect::kFail, kInvalidArgument);
      return true;
    case 5: {
      if (t->d.ndim < 1 || t->d.ndim > 4) return false;  // (an earlier mutation made ndim invalid)
      const int i = static_cast<int>(c.rng.below(static_cast<uint64_t>(t->d.ndim)));
      t->d.shape[i] = c.rng.pick<int64_t>({-1, -2, INT64_MIN, -(int64_t{1} << 40)});
      c.mut(fmt("%s.shape[%d]=%" PRId64, name.c_str(), i, t->d.shape[i]), Expect::kFail, kInvalidArgument);
      return true;
    }
    case 6: {  // element count overflows int64, or the byte count does (small buffer behind it)
      if (c.rng.chance(0.5)) {
        set_shape(&t->d, {int64_t{1} << 32, int64_t{1} << 32});
        if (c.rng.chance(0.5)) set_shape(&t->d, {INT64_MAX, 2});
        if (c.rng.chance(0.3)) set_shape(&t->d, {3, int64_t{1} << 21, int64_t{1} << 21, int64_t{1} << 21});
        c.mut(name + ".shape=overflowing elements", Expect::kFail, kInvalidArgument);
      } else {
        if (dtype_size(t->d.dtype) < 2) return false;
        set_shape(&t->d, {int64_t{1} << 62});
        c.mut(name + ".shape=overflowing bytes", Expect::kFail, kInvalidArgument);
      }
      if (t->d.data == nullptr) t->d.data = c.alloc(name + "(small)", 64, role)->p();
      return true;
    }
    case 7: {  // a too-short (or too-long) buffer with its true shape
      const int64_t n = t->numel();
      if (len == Len::kUnchecked || n < 0 || n > (int64_t{1} << 24)) return false;
      const int64_t m = c.rng.chance(0.5) && n > 0 ? n - 1 : n + static_cast<int64_t>(c.rng.range(1, 3));
      Buf* b = c.alloc(name + "(resized)", static_cast<size_t>(m) * dtype_size(t->d.dtype), role);
      fill_values(c, b->p(), t->d.dtype, m);
      set_shape(&t->d, {m});
      t->d.data = m > 0 ? b->p() : nullptr;
      t->buf = b;
      c.mut(fmt("%s: %" PRId64 " elements instead of %" PRId64, name.c_str(), m, n),
            len == Len::kFixed ? Expect::kFail : Expect::kAny, kInvalidArgument);
      return true;
    }
    case 8: {  // misaligned data pointer (same bytes behind it)
      const size_t es = dtype_size(t->d.dtype);
      if (es < 2 || t->numel() <= 0) return false;
      Buf* b = c.alloc(name + "(misaligned)", t->buf ? t->buf->bytes : 0, role, 1);
      if (t->buf) std::memcpy(b->p(), t->buf->p(), t->buf->bytes);
      t->d.data = b->p();
      t->buf = b;
      // Data pointers must be aligned to their element size (refused otherwise); a size query
      // does not look at the data.
      c.mut(name + ".data misaligned by 1 byte", data != Data::kIgnored ? Expect::kFail : Expect::kAny, kInvalidArgument);
      return true;
    }
    default: {  // another shape of the same number of elements
      if (!shape_free || t->numel() <= 0) return false;
      const int64_t n = t->numel();
      if (c.rng.chance(0.5)) set_shape(&t->d, {n});
      else set_shape(&t->d, {1, n, 1});
      c.mut(name + ": reshaped, same elements");
      return true;
    }
  }
}


// ---- shared by the FP8 and TBE cases ------------------------------------------------------------
inline bool float_ok(int dt) { return is_float(dt); }
inline bool fp8_ok(int dt) { return is_fp8(dt); }

// A size query's bytes pointer: a real size_t, or NULL.
inline size_t* size_out(Case& c, size_t* storage) {
  if (c.rng.chance(0.05)) {
    c.mut("bytes=NULL", Expect::kFail, kInvalidArgument);
    return nullptr;
  }
  return storage;
}

struct Workspace {
  void* p = nullptr;
  size_t bytes = 0;
};
// A workspace for `needed` bytes (the size the query gave for the valid arguments), sometimes too small,
// NULL, or larger.
inline Workspace make_workspace(Case& c, size_t needed, bool size_known) {
  Workspace w;
  size_t bytes = needed;
  const uint64_t k = c.rng.below(20);
  if (size_known && k == 0 && needed > 0) {
    bytes = c.rng.chance(0.5) ? needed - 1 : 0;
    c.mut(fmt("workspace_bytes=%zu<%zu", bytes, needed), Expect::kFail, kWorkspaceTooSmall);
  } else if (size_known && k == 1 && needed > 0) {
    c.mut("workspace=NULL", Expect::kFail, kInvalidArgument);
    w.bytes = needed;
    return w;
  } else if (k == 2) {
    bytes = needed + static_cast<size_t>(c.rng.range(1, 4096));
    c.mut("workspace larger than needed");
  }
  w.bytes = bytes;
  if (bytes > 0 || c.rng.chance(0.5)) w.p = c.alloc("workspace", bytes, Role::kScratch)->p();
  return w;
}

// ---- the cases, one function family per file ----------------------------------------------------------
// fuzz_fp8.cpp: which = 0 amax, 1 quantize_current_scaling, 2 activation_amax.
void case_fp8_workspace_size(Case& c, bool cuda, int which);
void case_amax(Case& c, bool cuda);
void case_compute_scale(Case& c, bool cuda);
void case_quantize(Case& c, bool cuda, bool dequant);
void case_quantize_current_scaling(Case& c, bool cuda);
void case_activation_amax(Case& c, bool cuda);
void case_cast_transpose(Case& c, bool cuda);
// fuzz_tbe_create.cpp
void case_tbe_create(Case& c, bool cuda);
// fuzz_tbe_forward.cpp
void case_tbe_forward(Case& c, bool cuda);
// fuzz_tbe_backward.cpp: op = 0 the workspace size query, 1 the backward.
void case_tbe_backward(Case& c, bool cuda, int op);
void case_optimizer_check(Case& c);

}  // namespace fuzz

