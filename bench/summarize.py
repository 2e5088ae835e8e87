#!/usr/bin/env python3
"""Summarises benchmark records (JSON lines from `embscale bench ... --json` and the peer scripts).

Prints one row per record (op, impl, dtype, n, median_us, GB/s, % of copy), grouped by case, and for
each case measured by embscale and at least one peer, embscale's speed relative to the fastest peer:
speedup = best peer's median_us / embscale's median_us (above 1: embscale is faster).

A case is (backend, op, dtype, n) plus, when present, rows/cols and any "config" field (so the
embedding benchmarks' records group by their configuration). Records of op "copy" are the ceilings
and are listed first. Lines that are not JSON objects are skipped with a note on stderr.
"""
import argparse
import json
import sys


def load(paths):
    recs = []
    for path in paths:
        try:
            with open(path) as f:
                for i, line in enumerate(f, 1):
                    line = line.strip()
                    if not line:
                        continue
                    try:
                        r = json.loads(line)
                    except ValueError:
                        print(f"note: {path}:{i}: not JSON, skipped", file=sys.stderr)
                        continue
                    if isinstance(r, dict) and "op" in r and "median_us" in r:
                        recs.append(r)
        except OSError as ex:
            print(f"note: {path}: {ex.strerror}", file=sys.stderr)
    return recs


def case_key(r):
    cfg = r.get("config")
    if isinstance(cfg, (dict, list)):
        cfg = json.dumps(cfg, sort_keys=True)
    return (str(r.get("backend", "")), str(r.get("op", "")), str(r.get("dtype", "")), int(r.get("n", 0) or 0),
            r.get("rows"), r.get("cols"), cfg or "")


def size_text(r):
    if r.get("rows") is not None:
        return f"{r['rows']}x{r['cols']}"
    n = int(r.get("n", 0) or 0)
    if n > 0 and n & (n - 1) == 0:
        return f"2^{n.bit_length() - 1}"
    return str(n)


def fmt(v, spec):
    return format(v, spec) if isinstance(v, (int, float)) else "-"


def main(argv=None):
    p = argparse.ArgumentParser(description="Summarise benchmark JSON-lines records.")
    p.add_argument("files", nargs="+", help="JSON-lines files (e.g. results.jsonl)")
    a = p.parse_args(argv)
    recs = load(a.files)
    if not recs:
        print("no records")
        return 1

    copies = [r for r in recs if r.get("op") == "copy"]
    for r in copies:
        print(f"ceiling: {r.get('impl', '?')} on {r.get('device', '?')} ({r.get('backend', '?')}): "
              f"{fmt(r.get('GBps'), '.1f')} GB/s read + write")

    groups = {}
    for r in recs:
        if r.get("op") != "copy":
            groups.setdefault(case_key(r), []).append(r)

    head = f"{'op':<26}{'impl':<19}{'dtype':<6}{'n':>11}{'median_us':>12}{'GB/s':>9}{'%copy':>7}"
    print()
    print(head)
    print("-" * len(head))
    ratios = []
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3], str(k[6]))):
        rows = sorted(groups[key], key=lambda r: r["median_us"])
        for r in rows:
            print(f"{str(r.get('op')):<26}{str(r.get('impl')):<19}{str(r.get('dtype')):<6}{size_text(r):>11}"
                  f"{fmt(r.get('median_us'), '.2f'):>12}{fmt(r.get('GBps'), '.1f'):>9}{fmt(r.get('pct_of_copy'), '.1f'):>7}")
        ours = [r for r in rows if r.get("impl") == "embscale"]
        peers = [r for r in rows if r.get("impl") != "embscale"]
        if ours and peers:
            best = min(peers, key=lambda r: r["median_us"])
            ratios.append((key, rows[0], ours[0], best))

    if ratios:
        print()
        print("embscale vs the fastest peer (speedup = peer median_us / embscale median_us; > 1 is faster)")
        head = f"{'op':<26}{'dtype':<6}{'n':>11}{'embscale_us':>13}{'best peer':>19}{'peer_us':>11}{'speedup':>9}"
        print(head)
        print("-" * len(head))
        for key, _, ours, best in ratios:
            speed = best["median_us"] / ours["median_us"] if ours["median_us"] > 0 else float("nan")
            print(f"{key[1]:<26}{key[2]:<6}{size_text(ours):>11}{ours['median_us']:>13.2f}{str(best.get('impl')):>19}"
                  f"{best['median_us']:>11.2f}{speed:>9.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
