"""Writes seeded random weights for the tiny Llama-shaped model, so that an engine computes
peaked next-token distributions a quality gate can tell apart (vLLM's `--load-format dummy`
draws every weight from U(-1e-3, 1e-3), which makes every distribution flat).

Run with the vLLM environment's python (it has torch and safetensors):

    python tests/support/seeded_weights.py CONFIG_DIR OUT_DIR --seed 1 [--perturb 0.05]

`--perturb` adds noise of that relative size (its own seed) to every matrix: the same model
with weights that differ, as a fine-tune or a bad conversion would.
"""

import argparse
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import save_file

# Standard deviations, per unit of 1/sqrt(hidden): embeddings of unit scale, layers large
# enough that attention (and with it the KV cache) shapes the output (0.08 at 256 wide, 0.02
# at 4096: Llama's own initializer range), an output head that makes the distribution peaked
# (logits of sd about 6).
EMBED_STD, LAYER_SCALE, HEAD_SCALE = 1.0, 1.28, 6.4


def weights(config: dict, seed: int, device: str = "cpu") -> dict[str, torch.Tensor]:
    generator = torch.Generator(device=device).manual_seed(seed)
    hidden, inter = config["hidden_size"], config["intermediate_size"]
    layer_std, head_std = LAYER_SCALE / hidden**0.5, HEAD_SCALE / hidden**0.5
    dtype = getattr(torch, config.get("torch_dtype", "bfloat16"))
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    head_dim = config.get("head_dim", hidden // heads)
    vocab = config["vocab_size"]

    def normal(*shape: int, std: float) -> torch.Tensor:
        drawn = torch.randn(*shape, generator=generator, device=device) * std
        return drawn.to(dtype).cpu()

    tensors = {
        "model.embed_tokens.weight": normal(vocab, hidden, std=EMBED_STD),
        "model.norm.weight": torch.ones(hidden, dtype=dtype),
        "lm_head.weight": normal(vocab, hidden, std=head_std),
    }
    for layer in range(config["num_hidden_layers"]):
        prefix = f"model.layers.{layer}"
        tensors |= {
            f"{prefix}.self_attn.q_proj.weight": normal(heads * head_dim, hidden, std=layer_std),
            f"{prefix}.self_attn.k_proj.weight": normal(kv_heads * head_dim, hidden, std=layer_std),
            f"{prefix}.self_attn.v_proj.weight": normal(kv_heads * head_dim, hidden, std=layer_std),
            f"{prefix}.self_attn.o_proj.weight": normal(hidden, heads * head_dim, std=layer_std),
            f"{prefix}.mlp.gate_proj.weight": normal(inter, hidden, std=layer_std),
            f"{prefix}.mlp.up_proj.weight": normal(inter, hidden, std=layer_std),
            f"{prefix}.mlp.down_proj.weight": normal(hidden, inter, std=layer_std),
            f"{prefix}.input_layernorm.weight": torch.ones(hidden, dtype=dtype),
            f"{prefix}.post_attention_layernorm.weight": torch.ones(hidden, dtype=dtype),
        }
    return tensors


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config_dir", type=Path)
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--perturb", type=float, default=0.0)
    parser.add_argument("--device", default="cpu", help="where to draw them (cuda is faster)")
    args = parser.parse_args()
    config = json.loads((args.config_dir / "config.json").read_text())
    tensors = weights(config, args.seed, args.device)
    if args.perturb:
        noise = torch.Generator().manual_seed(args.seed + 1_000_003)
        for name, tensor in tensors.items():
            if tensor.dim() == 2:
                wide = tensor.float()
                moved = wide + torch.randn(*tensor.shape, generator=noise) * (
                    args.perturb * wide.std()
                )
                tensors[name] = moved.to(tensor.dtype)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy(args.config_dir / "config.json", args.out_dir / "config.json")
    save_file(
        {name: t.contiguous() for name, t in tensors.items()},
        str(args.out_dir / "model.safetensors"),
    )


if __name__ == "__main__":
    main()
