"""Reading a ``UNet2DConditionModel`` config: the checks, and each level's settings spelled out.

diffusers lets most per-level keys be one value or one per level (``attention_head_dim``,
``cross_attention_dim``, ``layers_per_block``, ``transformer_layers_per_block`` ...);
``levels`` expands them into one ``Level`` per down block (the up path reads them
reversed), after ``check_config`` has refused every value this class cannot build.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from .activations import check_activation
from .bounds import Bound, count, flag, list_of, name, number, optional, size_or_pair, width
from .resnet import TIME_EMBEDDING_NORMS

OWNER = "UNet2DConditionModel"
# block type -> whether it holds transformers (cross-attention)
DOWN_BLOCK_TYPES = {"CrossAttnDownBlock2D": True, "DownBlock2D": False}
UP_BLOCK_TYPES = {"CrossAttnUpBlock2D": True, "UpBlock2D": False}
MID_BLOCK_TYPES = ("UNetMidBlock2DCrossAttn", "UNetMidBlock2D", None)
CLASS_EMBED_TYPES = (None, "timestep", "identity", "projection", "simple_projection")
ADDITION_EMBED_TYPES = (None, "text_time")
TIME_EMBEDDING_TYPES = ("positional", "fourier")

Depth = int | tuple[int, ...]


def _one_or_list(bound: Bound) -> Bound:
    """``bound``, or a list of values each passing it (a per-level key)."""
    many = list_of(bound)
    return lambda v: None if bound(v) is None or many(v) is None else f"{bound(None)} or {many(None)}"


# The kind and range of every key, checked before anything is built (see bounds.check_config).
CONFIG_BOUNDS: dict[str, Bound] = {
    "sample_size": optional(size_or_pair()), "in_channels": width(), "out_channels": width(),
    "center_input_sample": flag(), "flip_sin_to_cos": flag(), "freq_shift": number(),
    "down_block_types": list_of(name()), "mid_block_type": optional(name()), "up_block_types": list_of(name()),
    "only_cross_attention": _one_or_list(flag()), "block_out_channels": list_of(width()),
    "layers_per_block": _one_or_list(count()), "downsample_padding": count(0), "mid_block_scale_factor": number(),
    "dropout": number(), "act_fn": name(), "norm_num_groups": width(), "norm_eps": number(),
    "cross_attention_dim": _one_or_list(width()), "transformer_layers_per_block": _one_or_list(_one_or_list(count())),
    "reverse_transformer_layers_per_block": optional(list_of(_one_or_list(count()))),
    "encoder_hid_dim": optional(width()), "encoder_hid_dim_type": optional(name()),
    "attention_head_dim": _one_or_list(width()), "num_attention_heads": optional(_one_or_list(width())),
    "dual_cross_attention": flag(), "use_linear_projection": flag(), "class_embed_type": optional(name()),
    "addition_embed_type": optional(name()), "addition_time_embed_dim": optional(width()),
    "num_class_embeds": optional(width()), "upcast_attention": optional(flag()), "resnet_time_scale_shift": name(),
    "resnet_skip_time_act": flag(), "resnet_out_scale_factor": number(), "time_embedding_type": name(),
    "time_embedding_dim": optional(width()), "time_embedding_act_fn": optional(name()),
    "timestep_post_act": optional(name()), "time_cond_proj_dim": optional(width()), "conv_in_kernel": count(),
    "conv_out_kernel": count(), "projection_class_embeddings_input_dim": optional(width()), "attention_type": name(),
    "class_embeddings_concat": flag(), "mid_block_only_cross_attention": optional(flag()),
    "cross_attention_norm": optional(name()), "addition_embed_type_num_heads": width(),
}


def parameter_shares(c: Mapping[str, Any]) -> dict[tuple[str, ...], int]:
    """A lower bound on the parameters, by the keys that make them: per level the 3x3 convs of the
    resnets (``layers_per_block`` down, one more up) and the transformers' 12 c² per block (down
    path only), the stem and head convs, and the class-label table."""
    n = len(c["block_out_channels"])
    layers = per_level("layers_per_block", c["layers_per_block"], n)
    depths = per_level("transformer_layers_per_block", c["transformer_layers_per_block"], n)
    first, kernel_in, kernel_out = c["block_out_channels"][0], c["conv_in_kernel"], c["conv_out_kernel"]
    cross = [DOWN_BLOCK_TYPES.get(t, False) for t in c["down_block_types"]]
    return {
        ("block_out_channels", "layers_per_block"): sum(9 * ch * ch * (2 * l + 1)
                                                        for ch, l in zip(c["block_out_channels"], layers)),
        ("block_out_channels", "transformer_layers_per_block"): sum(
            12 * ch * ch * (sum(d) if isinstance(d, tuple) else d * l)
            for ch, l, d, has in zip(c["block_out_channels"], layers, depths, cross) if has),
        ("in_channels", "conv_in_kernel"): kernel_in * kernel_in * c["in_channels"] * first,
        ("out_channels", "conv_out_kernel"): kernel_out * kernel_out * c["out_channels"] * first,
        ("num_class_embeds",): (c["num_class_embeds"] or 0) * (c["time_embedding_dim"] or 4 * first),
    }


@dataclass(frozen=True)
class Level:
    """One resolution of the UNet as its down block sees it (the up block reads the same level)."""

    channels: int
    layers: int
    heads: int | None
    cross_attention_dim: int
    depth: Depth
    only_cross_attention: bool


def per_level(key: str, value: Any, count: int) -> tuple[Any, ...]:
    """``value`` repeated ``count`` times, or the ``count`` values given for the levels."""
    if not isinstance(value, (list, tuple)):
        return (value,) * count
    if len(value) != count:
        raise ValueError(f"{OWNER}: {key} has {len(value)} entries {list(value)}, expected one per level ({count})")
    return tuple(tuple(v) if isinstance(v, (list, tuple)) else v for v in value)


def _positive_int(key: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{OWNER}: {key} must be a positive integer, got {value!r}")


def check_config(c: Mapping[str, Any]) -> None:
    """Raise ValueError naming the first config value this class cannot build."""
    n = len(c["block_out_channels"])
    if n == 0 or len(c["down_block_types"]) != n or len(c["up_block_types"]) != n:
        raise ValueError(f"{OWNER}: block_out_channels ({n}), down_block_types ({len(c['down_block_types'])}) and "
                         f"up_block_types ({len(c['up_block_types'])}) must have the same positive length")
    for key, known in (("down_block_types", DOWN_BLOCK_TYPES), ("up_block_types", UP_BLOCK_TYPES)):
        unknown = [t for t in c[key] if t not in known]
        if unknown:
            raise ValueError(f"{OWNER}: {key} {unknown} not supported; choose from {list(known)}")
    choices = [("mid_block_type", MID_BLOCK_TYPES), ("class_embed_type", CLASS_EMBED_TYPES),
               ("addition_embed_type", ADDITION_EMBED_TYPES), ("time_embedding_type", TIME_EMBEDDING_TYPES),
               ("resnet_time_scale_shift", TIME_EMBEDDING_NORMS), ("attention_type", ("default",)),
               ("encoder_hid_dim_type", (None,)), ("encoder_hid_dim", (None,)), ("dual_cross_attention", (False,))]
    for key, valid in choices:
        if c[key] not in valid:
            raise ValueError(f"{OWNER}: {key} must be one of {valid}, got {c[key]!r}")
    for key in ("act_fn", "time_embedding_act_fn", "timestep_post_act"):
        if c[key] is not None:
            check_activation(c[key], OWNER)
    for key in ("block_out_channels", "layers_per_block", "cross_attention_dim", "attention_head_dim"):
        for value in per_level(key, c[key], n):
            _positive_int(key, value)
    if c["num_attention_heads"] is not None:
        for value in per_level("num_attention_heads", c["num_attention_heads"], n):
            _positive_int("num_attention_heads", value)
    for key in ("in_channels", "out_channels", "norm_num_groups", "conv_in_kernel", "conv_out_kernel"):
        _positive_int(key, c[key])
    for key in ("conv_in_kernel", "conv_out_kernel"):
        if c[key] % 2 == 0:
            raise ValueError(f"{OWNER}: {key} must be odd (the output keeps the input's size), got {c[key]}")
    for channels in c["block_out_channels"]:
        if channels % c["norm_num_groups"]:
            raise ValueError(f"{OWNER}: norm_num_groups={c['norm_num_groups']} must divide block_out_channels {list(c['block_out_channels'])}")
    _check_embeddings(c)
    _check_transformer_depths(c, n)


def _check_embeddings(c: Mapping[str, Any]) -> None:
    if c["class_embed_type"] in ("projection", "simple_projection") and c["projection_class_embeddings_input_dim"] is None:
        raise ValueError(f"{OWNER}: class_embed_type={c['class_embed_type']!r} needs projection_class_embeddings_input_dim")
    if c["addition_embed_type"] == "text_time":
        for key in ("addition_time_embed_dim", "projection_class_embeddings_input_dim"):
            if c[key] is None:
                raise ValueError(f"{OWNER}: addition_embed_type='text_time' needs {key}")
            _positive_int(key, c[key])
    if c["num_class_embeds"] is not None:
        _positive_int("num_class_embeds", c["num_class_embeds"])
    if c["time_cond_proj_dim"] is not None:
        _positive_int("time_cond_proj_dim", c["time_cond_proj_dim"])
    if c["time_embedding_type"] == "fourier" and (c["time_embedding_dim"] or 2 * c["block_out_channels"][0]) % 2:
        raise ValueError(f"{OWNER}: time_embedding_type='fourier' needs an even time_embedding_dim, got {c['time_embedding_dim']}")


def _check_transformer_depths(c: Mapping[str, Any], n: int) -> None:
    depths = per_level("transformer_layers_per_block", c["transformer_layers_per_block"], n)
    nested = any(isinstance(d, tuple) for d in depths)
    if nested and c["reverse_transformer_layers_per_block"] is None:
        raise ValueError(f"{OWNER}: transformer_layers_per_block with per-layer counts {list(depths)} "
                         "needs reverse_transformer_layers_per_block for the up blocks")
    reverse = c["reverse_transformer_layers_per_block"]
    for depth in depths + (() if reverse is None else per_level("reverse_transformer_layers_per_block", reverse, n)):
        for count in depth if isinstance(depth, tuple) else (depth,):
            _positive_int("transformer_layers_per_block", count)


def levels(c: Mapping[str, Any]) -> list[Level]:
    """One ``Level`` per down block, the per-level keys expanded (SD-1.x's ``attention_head_dim`` read as heads)."""
    n = len(c["block_out_channels"])
    heads = per_level("num_attention_heads", c["num_attention_heads"] or c["attention_head_dim"], n)
    only_cross = per_level("only_cross_attention", c["only_cross_attention"], n)
    return [Level(channels, layers, head, cross, depth, bool(only))
            for channels, layers, head, cross, depth, only in zip(
                c["block_out_channels"], per_level("layers_per_block", c["layers_per_block"], n), heads,
                per_level("cross_attention_dim", c["cross_attention_dim"], n),
                per_level("transformer_layers_per_block", c["transformer_layers_per_block"], n), only_cross)]


def up_depths(c: Mapping[str, Any], down: Sequence[Level]) -> list[Depth]:
    """The transformer depths of the up blocks: ``reverse_transformer_layers_per_block``, else the down ones reversed."""
    reverse = c["reverse_transformer_layers_per_block"]
    if reverse is None:
        return [level.depth for level in reversed(down)]
    return list(per_level("reverse_transformer_layers_per_block", reverse, len(down)))
