"""transformers-side helpers for the generation and model-file interop tests.

  greedy  --model DIR --prompt 1,2,3 --max-new N --out FILE
      greedy decoding with the model's KV cache in float64 (GPT2LMHeadModel, or the model_type's
      *ForCausalLM: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM); writes `tokens` (int64,
      the new tokens) and `gaps` (float64, top-1 minus top-2 logit at each step) to FILE.
  save    --kind model|lmhead --config JSON --seed S --dir DIR --tokens 1,2,3 --out FILE
      saves a randomly initialised GPT2Model (bare keys) or GPT2LMHeadModel (`transformer.`
      keys) with save_pretrained, and writes its float64 `logits` for `tokens` to FILE. JSON
      holds GPT2Config arguments (scale_attn_weights, initializer_range, ...).

Models run with the eager attention, the one that implements GPT2Config's attention options
(transformers' sdpa path ignores scale_attn_weights, scale_attn_by_inverse_layer_idx and
reorder_and_upcast_attn). With reorder_and_upcast_attn the scores are computed in float32 even
in a float64 model: transformers always does that computation in float32.
"""
import argparse
import json
import sys

import torch
import transformers
from safetensors.torch import save_file


def baddbmm(input, batch1, batch2, *, beta=1, alpha=1):
    # Debian's torch 1.13 CPU baddbmm returns wrong float32 products for small batches, at random
    # (even NaN; 2-10% of calls at KV-cache decoding's shapes), while bmm is right. GPT-2 calls
    # baddbmm only with reorder_and_upcast_attn, so the oracle gives it this same formula.
    product = alpha * torch.bmm(batch1, batch2)
    return product if beta == 0 else beta * input + product


torch.baddbmm = baddbmm


def ids(text):
    return torch.tensor([[int(x) for x in text.split(",")]], dtype=torch.long)


def load(model_dir):
    return transformers.AutoModelForCausalLM.from_pretrained(model_dir, attn_implementation="eager").double().eval()


def greedy(args):
    # transformers' own KV-cache decoding (past_key_values), greedy. model.generate() itself cannot
    # run on Debian's torch 1.13 with transformers 4.49 (it imports torch.distributed FSDP
    # modules that this torch build lacks), so the loop is written out: it is generate's greedy.
    model = load(args.model)
    tokens = ids(args.prompt)
    new, gaps, past = [], [], None
    with torch.no_grad():
        for _ in range(args.max_new):
            out = model(tokens, past_key_values=past, use_cache=True)
            past = out.past_key_values
            scores = out.logits[0, -1]
            top = torch.topk(scores, 2).values
            gaps.append(float(top[0] - top[1]))
            token = int(torch.argmax(scores))
            new.append(token)
            tokens = torch.tensor([[token]], dtype=torch.long)
    save_file({"tokens": torch.tensor(new, dtype=torch.int64), "gaps": torch.tensor(gaps, dtype=torch.float64)}, args.out)


def save(args):
    torch.manual_seed(args.seed)
    config = transformers.GPT2Config(**json.loads(args.config), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    cls = transformers.GPT2Model if args.kind == "model" else transformers.GPT2LMHeadModel
    model = cls(config).double().eval()
    with torch.no_grad():  # GPT-2 init leaves biases at zero and gains at one: perturb them too
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.add_(0.1 * torch.randn_like(p))
    model.float().save_pretrained(args.dir, safe_serialization=True)
    model = load(args.dir)
    with torch.no_grad():
        logits = model(ids(args.tokens)).logits[0]
    save_file({"logits": logits.contiguous()}, args.out)


def main():
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command", required=True)
    g = sub.add_parser("greedy")
    g.add_argument("--model", required=True)
    g.add_argument("--prompt", required=True)
    g.add_argument("--max-new", type=int, required=True)
    g.add_argument("--out", required=True)
    s = sub.add_parser("save")
    s.add_argument("--kind", choices=["model", "lmhead"], required=True)
    s.add_argument("--config", required=True)
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--dir", required=True)
    s.add_argument("--tokens", required=True)
    s.add_argument("--out", required=True)
    args = parser.parse_args()
    print(f"torch {torch.__version__}, transformers {transformers.__version__}", file=sys.stderr)
    greedy(args) if args.command == "greedy" else save(args)


if __name__ == "__main__":
    main()
