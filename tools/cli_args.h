// How the CLI reads and refuses its arguments. Every refusal, whether CLI11 or a subcommand's own
// validation finds the problem, is one line "error: <flag>: <reason>" on stderr and exit status 2
// (kExitBadArgument), before anything is allocated or run; a run that fails later exits 1.
//
// Numbers are read here rather than by CLI11's conversions, which take "-1" for an unsigned value
// (it wraps), clamp or wrap values out of range and read "010" as octal: the readers below take
// decimal digits only and say what is wrong with the text. Sizes derived from the arguments are
// computed with CheckedSize, so an overflow is refused instead of wrapping to a small number.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace CLI {
class App;
class Option;
class ParseError;
}  // namespace CLI

namespace embscale {
namespace tools {

constexpr int kExitFailed = 1;       // a run that failed: a measurement, a mismatch, an allocation
constexpr int kExitBadArgument = 2;  // the command line was refused; nothing ran

// A refused argument: thrown by the option readers (during parsing) and reported by main.
class BadArgument : public std::runtime_error {
 public:
  BadArgument(const std::string& flag, const std::string& reason)
      : std::runtime_error(flag + ": " + reason), flag_(flag), reason_(reason) {}
  const std::string& flag() const { return flag_; }
  const std::string& reason() const { return reason_; }

 private:
  std::string flag_, reason_;
};

// Prints "error: <flag>: <reason>" and returns kExitBadArgument.
int refuse(const std::string& flag, const std::string& reason);
// The same for a message that already starts with its flag ("--sizes: ...").
int refuse(const std::string& flag_and_reason);

// Strict readers: optional '-' (signed values only; for an unsigned one it is reported as negative),
// then decimal digits; nothing else (no spaces, signs elsewhere, hex, octal or suffixes). The value
// must lie in [lo, hi]. On failure *why says what is wrong with `text` (without the flag).
bool read_integer(const std::string& text, int64_t lo, int64_t hi, int64_t* out, std::string* why);
bool read_unsigned(const std::string& text, uint64_t hi, uint64_t* out, std::string* why);
// A finite decimal number: [-]digits[.digits][e[+-]digits] (or .digits), in [lo, hi].
bool read_real(const std::string& text, double lo, double hi, double* out, std::string* why);

// Options read by the strict readers: the target is written only when the option is given (so a
// sentinel default stays), and a bad value throws BadArgument naming the option.
CLI::Option* add_integer_option(CLI::App* app, const std::string& name, int64_t* dst, int64_t lo, int64_t hi,
                                const std::string& help);
CLI::Option* add_integer_option(CLI::App* app, const std::string& name, int* dst, int lo, int hi,
                                const std::string& help);
CLI::Option* add_unsigned_option(CLI::App* app, const std::string& name, uint64_t* dst, const std::string& help);
// A text option whose value must not be empty (for options where "" would read as "not given").
CLI::Option* add_text_option(CLI::App* app, const std::string& name, std::string* dst, const std::string& help);
CLI::Option* add_real_option(CLI::App* app, const std::string& name, double* dst, double lo, double hi,
                             const std::string& help);
CLI::Option* add_real_option(CLI::App* app, const std::string& name, float* dst, float lo, float hi,
                             const std::string& help);
// A comma-separated list ("2^16,2^20"; given more than once, or as several values, the lists are joined).
// Every element must be non-empty: "1000,,2000", a leading or trailing comma and an empty value are
// refused, naming the option and the element's position (CLI11's own splitting drops empty elements).
CLI::Option* add_list_option(CLI::App* app, const std::string& name, std::vector<std::string>* dst,
                             const std::string& help);

// "a, b or c": the values an option accepts, for its help and its refusals.
std::string one_of(const std::vector<std::string>& names);

// Reports a CLI11 parse error (other than --help, which the caller hands to app.exit) as
// "error: <flag>: <reason>", whatever CLI11's own wording, and returns kExitBadArgument.
int report_parse_error(const CLI::App& app, const CLI::ParseError& e);

// "embscale bench fp8": the command line's deepest subcommand that was parsed.
std::string command_path(const CLI::App& app);

// A byte or element count whose arithmetic cannot wrap: once a step overflows 64 bits the value is
// marked overflowed and stays so (compare with fits_in before using value()).
class CheckedSize {
 public:
  CheckedSize() = default;
  CheckedSize(uint64_t v) : value_(v) {}  // NOLINT: implicit, so expressions mix sizes and plain counts
  static CheckedSize overflowed() {
    CheckedSize c;
    c.overflow_ = true;
    return c;
  }
  uint64_t value() const { return value_; }
  bool overflow() const { return overflow_; }
  // False on overflow or when the value exceeds `limit`.
  bool fits_in(uint64_t limit) const { return !overflow_ && value_ <= limit; }

  friend CheckedSize operator+(CheckedSize a, CheckedSize b) {
    if (a.overflow_ || b.overflow_ || a.value_ > UINT64_MAX - b.value_) return overflowed();
    return CheckedSize(a.value_ + b.value_);
  }
  friend CheckedSize operator*(CheckedSize a, CheckedSize b) {
    if ((!a.overflow_ && a.value_ == 0) || (!b.overflow_ && b.value_ == 0)) return CheckedSize(0);  // even x huge
    if (a.overflow_ || b.overflow_) return overflowed();
    if (a.value_ != 0 && b.value_ > UINT64_MAX / a.value_) return overflowed();
    return CheckedSize(a.value_ * b.value_);
  }
  CheckedSize& operator+=(CheckedSize b) { return *this = *this + b; }
  CheckedSize& operator*=(CheckedSize b) { return *this = *this * b; }
  // Up to a multiple of `align` (> 0).
  CheckedSize round_up(uint64_t align) const {
    if (overflow_ || value_ > UINT64_MAX - (align - 1)) return overflowed();
    return CheckedSize((value_ + align - 1) / align * align);
  }
  friend CheckedSize max(CheckedSize a, CheckedSize b) {
    if (a.overflow_ || b.overflow_) return overflowed();
    return a.value_ >= b.value_ ? a : b;
  }

 private:
  uint64_t value_ = 0;
  bool overflow_ = false;
};

// "1.5 GiB", "512 B", or "more than 2^64 bytes" for an overflowed size.
std::string format_bytes(const CheckedSize& bytes);

}  // namespace tools
}  // namespace embscale
