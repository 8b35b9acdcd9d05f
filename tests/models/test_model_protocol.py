"""Issue 38.3: hooks/ holds hooks. Importing ``bertscope.models`` and loading a model import no analysis, and the
block interface the analyses read (``models/protocol.py``) is met by every family, with the missing piece named
when a family lacks one."""

from __future__ import annotations

import copy
import subprocess
import sys
import textwrap
import types

import pytest
import torch
from bertscope.models import protocol
from family_fixtures import FAMILIES, save_tiny_family
from fixtures_deberta_modernbert import save_tiny_deberta, save_tiny_modernbert
from helpers import save_tiny_bert

from bertscope import models

MAKERS = {
    "bert": save_tiny_bert,
    **{name: (lambda folder, name=name: save_tiny_family(name, folder)) for name in FAMILIES},
    "deberta": save_tiny_deberta,
    "modernbert": save_tiny_modernbert,
}
ANALYSES = ("bertscope.hooks.mixing", "bertscope.hooks.circuits", "bertscope.hooks.interventions",
            "bertscope.hooks.ablation", "bertscope.probes", "bertscope.experiments")  # fmt: skip


def test_importing_and_loading_a_model_imports_no_analysis():
    """In a fresh interpreter: import ``bertscope.models``, load the bundled model and a random one, run both;
    then no module of mixing, circuits, interventions, probes (dictionaries, erasure) or experiments is loaded.
    Asking ``bertscope.hooks`` for an analysis name afterwards still imports it (the names are lazy, not gone)."""
    script = textwrap.dedent(f"""
        import sys
        import bertscope.models
        import bertscope
        model = bertscope.load()
        rand = bertscope.models.random_encoder(model.config, tokenizer=model.tokenizer)
        for m in (model, rand):
            _, cache = m.run_with_cache(["The cat sat."], names_filter="blocks.0.attn.hook_pattern")
            assert cache["pattern", 0].shape[0] == 1
        loaded = sorted(k for k in sys.modules if k.startswith({ANALYSES!r}))
        assert not loaded, loaded
        from bertscope.hooks import contributions, ablate_heads
        assert "bertscope.hooks.mixing" in sys.modules and "bertscope.hooks.interventions" in sys.modules
        print("ok")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


@pytest.fixture(scope="module", params=list(MAKERS))
def family(request, tmp_path_factory) -> tuple[str, models.Encoder]:
    folder = tmp_path_factory.mktemp(request.param)
    MAKERS[request.param](folder)
    return request.param, models.load(folder)


def test_every_family_meets_the_block_interface(family):
    """All eight families: nothing of ``AnalysableEncoder`` missing, and the interface does what it says:
    ``attn(x, ctx)`` and ``mlp(x)`` give ``[b, p, m]``, the weights have their documented shapes, and a block run
    from the hooked ``resid_pre`` through ``forward_from`` reproduces the model's own output."""
    name, model = family
    assert protocol.missing_members(model) == [], name
    protocol.check_model(model)
    assert isinstance(model, protocol.AnalysableEncoder)
    cfg = model.config
    assert cfg.norm_placement in ("post", "pre")
    inputs = model.tokenize(["the cat sat on the mat.", "dogs bark"])
    b, p = inputs["input_ids"].shape
    m, h, d = cfg.d_model, cfg.n_heads, cfg.d_head
    with torch.no_grad():
        out, cache = model.run_with_cache(**inputs, names_filter="blocks.*.hook_resid_pre")
        x = cache["blocks.0.hook_resid_pre"]
        ctx = model.context(x, inputs["attention_mask"])
        for block in model.blocks:
            assert block.attn(x, ctx).shape == block.mlp(x).shape == (b, p, m)
            assert block.attn.W_Q.shape == block.attn.W_K.shape == block.attn.W_V.shape == (h, m, d)
            assert block.attn.W_O.shape == (h, d, m) and block.attn.b_O.shape == (m,)
            assert block.attn.b_Q.shape == (h, d) and block.ln1(x).shape == block.ln2(x).shape == (b, p, m)
            if cfg.norm_placement == "post":
                assert block.ln1.weight.shape == block.ln2.weight.shape == (m,)
        again = model.forward_from(1, cache["blocks.1.hook_resid_pre"], inputs["attention_mask"])
    real = inputs["attention_mask"].bool()
    torch.testing.assert_close(again[real], out[real], rtol=1e-5, atol=1e-5)


def test_a_family_missing_a_piece_is_named(tiny_model_dir):
    """A fake family whose second block has no ``ln2`` and whose attention takes no ``ctx``, with no
    ``forward_from``: each missing piece is named by its path, and ``check_model`` refuses it."""

    class NoContext(torch.nn.Module):
        def __init__(self, attn: torch.nn.Module) -> None:
            super().__init__()
            self.inner = attn
            for w in ("W_Q", "W_K", "W_V", "W_O", "b_Q", "b_K", "b_V", "b_O"):
                setattr(self, w, getattr(attn, w))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.inner(x, None)

    class FakeFamily(models.Encoder):
        forward_from = None  # type: ignore[assignment]

    model = copy.deepcopy(models.load(tiny_model_dir))
    model.__class__ = FakeFamily
    del model.blocks[1].ln2
    model.blocks[0].attn = NoContext(model.blocks[0].attn)
    missing = protocol.missing_members(model)
    assert missing == ["model.blocks[0].attn(x, ctx)", "model.blocks[1].ln2",
                       "model.forward_from(layer, resid_pre, attention_mask)"], missing  # fmt: skip
    with pytest.raises(TypeError, match=r"FakeFamily lacks what the analyses read: model\.blocks\[0\]\.attn\(x, ctx\)"):
        protocol.check_model(model)
    cfg = model.config
    model.config = types.SimpleNamespace(**{k: getattr(cfg, k) for k in ("n_layers", "n_heads", "d_head", "d_model",
                                                                          "pad_token_id")})  # fmt: skip
    assert "model.config.norm_placement" in protocol.missing_members(model)
