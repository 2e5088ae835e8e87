#!/usr/bin/env python3
"""Fuzzer of the embscale command-line tool: random hostile flag values for every subcommand.

    python3 tests/fuzz/fuzz_cli.py --cli build/embscale [--cases N] [--seed S] [--case K] [--timeout SEC]
                                   [--jobs J] [--verbose]

Case k of a run is drawn from (seed, k) alone, so ``--seed S --case K`` replays it (and prints its command
line). Every case starts from a tiny valid command line for its subcommand (sizes that run in well under a
second) and replaces one to three flags with hostile values: negative, zero, huge (2^31, 2^62, 2^63, 2^64,
1e30), malformed text, empty values, missing values, unknown or repeated flags. Each case is its own
process (so a crash ends only that case). Properties:

  * no death by a signal (a crash, an abort, a sanitizer report that aborts);
  * exit status 0 (ran), or 2 (refused) with a line ``error: <flag>: ...`` on stderr naming one of the
    flags (or positional values) of the command line; any other status (1: a run that failed, e.g. an
    allocation an absurd size asked for; a sanitizer's exit code) is a failure;
  * no hang: every case ends within the timeout.

A command line that was refused must have printed nothing to stdout before (nothing ran). The exit status
is non-zero when any case failed; the failures are listed with their seed, case and command line.
"""
import argparse
import os
import random
import re
import shlex
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor

# Hostile numbers and texts. Sizes stay absurd (or tiny) so no case runs a large benchmark for real.
NEG = ["-1", "-2", "-9223372036854775808", "-9223372036854775809", "-2147483648"]
HUGE = ["2147483647", "2147483648", "4294967296", "4611686018427387904", "9223372036854775807",
        "9223372036854775808", "18446744073709551615", "18446744073709551616", "1" + "0" * 30, "9" * 400]
MALFORMED = ["", "abc", "1.5", "0x10", "010", " 5", "5 ", "5abc", "+5", "--", "-", "1e3", "2^", "2^64", "2^-1",
             "nan", "inf", "-inf", "\u0661\u0662", "1,2", ",", "0b11", "5k", "1_000", "\t", "-0", "00"]
REAL_HOSTILE = ["-1", "-0", "0", "nan", "NaN", "inf", "-inf", "1e308", "1e309", "-1e309", "1e-320", "3.5e38",
                "1e", ".", "1.2.3", "", "abc", "0x1p3", "1,5"]
TEXT_HOSTILE = ["", " ", "nope", "CPU", "cuda", "none", "\u00e9", "x" * 5000, "-1", "--json", "fp32,fp16"]


def pick_number(r, small):
    """A hostile integer text; `small`: valid values that keep a run tiny."""
    k = r.random()
    if k < 0.2:
        return r.choice(NEG)
    if k < 0.5:
        return r.choice(HUGE)
    if k < 0.75:
        return r.choice(MALFORMED)
    return r.choice(small)


# The subcommands: a tiny valid command line (flag -> value, None for a plain flag) and how to draw a
# hostile value for each flag. "number:<small values>" draws from pick_number; "real", "text:<valid>",
# "list:<valid items>" likewise; "flag" toggles a plain flag.
TBE_COMMON = {
    "--backend": ("cpu", "text:cpu"),
    "--batch-size": ("2", "number:0,1,3"),
    "--num-tables": ("2", "number:1,3"),
    "--embedding-dim": ("4", "number:1,5,8"),
    "--bag-size": ("2", "number:0,1,3"),
    "--num-embeddings": ("10", "number:1,7,100"),
    "--iters": ("1", "number:1,2"),
    "--warmup": ("0", "number:0,1"),
    "--alpha": (None, "real:0,1.15,3"),
    "--weights-precision": (None, "text:fp32,fp16,bf16"),
    "--output-dtype": (None, "text:fp32,fp16,bf16"),
    "--pooling": (None, "text:sum,mean,none,SUM,sequence"),
    "--indices-dtype": (None, "text:32,64"),
    "--bounds-check": (None, "text:error,skip,off,warn,FATAL,IGNORE,NONE,WARNING"),
    "--seed": (None, "unsigned"),
    "--mixed-dim": (None, "flag"),
    "--variable-bag-size": (None, "flag"),
    "--weighted": (None, "flag"),
    "--json": (None, "flag"),
}
TBE_BACKWARD = dict(TBE_COMMON, **{
    "--optimizer": (None, "text:sgd,rowwise_adagrad,adam,partial_rowwise_adam,none"),
    "--max-warp-segment": (None, "number:0,1,32"),
    "--max-block-segment": (None, "number:0,1,64"),
    "--block-threads": (None, "number:0,32,64"),
    "--learning-rate": (None, "real:0,0.1,1"),
    "--rounding": (None, "text:stochastic,nearest"),
})
SUBCOMMANDS = {
    "info": (["info"], {}),
    "check": (["check"], {
        "--backend": ("cpu", "text:cpu"),
        "--seed": (None, "unsigned"),
        "--verbose": (None, "flag"),
        "--list": (None, "flag"),
        "OPS": ("amax", "ops"),
    }),
    "bench fp8": (["bench", "fp8"], {
        "--backend": ("cpu", "text:cpu"),
        "--sizes": ("1024", "sizes"),
        "--shape": ("8x8", "shape"),
        "--iters": ("1", "number:1,2"),
        "--warmup": ("0", "number:0,1"),
        "--ops": ("amax", "list:amax,compute_scale,quantize,dequantize,quantize_current_scaling,activation_amax,"
                          "cast_transpose"),
        "--dtypes": (None, "list:fp32,bf16,fp16"),
        "--algo": (None, "text:auto,atomic,two_stage"),
        "--fp8": (None, "text:e4m3,e5m2"),
        "--activation": (None, "text:relu,gelu_tanh,silu"),
        "--seed": (None, "unsigned"),
        "--json": (None, "flag"),
        "--no-peers": (None, "flag"),
        "--dry-run": (None, "flag"),
    }),
    "bench tbe-forward": (["bench", "tbe-forward"], TBE_COMMON),
    "bench tbe-backward": (["bench", "tbe-backward"], TBE_BACKWARD),
    "bench tbe-train": (["bench", "tbe-train"], TBE_BACKWARD),
}
CHECK_OPS = ["amax", "compute_scale", "quantize", "dequantize", "cast_transpose", "tbe_forward"]


def hostile_value(r, kind):
    """A value for a flag of `kind` (see SUBCOMMANDS); None means the plain flag (no value)."""
    name, _, arg = kind.partition(":")
    if name == "number":
        return pick_number(r, arg.split(","))
    if name == "unsigned":
        return pick_number(r, ["0", "1", "18446744073709551615"])
    if name == "real":
        return r.choice(REAL_HOSTILE + arg.split(","))
    if name == "text":
        return r.choice(TEXT_HOSTILE + arg.split(","))
    if name == "list":
        items = arg.split(",")
        k = r.random()
        if k < 0.3:
            return ",".join(r.sample(items, r.randint(1, min(3, len(items)))))
        return r.choice(["", ",", items[0] + ",,", ",".join([items[0]] * 3), "nope", items[0] + ",nope",
                         items[0].upper(), " " + items[0]])
    if name == "sizes":  # element counts for the 1-D fp8 ops: tiny valid ones, or hostile ones
        return r.choice(["1", "0", "1K", "2^10", "4096,8", "-1", "2^40", "2^62", "2^63", "2^64", "1T", "1e3", "abc",
                         "", ",", "2^", "2^-3", "1024,", "8,2^70", "1K,1M,1G", "99999999999999999999", "64K",
                         "0x100", "1.5K"])
    if name == "shape":
        return r.choice(["8x8", "1x1", "0x0", "0x8", "-1x5", "5x-1", "x", "8", "8x", "x8", "8x8x8", "", "1e3x1",
                         "2147483648x2", "4294967296x4294967296", "65536x65536", "2^31x2^31", "8X8", "8 x 8", "1x0"])
    if name == "ops":
        # (not "--": it would end the options and, with no op after it, check every op, a minutes-long run)
        return r.choice(CHECK_OPS + ["nope", "", "AMAX", "amax,quantize", "-x", "amax nope"])
    if name == "flag":
        return None
    raise ValueError(kind)


def make_case(seed, k):
    """(argv after the binary, description of the mutations) of case k."""
    r = random.Random(f"{seed}:{k}")
    sub = r.choice(sorted(SUBCOMMANDS))
    prefix, flags = SUBCOMMANDS[sub]
    chosen = {f: v for f, (v, _) in flags.items() if v is not None}
    if sub == "bench fp8" and r.random() < 0.85:
        chosen["--dry-run"] = None  # checks every argument, runs nothing (a real run measures a 1 GB copy)
    extra = []  # raw tokens appended at the end
    notes = []
    for _ in range(r.choice([1, 1, 2, 3])):
        k2 = r.random()
        if flags and k2 < 0.8:
            flag = r.choice(sorted(flags))
            kind = flags[flag][1]
            value = hostile_value(r, kind)
            if kind == "flag":
                chosen[flag] = None
                notes.append(flag)
            else:
                chosen[flag] = value
                notes.append(f"{flag}={value!r}"[:80])
        elif k2 < 0.86 or not flags:
            tok = r.choice(["--bogus", "-z", "--batch-size", "--help", "extra", "--backend=cpu", "--=", "-", "-h"])
            extra.append(tok)
            notes.append(f"extra {tok!r}")
        elif k2 < 0.93 and flags:
            flag = r.choice([f for f in sorted(flags) if f.startswith("--") and flags[f][1] != "flag"] or ["--seed"])
            chosen.pop(flag, None)
            extra.append(flag)  # the flag last, without its value
            notes.append(f"{flag} without a value")
        elif flags:
            flag = r.choice([f for f in sorted(chosen) if f.startswith("--")] or ["--seed"])
            extra += [flag, chosen.get(flag) or "1"]  # given twice
            notes.append(f"{flag} repeated")
    argv = list(prefix)
    for flag, value in chosen.items():
        if flag == "OPS":
            argv.append(value)
        elif value is None:
            argv.append(flag)
        else:
            argv += [flag, value]
    argv += extra
    return argv, "; ".join(notes)


def named_flag(stderr, argv):
    """Whether a line 'error: <what>: ...' names, in <what>, one of argv's flags (or a positional value, or
    the check command's "ops"), as a whole word."""
    names = {"ops"}
    for a in argv:
        names.add(a)
        if a.startswith("-") and "=" in a:
            names.add(a.split("=", 1)[0])
    for line in stderr.splitlines():
        if not line.startswith("error: "):
            continue
        head = line[len("error: "):].split(": ", 1)[0]
        if head in names or any(tok in names for tok in re.split(r"[ ,/]+", head) if tok.startswith("-")):
            return True
    return False


def limit_memory():
    """Child set-up (builds without AddressSanitizer): an absurd allocation fails instead of swapping."""
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


MEMORY_LIMIT = 8 << 30


def run_case(cli, seed, k, timeout, env, asan):
    argv, notes = make_case(seed, k)
    cmd = [cli] + argv
    start = time.monotonic()
    try:
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           timeout=timeout, env=env, preexec_fn=None if asan else limit_memory)
    except subprocess.TimeoutExpired:  # run() has killed it
        return k, cmd, notes, f"HANG: no exit within {timeout} s", time.monotonic() - start
    out = p.stdout.decode("utf-8", "replace")
    err = p.stderr.decode("utf-8", "replace")
    why = None
    if p.returncode < 0:
        why = f"killed by signal {-p.returncode} ({signal.Signals(-p.returncode).name})"
    elif p.returncode == 2:
        if not named_flag(err, argv):
            why = "refused (2) without 'error: <flag>: ...' naming a flag of the command line"
        elif out.strip():
            why = "refused (2) after it had printed to stdout (refusals come before anything runs)"
    elif p.returncode != 0:
        why = f"exit status {p.returncode} (0 or 2 expected)"
    if why:
        tail = "\n".join((err.strip().splitlines() or ["(no stderr)"])[-6:])
        why += "\n      stderr: " + tail.replace("\n", "\n              ")
    return k, cmd, notes, why, time.monotonic() - start


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cli", default=os.environ.get("EMBSCALE_CLI", "build/embscale"), help="the embscale binary")
    ap.add_argument("--cases", type=int, default=200)
    ap.add_argument("--seed", type=int, default=20261201)
    ap.add_argument("--case", type=int, default=None, help="run only this case (replay)")
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds a case may take")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    if not os.access(a.cli, os.X_OK):
        print(f"error: --cli: {a.cli} is not an executable (build the embscale target first)", file=sys.stderr)
        return 2
    cases = [a.case] if a.case is not None else list(range(a.cases))
    print(f"fuzz_cli: {a.cli}, seed {a.seed}, {len(cases)} cases (replay one: --seed {a.seed} --case K)", flush=True)
    env = dict(os.environ)
    with open(a.cli, "rb") as f:
        asan = b"__asan_init" in f.read()
    if asan:
        # Absurd sizes: a single allocation over 4 GiB, or a process over 6 GiB resident, is reported and
        # ends the process (a failure of the case) instead of taking the machine's memory.
        opts = env.get("ASAN_OPTIONS", "")
        for opt in ("max_allocation_size_mb=4096", "hard_rss_limit_mb=6144"):
            if opt.split("=")[0] not in opts:
                opts = f"{opts}:{opt}" if opts else opt
        env["ASAN_OPTIONS"] = opts
    failures = []
    slowest = (0.0, None)
    t0 = time.monotonic()
    with ThreadPoolExecutor(max_workers=max(1, a.jobs)) as pool:
        for k, cmd, notes, why, secs in pool.map(lambda k: run_case(a.cli, a.seed, k, a.timeout, env, asan), cases):
            if secs > slowest[0]:
                slowest = (secs, k)
            line = f"case {k}: {shlex.join(cmd[1:])}  [{notes}]"
            if a.verbose or a.case is not None:
                print(f"{line}  ({secs:.1f} s)", flush=True)
            if why:
                failures.append(f"FAIL seed={a.seed} case={k}: {why}\n      command: {shlex.join(cmd)}\n      "
                                f"mutations: {notes}")
                print(failures[-1], flush=True)
    print(f"fuzz_cli: {len(cases)} cases in {time.monotonic() - t0:.0f} s (slowest: case {slowest[1]}, "
          f"{slowest[0]:.1f} s)")
    if failures:
        print(f"fuzz_cli: {len(failures)} failed (replay one: {sys.argv[0]} --cli {a.cli} --seed {a.seed} --case K)")
        return 1
    print("fuzz_cli: all cases passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
