#!/usr/bin/env python3
"""bench/torch_gpt.py — the PyTorch reference for examples/gpt_ddp.

A nanoGPT-style GPT-2 (pre-norm blocks, exact-erf GELU MLP of 4C, tied
embeddings, learned positions, no dropout) built with the same shapes as
gpt_ddp, trained on the same bytes in the same order (--sequential: batch k
is windows k*B .. k*B+B-1 of the first nine tenths of the text, each window
T+1 bytes starting at a multiple of T), AdamW with torch's defaults (betas
0.9, 0.999, eps 1e-8) and decay on matrices (not embeddings), a linear
warm-up then cosine decay to a tenth, gradient clipping by global norm.

--init FILE writes the initial parameters (N(0, 0.02), residual projections
0.02/sqrt(2L), as GPT-2) in loom's order as f64, for gpt_ddp --init; every
step's loss goes to --losses FILE ("step loss", %.17g); the last line of
stdout gives tokens/s. Run it from a virtual environment with torch
(outside the repository: /work/venv-torch/bin/python bench/torch_gpt.py ...).

--nanogpt runs the model the way users train GPT-2 (nanoGPT, llm.c's
train_gpt2.py): F.scaled_dot_product_attention(is_causal=True), tanh GELU,
the table padded to a multiple of 64 (50257 -> 50304, the loss over all its
classes as nanoGPT's vocab_size=50304 does), biases zeroed, AdamW with
nanoGPT's betas (0.9, 0.95) and decay on every matrix, fused on CUDA, bf16
autocast, TF32 products, 10 untimed warm-up steps (--warmup) before the
timed ones; add --compile for torch.compile(model). Its last line gives
tokens/s and MFU: nanoGPT's estimate (6N + 12LCT FLOPs per token, N the
parameters less the position table) against --peak-flops, on CUDA by
default 989 TFLOP/s (H100/H200 SXM bf16 dense). Without --data it trains on
uniform random tokens, as llm.c's speed runs do. The default mode (the
golden path of gpt_compare.sh, yardstick.sh and llmc_compare.sh) is
unchanged, bit for bit.

--float8 (issue 42's baseline for loom's --precision fp8): torchao's float8
training, convert_to_float8_training with tensorwise (current) scaling, on
every linear of the blocks (the classifier, a product with the tied table,
stays bf16 as loom's does); CUDA and --compile only, under the bf16
autocast. torchao is not part of torch: bench/setup_torch.sh installs it,
and without it the script stops with one line saying so.
"""
import argparse
import math
import resource
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(s, C, nh, gelu, sdpa=False):
        super().__init__()
        s.nh = nh
        s.gelu = gelu
        s.sdpa = sdpa
        s.ln_1 = nn.LayerNorm(C)
        s.c_attn = nn.Linear(C, 3 * C)
        s.attn_proj = nn.Linear(C, C)
        s.ln_2 = nn.LayerNorm(C)
        s.c_fc = nn.Linear(C, 4 * C)
        s.mlp_proj = nn.Linear(4 * C, C)

    def attn(s, x):
        B, T, C = x.shape
        q, k, v = s.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, s.nh, C // s.nh).transpose(1, 2) for t in (q, k, v))
        if s.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
            return s.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(C // s.nh)
        mask = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        att = att.masked_fill(~mask, float("-inf")).softmax(dim=-1)
        return s.attn_proj((att @ v).transpose(1, 2).contiguous().view(B, T, C))

    def forward(s, x):
        x = x + s.attn(s.ln_1(x))
        return x + s.mlp_proj(F.gelu(s.c_fc(s.ln_2(x)), approximate=s.gelu))


class GPT(nn.Module):
    def __init__(s, V, T, C, L, nh, gelu="none", sdpa=False):
        super().__init__()
        s.wte = nn.Embedding(V, C)
        s.wpe = nn.Embedding(T, C)
        s.h = nn.ModuleList(Block(C, nh, gelu, sdpa) for _ in range(L))
        s.ln_f = nn.LayerNorm(C)

    def forward(s, idx, targets):
        B, T = idx.shape
        x = s.wte(idx) + s.wpe(torch.arange(T, device=idx.device))
        for b in s.h:
            x = b(x)
        logits = s.ln_f(x) @ s.wte.weight.t()
        return F.cross_entropy(logits.view(B * T, -1), targets.reshape(-1))

    def loom_order(s):
        """Parameters in gpt_ddp's creation order (examples/gpt_ddp.c, gpt_build)."""
        ps = [s.wte.weight, s.wpe.weight]
        for b in s.h:
            ps += [b.ln_1.weight, b.ln_1.bias, b.c_attn.weight, b.c_attn.bias,
                   b.attn_proj.weight, b.attn_proj.bias, b.ln_2.weight, b.ln_2.bias,
                   b.c_fc.weight, b.c_fc.bias, b.mlp_proj.weight, b.mlp_proj.bias]
        return ps + [s.ln_f.weight, s.ln_f.bias]


def lr_at(a, step, total):
    if step < a.warmup_steps:
        return a.lr * (step + 1) / a.warmup_steps
    r = (step - a.warmup_steps) / (total - a.warmup_steps) if total > a.warmup_steps else 1
    lo = a.lr * 0.1
    return lo + 0.5 * (1 + math.cos(math.pi * min(r, 1.0))) * (a.lr - lo)


def nanogpt_groups(m, wd):
    """nanoGPT's configure_optimizers: decay on every matrix (the tables
    included), none on biases and norms."""
    decay = [w for w in m.parameters() if w.dim() >= 2]
    rest = [w for w in m.parameters() if w.dim() < 2]
    return [{"params": decay, "weight_decay": wd}, {"params": rest, "weight_decay": 0.0}]


def to_float8(p, a, m, cuda):
    """--float8: the blocks' nn.Linear layers swapped for torchao's
    Float8Linear (tensorwise scaling: each tensor's own amax, as loom's
    current scaling), before the optimizer takes the parameters."""
    if not cuda:
        p.error("--float8 runs on CUDA only (FP8 tensor cores, sm_89 or later)")
    if not a.compile:
        p.error("--float8 is measured with --compile (torchao's float8 is made for torch.compile)")
    try:
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as e:
        sys.exit("torch_gpt.py: --float8 needs torchao, which this Python lacks "
                 "(bench/setup_torch.sh installs it): %s" % e)
    if hasattr(Float8LinearConfig, "from_recipe_name"):
        cfg = Float8LinearConfig.from_recipe_name("tensorwise")
    else:
        cfg = Float8LinearConfig()  # tensorwise dynamic scaling, torchao's default
    # FP8 products want both dimensions a multiple of 16.
    def takes(mod, fqn):
        return (isinstance(mod, nn.Linear) and mod.in_features % 16 == 0 and
                mod.out_features % 16 == 0)
    convert_to_float8_training(m, config=cfg, module_filter_fn=takes)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", help="text whose bytes are the tokens (required but with "
                   "--nanogpt, where its absence means uniform random tokens)")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--embd", type=int, default=128)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--vocab", type=int, default=256,
                   help="table size (the ids are bytes; 50257 for GPT-2's shapes)")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--steps", type=int, default=50,
                   help="steps in all, the --warmup untimed ones included")
    p.add_argument("--warmup", type=int,
                   help="untimed steps first (default 1; 10 with --nanogpt)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.1)
    p.add_argument("--warmup-steps", type=int, default=20, help="the lr's linear warm-up")
    p.add_argument("--clip-grad", type=float, default=1.0)
    p.add_argument("--dtype", choices=["f32", "f64"], default="f32")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--device", default="cpu", help="cpu or cuda (the GPU suite's twin of gpt_ddp)")
    p.add_argument("--autocast", choices=["none", "bf16"],
                   help="bf16 autocast (gpt_ddp --opt-level O1 --precision bf16's twin); "
                   "default none, bf16 with --nanogpt")
    p.add_argument("--gelu", choices=["erf", "tanh"], help="default erf, tanh with --nanogpt")
    p.add_argument("--nanogpt", action="store_true",
                   help="SDPA causal, fused AdamW (CUDA), bf16 autocast, padded table, tanh "
                   "GELU, TF32, 10 warm-up steps, MFU on the last line")
    p.add_argument("--sdpa", action="store_true",
                   help="attention by F.scaled_dot_product_attention(is_causal=True), what "
                   "users run (default: written out, masked softmax, for the f64 golden "
                   "comparisons; on with --nanogpt)")
    p.add_argument("--vocab-pad", type=int,
                   help="the table's rows (>= --vocab; with --nanogpt default --vocab "
                   "rounded up to 64: 50257 -> 50304)")
    p.add_argument("--peak-flops", type=float,
                   help="FLOP/s for MFU (with --nanogpt on CUDA default 989e12, the "
                   "H100/H200 SXM bf16 dense peak)")
    p.add_argument("--float8", action="store_true",
                   help="torchao's float8 training (convert_to_float8_training, tensorwise "
                   "scaling) on the blocks' linears; CUDA, with --compile")
    p.add_argument("--init", help="write the initial parameters here (f64, loom's order)")
    p.add_argument("--losses", help="write every step's loss here")
    a = p.parse_args()
    if a.data is None and not a.nanogpt:
        p.error("--data is required (but with --nanogpt)")
    ng = a.nanogpt
    if a.autocast is None:
        a.autocast = "bf16" if ng else "none"
    if a.gelu is None:
        a.gelu = "tanh" if ng else "erf"
    if a.warmup is None:
        a.warmup = 10 if ng else 1
    if a.vocab_pad is None:
        a.vocab_pad = (a.vocab + 63) // 64 * 64 if ng else a.vocab
    if a.vocab_pad < a.vocab:
        p.error("--vocab-pad %d is below --vocab %d" % (a.vocab_pad, a.vocab))
    if ng and a.steps <= a.warmup:
        p.error("--steps %d: no timed step after --warmup %d" % (a.steps, a.warmup))
    if a.threads:
        torch.set_num_threads(a.threads)
    dt = torch.float64 if a.dtype == "f64" else torch.float32
    torch.manual_seed(a.seed)
    cuda = a.device.startswith("cuda")
    if ng:
        torch.set_float32_matmul_precision("high")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True

    B, T = a.batch_size, a.context
    if a.data:
        data = open(a.data, "rb").read()
        cut = len(data) - len(data) // 10
        train = torch.tensor(list(data[:cut]), dtype=torch.long).to(a.device)
    else:
        g = torch.Generator().manual_seed(a.seed + 1)
        train = torch.randint(0, a.vocab, (max(64 * B * (T + 1), 1 << 20),), generator=g)
        train = train.to(a.device)
    windows = (len(train) - 1) // T

    m = GPT(a.vocab_pad, T, a.embd, a.layers, a.heads, "tanh" if a.gelu == "tanh" else "none",
            sdpa=ng or a.sdpa).to(dt)
    m = m.to(a.device)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    with torch.no_grad():
        for name, w in m.named_parameters():
            if w.dim() == 2:
                proj = name.endswith("attn_proj.weight") or name.endswith("mlp_proj.weight")
                w.normal_(0, 0.02 / math.sqrt(2 * a.layers) if proj else 0.02)
            elif ng and name.endswith(".bias"):
                w.zero_()
    if a.init:
        with open(a.init, "wb") as f:
            for w in m.loom_order():
                f.write(w.detach().to(torch.float64).contiguous().numpy().tobytes())
    if a.float8:
        to_float8(p, a, m, cuda)
    fused = ng and cuda
    if ng:
        opt = torch.optim.AdamW(nanogpt_groups(m, a.weight_decay), lr=a.lr, betas=(0.9, 0.95),
                                **({"fused": True} if fused else {}))
    else:
        # Decay on matrices only: not the embeddings (wte, tied to the output
        # projection, and wpe), biases or norms (loom_optim_opts.decay_matrices_only).
        emb = {id(m.wte.weight), id(m.wpe.weight)}
        decay = [w for w in m.parameters() if w.dim() >= 2 and id(w) not in emb]
        rest = [w for w in m.parameters() if w.dim() < 2 or id(w) in emb]
        opt = torch.optim.AdamW([{"params": decay, "weight_decay": a.weight_decay},
                                 {"params": rest, "weight_decay": 0.0}], lr=a.lr)
    fwd = torch.compile(m) if a.compile else m
    out = open(a.losses, "w") if a.losses else None
    t0 = c0 = None
    for step in range(a.steps):
        if step == a.warmup:
            sync()
            t0 = time.perf_counter()  # the warm-up steps pay for start-up
            c0 = time.process_time()
        rows = [((step * B + r) % windows) * T for r in range(B)]
        x = torch.stack([train[s:s + T] for s in rows])
        y = torch.stack([train[s + 1:s + T + 1] for s in rows])
        for g in opt.param_groups:
            g["lr"] = lr_at(a, step, a.steps)
        opt.zero_grad(set_to_none=True)
        if a.autocast == "bf16":
            with torch.autocast(device_type="cuda" if cuda else "cpu", dtype=torch.bfloat16):
                loss = fwd(x, y)
        else:
            loss = fwd(x, y)
        loss.backward()
        if a.clip_grad > 0:
            torch.nn.utils.clip_grad_norm_(m.parameters(), a.clip_grad)
        opt.step()
        if out:
            out.write("%d %.17g\n" % (step + 1, loss.item()))
    sync()
    dt_s = time.perf_counter() - t0 if t0 else float("nan")
    cpu_s = time.process_time() - c0 if c0 is not None else float("nan")
    timed = a.steps - a.warmup
    tok_s = timed * B * T / dt_s
    n = sum(w.numel() for w in m.parameters())
    if ng:
        what = "nanoGPT (SDPA causal, %s AdamW, %s%s, table %d, %s GELU)" % (
            "fused" if fused else "foreach", "bf16 autocast" if a.autocast == "bf16" else "fp32",
            ", torchao float8 tensorwise" if a.float8 else "", a.vocab_pad, a.gelu)
        print("torch %s %s %s on %s: %d parameters, %d steps (%d untimed), %.1f ms/step, "
              "%.0f tok/s" % (torch.__version__, "compiled" if a.compile else "eager", what,
                              a.device, n, a.steps, a.warmup, 1e3 * dt_s / max(timed, 1), tok_s))
    else:
        print("torch %s %s%s on %s: %d parameters, %d steps, %.1f ms/step, %.0f tok/s" % (
            torch.__version__, "compiled" if a.compile else "eager",
            " bf16 autocast" if a.autocast == "bf16" else "", a.device, n, a.steps,
            1e3 * dt_s / max(timed, 1), tok_s))
    # A second line, so that the first still ends in tok/s (llmc_compare.sh
    # reads it): the same steps per CPU-second of this process, and its peak
    # resident memory (bench/yardstick.sh's cells).
    print("torch cpu: %.0f tok/s per CPU-second, peak RSS %.0f MiB" % (
        timed * B * T / cpu_s if cpu_s > 0 else float("nan"),
        resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0))
    # MFU last (--nanogpt, or any run given --peak-flops): nanoGPT's
    # estimate_mfu, N without the position table (its get_num_params).
    peak = a.peak_flops
    if peak is None and ng and cuda:
        peak = 989e12
    if ng or peak:
        flop_tok = 6.0 * (n - m.wpe.weight.numel()) + 12.0 * a.layers * a.embd * T
        mfu = "MFU %.1f%%" % (100.0 * tok_s * flop_tok / peak) if peak else "MFU n/a"
        how = ("peak %.1f TFLOP/s (%s)" % (peak / 1e12, "--peak-flops" if a.peak_flops else
                                            "H100/H200 SXM bf16 dense") if peak else
               "no peak: give --peak-flops")
        print("torch mfu: %.0f tok/s, %s (%.1f MFLOP per token: 6N + 12LCT, N %d without "
              "the position table; %s)" % (tok_s, mfu, flop_tok / 1e6,
                                           n - m.wpe.weight.numel(), how))
    return 0


if __name__ == "__main__":
    sys.exit(main())
