#!/usr/bin/env python3
"""Fits the bandwidths of embscale's planner cost model (python/embscale/_planner_model.py) to the records
of bench/results/, and prints the FITTED table (``--write``: puts it into _planner_model.py).

- forward and backward of tables in device memory: the H200 run of bench/tbe_vs_fbgemm.py with GPU busy time
  (DEVICE_RECORDS): embscale's ``tbe_forward`` records, and ``tbe_train_<optimizer>`` less the forward of the same
  case for the backward, by weights precision and index distribution (uniform; Zipf for alpha > 0), D of one
  width (the mixed-D cases are left out);
- the host link of host and cached tables: the H100 run of scripts/tbe_cache_peers.sh 16 (LINK_RECORDS): the
  bytes each step moved over the link (the row cache's counters: rows fetched and written back) over the
  step's time less the step of the same tables in device memory, by placement and index distribution.

Each device group is fitted as time = bytes / bandwidth with the bytes of _planner_model (a lookup's floor
chosen from FLOOR_CHOICES, bandwidth and per-lookup overhead by least squares of the relative error); each link
group as the ratio of its bytes to its time, summed over its records. tests/python/test_planner_model.py checks
that _planner_model.FITTED is what this script fits.
"""

import argparse
import functools
import importlib.util
import json
import os
from collections import defaultdict

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL_FILE = os.path.join(ROOT, "python", "embscale", "_planner_model.py")


def _load_model():
    """_planner_model by its path: it needs neither torch nor the library, so neither does this script."""
    spec = importlib.util.spec_from_file_location("_planner_model", MODEL_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


model = _load_model()
RESULTS = os.path.join(ROOT, "bench", "results")
DEVICE_RECORDS = "2026-12-02-nvidia-h200-busy-time-peers.jsonl"
LINK_RECORDS = "2026-12-06-nvidia-h100-tbe-cache-16gib-managed.jsonl"
# Bytes of optimizer state a row carries, for the optimizers the records measured (fp32 state: row-wise
# Adagrad's one value a row; SGD none), as the library's optimizer table gives them (checked by the test).
STATE_LAYOUTS = {"rowwise_adagrad": (("rows", "sum"), None), "sgd": (None, None)}


def _records(name):
    with open(os.path.join(RESULTS, name)) as f:
        return [json.loads(line) for line in f if line.strip()]


def _indices(alpha):
    return "zipf" if alpha else "uniform"


def _fit_bandwidth(points, floor):
    """points: (lookups, bytes, us), bytes(floor, overhead) the pass's bytes by _planner_model. Least squares of
    the relative error of time = bytes(floor, overhead) / bandwidth over 1/bandwidth and overhead / bandwidth (the
    bytes are linear in the overhead: lookups a byte each), the overhead kept >= 0. Returns (sum of squared
    relative errors, GB/s, overhead bytes, errors)."""
    u = [n / t for n, _, t in points]
    v = [size(floor, 0) / t for _, size, t in points]
    suu, svv = sum(x * x for x in u), sum(x * x for x in v)
    suv, su, sv = sum(x * y for x, y in zip(u, v)), sum(u), sum(v)
    det = suu * svv - suv * suv
    a = (su * svv - sv * suv) / det if det else 0.0
    b = (sv * suu - su * suv) / det if det else sv / svv
    if a < 0:
        a, b = 0.0, sv / svv
    errors = [a * x + b * y - 1 for x, y in zip(u, v)]
    return sum(e * e for e in errors), 1e-3 / b, a / b, errors  # b: us per byte


def _device_points():
    """{(pass, optimizer, weights, indices): [(lookups, bytes(floor, overhead), us)]}, and each group's Ds."""
    records = [r for r in _records(DEVICE_RECORDS)
               if r.get("impl") == "embscale_torch" and isinstance(r.get("embedding_dim"), int)
               and r.get("bounds_check", "off") == "off" and r.get("pooling") == "sum" and not r.get("weighted")]

    def case(r):
        return (r["num_tables"], r["batch_size"], r["embedding_dim"], r["bag_size"], r["num_embeddings"], r["alpha"],
                r["weights_precision"], r["output_dtype"])

    forward = {case(r): r for r in records if r["op"] == "tbe_forward"}
    groups, dims = defaultdict(list), defaultdict(set)
    for r in records:
        dim = r["embedding_dim"]
        e, out = model.ELEMENT_BYTES[r["weights_precision"]], model.ELEMENT_BYTES[r["output_dtype"]]
        lookups, bags = r["num_lookups"], r["num_tables"] * r["batch_size"]
        weights, indices = model.weights_key(r["weights_precision"]), _indices(r["alpha"])
        if r["op"] == "tbe_forward":
            key = ("forward", "", weights, indices)
            size = functools.partial(model.forward_bytes, lookups, bags, dim, e, out)
            groups[key].append((lookups, size, r["busy_us"]))
        elif r["op"].startswith("tbe_train_") and case(r) in forward:
            opt = r["optimizer"]
            state = model.state_bytes_per_row(STATE_LAYOUTS[opt], dim)
            key = ("backward", opt, weights, indices)
            size = functools.partial(model.backward_bytes, lookups, bags, dim, e, out, state)
            groups[key].append((lookups, size, r["busy_us"] - forward[case(r)]["busy_us"]))
        else:
            continue
        dims[key].add(dim)
    return groups, dims, records[0]


def _link_points():
    records = _records(LINK_RECORDS)
    device = {r["alpha"]: r for r in records if r.get("impl") == "embscale_device"}
    groups = defaultdict(list)
    for r in records:
        if r.get("impl") not in ("embscale_host", "embscale_cached") or r["alpha"] not in device:
            continue
        c = r["counters_per_step"]
        state = model.state_bytes_per_row(STATE_LAYOUTS[r["optimizer"]], r["embedding_dim"])
        moved = model.link_bytes(c["rows_fetched"] + c["rows_written_back"], r["embedding_dim"],
                                 model.ELEMENT_BYTES[r["weights_precision"]], state)
        groups[("link", r["placement"], "", _indices(r["alpha"]))].append(
            (moved, r["median_us"] - device[r["alpha"]]["median_us"], r))
    return groups


def fit():
    """The FITTED table: {key: _planner_model.Fitted}, in the table's order."""
    out = {}
    groups, dims, first = _device_points()
    card = first["device"].replace("NVIDIA ", "")
    shape = f"T={first['num_tables']} B={first['batch_size']} L={first['bag_size']}"
    for key in sorted(groups, key=lambda k: (k[0] != "forward", k[1], k[2], k[3])):
        points = groups[key]
        best = min((_fit_bandwidth(points, floor) + (floor,) for floor in model.FLOOR_CHOICES), key=lambda x: x[0])
        _, gbps, overhead, errors, floor = best
        ds = sorted(dims[key])
        worst = max(abs(e) for e in errors)
        note = (f"{card}, {shape}, D {ds[0]}-{ds[-1]} ({len(points)} records, busy time): "
                f"within {100 * worst:.0f}%")
        out[key] = model.Fitted(round(gbps, 1), floor, round(overhead), DEVICE_RECORDS, note)
    for key, points in sorted(_link_points().items()):
        moved, us = sum(p[0] for p in points), sum(p[1] for p in points)
        r0 = points[0][2]
        factors = sorted({p[2]["cache_load_factor"] for p in points if p[2]["cache_load_factor"] is not None})
        lf = f", load factor {'/'.join(f'{f:g}' for f in factors)}" if factors else ""
        card = r0["device"].replace("NVIDIA ", "").split(" ")[0]
        note = (f"{card}, {r0['tables_gib']:g} GiB fp32 D={r0['embedding_dim']}{lf}"
                f" ({len(points)} record{'s' if len(points) > 1 else ''}): link bytes / (step - device step)")
        out[key] = model.Fitted(round(moved / us * 1e-3, 1), 0, 0, LINK_RECORDS, note)
    return out


def table_source(fitted):
    lines = []
    for key, f in fitted.items():
        lines.append(f"    {key!r}: Fitted(")
        lines.append(f"        {f.gbps!r}, {f.floor}, {f.overhead}, {f.source!r},")
        lines.append(f"        {f.note!r}),")
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="write the table into python/embscale/_planner_model.py")
    args = parser.parse_args()
    text = table_source(fit())
    if not args.write:
        print(text)
        return
    with open(MODEL_FILE) as f:
        src = f.read()
    begin, end = "    # BEGIN FITTED\n", "    # END FITTED\n"
    head, rest = src.split(begin)
    _, tail = rest.split(end)
    with open(MODEL_FILE, "w") as f:
        f.write(head + begin + text + "\n" + end + tail)
    print(f"wrote {len(text.splitlines()) // 3} rows into {os.path.relpath(MODEL_FILE, ROOT)}")


if __name__ == "__main__":
    main()
