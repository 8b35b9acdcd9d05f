"""Masked LMs built by hand with known answers, for the lens tests (importable: pytest puts tests/ on sys.path).

``TableMLM``: a head that is a lookup table indexed by (position, masks in the row). ``constructed_mlm``: pre-LN,
a 16-token vocabulary in 16 dimensions, token j's embedding ``3 e_j``, no positions or segments, the head's
``dense`` the identity: every block writes nothing except block ``K - 1``, whose MLP bias writes ``100 e_ANSWER``.
So streams ``0..K-1`` hold the input tokens' own directions (the tied decoder reads each token back) and streams
``K..N_LAYERS`` the answer's.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from bertscope.models import Encoder, EncoderConfig
from family_fixtures import wordpiece_tokenizer

V = D = 16
N_LAYERS, K, ANSWER = 4, 2, 11


def constructed_mlm(decoder: torch.Tensor | None = None) -> Encoder:
    """The model above; ``decoder`` ``[vocab, d_model]`` unties the decoder from the embeddings."""
    cfg = EncoderConfig(vocab_size=V, d_model=D, n_layers=N_LAYERS, n_heads=2, d_mlp=8, max_positions=8,
                        type_vocab_size=0, norm_placement="pre", hidden_dropout=0.0, attention_dropout=0.0)
    model = Encoder(cfg, mlm_head=True).eval()
    with torch.no_grad():
        model.embed.word.weight.copy_(3 * torch.eye(V))
        model.embed.pos.weight.zero_()
        for block in model.blocks:
            for p in (*block.attn.out.parameters(), *block.mlp.fc_out.parameters()):
                p.zero_()
        model.blocks[K - 1].mlp.fc_out.bias.copy_(100 * torch.eye(D)[ANSWER])
        model.mlm_head.dense.weight.copy_(torch.eye(D))
        model.mlm_head.dense.bias.zero_()
        if decoder is not None:
            model.mlm_head.decoder = torch.nn.Parameter(decoder)
    return model


P, M = 32, 8  # positions and mask counts the lookup table covers


class TableMLM(torch.nn.Module):
    """A masked LM whose prediction at position p of a row with m masked tokens is row ``(p, m)`` of a lookup table:
    ``forward`` gives the one-hot of ``(p, m)`` ``[batch, pos, P * M]``, ``mlm_logits`` reads the table."""

    def __init__(self) -> None:
        super().__init__()
        self.tokenizer = wordpiece_tokenizer()
        draw = torch.Generator().manual_seed(0)
        self.table = torch.nn.Parameter(torch.randn(P * M, len(self.tokenizer), generator=draw))
        self.mlm_head = torch.nn.Parameter(torch.randn(len(self.tokenizer)))  # the output bias
        self.config = SimpleNamespace(n_layers=0, d_model=P * M, max_length=P)
        self.source = "a lookup table"

    @property
    def device(self) -> torch.device:
        return self.table.device

    def forward(self, ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        n_masked = ((ids == self.tokenizer.mask_token_id) & mask.bool()).sum(1, keepdim=True)  # [batch, 1]
        cell = torch.arange(ids.shape[1])[None] * M + n_masked.clamp(max=M - 1)
        return torch.nn.functional.one_hot(cell, P * M).float()

    def mlm_logits(self, hidden: torch.Tensor, *, bias: bool = True) -> torch.Tensor:
        return hidden @ self.table + (self.mlm_head if bias else 0)


#: Two public antibody variable domains (trastuzumab's heavy and light chains), space-separated as AntiBERTy reads them.
TRASTUZUMAB = (
    "EVQLVESGGGLVQPGGSLRLSCAASGFNIKDTYIHWVRQAPGKGLEWVARIYPTNGYTRYADSVKGRFTISADTSKNTAYLQMNSLRAEDTAVYYCSRWGGDGFYAMDYWGQG"
    "TLVTVSS",
    "DIQMTQSPSSLSASVGDRVTITCRASQDVNTAVAWYQQKPGKAPKLLIYSASFLYSGVPSRFSGSRSGTDFTLTISSLQPEDFATYYCQQHYTTPPTFGQGTKVEIK",
)


def antiberty_folder(dest):
    """AntiBERTy's masked-LM weights (``antiberty==0.1.3``, BERT 8 x 512, 25 tokens) as a ``BertForMaskedLM`` folder
    bertscope loads: its species, chain and graft heads dropped, its vocabulary as a cased WordPiece tokenizer.
    Returns the folder, or None when antiberty is not installed."""
    import json
    from pathlib import Path

    try:
        import antiberty
    except ImportError:
        return None
    import transformers
    from safetensors.torch import save_file

    src = Path(antiberty.__file__).parent / "trained_models"
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    state = torch.load(src / "AntiBERTy_md_smooth" / "pytorch_model.bin", map_location="cpu", weights_only=True)
    keep = {k: v.clone().contiguous() for k, v in state.items() if k.startswith(("bert.", "cls.predictions."))}
    save_file(keep, str(dest / "model.safetensors"))
    config = json.loads((src / "AntiBERTy_md_smooth" / "config.json").read_text())
    config["architectures"] = ["BertForMaskedLM"]
    (dest / "config.json").write_text(json.dumps(config))
    vocab = {t: i for i, t in enumerate((src / "vocab.txt").read_text().split())}
    tok = transformers.BertTokenizerFast(vocab=vocab, do_lower_case=False)
    tok.save_pretrained(dest)
    return dest


def antibody_variants(n: int, rate: float = 0.05, seed: int = 0) -> list[str]:
    """``n`` sequences: trastuzumab's chains in turn, each residue replaced by a random amino acid with probability
    ``rate``, as space-separated letters."""
    import random

    rng = random.Random(seed)
    letters = "ACDEFGHIKLMNPQRSTVWY"
    out = []
    for i in range(n):
        chain = TRASTUZUMAB[i % 2]
        out.append(" ".join(rng.choice(letters) if rng.random() < rate else c for c in chain))
    return out
