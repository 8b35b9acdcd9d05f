"""The one site vocabulary (`bertscope.hooks.sites`): parsing, globs, block components, forward order."""

import pytest
from bertscope.hooks import sites
from bertscope.models import EncoderConfig, random_encoder


def test_parse_site_splits_module_layer_and_suffix():
    assert sites.parse_site("blocks.11.attn.hook_pattern") == sites.Site(
        "blocks.11.attn.hook_pattern", "blocks", 11, "attn.hook_pattern"
    )
    assert sites.parse_site("embed.hook_word") == sites.Site("embed.hook_word", "embed", None, "hook_word")
    assert sites.parse_site("ln_final.hook_scale").module == "ln_final"
    assert sites.block_layer("blocks.3.hook_resid_post") == 3 and sites.block_layer("embed.hook_out") is None
    assert sites.block_site(2, "resid_mid") == "blocks.2.hook_resid_mid"
    assert sites.block_site(2, "attn.hook_z") == "blocks.2.attn.hook_z"


def test_site_layer_counts_like_hidden_states():
    assert sites.site_layer("embed.hook_word") == (0, "word")
    assert sites.site_layer("embed.hook_out") == (0, "embed")
    for layer in range(3):
        for c in sites.BLOCK_COMPONENTS:
            assert sites.site_layer(sites.block_site(layer, c)) == (layer + 1, c)
    for bad in ("blocks.0.attn.hook_pattern", "blocks.x.hook_resid_post", "ln_final.hook_scale", "blocks.0"):
        with pytest.raises(ValueError, match="not a residual-stream site"):
            sites.site_layer(bad)


def test_globs_select_in_the_given_order_and_typos_raise():
    names = ["embed.hook_out", "blocks.0.hook_resid_post", "blocks.0.attn.hook_z", "blocks.1.hook_resid_post"]
    assert sites.match_sites("blocks.*.hook_resid_post", names) == [names[1], names[3]]
    assert sites.match_sites(["blocks.1.hook_resid_post", "embed.*"], names) == [names[0], names[3]]
    assert sites.is_glob("blocks.[01].hook_z") and not sites.is_glob("blocks.0.hook_z")
    with pytest.raises(KeyError, match="no hook point matches"):
        sites.match_sites("blocks.*.hook_resid_pots", names)


def test_forward_order_and_last_block():
    order = {"embed": ("hook_word", "hook_out"), "blocks": ("hook_resid_pre", "attn.hook_z", "hook_resid_post")}
    names = ["blocks.1.attn.hook_z", "blocks.0.hook_resid_post", "embed.hook_out", "blocks.0.hook_resid_pre"]
    assert sites.forward_order(names, order) == [
        "embed.hook_out", "blocks.0.hook_resid_pre", "blocks.0.hook_resid_post", "blocks.1.attn.hook_z"
    ]
    assert sites.last_block(names) == 1 and sites.last_block(["embed.hook_word"]) == 0
    assert sites.last_block(["blocks.0.hook_z", "ln_final.hook_scale"]) is None


def test_every_model_hook_name_parses_and_residual_sites_are_the_block_components():
    model = random_encoder(EncoderConfig(n_layers=2, d_model=16, n_heads=2, d_mlp=32, vocab_size=50), seed=0)
    names = model.hook_names()
    for name in names:
        site = sites.parse_site(name)
        assert site.module in ("embed", "blocks", "ln_final") and site.suffix
    residual = [n for n in names if sites.parse_site(n).suffix in {f"hook_{c}" for c in sites.BLOCK_COMPONENTS}]
    assert residual == [sites.block_site(L, c) for L in range(2) for c in sites.BLOCK_COMPONENTS]
    assert sites.match_sites("blocks.*.attn.hook_pattern", names) == model.select_hooks("blocks.*.attn.hook_pattern")


def test_split_block_reads_bare_blocks_and_named_sites():
    assert sites.split_block("blocks.3") == (3, None)
    assert sites.split_block("blocks.12.attn.hook_z") == (12, "attn.hook_z")
    assert sites.split_block("embed.hook_out") is None and sites.split_block("blocks.x.hook_z") is None
    assert sites.split_block("blocks.3.") is None
    # parse_site and block_layer keep reading a bare block as no block site (its "module" is blocks.3)
    assert sites.parse_site("blocks.3") == sites.Site("blocks.3", "blocks", None, "3")
    assert sites.block_layer("blocks.3") is None


def test_attention_shaped_sites_are_the_scores_and_the_pattern():
    model = random_encoder(EncoderConfig(d_model=8, n_layers=1, n_heads=2, d_mlp=8))
    _, cache = model.run_with_cache(
        __import__("torch").tensor([[1, 2, 3, 4, 5]]), names_filter=lambda name: name.startswith("blocks.0"))
    for name in cache:  # a site is attention-shaped exactly when its tensor is [batch, head, query, key]
        t = cache[name]
        square = t.ndim == 4 and t.shape[1] == 2 and t.shape[2] == t.shape[3] == 5
        assert sites.is_attention_site(name) == square, name
    assert sites.is_attention_site("hook_pattern") and not sites.is_attention_site("hook_z")


# Files still to switch to sites.split_block / sites.is_attention_site (the dictionary package's, reworked on
# another branch): experiments/sae.py (transcoder_sites, the attention check of its site widths),
# probes/dictionary/evaluate.py (int(s.split(".")[1])). Empty this set once they do.
NOT_YET: set[str] = set()


def test_block_names_and_attention_sites_are_read_only_in_sites_py():
    """Issue 38.4: no other module parses ``blocks.{L}`` names by hand (a regex, ``split(".")[1]``) or writes its
    own list of the attention-shaped hooks."""
    import re
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    by_hand = [re.compile(r"blocks\\\\?\.\(\\\\?d\+\)"), re.compile(r"""split\(["']\.["']\)\[1\]"""),
               re.compile(r"""\(\s*["'](?:attn\.)?hook_(?:scores|pattern)["']\s*,\s*["'](?:attn\.)?hook_(?:scores|pattern)["']"""
                          r"""\s*,?\s*\)""")]  # a tuple of just the two: an attention-shape list
    found = []
    for top in ("models", "hooks", "probes", "experiments", "bertscope"):
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if rel in ("hooks/sites.py", *NOT_YET):
                continue
            for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
                if any(p.search(line) for p in by_hand):
                    found.append(f"{rel}:{n}: {line.strip()}")
    assert not found, found
