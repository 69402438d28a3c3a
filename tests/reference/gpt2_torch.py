#!/usr/bin/env python3
"""Independent PyTorch / Hugging Face oracle for the C++ trainer: GPT-2 and the Llama family.

Usage (from the repo root, after scripts/setup_python.sh):

    .venv-ref/bin/python tests/reference/gpt2_torch.py --model DIR --batch FILE --out FILE \
        [--steps N --lr X --beta1 B1 --beta2 B2 --eps E --weight-decay WD --dtype float64|float32]

DIR    Hugging Face model directory (config.json + model.safetensors), as the
       C++ code writes it: GPT-2 (GPT2Model tensor names: wte.weight,
       h.0.attn.c_attn.weight, ...; lm_head tied to wte unless
       tie_word_embeddings is false), or model_type llama, mistral or qwen2
       (LlamaForCausalLM names: model.layers.0.self_attn.q_proj.weight, ...).
       It is loaded with the model_type's *ForCausalLM.from_pretrained, so the
       layout is checked by transformers itself.
FILE   safetensors batch with `tokens` and `targets`, both int64 [B, T].
OUT    safetensors written with safetensors.torch.save_file:
         logits        float32 [B, T, V]   at the initial weights
         loss          float32 [1]         mean cross-entropy over all B*T positions
         grad.<name>   float32, same shape as the parameter, for every parameter
                       <name> of the input file, GPT-2's without `transformer.`
                       (a tied head's gradient is in its embedding table's)
         losses        float64 [N]         only with --steps N > 0: the loss of
                       the forward pass before each of N AdamW steps (steps 0..N-1),
                       restarted from the initial weights, same batch every step.

Exit status: 0 on success, 1 on any error (bad model dir, a parameter missing
from or unexpected in the checkpoint, a weight that did not load, bad batch).
"""

import argparse
import os
import sys

# Never reach for the Hub: everything is local.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
import safetensors  # noqa: E402
from safetensors.torch import load_file, save_file  # noqa: E402
import transformers  # noqa: E402
from transformers import (AutoConfig, GPT2LMHeadModel, LlamaForCausalLM,  # noqa: E402
                          MistralForCausalLM, Qwen2ForCausalLM)

MODEL_CLASSES = {"gpt2": GPT2LMHeadModel, "llama": LlamaForCausalLM,
                 "mistral": MistralForCausalLM, "qwen2": Qwen2ForCausalLM}
EMBEDDINGS = ("wte.weight", "wpe.weight", "embed_tokens.weight")

PREFIX = "transformer."
# Non-parameter buffers that older checkpoints carry; never an error.
IGNORED_KEY_SUFFIXES = (".attn.bias", ".attn.masked_bias")


class OracleError(Exception):
    pass


def log(msg):
    print(f"[gpt2_torch] {msg}", file=sys.stderr, flush=True)


def is_ignored(key):
    return key.endswith(IGNORED_KEY_SUFFIXES)


def bare(name):
    """HF name inside GPT2LMHeadModel -> bare GPT2Model name."""
    return name[len(PREFIX):] if name.startswith(PREFIX) else name


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="HF GPT-2 model dir")
    p.add_argument("--batch", required=True, help="safetensors file with tokens/targets int64 [B,T]")
    p.add_argument("--out", required=True, help="output safetensors file")
    p.add_argument("--steps", type=int, default=0, help="AdamW steps to run (0: none)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--beta1", type=float, default=0.9)
    p.add_argument("--beta2", type=float, default=0.999)
    p.add_argument("--eps", type=float, default=1e-8)
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--decay-embeddings", action="store_true",
                   help="also decay the embedding tables (default: only the linear layers' 2-D weights)")
    p.add_argument("--dtype", choices=["float64", "float32"], default="float64")
    args = p.parse_args(argv)
    if args.steps < 0:
        p.error("--steps must be >= 0")
    return args


def load_model(model_dir, dtype):
    if not os.path.isfile(os.path.join(model_dir, "config.json")):
        raise OracleError(f"{model_dir}: no config.json")
    st_path = os.path.join(model_dir, "model.safetensors")
    if not os.path.isfile(st_path):
        raise OracleError(f"{model_dir}: no model.safetensors")

    config = AutoConfig.from_pretrained(model_dir, local_files_only=True)
    if config.model_type not in MODEL_CLASSES:
        raise OracleError(f"config.json: model_type is {config.model_type!r}, not one of {sorted(MODEL_CLASSES)}")
    model_class = MODEL_CLASSES[config.model_type]
    # No dropout anywhere, whatever config.json says.
    for field in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout", "attention_dropout"):
        if hasattr(config, field):
            setattr(config, field, 0.0)

    kwargs = dict(config=config, local_files_only=True, output_loading_info=True,
                  torch_dtype=torch.float32, use_safetensors=True)
    try:
        model, info = model_class.from_pretrained(model_dir, attn_implementation="eager", **kwargs)
    except TypeError:  # a transformers too old to choose the attention implementation
        model, info = model_class.from_pretrained(model_dir, **kwargs)

    problems = []
    for kind in ("missing_keys", "unexpected_keys"):
        bad = [k for k in info.get(kind, []) if not is_ignored(k)]
        if bad:
            problems.append(f"{kind}: {bad}")
    if info.get("mismatched_keys"):
        problems.append(f"mismatched_keys: {info['mismatched_keys']}")
    if info.get("error_msgs"):
        problems.append(f"error_msgs: {info['error_msgs']}")
    if problems:
        raise OracleError(f"checkpoint does not match {model_class.__name__}: " + "; ".join(problems))

    # Independent check that every parameter really holds the file's values,
    # that the file has no parameter the model lacks, and that a tied lm_head
    # is the embedding table.
    tied = model.lm_head.weight is model.get_input_embeddings().weight
    if tied != config.tie_word_embeddings:
        raise OracleError(f"lm_head tied: {tied}, but tie_word_embeddings is {config.tie_word_embeddings}")
    file_tensors = {k: v for k, v in load_file(st_path).items() if not is_ignored(k)}
    file_tensors = {bare(k): v for k, v in file_tensors.items()}
    params = {bare(n): p for n, p in model.named_parameters()}
    if set(file_tensors) - set(params) - {"lm_head.weight"}:
        raise OracleError(f"unexpected tensors in model.safetensors: "
                          f"{sorted(set(file_tensors) - set(params) - {'lm_head.weight'})}")
    for name, p in params.items():
        t = file_tensors.get(name)
        if t is None:
            raise OracleError(f"parameter {name} missing from model.safetensors")
        if tuple(t.shape) != tuple(p.shape):
            raise OracleError(f"{name}: file shape {tuple(t.shape)} != model shape {tuple(p.shape)}")
        if not torch.equal(t.to(p.dtype), p.detach()):
            raise OracleError(f"{name}: loaded weights differ from model.safetensors")
        if t.dtype != torch.float32:
            log(f"note: {name} is stored as {t.dtype}, not float32")

    model = model.to(dtype)
    model.eval()
    log(f"config: {config.to_json_string(use_diff=True)} "
        f"attn={getattr(config, '_attn_implementation', '?')} dtype={dtype}")
    return model, config


def load_batch(path, config):
    if not os.path.isfile(path):
        raise OracleError(f"{path}: no such batch file")
    b = load_file(path)
    out = []
    for key in ("tokens", "targets"):
        if key not in b:
            raise OracleError(f"{path}: no tensor {key!r} (has {sorted(b)})")
        t = b[key]
        if t.dtype != torch.int64 or t.dim() != 2:
            raise OracleError(f"{path}: {key} must be int64 [B,T], is {t.dtype} {tuple(t.shape)}")
        if t.numel() and (int(t.min()) < 0 or int(t.max()) >= config.vocab_size):
            raise OracleError(f"{path}: {key} has ids outside [0, {config.vocab_size})")
        out.append(t.contiguous())
    tokens, targets = out
    if tokens.shape != targets.shape:
        raise OracleError(f"tokens {tuple(tokens.shape)} and targets {tuple(targets.shape)} differ in shape")
    if tokens.shape[1] > config.max_position_embeddings:
        raise OracleError(f"T={tokens.shape[1]} exceeds max_position_embeddings={config.max_position_embeddings}")
    return tokens, targets


def forward_loss(model, tokens, targets):
    logits = model(input_ids=tokens, use_cache=False).logits  # [B,T,V]
    V = logits.shape[-1]
    loss = F.cross_entropy(logits.reshape(-1, V), targets.reshape(-1), reduction="mean")
    return logits, loss


def main(argv=None):
    args = parse_args(argv)
    dtype = {"float64": torch.float64, "float32": torch.float32}[args.dtype]
    log(f"torch {torch.__version__}, transformers {transformers.__version__}, "
        f"safetensors {safetensors.__version__}")
    torch.manual_seed(0)  # nothing is random here (eval, no dropout); just in case

    model, config = load_model(args.model, dtype)
    tokens, targets = load_batch(args.batch, config)
    init_state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    named = [(bare(n), p) for n, p in model.named_parameters()]  # tied wte appears once

    # 1. Logits, loss and gradients at the initial weights.
    model.zero_grad(set_to_none=True)
    logits, loss = forward_loss(model, tokens, targets)
    loss.backward()
    out = {
        "logits": logits.detach().to(torch.float32).contiguous(),
        "loss": loss.detach().reshape(1).to(torch.float32).contiguous(),
    }
    for name, p in named:
        if p.grad is None:
            raise OracleError(f"no gradient for {name}")
        out[f"grad.{name}"] = p.grad.detach().to(torch.float32).contiguous()
    log(f"B={tokens.shape[0]} T={tokens.shape[1]} loss={loss.item():.10g}")

    # 2. Optionally, N AdamW steps from the initial weights on the same batch.
    if args.steps > 0:
        with torch.no_grad():
            model.load_state_dict(init_state)
        model.zero_grad(set_to_none=True)
        def decayed(name, p):
            return p.dim() >= 2 and (args.decay_embeddings or not name.endswith(EMBEDDINGS))
        decay = [p for name, p in named if decayed(name, p)]
        no_decay = [p for name, p in named if not decayed(name, p)]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": args.weight_decay},
             {"params": no_decay, "weight_decay": 0.0}],
            lr=args.lr, betas=(args.beta1, args.beta2), eps=args.eps)
        losses = []
        for step in range(args.steps):
            opt.zero_grad(set_to_none=True)
            _, l = forward_loss(model, tokens, targets)
            losses.append(l.item())
            l.backward()
            opt.step()
        out["losses"] = torch.tensor(losses, dtype=torch.float64)
        log(f"{args.steps} AdamW steps (lr={args.lr} betas=({args.beta1},{args.beta2}) "
            f"eps={args.eps} wd={args.weight_decay}): loss {losses[0]:.10g} -> {losses[-1]:.10g}")

    out_dir = os.path.dirname(os.path.abspath(args.out))
    os.makedirs(out_dir, exist_ok=True)
    save_file(out, args.out, metadata={"format": "pt", "oracle": "gpt2_torch.py",
                                       "dtype": args.dtype,
                                       "torch": torch.__version__,
                                       "transformers": transformers.__version__})
    log(f"wrote {args.out} ({len(out)} tensors)")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except OracleError as e:
        log(f"error: {e}")
        sys.exit(1)
    except Exception as e:  # any other failure is still exit status 1 for the C++ tests
        import traceback
        traceback.print_exc()
        log(f"error: {type(e).__name__}: {e}")
        sys.exit(1)
