// Fuzzer of the C API (embscale/embscale_c.h): seeded random calls of every public function with
// hostile and edge arguments, and valid ones, on the CPU backend.
//
//   embscale_fuzz_capi [--cases N] [--seed S] [--case K] [--batch M] [--timeout SEC] [--no-fork] [--verbose]
//
// Case k of a run is generated from (seed, k) alone, so `--seed S --case K` replays one case. Cases run
// in batches in fork()ed children: a crash (signal, sanitizer report) or a hang ends that child only;
// the parent reports the case it was running and goes on with the next one, then exits non-zero if
// any case failed, crashed or hung.
//
// Properties checked for every call:
//  * it returns OK or a documented status code (embscale::StatusCode 0..5);
//  * a refusal comes with a non-empty embscale_last_error() whose text before the first ':' names an
//    argument of the function (or a field of its argument structs);
//  * a call made only of valid arguments succeeds, and one with an argument the library can tell is
//    wrong (a null required pointer, a bad enum, a bad dtype or shape, lengths that do not match,
//    too small a workspace, ...) is refused (with the specific code where one mutation decides it);
//  * inputs are never written; on a refused call the tables (weights) and the optimizer state are
//    unchanged (byte copies compared);
//  * nothing is written outside a buffer (guard bytes, when not built with AddressSanitizer, which
//    catches that itself), no crash, no sanitizer report, no hang.
//
// Every buffer passed is as large as the shape it comes with claims. Shapes whose element or byte count
// overflows 64 bits, or that have a negative extent, come with a small buffer: the library must refuse
// them before touching the data. A too-short buffer comes with its true (short) shape, so the library
// can see the mismatch.
#include "embscale/embscale_c.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
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

namespace {

// ---- status codes and enumerations, as the C API numbers them ---------------------------------------
enum Code { kOk = 0, kInvalidArgument = 1, kUnsupported = 2, kOutOfRange = 3, kWorkspaceTooSmall = 4,
            kBackendError = 5 };
enum DT { kF32 = 0, kF16 = 1, kBF16 = 2, kE4M3 = 3, kE5M2 = 4, kI32 = 5, kI64 = 6 };
constexpr int kNumDtypes = 7;
size_t dtype_size(int dt) {
  static const size_t kSizes[kNumDtypes] = {4, 2, 2, 1, 1, 4, 8};
  return dt >= 0 && dt < kNumDtypes ? kSizes[dt] : 1;
}
bool is_float(int dt) { return dt == kF32 || dt == kF16 || dt == kBF16; }
bool is_fp8(int dt) { return dt == kE4M3 || dt == kE5M2; }

// ---- random numbers ---------------------------------------------------------------------------------
uint64_t splitmix64(uint64_t x) {
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

std::string fmt(const char* f, ...) {
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
enum class Expect { kAny, kOk, kFail };

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

  // Records a mutation; `e` says what it implies for the outcome, `code` the specific status if any.
  void mut(const std::string& what, Expect e = Expect::kAny, int code = -1) {
    muts.push_back(what);
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

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : "; ") + x;
  return s.empty() ? "valid" : s;
}

void Case::snapshot() {
  for (Buf& b : bufs) b.snap.assign(b.p(), b.p() + b.bytes);
  if (announce) announce(op + " [" + join(muts) + "]");
}

// The text before the first ':' of a message must contain one of the function's argument names.
bool names_argument(const std::string& msg, const std::set<std::string>& vocab) {
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

// Checks the outcome of one call of the case.
void check_call(Case& c, const char* fn, int rc) {
  const char* err = embscale_last_error();
  const std::string msg = err ? err : "";
  if (rc < kOk || rc > kBackendError) {
    c.fail(fmt("%s returned %d, not a documented status code", fn, rc));
  } else if (rc != kOk) {
    if (msg.empty()) c.fail(fmt("%s returned %d with an empty embscale_last_error()", fn, rc));
    else if (!names_argument(msg, c.vocab)) c.fail(fmt("%s: message names no argument: \"%s\"", fn, msg.c_str()));
  }
  if ((c.muts.empty() || c.must_ok) && rc != kOk) c.fail(fmt("%s: a valid call was refused (%d): %s", fn, rc, msg.c_str()));
  if (c.must_fail && rc == kOk) c.fail(fmt("%s: accepted an argument it can tell is wrong", fn));
  if (c.must_fail && c.fail_votes == 1 && c.fail_code >= 0 && rc != kOk && rc != c.fail_code)
    c.fail(fmt("%s returned %d, expected %d: %s", fn, rc, c.fail_code, msg.c_str()));
  c.check_buffers(rc);
}

// A call that must be refused (outside the case's own expectations): code and message.
void expect_refusal(Case& c, const char* fn, int rc) {
  const char* err = embscale_last_error();
  if (rc == kOk) c.fail(fmt("%s succeeded", fn));
  else if (rc < kOk || rc > kBackendError) c.fail(fmt("%s returned %d, not a documented status code", fn, rc));
  else if (err == nullptr || err[0] == '\0') c.fail(fmt("%s: empty embscale_last_error()", fn));
  else if (!names_argument(err, c.vocab)) c.fail(fmt("%s: message names no argument: \"%s\"", fn, err));
}

// ---- shared argument generators ---------------------------------------------------------------------
const int32_t kBadEnums[] = {-1, 7, 99, 1000, INT32_MIN, INT32_MAX};
int32_t bad_enum(Case& c, int32_t first_bad) {
  const int32_t v = kBadEnums[c.rng.below(sizeof kBadEnums / sizeof kBadEnums[0])];
  return v >= 0 && v < first_bad ? first_bad : v;
}

// A CPU context, sometimes hostile. `ctx_ptr` is set to null for the null-context mutation.
struct Ctx {
  embscale_context c{};
  bool null = false;
  const embscale_context* ptr() const { return null ? nullptr : &c; }
};
void make_ctx(Case& c, Ctx* x, bool cuda_compiled, double p_mut = 0.08) {
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
      else c.mut("ctx.backend=cuda(not compiled)", Expect::kFail, kUnsupported);
      break;
    case 3:
      x->c.num_threads = c.rng.pick<int32_t>({-1, -7, INT32_MIN});
      c.mut(fmt("ctx.num_threads=%d", x->c.num_threads), Expect::kFail, kInvalidArgument);
      break;
    default:
      // Huge thread counts: refused or served with fewer threads, but never a crash. Rare, as an
      // unchecked one makes OpenMP try to start them all.
      if (c.rng.chance(0.25)) {
        x->c.num_threads = c.rng.pick<int32_t>({1 << 20, INT32_MAX});
        c.mut(fmt("ctx.num_threads=%d", x->c.num_threads));
      } else {
        x->c.num_threads = c.rng.pick<int32_t>({3, 8, 64});
        c.mut(fmt("ctx.num_threads=%d", x->c.num_threads));
      }
  }
}

// Fills n elements of dtype dt at p with values: mostly moderate, some special (inf, NaN, -0, huge).
void fill_values(Case& c, void* p, int dt, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    float v;
    const uint64_t k = c.rng.below(20);
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
      const uint16_t h = static_cast<uint16_t>(c.rng.next());  // any pattern is an fp16 value
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
  bool null = false;  // pass NULL instead of the descriptor
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
void random_shape(Case& c, embscale_tensor* d, int64_t max_numel) {
  d->ndim = static_cast<int32_t>(c.rng.range(1, 4));
  int64_t left = std::max<int64_t>(1, max_numel);
  for (int i = 0; i < 4; ++i) d->shape[i] = 0;
  for (int i = 0; i < d->ndim; ++i) {
    const int64_t hi = std::max<int64_t>(1, i + 1 == d->ndim ? left : std::min<int64_t>(left, 40));
    d->shape[i] = c.rng.chance(0.03) ? 0 : c.rng.range(1, hi);
    left = std::max<int64_t>(1, left / std::max<int64_t>(1, d->shape[i]));
  }
}
void set_shape(embscale_tensor* d, std::initializer_list<int64_t> s) {
  d->ndim = static_cast<int32_t>(s.size());
  int i = 0;
  for (int64_t v : s) d->shape[i++] = v;
  for (; i < 4; ++i) d->shape[i] = 0;
}

// Allocates the buffer of t's (valid) shape and fills it.
void materialise(Case& c, Tensor* t, const std::string& name, Role role, bool fill = true) {
  const int64_t n = t->numel();
  t->buf = c.alloc(name, static_cast<size_t>(n) * dtype_size(t->d.dtype), role);
  t->d.data = n > 0 || c.rng.chance(0.5) ? t->buf->p() : nullptr;  // an empty tensor's data may be NULL
  if (fill && n > 0) fill_values(c, t->buf->p(), t->d.dtype, n);
}

// How the library knows the length of an argument: not at all, fixed by the configuration (so another
// length is refused), or by a partner argument (the case compares the two after the mutations).
enum class Len { kUnchecked, kFixed, kPartner };

// Hostile mutations of one tensor argument. `dtype_ok(dt)` says which dtypes the argument accepts.
// Returns true when a mutation was applied.
bool mutate_tensor(Case& c, Tensor* t, const std::string& name, Role role, const std::function<bool(int)>& dtype_ok,
                   Len len, bool shape_free, bool data_needed = true) {
  switch (c.rng.below(10)) {
    case 0:
      t->null = true;
      c.mut(name + "=NULL", Expect::kFail, kInvalidArgument);
      return true;
    case 1:
      if (t->numel() <= 0) return false;
      t->d.data = nullptr;
      c.mut(name + ".data=NULL", data_needed ? Expect::kFail : Expect::kAny, kInvalidArgument);
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
      if (len == Len::kUnchecked || n < 0) return false;
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
      c.mut(name + ".data misaligned by 1 byte");
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

// ---- FP8 ops ----------------------------------------------------------------------------------------
const std::set<std::string> kFp8Vocab = {"ctx", "backend", "num_threads", "x", "y", "yt", "amax", "scale",
                                          "scale_inv", "algo", "opts", "eps", "fp8_dtype", "activation", "act",
                                          "workspace", "workspace_bytes", "bytes", "nonfinite_flag",
                                          "EMBSCALE_AMAX_ALGO", "power_of_2"};

struct Scalar {
  float* p = nullptr;
  Buf* buf = nullptr;
};
Scalar make_scalar(Case& c, const std::string& name, Role role, float value, bool required) {
  Scalar s;
  s.buf = c.alloc(name, 4, role);
  std::memcpy(s.buf->p(), &value, 4);
  s.p = reinterpret_cast<float*>(s.buf->p());
  if (c.rng.chance(0.04)) {
    s.p = nullptr;
    if (required) c.mut(name + "=NULL", Expect::kFail, kInvalidArgument);
    else c.mut(name + "=NULL(optional)");
  }
  return s;
}

float random_scale_value(Case& c) {
  switch (c.rng.below(8)) {
    case 0: return 0.0f;
    case 1: return INFINITY;
    case 2: return NAN;
    case 3: return -3.5f;
    case 4: return 3e38f;
    default: return static_cast<float>(c.rng.range(1, 100000)) * 1e-2f;
  }
}

// The amax algorithm (valid or not) and, sometimes, a hostile EMBSCALE_AMAX_ALGO.
int32_t make_algo(Case& c) {
  int32_t algo = static_cast<int32_t>(c.rng.range(0, 2));
  if (c.rng.chance(0.04)) {
    algo = bad_enum(c, 3);
    c.mut(fmt("algo=%d", algo), Expect::kFail, kInvalidArgument);
  }
  if (c.rng.chance(0.03)) {
    const char* v = c.rng.pick<const char*>({"atomic", "two_stage", "bogus", "", "ATOMIC "});
    setenv("EMBSCALE_AMAX_ALGO", v, 1);
    const bool bad = algo == 0 && v[0] != '\0' && std::strcmp(v, "atomic") != 0 && std::strcmp(v, "two_stage") != 0;
    c.mut(fmt("EMBSCALE_AMAX_ALGO=\"%s\"", v), bad ? Expect::kFail : Expect::kAny, kInvalidArgument);
  }
  return algo;
}

struct Workspace {
  void* p = nullptr;
  size_t bytes = 0;
};
// A workspace for `needed` bytes (the size the query gave for the valid arguments), sometimes too small,
// NULL, or larger.
Workspace make_workspace(Case& c, size_t needed, bool size_known) {
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

void finish_env() { unsetenv("EMBSCALE_AMAX_ALGO"); }

// x of a float dtype (an input) with a random valid shape.
Tensor make_x(Case& c, int64_t max_numel, Role role = Role::kInput) {
  Tensor x;
  x.d.dtype = c.rng.pick<int32_t>({kF32, kF16, kBF16});
  random_shape(c, &x.d, max_numel);
  materialise(c, &x, "x", role);
  return x;
}
// An output tensor of dtype dt with `like`'s shape (before its mutations).
Tensor make_like(Case& c, const Tensor& like, int dt, const std::string& name, Role role) {
  Tensor y;
  y.d.dtype = dt;
  y.d.ndim = like.d.ndim;
  for (int i = 0; i < 4; ++i) y.d.shape[i] = like.d.shape[i];
  materialise(c, &y, name, role, role == Role::kInput);
  return y;
}

// Two arguments whose element counts must match (both valid counts, after their mutations).
void partner_lengths(Case& c, const Tensor& a, const Tensor& b, const std::string& b_name) {
  if (a.numel() >= 0 && b.numel() >= 0 && a.numel() != b.numel())
    c.mut(b_name + ": element count differs from its partner's", Expect::kFail, kInvalidArgument);
}

bool float_ok(int dt) { return is_float(dt); }
bool fp8_ok(int dt) { return is_fp8(dt); }

// A size query's bytes pointer: a real size_t, or NULL.
size_t* size_out(Case& c, size_t* storage) {
  if (c.rng.chance(0.05)) {
    c.mut("bytes=NULL", Expect::kFail, kInvalidArgument);
    return nullptr;
  }
  return storage;
}

// Valid-argument size of the workspace of op `which` for x and algo (0 when the query refuses).
size_t query_ws(int which, const embscale_tensor& x, int32_t algo) {
  embscale_context ctx{};
  size_t bytes = 0;
  int rc = 0;
  if (which == 0) rc = embscale_amax_workspace_size(&ctx, &x, algo, &bytes);
  else if (which == 1) rc = embscale_quantize_current_scaling_workspace_size(&ctx, &x, algo, &bytes);
  else rc = embscale_activation_amax_workspace_size(&ctx, &x, algo, &bytes);
  return rc == 0 ? bytes : 0;
}

void case_fp8_workspace_size(Case& c, bool cuda, int which) {
  static const char* kNames[] = {"embscale_amax_workspace_size", "embscale_quantize_current_scaling_workspace_size",
                                 "embscale_activation_amax_workspace_size"};
  c.op = kNames[which];
  c.vocab = kFp8Vocab;
  Ctx ctx;
  make_ctx(c, &ctx, cuda);
  Tensor x = make_x(c, 5000);
  // The size query needs no data: a NULL data pointer is fine there.
  if (c.rng.chance(0.3)) mutate_tensor(c, &x, "x", Role::kInput, float_ok, Len::kUnchecked, true, false);
  const int32_t algo = make_algo(c);
  size_t storage = 12345;
  size_t* bytes = size_out(c, &storage);
  if (ctx.c.backend == 1 && cuda) return;  // host memory on a CUDA context: not a call we can make
  c.snapshot();
  int rc;
  if (which == 0) rc = embscale_amax_workspace_size(ctx.ptr(), x.ptr(), algo, bytes);
  else if (which == 1) rc = embscale_quantize_current_scaling_workspace_size(ctx.ptr(), x.ptr(), algo, bytes);
  else rc = embscale_activation_amax_workspace_size(ctx.ptr(), x.ptr(), algo, bytes);
  check_call(c, c.op.c_str(), rc);
  if (rc == kOk && storage > (size_t{1} << 40)) c.fail(fmt("%s: %zu bytes", c.op.c_str(), storage));
}

// amax of the values as the library defines it (NaN skipped, -0 -> +0), for a valid call's check.
float reference_amax(const Tensor& x) {
  float a = 0.0f;
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) {
    float v;
    if (x.d.dtype == kF32) {
      std::memcpy(&v, static_cast<const char*>(x.d.data) + 4 * i, 4);
    } else {
      uint16_t h;
      std::memcpy(&h, static_cast<const char*>(x.d.data) + 2 * i, 2);
      uint32_t bits;
      if (x.d.dtype == kBF16) {
        bits = static_cast<uint32_t>(h) << 16;
      } else {  // fp16 -> fp32
        const uint32_t s = (h >> 15) & 1, e = (h >> 10) & 31, m = h & 1023;
        if (e == 0) {
          const float f = std::ldexp(static_cast<float>(m), -24);
          v = s ? -f : f;
          if (std::fabs(v) > a) a = std::fabs(v);
          continue;
        }
        bits = (s << 31) | (e == 31 ? (255u << 23) | (m << 13) : ((e + 112) << 23) | (m << 13));
      }
      std::memcpy(&v, &bits, 4);
    }
    if (!std::isnan(v) && std::fabs(v) > a) a = std::fabs(v);
  }
  return a;
}

void case_amax(Case& c, bool cuda) {
  c.op = "embscale_amax";
  c.vocab = kFp8Vocab;
  Ctx ctx;
  make_ctx(c, &ctx, cuda);
  Tensor x = make_x(c, 5000);
  const embscale_tensor valid_x = x.d;
  if (c.rng.chance(0.3)) mutate_tensor(c, &x, "x", Role::kInput, float_ok, Len::kUnchecked, true);
  const int32_t algo = make_algo(c);
  const size_t need = query_ws(0, valid_x, algo >= 0 && algo <= 2 ? algo : 0);
  Workspace ws = make_workspace(c, need, true);
  Scalar amax = make_scalar(c, "amax", Role::kOutput, -1.0f, true);
  int32_t flag_storage = -7;
  int32_t* flag = c.rng.chance(0.5) ? &flag_storage : nullptr;
  if (ctx.c.backend == 1 && cuda) return;
  c.snapshot();
  const int rc = embscale_amax(ctx.ptr(), x.ptr(), amax.p, algo, flag, ws.p, ws.bytes);
  check_call(c, c.op.c_str(), rc);
  if (rc == kOk && c.muts.empty()) {
    const float want = reference_amax(x);
    if (std::memcmp(amax.p, &want, 4) != 0) c.fail(fmt("amax %g, expected %g", *amax.p, want));
    if (flag && flag_storage != 0 && flag_storage != 1) c.fail(fmt("nonfinite_flag %d", flag_storage));
  }
}

void case_compute_scale(Case& c, bool cuda) {
  c.op = "embscale_compute_scale";
  c.vocab = kFp8Vocab;
  Ctx ctx;
  make_ctx(c, &ctx, cuda);
  Scalar amax = make_scalar(c, "amax", Role::kInput, random_scale_value(c), true);
  int32_t fp8 = c.rng.pick<int32_t>({kE4M3, kE5M2});
  if (c.rng.chance(0.08)) {
    fp8 = c.rng.chance(0.5) ? c.rng.pick<int32_t>({kF32, kF16, kBF16, kI32, kI64}) : bad_enum(c, kNumDtypes);
    c.mut(fmt("fp8_dtype=%d", fp8), Expect::kFail, kInvalidArgument);
  }
  float eps = c.rng.chance(0.5) ? 0.0f : static_cast<float>(c.rng.range(0, 1000)) * 1e-3f;
  if (c.rng.chance(0.08)) {
    eps = c.rng.pick<float>({NAN, INFINITY, -INFINITY, -1.0f, -1e-30f});
    c.mut(fmt("eps=%g", eps), Expect::kFail, kInvalidArgument);
  }
  const int32_t pow2 = c.rng.pick<int32_t>({0, 1, -1, 2, INT32_MIN});
  Scalar scale = make_scalar(c, "scale", Role::kOutput, -1.0f, true);
  Scalar scale_inv = make_scalar(c, "scale_inv", Role::kOutput, -1.0f, true);
  if (ctx.c.backend == 1 && cuda) return;
  c.snapshot();
  const int rc = embscale_compute_scale(ctx.ptr(), amax.p, fp8, eps, pow2, scale.p, scale_inv.p);
  check_call(c, c.op.c_str(), rc);
  if (rc == kOk && c.muts.empty() && !(*scale.p > 0.0f && std::isfinite(*scale.p)))
    c.fail(fmt("scale %g is not a finite positive value", *scale.p));
}

void case_quantize(Case& c, bool cuda, bool dequant) {
  c.op = dequant ? "embscale_dequantize" : "embscale_quantize";
  c.vocab = kFp8Vocab;
  Ctx ctx;
  make_ctx(c, &ctx, cuda);
  // quantize: x (float) -> y (fp8); dequantize: y (fp8) -> x (float).
  Tensor in, out;
  if (!dequant) {
    in = make_x(c, 5000);
    out = make_like(c, in, c.rng.pick<int32_t>({kE4M3, kE5M2}), "y", Role::kOutput);
  } else {
    in.d.dtype = c.rng.pick<int32_t>({kE4M3, kE5M2});
    random_shape(c, &in.d, 5000);
    materialise(c, &in, "y", Role::kInput);
    out = make_like(c, in, c.rng.pick<int32_t>({kF32, kF16, kBF16}), "x", Role::kOutput);
  }
  const char* in_name = dequant ? "y" : "x";
  const char* out_name = dequant ? "x" : "y";
  auto in_ok = dequant ? fp8_ok : float_ok;
  auto out_ok = dequant ? float_ok : fp8_ok;
  if (c.rng.chance(0.25)) mutate_tensor(c, &in, in_name, Role::kInput, in_ok, Len::kPartner, true);
  if (c.rng.chance(0.25)) mutate_tensor(c, &out, out_name, Role::kOutput, out_ok, Len::kPartner, true);
  partner_lengths(c, in, out, out_name);
  Scalar s = make_scalar(c, dequant ? "scale_inv" : "scale", Role::kInput, random_scale_value(c), true);
  if (ctx.c.backend == 1 && cuda) return;
  c.snapshot();
  const int rc = dequant ? embscale_dequantize(ctx.ptr(), in.ptr(), s.p, out.ptr()) : embscale_quantize(ctx.ptr(), in.ptr(), s.p, out.ptr());
  check_call(c, c.op.c_str(), rc);
}

void case_quantize_current_scaling(Case& c, bool cuda) {
  c.op = "embscale_quantize_current_scaling";
  c.vocab = kFp8Vocab;
  Ctx ctx;
  make_ctx(c, &ctx, cuda);
  Tensor x = make_x(c, 5000);
  const embscale_tensor valid_x = x.d;
  Tensor y = make_like(c, x, c.rng.pick<int32_t>({kE4M3, kE5M2}), "y", Role::kOutput);
  if (c.rng.chance(0.25)) mutate_tensor(c, &x, "x", Role::kInput, float_ok, Len::kPartner, true);
  if (c.rng.chance(0.25)) mutate_tensor(c, &y, "y", Role::kOutput, fp8_ok, Len::kPartner, true);
  partner_lengths(c, x, y, "y");
  const int32_t algo = make_algo(c);
  const size_t need = query_ws(1, valid_x, algo >= 0 && algo <= 2 ? algo : 0);
  Workspace ws = make_workspace(c, need, true);
  Scalar amax = make_scalar(c, "amax", Role::kOutput, -1.0f, true);
  Scalar scale = make_scalar(c, "scale", Role::kOutput, -1.0f, true);
  Scalar scale_inv = make_scalar(c, "scale_inv", Role::kOutput, -1.0f, true);
  float eps = c.rng.chance(0.5) ? 0.0f : 1e-3f;
  if (c.rng.chance(0.06)) {
    eps = c.rng.pick<float>({NAN, INFINITY, -1.0f});
    c.mut(fmt("eps=%g", eps), Expect::kFail, kInvalidArgument);
  }
  int32_t flag_storage = -7;
  int32_t* flag = c.rng.chance(0.5) ? &flag_storage : nullptr;
  if (ctx.c.backend == 1 && cuda) return;
  c.snapshot();
  const int rc = embscale_quantize_current_scaling(ctx.ptr(), x.ptr(), y.ptr(), amax.p, scale.p, scale_inv.p, algo, eps,
                                                   c.rng.pick<int32_t>({0, 1, 5}), flag, ws.p, ws.bytes);
  check_call(c, c.op.c_str(), rc);
}

void case_activation_amax(Case& c, bool cuda) {
  c.op = "embscale_activation_amax";
  c.vocab = kFp8Vocab;
  Ctx ctx;
  make_ctx(c, &ctx, cuda);
  Tensor x = make_x(c, 5000);
  const embscale_tensor valid_x = x.d;
  Tensor y = make_like(c, x, c.rng.pick<int32_t>({kF32, kF16, kBF16}), "y", Role::kOutput);
  if (c.rng.chance(0.25)) mutate_tensor(c, &x, "x", Role::kInput, float_ok, Len::kPartner, true);
  if (c.rng.chance(0.25)) mutate_tensor(c, &y, "y", Role::kOutput, float_ok, Len::kPartner, true);
  partner_lengths(c, x, y, "y");
  int32_t act = static_cast<int32_t>(c.rng.range(0, 2));
  if (c.rng.chance(0.05)) {
    act = bad_enum(c, 3);
    c.mut(fmt("activation=%d", act), Expect::kFail, kInvalidArgument);
  }
  const int32_t algo = make_algo(c);
  const size_t need = query_ws(2, valid_x, algo >= 0 && algo <= 2 ? algo : 0);
  Workspace ws = make_workspace(c, need, true);
  Scalar amax = make_scalar(c, "amax", Role::kOutput, -1.0f, true);
  if (ctx.c.backend == 1 && cuda) return;
  c.snapshot();
  const int rc = embscale_activation_amax(ctx.ptr(), act, x.ptr(), y.ptr(), amax.p, algo, ws.p, ws.bytes);
  check_call(c, c.op.c_str(), rc);
}

void case_cast_transpose(Case& c, bool cuda) {
  c.op = "embscale_cast_transpose";
  c.vocab = kFp8Vocab;
  Ctx ctx;
  make_ctx(c, &ctx, cuda);
  Tensor x;
  x.d.dtype = c.rng.pick<int32_t>({kF32, kF16, kBF16});
  set_shape(&x.d, {c.rng.range(0, 70), c.rng.range(0, 70)});
  materialise(c, &x, "x", Role::kInput);
  const int fp8 = c.rng.pick<int32_t>({kE4M3, kE5M2});
  Tensor y = make_like(c, x, fp8, "y", Role::kOutput);
  Tensor yt;
  yt.d.dtype = fp8;
  set_shape(&yt.d, {x.d.shape[1], x.d.shape[0]});
  materialise(c, &yt, "yt", Role::kOutput, false);
  // Every shape change of x, y or yt breaks the [rows, cols] / [cols, rows] contract.
  if (c.rng.chance(0.2)) mutate_tensor(c, &x, "x", Role::kInput, float_ok, Len::kFixed, false);
  if (c.rng.chance(0.2)) mutate_tensor(c, &y, "y", Role::kOutput, fp8_ok, Len::kFixed, false);
  if (c.rng.chance(0.2)) mutate_tensor(c, &yt, "yt", Role::kOutput, fp8_ok, Len::kFixed, false);
  if (c.rng.chance(0.05)) {
    yt.d.dtype = fp8 == kE4M3 ? kE5M2 : kE4M3;
    c.mut("yt.dtype differs from y's", Expect::kFail, kInvalidArgument);
  }
  if (c.rng.chance(0.05) && x.d.shape[0] != x.d.shape[1] && x.numel() > 0) {  // y given yt's shape
    std::swap(y.d.shape[0], y.d.shape[1]);
    c.mut("y has the transposed shape", Expect::kFail, kInvalidArgument);
  }
  Scalar s = make_scalar(c, "scale", Role::kInput, random_scale_value(c), true);
  if (ctx.c.backend == 1 && cuda) return;
  c.snapshot();
  const int rc = embscale_cast_transpose(ctx.ptr(), x.ptr(), s.p, y.ptr(), yt.ptr());
  check_call(c, c.op.c_str(), rc);
}

// ---- TBE: create, layout, table offsets -------------------------------------------------------------
const std::set<std::string> kCreateVocab = {"ctx", "backend", "num_threads", "num_tables", "num_rows", "dims",
                                            "num_features", "feature_table_map", "weights_dtype", "out", "cfg",
                                            "tables", "tbe"};

void case_tbe_create(Case& c, bool cuda) {
  c.op = "embscale_tbe_create";
  c.vocab = kCreateVocab;
  Ctx ctx;
  make_ctx(c, &ctx, cuda, 0.05);
  // Mutations are labels only here: whether the call must succeed is decided from the final
  // arguments below (an exact model of the documented rules).
  c.must_fail = false;
  c.fail_votes = 0;
  int32_t T = static_cast<int32_t>(c.rng.range(1, 6));
  std::vector<int64_t> rows(T);
  std::vector<int32_t> dims(T);
  for (int t = 0; t < T; ++t) {
    rows[t] = c.rng.range(1, 1000);
    dims[t] = static_cast<int32_t>(c.rng.range(1, 300));
  }
  const int32_t F = static_cast<int32_t>(c.rng.range(1, 8));
  std::vector<int32_t> fmap(F);
  for (auto& f : fmap) f = static_cast<int32_t>(c.rng.below(T));
  bool use_map = c.rng.chance(0.7);
  int32_t num_features = use_map ? F : T;
  int32_t wdt = c.rng.pick<int32_t>({kF32, kF16, kBF16});
  bool rows_null = false, dims_null = false;
  const int nmut = c.rng.chance(0.6) ? static_cast<int>(c.rng.range(1, 2)) : 0;
  for (int m = 0; m < nmut; ++m) {
    const int t = static_cast<int>(c.rng.below(rows.size()));
    switch (c.rng.below(12)) {
      case 0:
        rows[t] = c.rng.pick<int64_t>({0, -1, INT64_MIN});
        c.mut(fmt("num_rows[%d]=%" PRId64, t, rows[t]));
        break;
      case 1:
        dims[t] = c.rng.pick<int32_t>({0, -1, INT32_MIN});
        c.mut(fmt("dims[%d]=%d", t, dims[t]));
        break;
      case 2:  // rows x dims (or their running sum) beyond 2^62 elements
        rows[t] = c.rng.pick<int64_t>({INT64_MAX, int64_t{1} << 62, int64_t{1} << 40, (int64_t{1} << 61) + 1});
        dims[t] = c.rng.pick<int32_t>({INT32_MAX, 1 << 30, 4, 2});
        c.mut(fmt("table %d: %" PRId64 " rows x %d", t, rows[t], dims[t]));
        break;
      case 3:  // huge but representable tables: creation allocates nothing of their size
        rows[t] = int64_t{1} << 40;
        c.mut(fmt("num_rows[%d]=2^40", t));
        break;
      case 4:
        dims[t] = INT32_MAX;
        c.mut(fmt("dims[%d]=INT32_MAX", t));  // more than 2^31-1 output columns with another feature
        break;
      case 5:
        T = c.rng.pick<int32_t>({0, -1, INT32_MIN});
        c.mut(fmt("num_tables=%d", T));
        break;
      case 6:
        if (c.rng.chance(0.5)) {
          rows_null = true;
          c.mut("num_rows=NULL");
        } else {
          dims_null = true;
          c.mut("dims=NULL");
        }
        break;
      case 7:
        if (!use_map) break;
        fmap[c.rng.below(F)] = c.rng.pick<int32_t>({-1, T, T + 5, INT32_MAX, INT32_MIN});
        c.mut("feature_table_map: a table that does not exist");
        break;
      case 8:
        if (use_map) {
          num_features = c.rng.pick<int32_t>({-1, INT32_MIN});
          c.mut(fmt("num_features=%d", num_features));
        } else {
          num_features = T + static_cast<int32_t>(c.rng.range(1, 3));
          c.mut("num_features!=num_tables without a map");
        }
        break;
      case 9:
        if (use_map) {
          num_features = static_cast<int32_t>(c.rng.range(0, F - 1));
          c.mut(fmt("num_features=%d, fewer than the map's entries", num_features));
        }
        break;
      case 10:
        wdt = c.rng.chance(0.5) ? c.rng.pick<int32_t>({kE4M3, kE5M2, kI32, kI64}) : bad_enum(c, kNumDtypes);
        c.mut(fmt("weights_dtype=%d", wdt));
        break;
      default:
        use_map = false;
        num_features = c.rng.chance(0.8) ? T : F;
        c.mut(fmt("feature_table_map=NULL, num_features=%d", num_features));
        break;
    }
  }
  // The model: what a valid call is, from the header's rules.
  bool bad = false, unsupported_only = false;
  if (ctx.null || ctx.c.backend < 0 || ctx.c.backend > 1) bad = true;
  if (!bad && ctx.c.backend == 1 && !cuda) unsupported_only = true;
  bool bad_args = T <= 0 || ((rows_null || dims_null) && T > 0) || !is_float(wdt);
  const __int128 kMax = static_cast<__int128>(1) << 62;  // elements of all tables together
  __int128 total = 0;
  for (int t = 0; t < T && !bad_args; ++t) {
    if (rows[t] < 1 || dims[t] < 1) bad_args = true;
    total += static_cast<__int128>(rows[t]) * dims[t];
  }
  if (!bad_args && total > kMax) bad_args = true;
  if (!bad_args) {
    // An empty map (num_features 0) means one feature per table, as a NULL one does.
    const bool mapped = use_map && num_features != 0;
    const int32_t nf = mapped ? num_features : T;
    if (use_map && num_features < 0) bad_args = true;
    if (!use_map && num_features != T) bad_args = true;
    double cols = 0;
    for (int32_t f = 0; f < nf && !bad_args; ++f) {
      const int32_t tab = mapped ? fmap[f] : f;
      if (tab < 0 || tab >= T) bad_args = true;
      else cols += dims[tab];
    }
    if (!bad_args && cols > 2147483647.0) bad_args = true;
  }
  if (bad || bad_args) {
    c.must_fail = true;
    c.fail_votes = 2;  // any refusal code
  } else if (unsupported_only) {
    c.must_fail = true;
    c.fail_votes = 1;
    c.fail_code = kUnsupported;
  } else {
    c.must_ok = true;
  }
  if (ctx.c.backend == 1 && cuda) return;
  embscale_tbe* tbe = reinterpret_cast<embscale_tbe*>(&c);  // must be overwritten
  const bool null_out = c.rng.chance(0.03);
  if (null_out) {
    c.mut("out=NULL");
    c.must_ok = false;
    c.must_fail = true;
    c.fail_votes = 2;
  }
  c.snapshot();
  // The arrays hold num_tables (and num_features) entries whenever those counts are positive.
  if (num_features > static_cast<int32_t>(fmap.size())) fmap.resize(num_features, 0);
  const int rc = embscale_tbe_create(ctx.ptr(), T, rows_null ? nullptr : rows.data(), dims_null ? nullptr : dims.data(),
                                     num_features, use_map ? fmap.data() : nullptr, wdt,
                                     null_out ? nullptr : &tbe);
  check_call(c, c.op.c_str(), rc);
  if (null_out) return;
  if (rc != kOk) {
    if (tbe != nullptr) c.fail("embscale_tbe_create: refused but *out is not NULL");
    embscale_tbe_destroy(nullptr);  // must be a no-op
    return;
  }
  if (tbe == nullptr) {
    c.fail("embscale_tbe_create: OK but *out is NULL");
    return;
  }
  // layout and offsets of the new object
  embscale_tbe_layout lay{};
  const int rc2 = embscale_tbe_layout_get(tbe, &lay);
  if (rc2 != kOk) c.fail(fmt("embscale_tbe_layout_get failed on a created object: %s", embscale_last_error()));
  std::vector<int64_t> woff(T, -1), roff(T, -1);
  const int rc3 = embscale_tbe_table_offsets(tbe, c.rng.chance(0.2) ? nullptr : woff.data(),
                                             c.rng.chance(0.2) ? nullptr : roff.data());
  if (rc3 != kOk) c.fail(fmt("embscale_tbe_table_offsets failed on a created object: %s", embscale_last_error()));
  if (rc2 == kOk && (lay.num_weights < 0 || lay.total_rows < 0 || lay.total_dim < 0 || lay.max_dim < 0))
    c.fail("embscale_tbe_layout_get: negative sizes");
  // hostile uses of the layout functions
  c.vocab.insert({"tbe", "out"});
  expect_refusal(c, "embscale_tbe_layout_get(NULL, out)", embscale_tbe_layout_get(nullptr, &lay));
  expect_refusal(c, "embscale_tbe_layout_get(tbe, NULL)", embscale_tbe_layout_get(tbe, nullptr));
  expect_refusal(c, "embscale_tbe_table_offsets(NULL, ...)", embscale_tbe_table_offsets(nullptr, woff.data(), roff.data()));
  embscale_tbe_destroy(tbe);
}

void case_misc(Case& c) {
  c.op = "embscale_version/backend_available/backend_compiled";
  const int32_t b = c.rng.pick<int32_t>({0, 1, 2, -1, INT32_MIN, INT32_MAX});
  const int a = embscale_backend_available(b), k = embscale_backend_compiled(b);
  if (a != 0 && a != 1) c.fail(fmt("embscale_backend_available(%d) = %d", b, a));
  if (k != 0 && k != 1) c.fail(fmt("embscale_backend_compiled(%d) = %d", b, k));
  if ((b < 0 || b > 1) && (a || k)) c.fail(fmt("backend %d reported as present", b));
  if (b == 0 && !(a && k)) c.fail("the CPU backend is not reported as available");
  const char* v = embscale_version();
  if (v == nullptr || v[0] == '\0') c.fail("embscale_version() is empty");
  if (embscale_last_error() == nullptr) c.fail("embscale_last_error() is NULL");
}

// ---- the case table ---------------------------------------------------------------------------------
struct OpEntry {
  const char* name;
  int weight;
  std::function<void(Case&, bool)> run;
};

const std::vector<OpEntry>& ops() {
  static const std::vector<OpEntry> kOps = {
      {"amax_workspace_size", 2, [](Case& c, bool cu) { case_fp8_workspace_size(c, cu, 0); }},
      {"amax", 5, [](Case& c, bool cu) { case_amax(c, cu); }},
      {"compute_scale", 3, [](Case& c, bool cu) { case_compute_scale(c, cu); }},
      {"quantize", 4, [](Case& c, bool cu) { case_quantize(c, cu, false); }},
      {"dequantize", 4, [](Case& c, bool cu) { case_quantize(c, cu, true); }},
      {"quantize_current_scaling_workspace_size", 2, [](Case& c, bool cu) { case_fp8_workspace_size(c, cu, 1); }},
      {"quantize_current_scaling", 5, [](Case& c, bool cu) { case_quantize_current_scaling(c, cu); }},
      {"activation_amax_workspace_size", 2, [](Case& c, bool cu) { case_fp8_workspace_size(c, cu, 2); }},
      {"activation_amax", 5, [](Case& c, bool cu) { case_activation_amax(c, cu); }},
      {"cast_transpose", 4, [](Case& c, bool cu) { case_cast_transpose(c, cu); }},
      {"tbe_create", 6, [](Case& c, bool cu) { case_tbe_create(c, cu); }},
      {"misc", 1, [](Case& c, bool) { case_misc(c); }},
  };
  return kOps;
}

const OpEntry& choose_op(Case& c) {
  int total = 0;
  for (const auto& e : ops()) total += e.weight;
  int r = static_cast<int>(c.rng.below(static_cast<uint64_t>(total)));
  for (const auto& e : ops()) {
    if (r < e.weight) return e;
    r -= e.weight;
  }
  return ops().back();
}

// Generates and runs case k; returns its failures (empty: passed). `start` is told the case's
// description (function and mutations) right before each library call, so a crash can be attributed.
std::vector<std::string> run_case(uint64_t seed, int64_t k, const std::function<void(const std::string&)>& start) {
  Case c(seed, k);
  const OpEntry& e = choose_op(c);
  static const bool cuda = embscale_backend_compiled(1) != 0;
  c.announce = start;
  start(e.name);
  e.run(c, cuda);
  finish_env();
  std::vector<std::string> out;
  for (const auto& f : c.failures) out.push_back(c.op + " [" + join(c.muts) + "]: " + f);
  return out;
}

// ---- the driver: batches in fork()ed children -------------------------------------------------------
struct Options {
  int64_t cases = 3000;
  uint64_t seed = 20261201;
  int64_t only = -1;
  int64_t batch = 100;
  int timeout_s = 60;
  bool fork = true;
  bool verbose = false;
};

void write_all(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t w = write(fd, s.data() + off, s.size() - off);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return;
    off += static_cast<size_t>(w);
  }
}

std::string one_line(std::string s) {
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  if (s.size() > 600) s = s.substr(0, 600) + "...";
  return s;
}

// Child: runs cases [first, last) and reports on fd: "S k op" when case k starts, "D k description"
// before each library call, "F k text" per failure, "E" at the end.
[[noreturn]] void child_main(const Options& o, int64_t first, int64_t last, int fd) {
  for (int64_t k = first; k < last; ++k) {
    bool started = false;
    auto fails = run_case(o.seed, k, [&](const std::string& what) {
      write_all(fd, fmt("%c %" PRId64 " ", started ? 'D' : 'S', k) + one_line(what) + "\n");
      started = true;
    });
    for (const auto& f : fails) write_all(fd, fmt("F %" PRId64 " ", k) + one_line(f) + "\n");
  }
  write_all(fd, "E\n");
  close(fd);
  std::fflush(nullptr);
  std::exit(0);  // normal exit, so LeakSanitizer checks the batch
}

struct Report {
  std::vector<std::string> failures;
  std::map<std::string, int> crashes_by_op;
};

std::string describe_status(int status) {
  if (WIFSIGNALED(status)) return fmt("killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
  if (WIFEXITED(status)) return fmt("exited with status %d (a sanitizer report or an exit in the library)", WEXITSTATUS(status));
  return "ended abnormally";
}

int run_forked(const Options& o) {
  Report rep;
  int64_t next = 0;
  std::map<std::string, int> counts;
  while (next < o.cases) {
    const int64_t last = std::min(o.cases, next + o.batch);
    int fds[2];
    if (pipe(fds) != 0) {
      std::perror("pipe");
      return 2;
    }
    std::fflush(nullptr);
    const pid_t pid = fork();
    if (pid < 0) {
      std::perror("fork");
      return 2;
    }
    if (pid == 0) {
      close(fds[0]);
      child_main(o, next, last, fds[1]);
    }
    close(fds[1]);
    std::string pending;
    int64_t current = -1;
    std::string current_op;
    bool ended = false, timed_out = false;
    auto last_progress = std::chrono::steady_clock::now();
    for (;;) {
      pollfd p{fds[0], POLLIN, 0};
      const int pr = poll(&p, 1, 1000);
      if (pr < 0 && errno == EINTR) continue;
      if (pr == 0) {
        if (std::chrono::steady_clock::now() - last_progress > std::chrono::seconds(o.timeout_s)) {
          timed_out = true;
          kill(pid, SIGKILL);
          break;
        }
        continue;
      }
      char buf[4096];
      const ssize_t n = read(fds[0], buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) break;
      pending.append(buf, static_cast<size_t>(n));
      size_t nl;
      while ((nl = pending.find('\n')) != std::string::npos) {
        const std::string line = pending.substr(0, nl);
        pending.erase(0, nl + 1);
        if (line.size() > 2 && (line[0] == 'S' || line[0] == 'D')) {
          long long k = 0;
          std::sscanf(line.c_str() + 2, "%lld", &k);
          const size_t sp = line.find(' ', 2);
          current = k;
          current_op = sp == std::string::npos ? "" : line.substr(sp + 1);
          if (line[0] == 'S') ++counts[current_op];
          last_progress = std::chrono::steady_clock::now();
          if (o.verbose) std::printf("case %lld %s\n", k, current_op.c_str());
        } else if (line.size() > 2 && line[0] == 'F') {
          long long k = 0;
          std::sscanf(line.c_str() + 2, "%lld", &k);
          const std::string text = line.substr(line.find(' ', 2) + 1);
          rep.failures.push_back(fmt("FAIL seed=%" PRIu64 " case=%lld: ", o.seed, k) + text);
          std::printf("%s\n", rep.failures.back().c_str());
          std::fflush(stdout);
        } else if (line == "E") {
          ended = true;
        }
      }
    }
    close(fds[0]);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    const bool clean = !timed_out && ended && WIFEXITED(status) && WEXITSTATUS(status) == 0;
    if (clean) {
      next = last;
      continue;
    }
    if (!ended && current >= 0) {
      const std::string what = timed_out ? fmt("HANG (no progress in %d s)", o.timeout_s) : "CRASH " + describe_status(status);
      rep.failures.push_back(fmt("%s seed=%" PRIu64 " case=%" PRId64 " op=%s (replay: --seed %" PRIu64 " --case %" PRId64 ")",
                                 what.c_str(), o.seed, current, current_op.c_str(), o.seed, current));
      ++rep.crashes_by_op[current_op];
      std::printf("%s\n", rep.failures.back().c_str());
      std::fflush(stdout);
      next = current + 1;
    } else {
      rep.failures.push_back(fmt("EXIT seed=%" PRIu64 " cases %" PRId64 "..%" PRId64 ": the batch %s after its last case "
                                 "(a leak report?)", o.seed, next, last - 1, describe_status(status).c_str()));
      std::printf("%s\n", rep.failures.back().c_str());
      next = last;
    }
  }
  std::printf("fuzz_capi: %" PRId64 " cases, seed %" PRIu64 ":", o.cases, o.seed);
  for (const auto& kv : counts) std::printf(" %s %d", kv.first.c_str(), kv.second);
  std::printf("\n");
  if (!rep.failures.empty()) {
    std::printf("fuzz_capi: %zu failures (replay one with --seed %" PRIu64 " --case K):\n", rep.failures.size(), o.seed);
    for (const auto& f : rep.failures) std::printf("  %s\n", f.c_str());
    return 1;
  }
  std::printf("fuzz_capi: all cases passed\n");
  return 0;
}

int run_inline(const Options& o) {
  const int64_t first = o.only >= 0 ? o.only : 0, last = o.only >= 0 ? o.only + 1 : o.cases;
  int failed = 0;
  for (int64_t k = first; k < last; ++k) {
    auto fails = run_case(o.seed, k, [&](const std::string& name) {
      if (o.verbose || o.only >= 0) std::printf("case %" PRId64 ": %s\n", k, name.c_str());
      std::fflush(stdout);
    });
    for (const auto& f : fails) std::printf("FAIL seed=%" PRIu64 " case=%" PRId64 ": %s\n", o.seed, k, f.c_str());
    failed += !fails.empty();
  }
  std::printf("fuzz_capi: %" PRId64 " cases, %d failed\n", last - first, failed);
  return failed ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&](const char* flag) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "error: %s needs a value\n", flag);
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--cases") o.cases = std::strtoll(value("--cases"), nullptr, 0);
    else if (a == "--seed") o.seed = std::strtoull(value("--seed"), nullptr, 0);
    else if (a == "--case") o.only = std::strtoll(value("--case"), nullptr, 0);
    else if (a == "--batch") o.batch = std::max<int64_t>(1, std::strtoll(value("--batch"), nullptr, 0));
    else if (a == "--timeout") o.timeout_s = std::max(1, std::atoi(value("--timeout")));
    else if (a == "--no-fork") o.fork = false;
    else if (a == "--verbose" || a == "-v") o.verbose = true;
    else {
      std::fprintf(stderr,
                   "usage: %s [--cases N] [--seed S] [--case K] [--batch M] [--timeout SEC] [--no-fork] [--verbose]\n",
                   argv[0]);
      return 2;
    }
  }
  std::printf("fuzz_capi: seed %" PRIu64 ", %" PRId64 " cases%s (replay one case: --seed %" PRIu64 " --case K)\n", o.seed,
              o.only >= 0 ? int64_t{1} : o.cases, FUZZ_ASAN ? ", AddressSanitizer build" : "", o.seed);
  std::fflush(stdout);
  if (o.only >= 0 || !o.fork) return run_inline(o);
  return run_forked(o);
}
