"""Forward throughput of bertscope's DeBERTa-v2/v3 and ModernBERT encoders against transformers (sdpa and eager).

    python benchmarks/forward_family.py --arch deberta-v2 --size tiny
    python benchmarks/forward_family.py --arch modernbert --size base --batch 2 --length 512

Random weights (transformers' initialisation), nothing downloaded; "base" is DeBERTa-v3-base / ModernBERT-base
shaped. Prints ms per batch for each implementation and the ratio of ours to the faster transformers one.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import make_batch, time_interleaved  # noqa: E402

from bertscope import models  # noqa: E402

SIZES = {
    "tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128),
    "base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072),
}


def hf_config(arch: str, size: str) -> transformers.PretrainedConfig:
    shape = dict(SIZES[size], vocab_size=30522)
    if arch == "deberta-v2":
        return transformers.DebertaV2Config(
            **shape, max_position_embeddings=512, relative_attention=True, position_buckets=256,
            max_relative_positions=512, pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm",
            position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7,
        )
    if size == "base":
        shape.update(num_hidden_layers=22, intermediate_size=1152)
    return transformers.ModernBertConfig(**shape, max_position_embeddings=8192, local_attention=128,
                                         global_attn_every_n_layers=3, pad_token_id=0, bos_token_id=101,
                                         eos_token_id=102, cls_token_id=101, sep_token_id=102)


def reference(arch: str, config, impl: str, state: dict | None):
    cls = transformers.DebertaV2Model if arch == "deberta-v2" else transformers.ModernBertModel
    try:
        model = cls._from_config(config, attn_implementation=impl).eval()
    except (ValueError, ImportError) as err:  # an implementation transformers does not offer for this class
        print(f"transformers {impl}: unavailable ({err.__class__.__name__}: {str(err).splitlines()[0][:100]})")
        return None
    if state is not None:
        model.load_state_dict(state)
    return model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", required=True, choices=["deberta-v2", "modernbert"])
    parser.add_argument("--size", default="tiny", choices=sorted(SIZES))
    parser.add_argument("--batch", type=int, default=None, help="default: 16 (tiny) / 4 (base)")
    parser.add_argument("--length", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=None, help="default: 20 (tiny) / 6 (base)")
    args = parser.parse_args()
    batch_size = args.batch or (16 if args.size == "tiny" else 4)
    repeats = args.repeats or (20 if args.size == "tiny" else 6)

    torch.manual_seed(0)
    device = torch.device("cpu")
    config = hf_config(args.arch, args.size)
    eager = reference(args.arch, config, "eager", None)
    sdpa = reference(args.arch, config, "sdpa", eager.state_dict())
    ours = models.from_hf_model(eager).eval()
    explicit = models.from_hf_model(eager).eval()
    explicit.set_attention_impl("explicit")
    batch = make_batch(batch_size, args.length, config.vocab_size, device)
    if args.arch == "modernbert":
        batch.pop("token_type_ids")

    fns = {"bertscope": lambda: ours(**batch), "bertscope explicit": lambda: explicit(**batch),
           "transformers eager": lambda: eager(**batch)}
    if sdpa is not None:
        fns["transformers sdpa"] = lambda: sdpa(**batch)
    with torch.inference_mode():
        check = (ours(**batch) - eager(**batch).last_hidden_state).abs().max().item()
        seconds = time_interleaved(fns, device, repeats)
    tokens = batch_size * args.length
    print(f"{args.arch} {args.size} ({ours.n_params() / 1e6:.1f}M params)  CPU threads: {torch.get_num_threads()}")
    print(f"batch {batch_size} x {args.length}, median of {repeats}; max |ours - eager| = {check:.2e}")
    print(f"{'implementation':<22}{'ms/batch':>10}{'tokens/s':>12}")
    for name, s in seconds.items():
        print(f"{name:<22}{s * 1e3:>10.1f}{tokens / s:>12.0f}")
    best = min(s for name, s in seconds.items() if name.startswith("transformers"))
    print(f"ratio bertscope / faster transformers (throughput): {best / seconds['bertscope']:.3f}")
    for name in fns:
        if name.startswith("transformers"):
            print(f"ratio bertscope / {name}: {seconds[name] / seconds['bertscope']:.3f}")


if __name__ == "__main__":
    main()
