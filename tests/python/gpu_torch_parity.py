"""On the GPU machine: zmuon.Muon (the cuda backend, CUDA tensors) against torch.optim.Muon +
AdamW on the same GPU, the small transformer of test_torch_optim, 20 steps, fp32 master weights.
Both run Newton-Schulz in bf16 (torch's own; zmuon's with fp32 sums), so the figure is bf16 NS
noise, not the CPU parity's 1e-5. Prints the worst relative error per parameter; exit 1 over
GPU_PARITY_TOL (default 5e-2). Run by bench/dev/gpu-check.sh:

    ZMUON_LIBRARY=.../libzmuon.so PYTHONPATH=python python3 tests/python/gpu_torch_parity.py
"""

import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import test_torch_optim as t  # noqa: E402  (the model, the data, the hyperparameters)

import zmuon  # noqa: E402

TOL = float(os.environ.get("GPU_PARITY_TOL", "5e-2"))


class CudaTransformer(t.TinyTransformer):
    def forward(self, idx):
        b, n = idx.shape
        x = self.tok_embed(idx) + self.pos_embed(torch.arange(n, device=idx.device))
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, n, -1))
        x = x + self.out(F.gelu(self.fc(self.ln2(x))))
        return self.lm_head(self.ln_f(x))


def main():
    if not torch.cuda.is_available():
        print("gpu_torch_parity: no GPU")
        return 77
    dev = torch.device("cuda")
    torch.manual_seed(0)
    ref = CudaTransformer().to(dev)
    ours = CudaTransformer().to(dev)
    ours.load_state_dict(ref.state_dict())
    start = {n: p.detach().clone() for n, p in ref.named_parameters()}
    h = dict(t.HYPER)
    ref_opts = t.torch_pair(ref)
    opt = zmuon.Muon(ours.named_parameters(), config={"zmuon": {"backend": "cuda"}}, **h)
    for tokens in t.batches(20):
        tokens = tokens.to(dev)
        for o in ref_opts:
            o.zero_grad()
        t.lm_loss(ref, tokens).backward()
        for o in ref_opts:
            o.step()
        opt.zero_grad()
        t.lm_loss(ours, tokens).backward()
        opt.step()
    torch.cuda.synchronize()
    worst = worst_update = 0.0
    for (n, a), (_, b) in zip(ours.named_parameters(), ref.named_parameters()):
        e = t.rel(a.detach(), b.detach())
        u = t.rel(a.detach() - start[n], b.detach() - start[n])
        print(f"  {n:18s} {'muon ' if t.uses_muon(n, a) else 'adamw'} param rel {e:.2e}  "
              f"update rel {u:.2e}")
        worst, worst_update = max(worst, e), max(worst_update, u)
    print(f"gpu parity after 20 steps ({torch.cuda.get_device_name()}): worst param rel "
          f"{worst:.2e}, worst update rel {worst_update:.2e} (tolerance {TOL:g} on params)")
    return 0 if worst <= TOL else 1


if __name__ == "__main__":
    sys.exit(main())
