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
