#!/usr/bin/env python3
"""Summarises benchmark records (JSON lines from `embscale bench ... --json` and the peer scripts).

Prints one row per record (op, impl, dtype, n, median_us, GB/s, % of copy), grouped by case; for
each case measured by embscale and at least one peer, embscale's speed relative to the fastest peer:
speedup = best peer's median_us / embscale's median_us (above 1: embscale is faster); and the ratio
table: every peer record set against embscale's record of the same case from the same run (same file
and date), ratio = peer time / embscale time, on wall time and, where both records carry them, on kernel
time (kernel_us, the kernels' durations summed) and GPU busy time (busy_us, overlapping kernels counted
once). embscale's records are impl "embscale" (the CLI and the C++ harnesses) and "embscale_torch" (its
torch module, bench/tbe_vs_fbgemm.py); a peer is paired with embscale's record from the same harness when
there is one (field "harness"), else with impl "embscale".

A case is (backend, op, dtype, n) plus, when present, rows/cols and any "config" field. Embedding
(TBE) records carry their workload as separate fields (tables, batch, D, bag size, rows, alpha, dtypes,
pooling, optimizer, ...): those fields are the case, so a record is only compared with peers measured on
the same workload, and only embscale's default tuning (no forward variant, order, bags, thresholds, L2
fetch hint or short-key sort set) is set against the peers. Records of op "copy" are the ceilings and
are listed first. Lines that are not JSON objects are skipped with a note on stderr.
"""
import argparse
import json
import sys


OURS = ("embscale", "embscale_torch")


def load(paths):
    """The records of the files, each with "_source" (its file) added."""
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
                        r["_source"] = path
                        recs.append(r)
        except OSError as ex:
            print(f"note: {path}: {ex.strerror}", file=sys.stderr)
    return recs


# The workload of a TBE record (tools/tbe_bench_common.h config_fields and the peer scripts' records).
# A field a record leaves out takes the value given here (None: no value). ("mixed" D is recorded as
# embedding_dim "mixed".) The learning rate does not change the work, so it is not part of the case.
TBE_WORKLOAD = {"num_tables": None, "batch_size": None, "embedding_dim": None, "bag_size": None,
                "variable_bag_size": False, "num_embeddings": None, "alpha": 0.0, "weights_precision": None,
                "output_dtype": None, "pooling": "sum", "weighted": False, "indices_dtype": None, "optimizer": None,
                "bounds_check": "off"}
# embscale's tuning fields and their default values (absent also means default; one bag per group was
# the forward's default before the automatic choice, recorded as 0).
TBE_DEFAULT_TUNING = {"fwd_variant": ("default",), "fwd_order": ("tile",), "fwd_bags_per_group": (0, 1),
                      "max_warp_segment": (0,), "max_block_segment": (0,), "block_threads": (0,),
                      "short_key_sort": (False,), "l2_fetch_bytes": ()}


def is_tbe(r):
    return "num_tables" in r and "embedding_dim" in r


def default_tuning(r):
    return all(k not in r or r[k] in ok for k, ok in TBE_DEFAULT_TUNING.items())


def case_key(r):
    cfg = r.get("config")
    if isinstance(cfg, (dict, list)):
        cfg = json.dumps(cfg, sort_keys=True)
    if not cfg and is_tbe(r):
        cfg = json.dumps({k: r.get(k, dflt) for k, dflt in TBE_WORKLOAD.items()}, sort_keys=True)
    return (str(r.get("backend", "")), str(r.get("op", "")), str(r.get("dtype", "")), int(r.get("n", 0) or 0),
            r.get("rows"), r.get("cols"), cfg or "")


def dtype_text(r):
    return str(r.get("dtype", r.get("weights_precision")))


def size_text(r):
    if is_tbe(r):
        return f"T{r['num_tables']} D{r['embedding_dim']} a{r.get('alpha', 0):g}"
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

    head = f"{'op':<30}{'impl':<27}{'dtype':<6}{'n':>18}{'median_us':>12}{'GB/s':>9}{'%copy':>7}"
    print()
    print(head)
    print("-" * len(head))
    ratios = []
    for key in sorted(groups, key=lambda k: (k[0], k[1], k[2], k[3], str(k[6]))):
        rows = sorted(groups[key], key=lambda r: r["median_us"])
        for r in rows:
            print(f"{str(r.get('op')):<30}{str(r.get('impl')):<27}{dtype_text(r):<6}{size_text(r):>18}"
                  f"{fmt(r.get('median_us'), '.2f'):>12}{fmt(r.get('GBps'), '.1f'):>9}{fmt(r.get('pct_of_copy'), '.1f'):>7}")
        ours = sorted((r for r in rows if r.get("impl") in OURS and (not is_tbe(r) or default_tuning(r))),
                      key=lambda r: OURS.index(r["impl"]))
        peers = [r for r in rows if r.get("impl") not in OURS]
        if ours and peers:
            best = min(peers, key=lambda r: r["median_us"])
            ratios.append((key, rows[0], ours[0], best))

    if ratios:
        print()
        print("embscale vs the fastest peer (speedup = peer median_us / embscale median_us; > 1 is faster)")
        head = f"{'op':<30}{'dtype':<6}{'n':>18}{'embscale_us':>13}{'best peer':>27}{'peer_us':>11}{'speedup':>9}"
        print(head)
        print("-" * len(head))
        for key, _, ours, best in ratios:
            speed = best["median_us"] / ours["median_us"] if ours["median_us"] > 0 else float("nan")
            print(f"{key[1]:<30}{dtype_text(ours):<6}{size_text(ours):>18}{ours['median_us']:>13.2f}{str(best.get('impl')):>27}"
                  f"{best['median_us']:>11.2f}{speed:>9.2f}")

    pairs = same_run_pairs(recs)
    if pairs:
        print()
        print("embscale vs each peer, same run (ratio = peer time / embscale time; > 1: embscale is faster; "
              "kernel: the same on kernel_us, the kernels' durations summed; busy: on busy_us, the time at least "
              "one kernel ran)")
        head = (f"{'op':<30}{'dtype':<6}{'case':>22}{'embscale':>16}{'us':>11}{'peer':>27}{'us':>11}{'ratio':>8}"
                f"{'kernel':>8}{'busy':>8}")
        print(head)
        print("-" * len(head))
        for ours, peer in pairs:
            kernel, busy = "-", "-"
            if ours.get("kernel_us") and peer.get("kernel_us"):
                kernel = f"{peer['kernel_us'] / ours['kernel_us']:.2f}"
            if ours.get("busy_us") and peer.get("busy_us"):
                busy = f"{peer['busy_us'] / ours['busy_us']:.2f}"
            print(f"{str(ours.get('op')):<30}{dtype_text(ours):<6}{case_text(ours):>22}{str(ours['impl']):>16}"
                  f"{ours['median_us']:>11.2f}{str(peer.get('impl')):>27}{peer['median_us']:>11.2f}"
                  f"{ratio_text(peer['median_us'], ours['median_us']):>8}{kernel:>8}{busy:>8}")
    return 0


def case_text(r):
    """size_text plus, for TBE records, the optimizer of a training or backward record."""
    text = size_text(r)
    if is_tbe(r) and r.get("optimizer") and not str(r.get("op", "")).endswith(str(r["optimizer"])):
        text += f" {r['optimizer']}"
    return text


def ratio_text(peer_us, ours_us):
    return f"{peer_us / ours_us:.2f}" if ours_us > 0 else "-"


def same_run_pairs(recs):
    """(embscale's record, peer record) for every peer record with an embscale record of the same case in
    the same run (file and date): embscale's record from the peer's harness when there is one, else impl
    "embscale"; only embscale's default tuning. In the order of the cases, then of the peers' names."""
    runs = {}
    for r in recs:
        if r.get("op") != "copy":
            runs.setdefault((r.get("_source"), r.get("date"), case_key(r)), []).append(r)
    pairs = []
    for key in sorted(runs, key=lambda k: (str(k[0]), str(k[1]), k[2][0], k[2][1], k[2][2], k[2][3], str(k[2][6]))):
        rows = runs[key]
        ours = [r for r in rows if r.get("impl") in OURS and (not is_tbe(r) or default_tuning(r))]
        for peer in sorted((r for r in rows if r.get("impl") not in OURS), key=lambda r: str(r.get("impl"))):
            mine = [r for r in ours if r.get("harness") is not None and r.get("harness") == peer.get("harness")]
            mine = mine or [r for r in ours if r.get("impl") == "embscale"]
            if mine:
                pairs.append((mine[0], peer))
    return pairs


if __name__ == "__main__":
    sys.exit(main())
