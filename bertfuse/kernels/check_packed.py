"""`bertfuse kernels check` cases for the packed path's ops: PackTokens, PackedBertAttention,
UnpackTokens, with float64/integer NumPy references of their own written from the kernels'
contract (csrc/pack.h, csrc/packed_attention.h, csrc/packed_ops.cc):

    PackTokens(mask [B,S] i32, token_bucket [T] i32, values unread)
        -> token_index [T]: flat b*S+s of packed token i, row by row, 0 past the kept count;
           token_slot [B,S]: packed row of (b, s), -1 where not kept (or cut at T);
           cu_seqlens [B+1]: running kept count per row, clamped to T
    PackedBertAttention(qkv [T,3H] f16, token_slot [R,S] i32, cu_seqlens [R+1] i32; num_heads, scale)
        -> [T,H]: each sequence cu[r]..cu[r+1]-1 attends to itself (BertAttention's math, no
           mask); rows past cu[R] are zeros
    UnpackTokens(packed [T,H] f16, token_slot [B,S] i32) -> [B,S,H]: packed[slot], zeros where
           slot < 0 or >= T
"""

from __future__ import annotations

import numpy as np

from bertfuse.kernels.cases import Case, Feeds, normal16
from bertfuse.ops.bertfuse import bert_attention
from bertfuse.ops.contract import BERTFUSE_DOMAIN, one_node_model


def pack_reference(mask: np.ndarray, t: int) -> list[np.ndarray]:
    b, s = mask.shape
    keep = mask != 0
    pos = np.flatnonzero(keep.reshape(-1))
    n = min(len(pos), t)
    index = np.zeros(t, np.int32)
    index[:n] = pos[:n]
    slot = np.full(b * s, -1, np.int32)
    slot[pos[:n]] = np.arange(n)
    cu = np.minimum(np.concatenate([[0], np.cumsum(keep.sum(axis=1))]), t).astype(np.int32)
    return [index, slot.reshape(b, s), cu]


def packed_attention_reference(qkv: np.ndarray, cu: np.ndarray, num_heads: int,
                               scale: float | None) -> np.ndarray:
    t, h3 = qkv.shape
    out = np.zeros((t, h3 // 3), np.float16)
    for a, b in zip(cu[:-1], cu[1:]):
        if b > a:
            out[a:b] = bert_attention.reference(qkv[None, a:b], None, num_heads=num_heads, scale=scale)[0]
    return out


def unpack_reference(packed: np.ndarray, slot: np.ndarray) -> np.ndarray:
    t, h = packed.shape
    ok = (slot >= 0) & (slot < t)
    out = np.zeros((*slot.shape, h), packed.dtype)
    out[ok] = packed[slot[ok]]
    return out


def _right_padded(lengths: list[int], s: int) -> np.ndarray:
    return (np.arange(s)[None, :] < np.asarray(lengths)[:, None]).astype(np.int32)


def _pack_case(label: str, mask: np.ndarray, t: int) -> Case:
    b, s = mask.shape
    model = one_node_model("PackTokens", BERTFUSE_DOMAIN,
                           [("mask", np.int32, (b, s)), ("token_bucket", np.int32, (t,))],
                           [("token_index", np.int32, (t,)), ("token_slot", np.int32, (b, s)),
                            ("cu_seqlens", np.int32, (b + 1,))])
    feeds = {"mask": mask, "token_bucket": np.zeros(t, np.int32)}
    return Case("PackTokens", f"mask[{b},{s}] {label} T={t}", model, feeds,
                lambda f: pack_reference(f["mask"], f["token_bucket"].shape[0]))


def packed_cases(rng: np.random.Generator) -> list[Case]:
    cases = []
    lengths = [64, 10, 0, 33]  # 107 kept tokens: a full row, a short one, an empty one
    mask = _right_padded(lengths, 64)
    holes = (rng.random((3, 40)) > 0.4).astype(np.int32)
    cases += [_pack_case("right-padded", mask, 128), _pack_case("holes", holes, int(holes.sum())),
              _pack_case("cut (T < kept)", mask, 64)]

    for lens, s, h, heads, scale in [(lengths, 64, 768, 12, None), ([128, 1, 77], 128, 768, 12, None),
                                     ([16, 5, 9], 16, 256, 4, 0.2),
                                     # head 26 on the general path; 32, 128 and S_max past 128 on the tiled kernel
                                     ([26, 5, 0], 32, 312, 12, None), ([300, 17, 1], 384, 384, 12, None),
                                     ([129, 64], 129, 1024, 8, None), ([512, 100], 512, 768, 12, None)]:
        t = -(-sum(lens) // 16) * 16 + 16  # a bucket above the kept count: filler rows at the end
        _, slot, cu = pack_reference(_right_padded(lens, s), t)
        feeds: Feeds = {"qkv": normal16(rng, (t, 3 * h)), "token_slot": slot, "cumulative_sequence_length": cu}
        model = one_node_model("PackedBertAttention", BERTFUSE_DOMAIN,
                               [("qkv", np.float16, (t, 3 * h)), ("token_slot", np.int32, slot.shape),
                                ("cumulative_sequence_length", np.int32, cu.shape)],
                               [("context", np.float16, (t, h))], {"num_heads": heads, "scale": scale})
        cases.append(Case("PackedBertAttention", f"qkv[{t},{3 * h}] lengths={lens} heads={heads}"
                          + (f" scale={scale}" if scale else ""), model, feeds,
                          lambda f, heads=heads, scale=scale: [packed_attention_reference(
                              f["qkv"], f["cumulative_sequence_length"], heads, scale)],
                          feeds2={**feeds, "qkv": normal16(rng, (t, 3 * h))}))

    for label, m, t, h in [("right-padded", mask, 128, 768), ("holes", holes, int(holes.sum()), 768),
                           ("cut (T < kept)", mask, 64, 256)]:
        _, slot, _ = pack_reference(m, t)
        feeds = {"packed": normal16(rng, (t, h)), "token_slot": slot}
        model = one_node_model("UnpackTokens", BERTFUSE_DOMAIN,
                               [("packed", np.float16, (t, h)), ("token_slot", np.int32, slot.shape)],
                               [("output", np.float16, (*slot.shape, h))])
        cases.append(Case("UnpackTokens", f"packed[{t},{h}] slot{list(slot.shape)} {label}", model, feeds,
                          lambda f: [unpack_reference(f["packed"], f["token_slot"])],
                          feeds2={**feeds, "packed": np.ascontiguousarray(np.roll(feeds["packed"], 1, axis=0))}))
    return cases
