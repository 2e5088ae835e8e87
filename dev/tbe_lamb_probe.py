#!/usr/bin/env python3
"""One LAMB and one partial row-wise LAMB step of three rows from a known state, FBGEMM against embscale and
against the formula (src/tbe/optimizer.h), with candidate misreadings beside it. Needs a GPU and FBGEMM's GPU
build on PYTHONPATH. Printed: per row and candidate, the largest difference from FBGEMM's and from embscale's row."""
import torch
from fbgemm_gpu.split_embedding_configs import EmbOptimType
from fbgemm_gpu.split_table_batched_embeddings_ops_common import EmbeddingLocation, PoolingMode
from fbgemm_gpu.split_table_batched_embeddings_ops_training import ComputeDevice, SplitTableBatchedEmbeddingBagsCodegen
import embscale
torch.manual_seed(0)
E, D = 8, 8
dev = torch.device("cuda")
lr, eps, b1, b2 = 0.01, 1e-8, 0.9, 0.999
for opt, name in ((EmbOptimType.LAMB, "lamb"), (EmbOptimType.PARTIAL_ROWWISE_LAMB, "partial_rowwise_lamb")):
    fb = SplitTableBatchedEmbeddingBagsCodegen([(E, D, EmbeddingLocation.DEVICE, ComputeDevice.CUDA)], optimizer=opt,
                                               learning_rate=lr, eps=eps, beta1=b1, beta2=b2,
                                               pooling_mode=PoolingMode.SUM, stochastic_rounding=False)
    es = embscale.TableBatchedEmbeddingBags([(E, D)], optimizer=name, learning_rate=lr, eps=eps, beta1=b1, beta2=b2,
                                            stochastic_rounding=False, device=dev)
    w0 = torch.randn(E, D, device=dev)
    with torch.no_grad():
        fb.split_embedding_weights()[0].copy_(w0)
        es.split_embedding_weights()[0].copy_(w0)
    idx = torch.tensor([1, 2, 3], device=dev)
    off = torch.tensor([0, 1, 2, 3], device=dev)
    g = torch.randn(3, D, device=dev)
    fb(idx, off).backward(g)
    es(idx, off).backward(g)
    it = int(fb.iter.item())
    wf = fb.split_embedding_weights()[0].detach().double()
    we = es.split_embedding_weights()[0].detach().double()
    print(name, "iter", it, "embscale step", es.step, "max |fb - es|", (wf - we).abs().max().item())
    for r in (1, 2, 3):
        w, gg = w0[r].double(), g[r - 1].double()
        m1 = (1 - b1) * gg
        m2 = (1 - b2) * gg * gg if name == "lamb" else (1 - b2) * (gg * gg).mean()
        for t in (it, it - 1, 1):
            bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
            rt = (m1 / bc1) / (torch.sqrt(m2 / bc2) + eps)
            cand = {"ours": w - lr * (w.norm() / rt.norm()) * rt,
                    "update with g": w - lr * (w.norm() / rt.norm()) * gg,
                    "no ratio": w - lr * rt}
            for k, v in cand.items():
                d_fb, d_es = (wf[r] - v).abs().max().item(), (we[r] - v).abs().max().item()
                print(f"  row {r} t={t} {k:14s} |fb - cand| {d_fb:.3e}  |es - cand| {d_es:.3e}")
        print("  fb step", (wf[r] - w).tolist()[:4], "es step", (we[r] - w).tolist()[:4])
