// Strict argument reading and the one format of every refusal (cli_args.h).
#include "cli_args.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <vector>

namespace embscale {
namespace tools {

int refuse(const std::string& flag, const std::string& reason) {
  std::fprintf(stderr, "error: %s: %s\n", flag.c_str(), reason.c_str());
  std::fflush(stderr);
  return kExitBadArgument;
}

int refuse(const std::string& flag_and_reason) {
  std::fprintf(stderr, "error: %s\n", flag_and_reason.c_str());
  std::fflush(stderr);
  return kExitBadArgument;
}

namespace {

std::string quoted(const std::string& text) { return "'" + text + "'"; }

bool all_digits(const std::string& s) {
  if (s.empty()) return false;
  for (char c : s)
    if (c < '0' || c > '9') return false;
  return true;
}

// Decimal digits to a value; false when it exceeds `limit`.
bool digits_value(const std::string& s, uint64_t limit, uint64_t* out) {
  uint64_t v = 0;
  for (char c : s) {
    const uint64_t d = static_cast<uint64_t>(c - '0');
    if (d > limit || v > (limit - d) / 10) return false;
    v = v * 10 + d;
  }
  *out = v;
  return true;
}

std::string range_text(int64_t lo, int64_t hi) {
  if (hi == std::numeric_limits<int64_t>::max()) return "an integer >= " + std::to_string(lo);
  return "an integer in " + std::to_string(lo) + ".." + std::to_string(hi);
}

std::string real_range_text(double lo, double hi) {
  char buf[96];
  if (hi >= std::numeric_limits<double>::max())
    std::snprintf(buf, sizeof buf, "a finite number >= %g", lo);
  else
    std::snprintf(buf, sizeof buf, "a number in %g..%g", lo, hi);
  return buf;
}

}  // namespace

bool read_integer(const std::string& text, int64_t lo, int64_t hi, int64_t* out, std::string* why) {
  const bool negative = !text.empty() && text[0] == '-';
  const std::string body = negative ? text.substr(1) : text;
  if (!all_digits(body)) {
    *why = quoted(text) + " is not an integer; expected " + range_text(lo, hi);
    return false;
  }
  // |value| up to 2^63 (the magnitude of INT64_MIN) reads exactly; beyond, out of range.
  uint64_t magnitude = 0;
  const uint64_t limit = negative ? uint64_t{1} << 63 : static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  bool in_range = digits_value(body, limit, &magnitude);
  int64_t v = 0;
  if (in_range) {
    v = negative ? static_cast<int64_t>(0 - magnitude) : static_cast<int64_t>(magnitude);
    in_range = v >= lo && v <= hi;
  }
  if (!in_range) {
    *why = quoted(text) + (negative && lo >= 0 ? " is negative" : " is out of range") + "; expected " +
           range_text(lo, hi);
    return false;
  }
  *out = v;
  return true;
}

bool read_unsigned(const std::string& text, uint64_t hi, uint64_t* out, std::string* why) {
  const std::string expected = "; expected an integer in 0.." + std::to_string(hi);
  const bool negative = !text.empty() && text[0] == '-';
  if (!all_digits(negative ? text.substr(1) : text)) {
    *why = quoted(text) + " is not an integer" + expected;
    return false;
  }
  uint64_t v = 0;
  if (negative && text.find_first_not_of("-0") != std::string::npos) {
    *why = quoted(text) + " is negative" + expected;
    return false;
  }
  if (!digits_value(negative ? text.substr(1) : text, hi, &v)) {
    *why = quoted(text) + " is out of range" + expected;
    return false;
  }
  *out = v;
  return true;
}

bool read_real(const std::string& text, double lo, double hi, double* out, std::string* why) {
  // The grammar first, so strtod's extras (spaces, hex, inf, nan) never get through.
  size_t i = 0;
  const size_t n = text.size();
  if (i < n && (text[i] == '-' || text[i] == '+')) ++i;
  size_t mantissa_digits = 0;
  while (i < n && text[i] >= '0' && text[i] <= '9') ++i, ++mantissa_digits;
  if (i < n && text[i] == '.') {
    ++i;
    while (i < n && text[i] >= '0' && text[i] <= '9') ++i, ++mantissa_digits;
  }
  bool ok = mantissa_digits > 0;
  if (ok && i < n && (text[i] == 'e' || text[i] == 'E')) {
    ++i;
    if (i < n && (text[i] == '-' || text[i] == '+')) ++i;
    size_t exponent_digits = 0;
    while (i < n && text[i] >= '0' && text[i] <= '9') ++i, ++exponent_digits;
    ok = exponent_digits > 0;
  }
  if (!ok || i != n) {
    *why = quoted(text) + " is not a number; expected " + real_range_text(lo, hi);
    return false;
  }
  errno = 0;
  const double v = std::strtod(text.c_str(), nullptr);
  if ((errno == ERANGE && std::fabs(v) > 1.0) || !std::isfinite(v) || v < lo || v > hi) {
    *why = quoted(text) + " is out of range; expected " + real_range_text(lo, hi);
    return false;
  }
  *out = v;
  return true;
}

namespace {

// An option of one value whose text the callback reads (the target is untouched unless given).
CLI::Option* add_read_option(CLI::App* app, const std::string& name, const std::string& help, const char* type,
                             std::function<void(const std::string&)> read) {
  CLI::Option* opt = app->add_option(
      name,
      [read](const CLI::results_t& res) {
        read(res.empty() ? std::string() : res.back());
        return true;
      },
      help);
  opt->type_name(type);
  opt->expected(1);
  return opt;
}

}  // namespace

CLI::Option* add_integer_option(CLI::App* app, const std::string& name, int64_t* dst, int64_t lo, int64_t hi,
                                const std::string& help) {
  return add_read_option(app, name, help, "INT", [=](const std::string& text) {
    std::string why;
    if (!read_integer(text, lo, hi, dst, &why)) throw BadArgument(name, why);
  });
}

CLI::Option* add_integer_option(CLI::App* app, const std::string& name, int* dst, int lo, int hi,
                                const std::string& help) {
  return add_read_option(app, name, help, "INT", [=](const std::string& text) {
    std::string why;
    int64_t v = 0;
    if (!read_integer(text, lo, hi, &v, &why)) throw BadArgument(name, why);
    *dst = static_cast<int>(v);
  });
}

CLI::Option* add_unsigned_option(CLI::App* app, const std::string& name, uint64_t* dst, const std::string& help) {
  CLI::Option* opt = add_read_option(app, name, help, "UINT", [=](const std::string& text) {
    std::string why;
    if (!read_unsigned(text, std::numeric_limits<uint64_t>::max(), dst, &why)) throw BadArgument(name, why);
  });
  opt->default_str(std::to_string(*dst));
  return opt;
}

CLI::Option* add_text_option(CLI::App* app, const std::string& name, std::string* dst, const std::string& help) {
  return add_read_option(app, name, help, "TEXT", [=](const std::string& text) {
    if (text.empty()) throw BadArgument(name, "expects a non-empty value");
    *dst = text;
  });
}

CLI::Option* add_real_option(CLI::App* app, const std::string& name, double* dst, double lo, double hi,
                             const std::string& help) {
  return add_read_option(app, name, help, "FLOAT", [=](const std::string& text) {
    std::string why;
    if (!read_real(text, lo, hi, dst, &why)) throw BadArgument(name, why);
  });
}

CLI::Option* add_real_option(CLI::App* app, const std::string& name, float* dst, float lo, float hi,
                             const std::string& help) {
  return add_read_option(app, name, help, "FLOAT", [=](const std::string& text) {
    std::string why;
    double v = 0;
    if (!read_real(text, lo, hi, &v, &why)) throw BadArgument(name, why);
    *dst = static_cast<float>(v);
  });
}

CLI::Option* add_list_option(CLI::App* app, const std::string& name, std::vector<std::string>* dst,
                             const std::string& help) {
  CLI::Option* opt = app->add_option(
      name,
      [=](const CLI::results_t& res) {
        dst->clear();
        for (const std::string& text : res) {
          if (text.empty()) throw BadArgument(name, "expects a non-empty comma-separated list");
          size_t begin = 0;
          for (int position = 1;; ++position) {
            const size_t end = std::min(text.find(',', begin), text.size());
            if (end == begin)
              throw BadArgument(name, "element " + std::to_string(position) + " of " + quoted(text) + " is empty");
            dst->push_back(text.substr(begin, end - begin));
            if (end == text.size()) break;
            begin = end + 1;
          }
        }
        return true;
      },
      help);
  opt->type_name("LIST");
  opt->expected(1, CLI::detail::expected_max_vector_size);
  opt->allow_extra_args(true);  // "--sizes 1K 2K", as CLI11's own list options
  return opt;
}

std::string one_of(const std::vector<std::string>& names) {
  std::string text;
  for (size_t i = 0; i < names.size(); ++i) text += (i == 0 ? "" : i + 1 == names.size() ? " or " : ", ") + names[i];
  return text;
}

std::string command_path(const CLI::App& app) {
  std::string path = "embscale";
  const CLI::App* at = &app;
  while (true) {
    const std::vector<CLI::App*> subs = at->get_subcommands();
    if (subs.empty()) break;
    at = subs.front();
    path += " " + at->get_name();
  }
  return path;
}

namespace {

// The first word of a CLI11 message that looks like an option ("--iters", "-v"), without the
// punctuation around it; "" when there is none.
std::string first_flag_in(const std::string& message) {
  size_t pos = 0;
  while (pos < message.size()) {
    const size_t begin = message.find_first_not_of(" \t\n[(,", pos);
    if (begin == std::string::npos) break;
    size_t end = message.find_first_of(" \t\n", begin);
    if (end == std::string::npos) end = message.size();
    std::string word = message.substr(begin, end - begin);
    while (!word.empty() && std::string(":,;)]").find(word.back()) != std::string::npos) word.pop_back();
    if (word.size() >= 2 && word[0] == '-' && word.find_first_not_of('-') != std::string::npos) {
      const size_t eq = word.find('=');
      return eq == std::string::npos ? word : word.substr(0, eq);
    }
    pos = end;
  }
  return "";
}

std::string subcommand_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; })) names.push_back(sub->get_name());
  return one_of(names);
}

// The deepest parsed subcommand (the app itself when none).
const CLI::App& deepest(const CLI::App& app) {
  const CLI::App* at = &app;
  while (!at->get_subcommands().empty()) at = at->get_subcommands().front();
  return *at;
}

}  // namespace

int report_parse_error(const CLI::App& app, const CLI::ParseError& e) {
  const std::string where = command_path(app);
  const std::string message = e.what();
  const std::vector<std::string> extras = app.remaining(true);
  const std::string more =
      extras.size() > 1 ? " (and " + std::to_string(extras.size() - 1) + " more unexpected argument(s))" : "";

  if (dynamic_cast<const CLI::ExtrasError*>(&e) != nullptr ||
      (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && !extras.empty())) {
    // Arguments no option or subcommand took: an unknown flag, a misspelt subcommand, a stray value.
    const std::string first = extras.empty() ? first_flag_in(message) : extras.front();
    const CLI::App& at = deepest(app);
    const bool looks_like_flag = !first.empty() && first[0] == '-';
    const std::string subs = subcommand_names(at);
    if (looks_like_flag) {
      const size_t eq = first.find('=');
      return refuse(eq == std::string::npos ? first : first.substr(0, eq),
                    "not an option of `" + where + "` (see `" + where + " --help`)" + more);
    }
    if (!first.empty())
      return refuse(first, "unexpected argument to `" + where + "`" +
                               (subs.empty() ? std::string() : "; expected a subcommand: " + subs) + more);
    return refuse(where, "unexpected arguments: " + message);
  }
  if (dynamic_cast<const CLI::RequiredError*>(&e) != nullptr && first_flag_in(message).empty()) {
    const std::string subs = subcommand_names(deepest(app));
    return refuse(where, subs.empty() ? message : "a subcommand is required: " + subs);
  }

  const std::string flag = first_flag_in(message);
  if (flag.empty()) return refuse(where, message);
  std::string reason;
  if (dynamic_cast<const CLI::ArgumentMismatch*>(&e) != nullptr) {
    // CLI11 says e.g. "--iters: 1 required INT missing" or "--iters: At Most 1 required but received 2".
    if (message.find("missing") != std::string::npos || message.find("least") != std::string::npos)
      reason = "expects a value";
    else if (message.find("Most") != std::string::npos || message.find("exactly") != std::string::npos)
      reason = "given more than once or with too many values";
    else if (message.find("flag override") != std::string::npos || message.find("flag") != std::string::npos)
      reason = "takes no value";
  } else if (dynamic_cast<const CLI::ConversionError*>(&e) != nullptr) {
    reason = message.find("flag") != std::string::npos || message.find("true/false") != std::string::npos
                 ? "takes no value (or true/false)"
                 : "the value cannot be read (" + message + ")";
  }
  if (reason.empty()) {
    // CLI11's own words, without the flag when they start with it.
    reason = message;
    if (reason.compare(0, flag.size(), flag) == 0) reason = reason.substr(flag.size());
    const size_t start = reason.find_first_not_of(" :");
    reason = start == std::string::npos ? message : reason.substr(start);
  }
  return refuse(flag, reason);
}

std::string format_bytes(const CheckedSize& bytes) {
  if (bytes.overflow()) return "more than 2^64 bytes";
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  double v = static_cast<double>(bytes.value());
  int u = 0;
  while (v >= 1024.0 && u < 6) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes.value()));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  return buf;
}

}  // namespace tools
}  // namespace embscale
