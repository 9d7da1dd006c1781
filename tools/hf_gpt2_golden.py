#!/usr/bin/env python3
"""tools/hf_gpt2_golden.py — Hugging Face GPT-2 against examples/gpt_ddp.

Needs torch, transformers and safetensors (a venv outside the repo:
bench/setup_torch.sh, then `pip install transformers safetensors` into it);
the test suite never runs this script, it reads the files it wrote.

  make DIR    a small random GPT2LMHeadModel (2 layers, 2 heads, n_embd 32,
              vocabulary 256 = gpt_ddp's bytes, n_positions 32 = --context,
              GPT-2's gelu_new = gpt_ddp --gelu tanh, no dropout) saved with
              save_pretrained (model.safetensors, config.json: gpt_ddp
              --init-from DIR takes the sizes and the GELU from it), the text
              whose first 32 bytes are the tokens (text.txt), and the logits
              of those tokens, [32, 256] f64 little-endian, from the model
              in f32 (logits_f32.bin) and in f64 (logits_f64.bin); and the
              same weights as GPT2Model names them, with the causal-mask
              buffers and a tied lm_head.weight (legacy.safetensors).
  check DIR LOGITS
              GPT2LMHeadModel.from_pretrained(DIR) (a folder gpt_ddp
              --export DIR/model.safetensors --export-format hf wrote), its
              logits on DIR/../text.txt or --text's first n_positions bytes
              against LOGITS (gpt_ddp --write-logits of the same weights):
              the largest difference, and a verdict against --tol.
"""
import argparse
import os
import sys

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import GPT2Config, GPT2LMHeadModel

TEXT = (
    "the cat sat on the mat. the dog sat on the log. a bird sang on the wire, "
    "and the fox ran past the fence at dusk. 3 cats, 4 dogs, 2 birds and 1 fox. "
) * 4


def logits_of(model, text, dtype):
    model = model.to(dtype).eval()
    n = model.config.n_positions
    ids = torch.tensor([list(text.encode()[:n])], dtype=torch.long)
    with torch.no_grad():
        return model(ids).logits[0].to(torch.float64).numpy()


def make(out):
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(1234)
    cfg = GPT2Config(vocab_size=256, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                     activation_function="gelu_new", layer_norm_epsilon=1e-5,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.1,
                     tie_word_embeddings=True, bos_token_id=None, eos_token_id=None)
    model = GPT2LMHeadModel(cfg)
    # N(0, 0.1) (GPT-2 draws 0.02: too small for the GELU's form to show in
    # f32) for the matrices; a random init leaves biases and layer norms at 0 and 1:
    # draw those too, so that a bias or a norm read wrongly shows.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.config.attn_implementation = "eager"
    model.save_pretrained(out, safe_serialization=True)
    with open(os.path.join(out, "text.txt"), "w") as f:
        f.write(TEXT)
    # The same weights as older files and GPT2Model's state_dict hold them:
    # no "transformer." prefix, the causal-mask buffers attn.bias and
    # attn.masked_bias, and a tied lm_head.weight beside wte.
    sd = {k[len("transformer."):] if k.startswith("transformer.") else k: v.contiguous()
          for k, v in model.state_dict().items()}
    n = cfg.n_positions
    for i in range(cfg.n_layer):
        sd[f"h.{i}.attn.bias"] = torch.tril(torch.ones(n, n)).view(1, 1, n, n)
        sd[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
    sd["lm_head.weight"] = sd["wte.weight"].clone()
    save_file(sd, os.path.join(out, "legacy.safetensors"), metadata={"format": "pt"})
    for dtype, name in ((torch.float32, "logits_f32.bin"), (torch.float64, "logits_f64.bin")):
        logits_of(model, TEXT, dtype).astype("<f8").tofile(os.path.join(out, name))
    print(f"wrote {out}: model.safetensors, config.json, legacy.safetensors, text.txt, "
          f"logits_f32.bin, logits_f64.bin ({cfg.n_layer} layers, {cfg.n_head} heads, {cfg.n_embd} wide, "
          f"context {cfg.n_positions}, vocabulary {cfg.vocab_size})")


def check(folder, logits, text, tol, f64):
    model = GPT2LMHeadModel.from_pretrained(folder, attn_implementation="eager")
    with open(text) as f:
        txt = f.read()
    ours = logits_of(model, txt, torch.float64 if f64 else torch.float32)
    theirs = np.fromfile(logits, dtype="<f8").reshape(ours.shape)
    diff = float(np.abs(ours - theirs).max())
    ok = diff <= tol
    print(f"from_pretrained({folder}): {sum(p.numel() for p in model.parameters())} "
          f"parameters; logits [{ours.shape[0]}, {ours.shape[1]}] "
          f"({'f64' if f64 else 'f32'}) against {logits}: max |diff| {diff:.3g} "
          f"(tolerance {tol:g}): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dir")
    c = sub.add_parser("check")
    c.add_argument("dir")
    c.add_argument("logits")
    c.add_argument("--text", help="the text whose first bytes are the tokens")
    c.add_argument("--tol", type=float, default=1e-5)
    c.add_argument("--f64", action="store_true", help="the model in f64 (gpt_ddp --dtype f64)")
    a = ap.parse_args()
    if a.cmd == "make":
        make(a.dir)
        return 0
    text = a.text or os.path.join(os.path.dirname(os.path.abspath(a.dir)), "text.txt")
    return check(a.dir, a.logits, text, a.tol, a.f64)


if __name__ == "__main__":
    sys.exit(main())
