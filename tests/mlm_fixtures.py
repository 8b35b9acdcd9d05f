"""A masked LM built by hand with known answers, for the lens tests (importable: pytest puts tests/ on sys.path).

Pre-LN, a 16-token vocabulary in 16 dimensions, token j's embedding ``3 e_j``, no positions or segments, the head's
``dense`` the identity: every block writes nothing except block ``K - 1``, whose MLP bias writes ``100 e_ANSWER``.
So streams ``0..K-1`` hold the input tokens' own directions (the tied decoder reads each token back) and streams
``K..N_LAYERS`` the answer's.
"""

from __future__ import annotations

import torch
from bertscope.models import Encoder, EncoderConfig

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
