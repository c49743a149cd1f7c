"""Geometry of one SSM layer of each family (full model before tensor parallelism; ``local(tp)`` gives one rank's).

Every dims class also answers in one vocabulary the kernels, cache and byte model share: the state of one sequence
is ``heads x rows x cols`` (rows: the value / head dim the output runs along; cols: the contiguous key / d_state
axis), and ``key_heads`` is the number of key-side inputs per token (Mamba-2 groups, GDN key heads, KDA heads).
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, ClassVar, Union

if TYPE_CHECKING:
    import torch


class _Geometry:
    family: ClassVar[str]
    per_channel_gate: ClassVar[bool] = False  # one log-gate per key channel (KDA) rather than per head

    @property
    def state_elems(self) -> int:
        """Elements of one sequence's state (all heads)."""
        return self.heads * self.rows * self.cols

    @classmethod
    def of_state(cls, state_shape: tuple[int, ...], key_heads: int):
        """The dims of a state pool ``[slots, heads, rows, cols]`` whose layer has ``key_heads`` key-side heads."""
        if len(state_shape) != 4:
            raise ValueError(f"state: expected a 4-D [slots, heads, rows, cols] tensor, got shape {tuple(state_shape)}")
        return cls._of_state(*state_shape[1:], key_heads)

    def local(self, tp_size: int):
        """One tensor-parallel rank's dims (every head and group count divided by ``tp_size``)."""
        bad = {k: v for k, v in self.tp_divisors().items() if v % tp_size}
        if bad:
            raise ValueError(f"tp_size: {tp_size} does not divide {', '.join(f'{k}={v}' for k, v in bad.items())}")
        return replace(self, **{f: getattr(self, f) // tp_size for f in self.head_fields})


@dataclass(frozen=True)
class Mamba2Dims(_Geometry):
    """Mamba-2 mixer: state per slot ``[nheads, head_dim, d_state]``."""

    nheads: int
    head_dim: int
    d_state: int
    n_groups: int
    conv_kernel: int = 4
    chunk_size: int = 128
    family: ClassVar[str] = "mamba2"
    head_fields: ClassVar[tuple[str, ...]] = ("nheads", "n_groups")

    @classmethod
    def _of_state(cls, heads: int, rows: int, cols: int, key_heads: int) -> "Mamba2Dims":
        return cls(nheads=heads, head_dim=rows, d_state=cols, n_groups=key_heads)

    heads = property(lambda self: self.nheads)
    rows = property(lambda self: self.head_dim)
    cols = property(lambda self: self.d_state)
    key_heads = property(lambda self: self.n_groups)

    @property
    def d_inner(self) -> int:
        return self.nheads * self.head_dim

    @property
    def conv_dim(self) -> int:
        return self.d_inner + 2 * self.n_groups * self.d_state

    def split_zxbcdt(self, zxbcdt: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
        """Views ``z [..., H*P]``, ``xBC [..., conv_dim]`` and ``dt [..., H]`` of the mixer's input projection
        ``[..., d_inner + conv_dim + H]`` (sections z | xBC | dt)."""
        width = self.d_inner + self.conv_dim + self.nheads
        if zxbcdt.dim() < 1 or zxbcdt.shape[-1] != width:
            raise ValueError(f"zxbcdt: expected shape [..., {width}], got {tuple(zxbcdt.shape)}")
        return zxbcdt.split([self.d_inner, self.conv_dim, self.nheads], dim=-1)

    def split_xbc(self, xbc: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
        """Views ``x [..., H, P]``, ``B [..., G, N]`` and ``C [..., G, N]`` of the post-conv ``xBC [..., conv_dim]``."""
        if xbc.dim() < 1 or xbc.shape[-1] != self.conv_dim:
            raise ValueError(f"xbc: expected shape [..., {self.conv_dim}], got {tuple(xbc.shape)}")
        group = self.n_groups * self.d_state
        x, B, C = xbc.split([self.d_inner, group, group], dim=-1)  # noqa: N806
        return (x.unflatten(-1, (self.nheads, self.head_dim)), B.unflatten(-1, (self.n_groups, self.d_state)),
                C.unflatten(-1, (self.n_groups, self.d_state)))

    def tp_divisors(self) -> dict[str, int]:
        """Counts that a tensor-parallel size must divide (HF config names)."""
        return {"mamba_num_heads": self.nheads, "n_groups": self.n_groups}

    def gate_input_bytes(self, act_bytes: int) -> int:
        """Bytes of a token's gate inputs: dt [H] in fp32."""
        return self.nheads * 4


@dataclass(frozen=True)
class GDNDims(_Geometry):
    """Gated DeltaNet: state per slot ``[num_v_heads, head_v_dim, head_k_dim]``, one key per key head."""

    num_k_heads: int
    num_v_heads: int
    head_k_dim: int
    head_v_dim: int
    conv_kernel: int = 4
    family: ClassVar[str] = "gdn"
    head_fields: ClassVar[tuple[str, ...]] = ("num_k_heads", "num_v_heads")

    @classmethod
    def _of_state(cls, heads: int, rows: int, cols: int, key_heads: int) -> "GDNDims":
        return cls(num_k_heads=key_heads, num_v_heads=heads, head_k_dim=cols, head_v_dim=rows)

    heads = property(lambda self: self.num_v_heads)
    rows = property(lambda self: self.head_v_dim)
    cols = property(lambda self: self.head_k_dim)
    key_heads = property(lambda self: self.num_k_heads)

    @property
    def conv_dim(self) -> int:
        return 2 * self.num_k_heads * self.head_k_dim + self.num_v_heads * self.head_v_dim

    def split_qkv(self, mixed_qkv: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
        """Views ``q [..., HK, K]``, ``k [..., HK, K]`` and ``v [..., HV, V]`` of the post-conv projection
        ``[..., conv_dim]`` (sections q | k | v)."""
        if mixed_qkv.dim() < 1 or mixed_qkv.shape[-1] != self.conv_dim:
            raise ValueError(f"mixed_qkv: expected shape [..., {self.conv_dim}], got {tuple(mixed_qkv.shape)}")
        key = self.num_k_heads * self.head_k_dim
        q, k, v = mixed_qkv.split([key, key, self.num_v_heads * self.head_v_dim], dim=-1)
        key_heads, value_heads = (self.num_k_heads, self.head_k_dim), (self.num_v_heads, self.head_v_dim)
        return q.unflatten(-1, key_heads), k.unflatten(-1, key_heads), v.unflatten(-1, value_heads)

    def tp_divisors(self) -> dict[str, int]:
        return {"linear_num_key_heads": self.num_k_heads, "linear_num_value_heads": self.num_v_heads}

    def gate_input_bytes(self, act_bytes: int) -> int:
        """Bytes of a token's gate inputs: the raw gate a [HV] and beta b [HV] in the activation dtype."""
        return 2 * self.num_v_heads * act_bytes


@dataclass(frozen=True)
class KDADims(_Geometry):
    """Kimi Delta Attention (per-channel gate): state per slot ``[num_heads, head_dim, head_dim]``."""

    num_heads: int
    head_dim: int
    conv_kernel: int = 4
    gate_lower_bound: float | None = None
    family: ClassVar[str] = "kda"
    per_channel_gate: ClassVar[bool] = True
    head_fields: ClassVar[tuple[str, ...]] = ("num_heads",)

    @classmethod
    def _of_state(cls, heads: int, rows: int, cols: int, key_heads: int) -> "KDADims":
        if rows != cols:
            raise ValueError(f"state: KDA states are [heads, head_dim, head_dim], got rows {rows}, cols {cols}")
        return cls(num_heads=heads, head_dim=rows)  # key heads = heads

    heads = property(lambda self: self.num_heads)
    rows = property(lambda self: self.head_dim)
    cols = property(lambda self: self.head_dim)
    key_heads = property(lambda self: self.num_heads)

    @property
    def conv_dim(self) -> int:
        return 3 * self.num_heads * self.head_dim

    def split_qkv(self, mixed_qkv: "torch.Tensor") -> tuple["torch.Tensor", "torch.Tensor", "torch.Tensor"]:
        """Views ``q, k, v [..., H, D]`` of the post-conv activations ``[..., conv_dim]`` (sections q | k | v)."""
        if mixed_qkv.dim() < 1 or mixed_qkv.shape[-1] != self.conv_dim:
            raise ValueError(f"mixed_qkv: expected shape [..., {self.conv_dim}], got {tuple(mixed_qkv.shape)}")
        return tuple(t.unflatten(-1, (self.num_heads, self.head_dim)) for t in mixed_qkv.chunk(3, dim=-1))

    def tp_divisors(self) -> dict[str, int]:
        return {"linear_attn_config.num_heads": self.num_heads}

    def gate_input_bytes(self, act_bytes: int) -> int:
        """Bytes of a token's gate inputs: the raw per-channel gate [H, K] and beta [H] in the activation dtype."""
        return (self.num_heads * self.head_dim + self.num_heads) * act_bytes


SSMDims = Union[Mamba2Dims, GDNDims, KDADims]
