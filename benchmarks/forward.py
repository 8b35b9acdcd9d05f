"""Forward throughput of bertscope's encoder against transformers' own model (sdpa and eager), same run.

    python benchmarks/forward.py                      # bundled model, batch 16 x 128, CPU
    python benchmarks/forward.py --device cuda        # on a GPU (TF32 off)
    python benchmarks/forward.py --arch roberta       # a random base-sized RoBERTa (also: bert, xlm-roberta,
                                                      # distilbert, albert, electra, deberta-v2, modernbert)
    python benchmarks/forward.py --arch modernbert --size tiny --repeats 5

Prints tokens/s for each and the ratio of ours to the faster transformers implementation.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
import warnings
from pathlib import Path

import torch
from benchutils import make_batch, reference_model, time_interleaved

from bertscope import models

# Random configs per architecture: "base" is the released base model's shape (ALBERT-base, ELECTRA-base
# discriminator, DistilBERT-base, XLM-R-base's 250k vocabulary, DeBERTa-v3-base); "tiny" a small one where
# per-call overhead dominates.
_TINY = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, intermediate_size=512, vocab_size=5000)
ARCHS: dict[str, tuple[str, dict, dict]] = {  # name -> (transformers config class, base shape, tiny shape)
    "bert": ("BertConfig", {}, _TINY),
    "roberta": ("RobertaConfig", dict(max_position_embeddings=514, type_vocab_size=1),
                dict(_TINY, max_position_embeddings=514, type_vocab_size=1)),
    "xlm-roberta": ("XLMRobertaConfig", dict(max_position_embeddings=514, type_vocab_size=1, vocab_size=250002),
                    dict(_TINY, max_position_embeddings=514, type_vocab_size=1)),
    "distilbert": ("DistilBertConfig", {}, dict(dim=128, n_layers=2, n_heads=4, hidden_dim=512, vocab_size=5000)),
    "albert": ("AlbertConfig", dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                                    embedding_size=128), dict(_TINY, embedding_size=64)),
    "electra": ("ElectraConfig", dict(hidden_size=768, num_attention_heads=12, intermediate_size=3072,
                                      embedding_size=768), dict(_TINY, embedding_size=64)),
    # DebertaV2Config's defaults are v2-xlarge's shape (1536 x 24 layers): "base" names DeBERTa-v3-base's
    "deberta-v2": ("DebertaV2Config", dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12,
                                           intermediate_size=3072, type_vocab_size=0),
                   dict(_TINY, type_vocab_size=0)),
    "modernbert": ("ModernBertConfig", dict(num_hidden_layers=22, intermediate_size=1152),
                   dict(_TINY, num_hidden_layers=3)),
}
#: family settings on top of the shapes (DeBERTa-v3-base's relative attention; ModernBERT-base's local windows)
_EXTRA = {
    "deberta-v2": dict(relative_attention=True, position_buckets=256, max_relative_positions=-1,
                       pos_att_type=["p2c", "c2p"], share_att_key=True, norm_rel_ebd="layer_norm",
                       position_biased_input=False, layer_norm_eps=1e-7),
    "modernbert": dict(max_position_embeddings=8192, local_attention=128, global_attn_every_n_layers=3,
                       pad_token_id=0, bos_token_id=101, eos_token_id=102, cls_token_id=101, sep_token_id=102),
}


def save_random(arch: str, size: str, folder: Path) -> None:
    """A random ``arch`` base model of the given size saved with save_pretrained (no tokenizer needed)."""
    import transformers

    name, base, tiny = ARCHS[arch]
    torch.manual_seed(0)
    config = getattr(transformers, name)(**(base if size == "base" else tiny), **_EXTRA.get(arch, {}))
    transformers.AutoModel.from_config(config).save_pretrained(folder)


def auto_reference(path: str, impl: str, device: torch.device):
    """transformers' own base model class for the checkpoint, with the given attention implementation."""
    from transformers import AutoModel

    try:
        return AutoModel.from_pretrained(path, attn_implementation=impl).to(device).eval()
    except (ValueError, ImportError) as err:  # an implementation transformers does not offer for this class
        print(f"transformers {impl}: unavailable ({type(err).__name__}: {str(err).splitlines()[0][:100]})")
        return None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="model folder (default: bundled all-MiniLM-L6-v2)")
    parser.add_argument("--arch", default=None, choices=sorted(ARCHS),
                        help="benchmark a random checkpoint of this architecture instead of --model")
    parser.add_argument("--size", default="base", choices=["base", "tiny"], help="shape of the --arch config")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--explicit", action="store_true", help="also time our explicit (unfused) attention path")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument("--threads", type=int, default=None,
                        help="torch threads (default: torch's); 1 gives steadier ratios on a loaded machine")
    parser.add_argument("--cpu-time", action="store_true",
                        help="time CPU seconds of this process instead of wall time (use with --threads 1)")
    args = parser.parse_args()
    if args.threads is not None:
        torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dtype = getattr(torch, args.dtype)
    if args.arch is not None:
        with tempfile.TemporaryDirectory() as tmp:
            save_random(args.arch, args.size, Path(tmp))
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # no tokenizer files: expected here
                ours = models.load(tmp, device=device, dtype=dtype)
            sdpa = auto_reference(tmp, "sdpa", device)
            eager = auto_reference(tmp, "eager", device).to(dtype)
            sdpa = None if sdpa is None else sdpa.to(dtype)
    else:
        ours = models.load(args.model, device=device, dtype=dtype)
        folder = str(models.loading.resolve_source(args.model))
        sdpa = reference_model(folder, "sdpa", device).to(dtype)
        eager = reference_model(folder, "eager", device).to(dtype)
    batch = make_batch(args.batch, args.length, ours.tokenizer, device, vocab_size=ours.config.vocab_size)
    if ours.config.type_vocab_size == 0:
        del batch["token_type_ids"]  # DistilBERT, DeBERTa-v3, ModernBERT take no segment ids
    fns = {"bertscope": lambda: ours(**batch), "transformers eager": lambda: eager(**batch)}
    if sdpa is not None:
        fns["transformers sdpa"] = lambda: sdpa(**batch)
    if args.explicit:
        import copy

        explicit = copy.deepcopy(ours)
        explicit.set_attention_impl("explicit")
        fns["bertscope explicit"] = lambda: explicit(**batch)
    with torch.inference_mode():
        check = (ours(**batch).float() - eager(**batch).last_hidden_state.float()).abs().max().item()
        clock = time.process_time if args.cpu_time else time.perf_counter
        seconds = time_interleaved(fns, device, args.repeats, clock=clock)
    tokens = args.batch * args.length
    what = f"random {args.size} {args.arch}" if args.arch else ours.source
    load = " ".join(f"{x:.1f}" for x in os.getloadavg())
    print(f"model: {what}  device: {device}  dtype: {args.dtype}  threads: {torch.get_num_threads()}  load: {load}")
    print(f"batch {args.batch} x {args.length}, median of {args.repeats} ({'CPU' if args.cpu_time else 'wall'} "
          f"time); max |ours - eager| = {check:.2e}")
    print(f"{'implementation':<22}{'ms/batch':>10}{'tokens/s':>12}")
    for name, s in seconds.items():
        print(f"{name:<22}{s * 1e3:>10.1f}{tokens / s:>12.0f}")
    best = min(s for name, s in seconds.items() if name.startswith("transformers"))
    print(f"ratio bertscope / faster transformers (throughput): {best / seconds['bertscope']:.3f}")
    for name in fns:
        if name != "bertscope":
            print(f"ratio bertscope / {name}: {seconds[name] / seconds['bertscope']:.3f}")


if __name__ == "__main__":
    main()
