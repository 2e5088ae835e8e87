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

// Told the status of every checked call (the driver tallies them per function).
std::function<void(const char* fn, int rc)> g_tally;

// Checks the outcome of one call of the case.
void check_call(Case& c, const char* fn, int rc) {
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
void expect_refusal(Case& c, const char* fn, int rc) {
  const char* err = embscale_last_error();
  if (rc == kOk) c.fail(fmt("%s succeeded", fn));
  else if (rc < kOk || rc > kBackendError) c.fail(fmt("%s returned %d, not a documented status code", fn, rc));
  else if (err == nullptr || err[0] == '\0') c.fail(fmt("%s: empty embscale_last_error()", fn));
  else if (!names_argument(err, c.vocab)) c.fail(fmt("%s: message names no argument: \"%s\"", fn, err));
}

// Claims argument `what` for a mutation: false when an earlier mutation of this case changed it (a second
// one could undo the first, e.g. a bad value overwritten by a good one).
bool touch(Case& c, const std::string& what) { return c.touched.insert(what).second; }

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
// `tbe`: for ops of a TableBatchedEmbedding (created on the CPU), where a CUDA context is an argument
// that does not match the object rather than an unsupported backend.
void make_ctx(Case& c, Ctx* x, bool cuda_compiled, double p_mut = 0.08, bool tbe = false) {
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
float half_to_float(uint16_t h) {
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
uint16_t float_to_half(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  const int e = static_cast<int>((bits >> 23) & 255) - 127 + 15;
  if (e <= 0) return static_cast<uint16_t>(sign);
  if (e >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(e) << 10) | ((bits >> 13) & 1023));
}
// Element i of a float tensor (fp32, fp16 or bf16) at p, as fp32.
float load_float(const void* p, int dt, int64_t i) {
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
void fill_values(Case& c, void* p, int dt, int64_t n, bool specials = true) {
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

// How the library uses an argument's data pointer: required (NULL refused unless empty), optional
// (NULL: absent), or not at all (a size query). Present pointers that are used must be aligned.
enum class Data { kRequired, kOptional, kIgnored };

// Hostile mutations of one tensor argument. `dtype_ok(dt)` says which dtypes the argument accepts.
// Returns true when a mutation was applied.
bool mutate_tensor(Case& c, Tensor* t, const std::string& name, Role role, const std::function<bool(int)>& dtype_ok,
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

// ---- FP8 ops ----------------------------------------------------------------------------------------
const std::set<std::string> kFp8Vocab = {"ctx", "backend", "num_threads", "x", "y", "yt", "amax", "scale",
                                          "scale_inv", "algo", "opts", "eps", "fp8_dtype", "activation", "act",
                                          "workspace", "workspace_bytes", "bytes", "nonfinite_flag",
                                          "power_of_2"};

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

// The amax algorithm, valid or not.
int32_t make_algo(Case& c) {
  int32_t algo = static_cast<int32_t>(c.rng.range(0, 2));
  if (c.rng.chance(0.04)) {
    algo = bad_enum(c, 3);
    c.mut(fmt("algo=%d", algo), Expect::kFail, kInvalidArgument);
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
  if (c.rng.chance(0.3)) mutate_tensor(c, &x, "x", Role::kInput, float_ok, Len::kUnchecked, true, Data::kIgnored);
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
    const float v = load_float(x.d.data, x.d.dtype, i);
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
  if (rc == kOk && !c.must_fail && c.unknown == 0) {
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
  if (rc == kOk && !c.must_fail && c.unknown == 0 && !(*scale.p > 0.0f && std::isfinite(*scale.p)))
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

// ---- TBE: forward, backward workspace size, backward ------------------------------------------------
const std::set<std::string> kTbeVocab = {
    "ctx", "backend", "num_threads", "tbe", "args", "weights", "indices", "offsets", "per_sample_weights",
    "batch_size", "pooling", "bounds_check", "output", "num_skipped", "grad_output", "optimizer", "type",
    "learning_rate", "eps", "beta1", "beta2", "weight_decay", "weight_decay_mode", "max_norm",
    "gradient_clipping", "step", "momentum1", "momentum2", "grad_per_sample_weights", "unique_rows",
    "num_unique", "unique_grads", "deterministic", "rounding", "seed", "tuning", "max_warp_segment",
    "max_block_segment", "block_threads", "workspace", "workspace_bytes", "bytes"};

// A small valid TableBatchedEmbedding made through the C API (destroyed with the case).
struct TbeObj {
  embscale_tbe* h = nullptr;
  std::vector<int64_t> rows;
  std::vector<int32_t> dims, fmap;  // fmap: the table of each feature
  int wdt = kF32;
  embscale_tbe_layout lay{};
  std::vector<int64_t> woff, roff;
  ~TbeObj() { embscale_tbe_destroy(h); }
  int F() const { return static_cast<int>(fmap.size()); }
  int D(int f) const { return dims[fmap[f]]; }
  int64_t E(int f) const { return rows[fmap[f]]; }
};

bool make_tbe(Case& c, TbeObj* o, bool same_dims) {
  const int T = static_cast<int>(c.rng.range(1, 4));
  const int32_t D = static_cast<int32_t>(c.rng.pick<int64_t>({1, 2, 3, 4, 5, 8, 13, 33}));
  for (int t = 0; t < T; ++t) {
    o->rows.push_back(c.rng.chance(0.15) ? 1 : c.rng.range(1, 40));
    o->dims.push_back(same_dims ? D : static_cast<int32_t>(c.rng.pick<int64_t>({1, 2, 3, 4, 7, 8, 16, 33, 65})));
  }
  const bool identity = c.rng.chance(0.3);
  const int F = identity ? T : static_cast<int>(c.rng.range(1, 5));
  for (int f = 0; f < F; ++f) o->fmap.push_back(identity ? f : static_cast<int32_t>(c.rng.below(T)));
  o->wdt = c.rng.pick<int32_t>({kF32, kF32, kF16, kBF16});
  embscale_context ctx{};
  const int rc = embscale_tbe_create(&ctx, T, o->rows.data(), o->dims.data(), F, identity ? nullptr : o->fmap.data(),
                                     o->wdt, &o->h);
  if (rc != kOk || o->h == nullptr) {
    c.fail(fmt("embscale_tbe_create refused a valid configuration: %s", embscale_last_error()));
    return false;
  }
  o->woff.assign(T, 0);
  o->roff.assign(T, 0);
  if (embscale_tbe_layout_get(o->h, &o->lay) != kOk || embscale_tbe_table_offsets(o->h, o->woff.data(), o->roff.data()) != kOk) {
    c.fail(fmt("layout of a valid TableBatchedEmbedding: %s", embscale_last_error()));
    return false;
  }
  return true;
}

int64_t get_index(const void* p, int dt, int64_t i) {
  if (dt == kI32) {
    int32_t v;
    std::memcpy(&v, static_cast<const char*>(p) + 4 * i, 4);
    return v;
  }
  int64_t v;
  std::memcpy(&v, static_cast<const char*>(p) + 8 * i, 8);
  return v;
}
void set_index(void* p, int dt, int64_t i, int64_t v) {
  if (dt == kI32) {
    const int32_t w = static_cast<int32_t>(v);
    std::memcpy(static_cast<char*>(p) + 4 * i, &w, 4);
  } else {
    std::memcpy(static_cast<char*>(p) + 8 * i, &v, 8);
  }
}

// The lookup arguments shared by forward and backward, valid, before mutations.
struct Lookup {
  int idx_dt = kI64;
  int64_t B = 0, N = 0, TB = 0;  // B may be mutated; TB (bags the offsets hold) is the valid T*B
  int32_t pooling = 0, bounds = 0;
  Tensor weights, indices, offsets, psw;
  bool bad_indices = false;  // out-of-range index values were written (skip/off: dropped)
  int64_t* num_skipped = nullptr;
};

void make_lookup(Case& c, const TbeObj& o, Lookup* l, int32_t pooling, Role weights_role, bool specials) {
  for (Tensor* t : {&l->weights, &l->indices, &l->offsets, &l->psw}) t->embedded = true;
  l->pooling = pooling;
  l->bounds = static_cast<int32_t>(c.rng.range(0, 2));
  l->idx_dt = c.rng.pick<int32_t>({kI32, kI64});
  l->B = c.rng.chance(0.05) ? 0 : c.rng.range(1, 5);
  const int64_t TB = l->TB = o.F() * l->B;
  std::vector<int64_t> off(TB + 1, 0), idx;
  for (int f = 0; f < o.F(); ++f)
    for (int64_t b = 0; b < l->B; ++b) {
      const int64_t len = c.rng.chance(0.15) ? 0 : c.rng.range(1, 5);
      for (int64_t j = 0; j < len; ++j) idx.push_back(c.rng.chance(0.3) ? 0 : c.rng.range(0, o.E(f) - 1));
      off[f * l->B + b + 1] = static_cast<int64_t>(idx.size());
    }
  l->N = static_cast<int64_t>(idx.size());
  l->weights.d.dtype = o.wdt;
  set_shape(&l->weights.d, {o.lay.num_weights});
  materialise(c, &l->weights, "weights", weights_role, false);
  fill_values(c, l->weights.buf->p(), o.wdt, o.lay.num_weights, specials);
  l->indices.d.dtype = l->idx_dt;
  set_shape(&l->indices.d, {l->N});
  materialise(c, &l->indices, "indices", Role::kInput, false);
  for (int64_t i = 0; i < l->N; ++i) set_index(l->indices.buf->p(), l->idx_dt, i, idx[i]);
  l->offsets.d.dtype = l->idx_dt;
  set_shape(&l->offsets.d, {TB + 1});
  materialise(c, &l->offsets, "offsets", Role::kInput, false);
  for (int64_t i = 0; i <= TB; ++i) set_index(l->offsets.buf->p(), l->idx_dt, i, off[i]);
  l->psw.d.dtype = kF32;
  set_shape(&l->psw.d, {l->N});
  if (pooling != 1 && c.rng.chance(0.35)) {
    materialise(c, &l->psw, "per_sample_weights", Role::kInput, false);
    fill_values(c, l->psw.buf->p(), kF32, l->N, specials);
  }
  if (c.rng.chance(0.7)) l->num_skipped = reinterpret_cast<int64_t*>(c.alloc("num_skipped", 8, Role::kOutput)->p());
}

// Whether element i (of index dtype dt) can be written through t's data pointer: its own buffer, not
// NULL or shortened by an earlier mutation.
bool room(const Tensor& t, int64_t i, int dt) {
  return t.d.data != nullptr && t.buf != nullptr && t.d.data == t.buf->p() &&
         static_cast<size_t>(i + 1) * dtype_size(dt) <= t.buf->bytes;
}

// Points tensor w's data into buffer r (an alias), when r's bytes hold w's claimed bytes.
bool alias(Case& c, Tensor* w, const std::string& wname, const Tensor& r, const std::string& rname) {
  const int64_t n = w->numel(), m = r.numel();
  if (n <= 0 || m <= 0 || r.d.data == nullptr || w->d.data == nullptr || r.buf == nullptr) return false;
  if (static_cast<size_t>(n) * dtype_size(w->d.dtype) > r.buf->bytes || !touch(c, wname)) return false;
  w->d.data = r.d.data;
  c.mut(wname + " aliases " + rname, Expect::kFail, kInvalidArgument);
  return true;
}

// Mutations of the lookup arguments (both ops). `values_checked`: whether the op reads the offsets and
// indices (a size query does not: it sees only shapes).
void mutate_lookup(Case& c, const TbeObj& o, Lookup* l, Role weights_role, bool* tbe_null, bool* args_null,
                   bool values_checked = true) {
  const int64_t TB = l->TB;
  switch (c.rng.below(16)) {
    case 0:
      *tbe_null = true;
      c.mut("tbe=NULL", Expect::kFail, kInvalidArgument);
      break;
    case 1:
      *args_null = true;
      c.mut("args=NULL", Expect::kFail, kInvalidArgument);
      break;
    case 2:
      mutate_tensor(c, &l->weights, "weights", weights_role, [&](int dt) { return dt == o.wdt; }, Len::kFixed, true);
      break;
    case 3:
      // Another N is seen through offsets[T*B] (a value: not by a size query) or the [N] buffers.
      if (mutate_tensor(c, &l->indices, "indices", Role::kInput, [](int dt) { return dt == kI32 || dt == kI64; },
                        values_checked ? Len::kFixed : Len::kPartner, false))
        c.fail_code = -1;  // another N: offsets, per-sample weights or outputs no longer match
      break;
    case 4:
      mutate_tensor(c, &l->offsets, "offsets", Role::kInput, [&](int dt) { return dt == l->idx_dt; }, Len::kFixed, false);
      break;
    case 5: {  // indices and offsets of different index dtypes (same buffers reinterpreted: shapes shrink)
      Tensor* t = c.rng.chance(0.5) ? &l->indices : &l->offsets;
      if (!touch(c, t == &l->indices ? "indices" : "offsets")) break;
      const int other = l->idx_dt == kI32 ? kI64 : kI32;
      const int64_t n = t->numel();
      if (n < 0 || n > (int64_t{1} << 40)) break;  // (an earlier mutation made the shape invalid)
      const int64_t m = other == kI64 ? n / 2 : n * 2;
      t->d.dtype = other;
      set_shape(&t->d, {m});
      c.mut(std::string(t == &l->indices ? "indices" : "offsets") + ": the other index dtype", Expect::kFail, -1);
      break;
    }
    case 6: {  // bad offset values: refused in every mode on the CPU
      void* p = l->offsets.d.data;
      if (!room(l->offsets, TB, l->idx_dt)) break;
      const uint64_t k = c.rng.below(4);
      if (k == 0) {
        set_index(p, l->idx_dt, 0, c.rng.pick<int64_t>({-1, -5, INT32_MIN}));
        c.mut("offsets[0] negative", Expect::kLabel);
      } else if (k == 1 && TB >= 1) {
        const int64_t i = c.rng.range(1, TB);
        set_index(p, l->idx_dt, i, get_index(p, l->idx_dt, i - 1) - c.rng.range(1, 3));
        c.mut(fmt("offsets[%" PRId64 "] decreasing", i), Expect::kLabel);
      } else if (k == 2) {
        const int64_t last = get_index(p, l->idx_dt, TB);
        set_index(p, l->idx_dt, TB, c.rng.chance(0.5) ? last + c.rng.range(1, 3) : last - 1);
        c.mut("offsets: last != N", Expect::kLabel);
      } else {
        const int64_t i = c.rng.range(0, TB);
        const int64_t big = l->idx_dt == kI32 ? INT32_MAX : c.rng.pick<int64_t>({int64_t{1} << 40, INT64_MAX});
        set_index(p, l->idx_dt, i, big);
        c.mut(fmt("offsets[%" PRId64 "]=%" PRId64, i, big), Expect::kLabel);
      }
      break;
    }
    case 7: {  // out-of-range index values
      if (l->N == 0 || !room(l->indices, l->N - 1, l->idx_dt)) break;
      int64_t maxE = 0;
      for (int64_t e : o.rows) maxE = std::max(maxE, e);
      const int64_t i = c.rng.range(0, l->N - 1);
      int64_t v = c.rng.pick<int64_t>({-1, maxE, maxE + 7, int64_t{1} << 40, INT64_MIN, INT64_MAX, -(int64_t{1} << 40)});
      if (l->idx_dt == kI32) v = c.rng.pick<int64_t>({-1, maxE, maxE + 7, INT32_MAX, INT32_MIN});
      set_index(l->indices.d.data, l->idx_dt, i, v);
      c.mut(fmt("indices[%" PRId64 "]=%" PRId64, i, v), Expect::kLabel);
      break;
    }
    case 8: {
      const int64_t B = TB / o.F();
      l->B = c.rng.pick<int64_t>({-1, INT64_MIN, int64_t{1} << 62, INT64_MAX, B + 1, B - 1, (INT64_MAX - 1) / o.F() + 1});
      c.mut(fmt("batch_size=%" PRId64 " (offsets hold %" PRId64 " bags)", l->B, TB), Expect::kFail, kInvalidArgument);
      break;
    }
    case 9:
      if (!touch(c, "pooling")) break;
      l->pooling = bad_enum(c, 3);
      c.mut(fmt("pooling=%d", l->pooling), Expect::kFail, kInvalidArgument);
      break;
    case 10:
      l->bounds = bad_enum(c, 3);
      c.mut(fmt("bounds_check=%d", l->bounds), Expect::kFail, kInvalidArgument);
      break;
    case 11:
      if (!touch(c, "pooling") || !touch(c, "per_sample_weights")) break;
      if (l->psw.d.data != nullptr && l->pooling != 2 && l->N > 0) {
        l->pooling = 1;
        c.mut("mean pooling with per-sample weights", Expect::kFail, kInvalidArgument);
      } else if (l->psw.d.data == nullptr && l->pooling != 1) {
        materialise(c, &l->psw, "per_sample_weights", Role::kInput, false);
        fill_values(c, l->psw.buf->p(), kF32, l->N, false);
        c.mut("per-sample weights added", Expect::kOk);
      }
      break;
    case 12:
      if (l->psw.d.data != nullptr)
        mutate_tensor(c, &l->psw, "per_sample_weights", Role::kInput, [](int dt) { return dt == kF32; }, Len::kFixed, true,
                      Data::kOptional);
      break;
    case 13:
      if (l->num_skipped) {
        l->num_skipped = nullptr;
        c.mut("num_skipped=NULL", Expect::kOk);
      }
      break;
    default:
      break;  // (the op's own mutations)
  }
}

// The verdict on the offsets and index values as they are after all mutations (when their buffers are
// still the ones generated): bad offsets are refused in every mode on the CPU (kOutOfRange); an index
// outside its table is refused in error mode and dropped in skip and off modes.
void judge_values(Case& c, const TbeObj& o, Lookup* l, bool values_checked) {
  const int64_t TB = l->TB, N = l->N;
  const bool intact = l->offsets.d.dtype == l->idx_dt && l->indices.d.dtype == l->idx_dt &&
                      l->offsets.numel() == TB + 1 && l->indices.numel() == N && room(l->offsets, TB, l->idx_dt) &&
                      (N == 0 || room(l->indices, N - 1, l->idx_dt));
  if (!intact) return;  // another mutation changed these buffers and decides
  const void* off = l->offsets.d.data;
  bool bad_off = get_index(off, l->idx_dt, 0) < 0 || get_index(off, l->idx_dt, TB) != N;
  for (int64_t i = 1; i <= TB && !bad_off; ++i)
    bad_off = get_index(off, l->idx_dt, i) < get_index(off, l->idx_dt, i - 1);
  if (bad_off) {
    if (values_checked) c.mut("=> offsets invalid", Expect::kFail, kOutOfRange);
    return;
  }
  const int64_t B = TB / std::max(1, o.F());
  for (int f = 0; f < o.F() && B > 0; ++f)
    for (int64_t i = get_index(off, l->idx_dt, f * B); i < get_index(off, l->idx_dt, (f + 1) * B); ++i) {
      const int64_t r = get_index(l->indices.d.data, l->idx_dt, i);
      if (r < 0 || r >= o.E(f)) l->bad_indices = true;
    }
  if (!l->bad_indices) return;
  // error: refused naming feature, bag and position; skip: dropped and counted; off: dropped, nothing reported
  if (l->bounds == 0) c.mut("=> an index outside its table (error mode)", values_checked ? Expect::kFail : Expect::kAny,
                            kOutOfRange);
  else if (l->bounds == 1 || l->bounds == 2) c.mut("=> an index outside its table (dropped)", Expect::kOk);
}

// Fills a C struct's lookup fields.
template <typename A>
void put_lookup(const Lookup& l, A* a) {
  a->weights = l.weights.d;
  a->indices = l.indices.d;
  a->offsets = l.offsets.d;
  a->per_sample_weights = l.psw.d;
  a->batch_size = l.B;
  a->pooling = l.pooling;
  a->bounds_check = l.bounds;
  a->num_skipped = l.num_skipped;
}

// The forward as the header defines it (fp32 accumulation in double), for a valid call's check.
void check_forward_values(Case& c, const TbeObj& o, const Lookup& l, const Tensor& out) {
  const int64_t B = l.B;
  const bool seq = l.pooling == 2;
  int64_t skipped = 0;
  int col = 0;
  for (int f = 0; f < o.F(); ++f) {
    const int D = o.D(f);
    const int64_t base = o.woff[o.fmap[f]];
    for (int64_t b = 0; b < B; ++b) {
      const int64_t s = get_index(l.offsets.d.data, l.idx_dt, f * B + b), e = get_index(l.offsets.d.data, l.idx_dt, f * B + b + 1);
      std::vector<double> acc(D, 0.0), mag(D, 0.0);
      int64_t valid = 0;
      for (int64_t i = s; i < e; ++i) {
        const int64_t r = get_index(l.indices.d.data, l.idx_dt, i);
        const bool ok = r >= 0 && r < o.E(f);
        if (!ok) ++skipped;
        const double w = l.psw.d.data ? load_float(l.psw.d.data, kF32, i) : 1.0;
        for (int d = 0; d < D; ++d) {
          const double v = ok ? w * load_float(l.weights.d.data, o.wdt, base + r * D + d) : 0.0;
          if (seq) {
            const float got = load_float(out.d.data, kF32, i * D + d);
            if (std::fabs(v) < 1e37 && std::fabs(got - v) > 1e-5 * (1 + std::fabs(v))) {
              c.fail(fmt("output[%" PRId64 ", %d] = %g, expected %g", i, d, got, v));
              return;
            }
          }
          acc[d] += v;
          mag[d] += std::fabs(v);
        }
        valid += ok;
      }
      if (seq) continue;
      for (int d = 0; d < D; ++d) {
        double want = acc[d];
        if (l.pooling == 1 && valid > 0) want /= static_cast<double>(valid);
        const float got = load_float(out.d.data, kF32, b * o.lay.total_dim + col + d);
        if (mag[d] < 1e37 && std::fabs(got - want) > 1e-5 * (1 + mag[d])) {
          c.fail(fmt("output[%" PRId64 ", %d] (feature %d) = %g, expected %g", b, col + d, f, got, want));
          return;
        }
      }
    }
    col += D;
  }
  if (l.bounds == 1 && l.num_skipped && *l.num_skipped != skipped)
    c.fail(fmt("num_skipped = %" PRId64 ", expected %" PRId64, *l.num_skipped, skipped));
}

void case_tbe_forward(Case& c, bool cuda) {
  c.op = "embscale_tbe_forward";
  c.vocab = kTbeVocab;
  const int32_t pooling = static_cast<int32_t>(c.rng.range(0, 2));
  TbeObj o;
  if (!make_tbe(c, &o, pooling == 2)) return;
  Ctx ctx;
  make_ctx(c, &ctx, cuda, 0.06, true);
  const bool specials = c.rng.chance(0.2);
  Lookup l;
  make_lookup(c, o, &l, pooling, Role::kInput, specials);
  Tensor out;
  out.embedded = true;
  out.d.dtype = c.rng.pick<int32_t>({kF32, kF32, kF16, kBF16});
  if (pooling == 2) set_shape(&out.d, {l.N, o.D(0)});
  else set_shape(&out.d, {l.B, o.lay.total_dim});
  materialise(c, &out, "output", Role::kOutput, false);
  bool tbe_null = false, args_null = false;
  const int nmut = c.rng.chance(0.65) ? static_cast<int>(c.rng.range(1, 2)) : 0;
  for (int m = 0; m < nmut; ++m) {
    if (c.rng.chance(0.8)) {
      mutate_lookup(c, o, &l, Role::kInput, &tbe_null, &args_null);
    } else if (c.rng.chance(0.6)) {
      mutate_tensor(c, &out, "output", Role::kOutput, float_ok, Len::kFixed, false);
    } else {
      const uint64_t k = c.rng.below(4);
      const Tensor& r = k == 0 ? l.weights : k == 1 ? l.indices : k == 2 ? l.offsets : l.psw;
      alias(c, &out, "output", r, k == 0 ? "weights" : k == 1 ? "indices" : k == 2 ? "offsets" : "per_sample_weights");
    }
  }
  judge_values(c, o, &l, true);
  if (ctx.c.backend == 1 && cuda) return;
  embscale_tbe_forward_args a{};
  put_lookup(l, &a);
  a.output = out.d;
  c.snapshot();
  const int rc = embscale_tbe_forward(tbe_null ? nullptr : o.h, ctx.ptr(), args_null ? nullptr : &a);
  check_call(c, c.op.c_str(), rc);
  if (rc == kOk && !c.must_fail && c.unknown == 0 && !specials && out.d.dtype == kF32 && !(l.bad_indices && l.bounds == 2))
    check_forward_values(c, o, l, out);
}

// Valid optimizer hyper-parameters for `type`.
embscale_optimizer make_optimizer(Case& c, int32_t type) {
  embscale_optimizer p{};
  p.type = type;
  p.learning_rate = c.rng.chance(0.1) ? 0.0f : static_cast<float>(c.rng.range(1, 1000)) * 1e-3f;
  p.eps = c.rng.pick<float>({1e-8f, 1e-6f, 1e-3f, 0.1f});
  p.beta1 = c.rng.pick<float>({0.0f, 0.5f, 0.9f, 0.99f});
  p.beta2 = c.rng.pick<float>({0.0f, 0.9f, 0.999f});
  const bool decays = type == 2 || type == 3 || type == 4;
  p.weight_decay_mode = decays ? static_cast<int32_t>(c.rng.range(0, 2)) : 0;
  p.weight_decay = decays && c.rng.chance(0.5) ? 0.01f : 0.0f;
  p.max_norm = type == 2 && c.rng.chance(0.3) ? 1.0f : 0.0f;
  p.gradient_clipping = type != 0 && c.rng.chance(0.3) ? 0.5f : 0.0f;
  p.step = c.rng.chance(0.2) ? 1 : c.rng.range(1, 100000);
  return p;
}

void mutate_optimizer(Case& c, embscale_optimizer* p) {
  if (!touch(c, "optimizer")) return;
  const bool adagrad = p->type == 2, adam = p->type == 3 || p->type == 4;
  switch (c.rng.below(11)) {
    case 0:
      p->type = bad_enum(c, 5);
      c.mut(fmt("optimizer.type=%d", p->type), Expect::kFail, kInvalidArgument);
      break;
    case 1:
      p->learning_rate = c.rng.pick<float>({NAN, INFINITY, -INFINITY, -0.5f});
      c.mut(fmt("optimizer.learning_rate=%g", p->learning_rate), Expect::kFail, kInvalidArgument);
      break;
    case 2:
      p->step = c.rng.pick<int64_t>({0, -1, INT64_MIN});
      c.mut(fmt("optimizer.step=%" PRId64, p->step), Expect::kFail, kInvalidArgument);
      break;
    case 3:
      p->eps = c.rng.pick<float>({NAN, INFINITY, 0.0f, -1e-8f});
      c.mut(fmt("optimizer.eps=%g", p->eps), adagrad || adam ? Expect::kFail : Expect::kAny, kInvalidArgument);
      break;
    case 4:
      if (c.rng.chance(0.5)) p->beta1 = c.rng.pick<float>({NAN, 1.0f, -0.1f, 2.0f});
      else p->beta2 = c.rng.pick<float>({NAN, 1.0f, -0.1f, INFINITY});
      c.mut(fmt("optimizer.beta1=%g beta2=%g", p->beta1, p->beta2), adam ? Expect::kFail : Expect::kAny, kInvalidArgument);
      break;
    case 5:
      p->weight_decay = c.rng.pick<float>({NAN, INFINITY});
      c.mut(fmt("optimizer.weight_decay=%g", p->weight_decay), Expect::kFail, kInvalidArgument);
      break;
    case 6:
      p->weight_decay_mode = bad_enum(c, 3);
      c.mut(fmt("optimizer.weight_decay_mode=%d", p->weight_decay_mode), Expect::kFail, kInvalidArgument);
      break;
    case 7:
      p->max_norm = c.rng.pick<float>({NAN, -1.0f, INFINITY, 2.0f});
      c.mut(fmt("optimizer.max_norm=%g", p->max_norm), p->max_norm == 2.0f && adagrad ? Expect::kOk : Expect::kFail,
            kInvalidArgument);
      break;
    case 8:
      p->gradient_clipping = c.rng.pick<float>({NAN, -1.0f, INFINITY, 1.0f});
      c.mut(fmt("optimizer.gradient_clipping=%g", p->gradient_clipping),
            p->gradient_clipping == 1.0f && p->type != 0 ? Expect::kOk : Expect::kFail, kInvalidArgument);
      break;
    case 9:
      if (!adagrad && !adam) {
        p->weight_decay = 0.01f;
        p->weight_decay_mode = static_cast<int32_t>(c.rng.range(1, 2));
        c.mut("weight decay with an optimizer that applies none", Expect::kFail, kInvalidArgument);
      }
      break;
    default:
      p->step = INT64_MAX;
      p->learning_rate = c.rng.chance(0.5) ? 1e30f : p->learning_rate;
      c.mut(fmt("optimizer.step=INT64_MAX, learning_rate=%g", p->learning_rate), Expect::kOk);
      break;
  }
}

// Whether the optimizer keeps momentum 1 / 2, and whether they are row-wise.
void state_shape(int type, bool* m1, bool* m1_rows, bool* m2, bool* m2_rows) {
  *m1 = type == 2 || type == 3 || type == 4;
  *m1_rows = type == 2;
  *m2 = type == 3 || type == 4;
  *m2_rows = type == 4;
}

// One backward case: op 0 = embscale_tbe_backward_workspace_size, 1 = embscale_tbe_backward.
void case_tbe_backward(Case& c, bool cuda, int op) {
  c.op = op == 0 ? "embscale_tbe_backward_workspace_size" : "embscale_tbe_backward";
  c.vocab = kTbeVocab;
  const int32_t pooling = static_cast<int32_t>(c.rng.range(0, 2));
  TbeObj o;
  if (!make_tbe(c, &o, pooling == 2)) return;
  Ctx ctx;
  make_ctx(c, &ctx, cuda, 0.05, true);
  const int32_t type = static_cast<int32_t>(c.rng.range(0, 4));
  const bool dense = type == 0;
  const Role wrole = dense ? Role::kInput : Role::kTable;  // dense-gradient mode never writes the weights
  const bool specials = c.rng.chance(0.15);
  Lookup l;
  make_lookup(c, o, &l, pooling, wrole, specials);
  Tensor go;
  go.embedded = true;
  go.d.dtype = c.rng.pick<int32_t>({kF32, kF32, kF16, kBF16});
  if (pooling == 2) set_shape(&go.d, {l.N, o.D(0)});
  else set_shape(&go.d, {l.B, o.lay.total_dim});
  materialise(c, &go, "grad_output", Role::kInput, false);
  fill_values(c, go.buf->p(), go.d.dtype, go.numel(), specials);
  embscale_optimizer opt = make_optimizer(c, type);
  bool m1, m1_rows, m2, m2_rows;
  state_shape(type, &m1, &m1_rows, &m2, &m2_rows);
  Tensor mom1, mom2, gpsw, urows, ugrads;
  for (Tensor* t : {&mom1, &mom2, &gpsw, &urows, &ugrads}) t->embedded = true;
  for (auto& m : {std::make_tuple(&mom1, m1, m1_rows, "momentum1"), std::make_tuple(&mom2, m2, m2_rows, "momentum2")}) {
    Tensor* t = std::get<0>(m);
    t->d.dtype = kF32;
    set_shape(&t->d, {std::get<2>(m) ? o.lay.total_rows : o.lay.num_weights});
    if (std::get<1>(m)) {
      materialise(c, t, std::get<3>(m), Role::kState, false);
      for (int64_t i = 0; i < t->numel(); ++i) {  // state as an optimizer leaves it: >= 0 sums and squares
        const float v = static_cast<float>(c.rng.range(0, 1000)) * 1e-3f;
        std::memcpy(t->buf->p() + 4 * i, &v, 4);
      }
    }
  }
  gpsw.d.dtype = kF32;
  set_shape(&gpsw.d, {l.N});
  if (l.psw.d.data != nullptr && c.rng.chance(0.5)) materialise(c, &gpsw, "grad_per_sample_weights", Role::kOutput, false);
  urows.d.dtype = kI64;
  set_shape(&urows.d, {l.N});
  ugrads.d.dtype = kF32;
  set_shape(&ugrads.d, {l.N * o.lay.max_dim});
  if (c.rng.chance(0.3)) set_shape(&ugrads.d, {l.N, o.lay.max_dim});
  int64_t* num_unique = nullptr;
  if (dense) {
    materialise(c, &urows, "unique_rows", Role::kOutput, false);
    materialise(c, &ugrads, "unique_grads", Role::kOutput, false);
    num_unique = reinterpret_cast<int64_t*>(c.alloc("num_unique", 8, Role::kOutput)->p());
  }
  embscale_tbe_backward_args a{};
  auto put = [&]() {
    put_lookup(l, &a);
    a.grad_output = go.d;
    a.optimizer = opt;
    a.momentum1 = mom1.d;
    a.momentum2 = mom2.d;
    a.grad_per_sample_weights = gpsw.d;
    a.unique_rows = urows.d;
    a.num_unique = num_unique;
    a.unique_grads = ugrads.d;
  };
  a.deterministic = c.rng.pick<int32_t>({1, 1, 0, 7});
  a.rounding = static_cast<int32_t>(c.rng.range(0, 1));
  a.seed = c.rng.next();
  if (c.rng.chance(0.3)) {
    a.max_warp_segment = static_cast<int32_t>(c.rng.range(0, 200));
    a.max_block_segment = static_cast<int32_t>(c.rng.range(0, 2000));
    a.block_threads = c.rng.pick<int32_t>({0, 32, 64, 256, 1024});
  }
  // The workspace the valid arguments need.
  put();
  size_t need = 0;
  {
    embscale_context vctx{};
    const int rc = embscale_tbe_backward_workspace_size(o.h, &vctx, &a, &need);
    if (rc != kOk) {
      c.fail(fmt("embscale_tbe_backward_workspace_size refused valid arguments: %s", embscale_last_error()));
      return;
    }
  }
  bool tbe_null = false, args_null = false;
  const int nmut = c.rng.chance(0.7) ? static_cast<int>(c.rng.range(1, 2)) : 0;
  for (int m = 0; m < nmut; ++m) {
    const uint64_t k = c.rng.below(20);
    if (k < 9) {
      mutate_lookup(c, o, &l, wrole, &tbe_null, &args_null, op == 1);
    } else if (k == 9) {
      mutate_tensor(c, &go, "grad_output", Role::kInput, float_ok, Len::kFixed, false);
    } else if (k == 10 || k == 11) {
      mutate_optimizer(c, &opt);
    } else if (k == 12) {  // state: present or absent against the optimizer's needs, or mutated
      Tensor* t = c.rng.chance(0.5) ? &mom1 : &mom2;
      const char* name = t == &mom1 ? "momentum1" : "momentum2";
      const bool used = t == &mom1 ? m1 : m2;
      if (c.touched.count(name)) {
        // already mutated
      } else if (used && c.rng.chance(0.7)) {
        mutate_tensor(c, t, name, Role::kState, [](int dt) { return dt == kF32; }, Len::kFixed, true);
        if (t->d.data == nullptr && !t->null) c.muts.back() += " (absent, but the optimizer keeps it)";
      } else if (used) {
        touch(c, name);
        t->d.data = nullptr;
        c.mut(std::string(name) + " absent", Expect::kFail, kInvalidArgument);
      } else {
        touch(c, name);
        set_shape(&t->d, {c.rng.chance(0.5) ? o.lay.total_rows : o.lay.num_weights});
        materialise(c, t, name, Role::kState, false);
        c.mut(std::string(name) + " given to an optimizer that keeps none", Expect::kFail, kInvalidArgument);
      }
    } else if (k == 13) {  // the gradient of the per-sample weights
      if (gpsw.d.data != nullptr) {
        mutate_tensor(c, &gpsw, "grad_per_sample_weights", Role::kOutput, [](int dt) { return dt == kF32; }, Len::kFixed,
                      true, Data::kOptional);
      } else if (l.psw.d.data == nullptr && l.N > 0 && touch(c, "grad_per_sample_weights")) {
        materialise(c, &gpsw, "grad_per_sample_weights", Role::kOutput, false);
        c.mut("grad_per_sample_weights given", Expect::kLabel);  // judged below, with the final per_sample_weights
      }
    } else if (k == 14) {  // dense-gradient outputs
      if (dense) {
        const uint64_t w = c.rng.below(3);
        if (w == 0) {
          mutate_tensor(c, &urows, "unique_rows", Role::kOutput, [](int dt) { return dt == kI64; }, Len::kFixed, true,
                        l.N > 0 ? Data::kRequired : Data::kOptional);
        } else if (w == 1) {
          mutate_tensor(c, &ugrads, "unique_grads", Role::kOutput, [](int dt) { return dt == kF32; }, Len::kFixed, true,
                        l.N > 0 ? Data::kRequired : Data::kOptional);
        } else if (touch(c, "num_unique")) {
          num_unique = nullptr;
          c.mut("num_unique=NULL", Expect::kFail, kInvalidArgument);
        }
      } else if (l.N > 0) {
        Tensor* t = c.rng.chance(0.5) ? &urows : &ugrads;
        if (!touch(c, t == &urows ? "unique_rows" : "unique_grads")) continue;
        materialise(c, t, "dense output", Role::kOutput, false);
        c.mut("a dense-gradient output given to an updating optimizer", Expect::kFail, kInvalidArgument);
      } else if (touch(c, "num_unique")) {
        num_unique = reinterpret_cast<int64_t*>(c.alloc("num_unique", 8, Role::kOutput)->p());
        c.mut("num_unique given to an updating optimizer", Expect::kFail, kInvalidArgument);
      }
    } else if (k == 15 && touch(c, "rounding")) {
      a.rounding = bad_enum(c, 2);
      c.mut(fmt("rounding=%d", a.rounding), Expect::kFail, kInvalidArgument);
    } else if (k == 16) {
      int32_t* f = c.rng.pick<int32_t*>({&a.max_warp_segment, &a.max_block_segment, &a.block_threads});
      if (!touch(c, f == &a.max_warp_segment ? "max_warp_segment" : f == &a.max_block_segment ? "max_block_segment"
                                                                                            : "block_threads")) {
        // already mutated
      } else if (c.rng.chance(0.5)) {
        *f = c.rng.pick<int32_t>({-1, INT32_MIN});
        c.mut(fmt("tuning=%d", *f), Expect::kFail, kInvalidArgument);
      } else {
        *f = c.rng.pick<int32_t>({1, INT32_MAX, 3, 1 << 30});
        c.mut(fmt("tuning=%d", *f));
      }
    } else if (k == 17) {
      a.deterministic = c.rng.pick<int32_t>({0, -1, INT32_MIN});
      c.mut(fmt("deterministic=%d", a.deterministic), Expect::kOk);
    } else {  // a written buffer aliasing another one
      std::vector<std::pair<Tensor*, const char*>> written = {{&mom1, "momentum1"}, {&mom2, "momentum2"},
                                                              {&gpsw, "grad_per_sample_weights"},
                                                              {&urows, "unique_rows"}, {&ugrads, "unique_grads"}};
      if (!dense) written.push_back({&l.weights, "weights"});
      std::vector<std::pair<const Tensor*, const char*>> any = {
          {&l.weights, "weights"}, {&l.indices, "indices"}, {&l.offsets, "offsets"}, {&l.psw, "per_sample_weights"},
          {&go, "grad_output"},    {&mom1, "momentum1"},    {&mom2, "momentum2"},   {&gpsw, "grad_per_sample_weights"},
          {&urows, "unique_rows"}, {&ugrads, "unique_grads"}};
      const auto& w = written[c.rng.below(written.size())];
      const auto& r = any[c.rng.below(any.size())];
      if (w.first != r.first) alias(c, w.first, w.second, *r.first, r.second);
    }
  }
  if (gpsw.d.data != nullptr && l.psw.d.data == nullptr)
    c.mut("=> grad_per_sample_weights without per_sample_weights", Expect::kFail, kInvalidArgument);
  judge_values(c, o, &l, op == 1);
  put();
  if (ctx.c.backend == 1 && cuda) return;
  if (op == 0) {
    size_t storage = 0;
    size_t* bytes = size_out(c, &storage);
    c.snapshot();
    const int rc = embscale_tbe_backward_workspace_size(tbe_null ? nullptr : o.h, ctx.ptr(), args_null ? nullptr : &a,
                                                        bytes);
    check_call(c, c.op.c_str(), rc);
    if (rc == kOk && storage > (size_t{1} << 36)) c.fail(fmt("workspace of %zu bytes for a tiny problem", storage));
    return;
  }
  Workspace ws = make_workspace(c, need, true);
  c.snapshot();
  const int rc = embscale_tbe_backward(tbe_null ? nullptr : o.h, ctx.ptr(), args_null ? nullptr : &a, ws.p, ws.bytes);
  check_call(c, c.op.c_str(), rc);
  if (rc == kOk && dense && num_unique && (*num_unique < 0 || *num_unique > l.N))
    c.fail(fmt("num_unique = %" PRId64 " with %" PRId64 " lookups", *num_unique, l.N));
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
      {"tbe_forward", 18, [](Case& c, bool cu) { case_tbe_forward(c, cu); }},
      {"tbe_backward_workspace_size", 5, [](Case& c, bool cu) { case_tbe_backward(c, cu, 0); }},
      {"tbe_backward", 18, [](Case& c, bool cu) { case_tbe_backward(c, cu, 1); }},
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
  g_tally = [fd](const char* fn, int rc) { write_all(fd, fmt("R %d ", rc) + fn + "\n"); };
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
  std::map<std::string, std::array<int, 7>> tally;  // per function: calls by status code (6: other)
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
          last_progress = std::chrono::steady_clock::now();
          if (o.verbose) std::printf("case %lld %s\n", k, current_op.c_str());
        } else if (line.size() > 2 && line[0] == 'F') {
          long long k = 0;
          std::sscanf(line.c_str() + 2, "%lld", &k);
          const std::string text = line.substr(line.find(' ', 2) + 1);
          rep.failures.push_back(fmt("FAIL seed=%" PRIu64 " case=%lld: ", o.seed, k) + text);
          std::printf("%s\n", rep.failures.back().c_str());
          std::fflush(stdout);
        } else if (line.size() > 2 && line[0] == 'R') {
          int rc = 0;
          std::sscanf(line.c_str() + 2, "%d", &rc);
          const std::string fn = line.substr(line.find(' ', 2) + 1);
          auto& t = tally[fn];
          ++t[rc >= 0 && rc <= 5 ? rc : 6];
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
  std::printf("fuzz_capi: %" PRId64 " cases, seed %" PRIu64 "; calls by status (ok, invalid_argument, unsupported, "
              "out_of_range, workspace_too_small, backend_error):\n", o.cases, o.seed);
  for (const auto& kv : tally) {
    std::printf("  %-50s", kv.first.c_str());
    for (int i = 0; i < 6; ++i) std::printf(" %6d", kv.second[i]);
    std::printf("\n");
  }
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
