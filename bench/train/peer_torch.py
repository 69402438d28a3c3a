"""PyTorch peer of paraflow's train_bench: transformers' GPT2LMHeadModel (tied lm_head, no
dropout) or, with --arch llama, LlamaForCausalLM (untied head), AdamW(6e-4, betas 0.9/0.95, wd 0.1), gradient clipping at 1.0, random tokens; eager
float32, or bf16 autocast around forward and loss (weights, gradients and optimizer in f32).
Run by compare_peers.py; alone:

    .venv-ref/bin/python bench/train/peer_torch.py --threads 2 [--precision mixed_bfloat16] [--steps 10]

On a GPU (scripts/gpu_check.sh: the issue's peer, torch.compile with bf16 autocast):

    python3 bench/train/peer_torch.py --threads 16 --device cuda --compile --precision mixed_bfloat16 ...
"""
import os

os.environ["OMP_WAIT_POLICY"] = "PASSIVE"  # read when torch loads its OpenMP runtime; the faster setting here

import torch  # noqa: E402
import transformers  # noqa: E402

import peer_common  # noqa: E402


def main():
    parser = peer_common.parser(__doc__)
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    if args.arch == "llama":
        kv_heads, intermediate = peer_common.llama_sizes(args)
        config = transformers.LlamaConfig(vocab_size=args.vocab, hidden_size=args.n_embd,
                                          intermediate_size=intermediate, num_hidden_layers=args.n_layer,
                                          num_attention_heads=args.n_head, num_key_value_heads=kv_heads,
                                          max_position_embeddings=args.n_ctx, rms_norm_eps=1e-6,
                                          tie_word_embeddings=False)
        model = transformers.LlamaForCausalLM(config).train()
    else:
        config = transformers.GPT2Config(vocab_size=args.vocab, n_positions=args.n_ctx, n_embd=args.n_embd,
                                         n_layer=args.n_layer, n_head=args.n_head,
                                         resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
        model = transformers.GPT2LMHeadModel(config).train()
    model = model.to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1)
    bf16 = args.precision == "mixed_bfloat16"
    forward = torch.compile(model) if args.compile else model

    def step():
        x = torch.randint(0, args.vocab, (args.batch, args.n_ctx), device=device)
        y = torch.randint(0, args.vocab, (args.batch, args.n_ctx), device=device)
        with torch.autocast(args.device, dtype=torch.bfloat16, enabled=bf16):
            logits = forward(x).logits
            loss = torch.nn.functional.cross_entropy(logits.float().view(-1, args.vocab), y.view(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        if args.device == "cuda":
            torch.cuda.synchronize()  # the step is timed to its end, not to its last launch

    if args.device == "cuda":
        print(f"gpu {torch.cuda.get_device_name()}")
    else:
        capability = [line for line in torch.__config__.show().splitlines() if "CPU capability" in line]
        print(f"isa {capability[0].strip(' -') if capability else 'unknown'}")
    peer_common.measure(step, args, torch.__version__, sum(p.numel() for p in model.parameters()))


if __name__ == "__main__":
    main()
