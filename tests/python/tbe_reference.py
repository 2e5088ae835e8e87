"""Naive float64 references for table-batched embeddings, written from the maths (DESIGN.md): pooled and
sequence lookups, the dense gradient of each table, and the optimizer rules applied once per touched row."""
import math

import torch


def make_lookups(gen, num_rows_per_feature, batch_size, max_bag, index_dtype=torch.int64, weighted=False,
                 hot_row=None, hot_share=0.0):
    """Random bags (lengths 0..max_bag) for each feature, table-major offsets [T*B+1]; with hot_row, about
    hot_share of all lookups hit that row (a hot row for the block-per-row paths)."""
    T = len(num_rows_per_feature)
    lengths = torch.randint(0, max_bag + 1, (T * batch_size,), generator=gen)
    offsets = torch.zeros(T * batch_size + 1, dtype=torch.int64)
    offsets[1:] = torch.cumsum(lengths, 0)
    parts = []
    for f in range(T):
        n = int(offsets[(f + 1) * batch_size] - offsets[f * batch_size])
        idx = torch.randint(0, num_rows_per_feature[f], (n,), generator=gen)
        if hot_row is not None and n:
            hot = torch.rand(n, generator=gen) < hot_share
            idx[hot] = hot_row % num_rows_per_feature[f]
        parts.append(idx)
    indices = torch.cat(parts) if parts else torch.zeros(0, dtype=torch.int64)
    psw = torch.rand(indices.numel(), generator=gen) + 0.5 if weighted else None
    return indices.to(index_dtype), offsets.to(index_dtype), psw


def forward(tables, fmap, indices, offsets, batch_size, pooling, psw=None):
    """tables: list of float64 [E_t, D_t]. Pooled [B, sum D] or sequence [N, D], float64."""
    T = len(fmap)
    dims = [tables[t].shape[1] for t in fmap]
    idx, off = indices.long(), offsets.long()
    if pooling == "none":
        out = torch.zeros(idx.numel(), dims[0] if dims else 0, dtype=torch.float64)
    else:
        out = torch.zeros(batch_size, sum(dims), dtype=torch.float64)
    col = 0
    for f in range(T):
        table = tables[fmap[f]]
        for b in range(batch_size):
            s, e = int(off[f * batch_size + b]), int(off[f * batch_size + b + 1])
            rows = table[idx[s:e]]
            if psw is not None:
                rows = rows * psw[s:e].double()[:, None]
            if pooling == "none":
                out[s:e] = rows
            else:
                pooled = rows.sum(0)
                if pooling == "mean" and e > s:
                    pooled = pooled / (e - s)
                out[b, col:col + dims[f]] = pooled
        col += dims[f]
    return out


def dense_grads(tables, fmap, indices, offsets, batch_size, pooling, grad_out, psw=None):
    """Per table the dense gradient [E_t, D_t], the set of touched rows, and the per-sample-weight grads."""
    grads = [torch.zeros_like(t) for t in tables]
    touched = [set() for _ in tables]
    grad_psw = torch.zeros(indices.numel(), dtype=torch.float64)
    dims = [tables[t].shape[1] for t in fmap]
    idx, off, g = indices.long(), offsets.long(), grad_out.double()
    col = 0
    for f in range(len(fmap)):
        t = fmap[f]
        for b in range(batch_size):
            s, e = int(off[f * batch_size + b]), int(off[f * batch_size + b + 1])
            for i in range(s, e):
                r = int(idx[i])
                go = g[i] if pooling == "none" else g[b, col:col + dims[f]]
                if pooling == "mean":
                    go = go / (e - s)
                w = 1.0 if psw is None else float(psw[i])
                grads[t][r] += w * go
                grad_psw[i] = torch.dot(tables[t][r], go)
                touched[t].add(r)
        col += dims[f]
    return grads, touched, grad_psw


def apply_optimizer(opt, tables, state, grads, touched, hp, step):
    """One update of the touched rows of each table, in place (float64). state: per table dict of
    "m1"/"m2" float64 tensors (row-wise [E] or element-wise [E, D])."""
    lr, eps, b1, b2, wd, max_norm, clip, wd_mode = (hp["learning_rate"], hp["eps"], hp["beta1"], hp["beta2"],
                                                     hp["weight_decay"], hp["max_norm"], hp["gradient_clipping"],
                                                     hp["weight_decay_mode"])
    for t, table in enumerate(tables):
        for r in sorted(touched[t]):
            g = grads[t][r].clone()
            if clip > 0:
                g = g.clamp(-clip, clip)
            w = table[r]
            if opt == "sgd":
                table[r] = w - lr * g
            elif opt == "rowwise_adagrad":  # weight decay as the mode says
                gp = g + wd * w if wd_mode == "l2" else g
                state[t]["m1"][r] += (gp * gp).mean()
                mult = lr / (math.sqrt(state[t]["m1"][r]) + eps)
                corr = {"l2": 1 - mult * wd, "decoupled": 1 - lr * wd}.get(wd_mode, 1.0)
                nw = corr * w - mult * g
                if max_norm > 0 and nw.norm() > max_norm:
                    nw = nw * (max_norm / nw.norm())
                table[r] = nw
            elif opt in ("adam", "partial_rowwise_adam"):  # FBGEMM's: decoupled weight decay whatever the mode
                m1 = state[t]["m1"][r] = b1 * state[t]["m1"][r] + (1 - b1) * g
                if opt == "adam":
                    m2 = state[t]["m2"][r] = b2 * state[t]["m2"][r] + (1 - b2) * g * g
                else:
                    m2 = state[t]["m2"][r] = b2 * state[t]["m2"][r] + (1 - b2) * (g * g).mean()
                upd = (m1 / (1 - b1 ** step)) / (torch.sqrt(torch.as_tensor(m2 / (1 - b2 ** step))) + eps)
                table[r] = w - lr * (upd + wd * w)
            elif opt == "adagrad":  # FBGEMM's EXACT_ADAGRAD: element-wise, no weight decay
                m = state[t]["m1"][r] = state[t]["m1"][r] + g * g
                table[r] = w - lr * g / (torch.sqrt(m) + eps)
            elif opt in ("lamb", "partial_rowwise_lamb"):  # the Adam direction plus wd*w, scaled per row
                m1 = state[t]["m1"][r] = b1 * state[t]["m1"][r] + (1 - b1) * g
                if opt == "lamb":
                    m2 = state[t]["m2"][r] = b2 * state[t]["m2"][r] + (1 - b2) * g * g
                else:
                    m2 = state[t]["m2"][r] = b2 * state[t]["m2"][r] + (1 - b2) * (g * g).mean()
                d = (m1 / (1 - b1 ** step)) / (torch.sqrt(torch.as_tensor(m2 / (1 - b2 ** step))) + eps) + wd * w
                ratio = w.norm() / d.norm() if d.norm() > 0 else 0.0
                table[r] = w - lr * ratio * d
            elif opt == "lars_sgd":  # rate = lr * eta * |w| / (|g| + wd * |w|); velocity with momentum
                den = g.norm() + wd * w.norm()
                rate = lr * hp["eta"] * w.norm() / den if den > 0 else 0.0
                v = state[t]["m1"][r] = hp["momentum"] * state[t]["m1"][r] + rate * (g + wd * w)
                table[r] = w - v
            else:
                raise ValueError(opt)
