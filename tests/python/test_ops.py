"""Every op family on the tests' backend (conftest.BACKEND: the CPU, or CUDA on a GPU
machine) against NumPy float64 references (not the library's own reference ops), on random
inputs of awkward sizes, outputs poisoned first."""
import numpy as np
import pytest

import metrale_gpu as mg
from conftest import assert_close_bf16, bf16_random, bf16_values, poisoned

E4M3 = mg.numerics.fp8_e4m3_to_f64


def silu(x):
    return x / (1.0 + np.exp(-x))


# ------------------------------------------------------------------ GEMM
@pytest.mark.parametrize("out_type", ["bf16", "f32"])
def test_gemm_bf16(b, put, rng, out_type):
    m, n, k = (int(v) for v in rng.integers(1, 70, 3))
    ldc = n + int(rng.integers(0, 5))
    a_bits, a = bf16_random(rng, (m, k))
    w_bits, w = bf16_random(rng, (n, k))
    out = poisoned(b, (m, ldc), out_type)
    # NumPy arrays go straight in on the CPU backend (DLPack, no copy)
    mg.gemm_bf16(b, None, m, n, k, put(a_bits), put(w_bits), out, mg.dtype_of(out_type), ldc)
    want = a @ w.T
    got = (bf16_values(out) if out_type == "bf16" else out.numpy().astype(np.float64))[:, :n]
    if out_type == "bf16":
        assert_close_bf16(got, want, abs_=1e-5 * np.sqrt(k))
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))
    # the padding columns of each row stay untouched
    if ldc > n:
        assert (out.view("u8").numpy().reshape(m, -1)[:, n * mg.dtype_bytes(out_type):] == 0xFF).all()


def test_gemm_with_prebuilt_descriptors(b, rng):
    m, n, k = 3, 40, 24
    a_bits, a = bf16_random(rng, (m, k))
    w_bits, w = bf16_random(rng, (n, k))
    act, weight = b.asbuffer(a_bits, "bf16"), b.asbuffer(w_bits, "bf16")
    out = poisoned(b, (m, n), "f32")
    plan = mg.gemm_plan(kind=mg.GEMM_BF16, m=m, n=n, k=k, ldc=n, out_type=mg.DTYPE_F32)
    t = mg.gemm_tensors(act=act, weight=weight, out=out)
    mg.gemm_prewarm(b, None, [plan])
    assert mg.gemm_workspace_bytes(b, plan) == 0
    mg.gemm(b, None, plan, t)
    np.testing.assert_allclose(out.numpy(), a @ w.T, rtol=1e-5, atol=1e-5)
    assert mg.op_stats_get(b, mg.OP_GEMM_BF16)["calls"] >= 1
    with pytest.raises(mg.InvalidArgument, match="ldc"):
        mg.gemm(b, None, mg.gemm_plan(kind=mg.GEMM_BF16, m=m, n=n, k=k, ldc=n - 1,
                                      out_type=mg.DTYPE_F32), t)


def test_gemm_fusion_residual_add(b, rng):
    """The appended fusion fields of the plan and tensors mirrors: a residual-add epilogue
    equals the GEMM rounded to BF16 plus the residual, rounded again; a fusion tensor the
    fusion does not read is refused by name."""
    m, n, k = 3, 37, 24
    a_bits, a = bf16_random(rng, (m, k))
    w_bits, w = bf16_random(rng, (n, k))
    r_bits, r = bf16_random(rng, (m, n))
    act, weight = b.asbuffer(a_bits, "bf16"), b.asbuffer(w_bits, "bf16")
    residual = b.asbuffer(r_bits, "bf16")
    out = poisoned(b, (m, n), "bf16")
    plan = mg.gemm_plan(kind=mg.GEMM_BF16, m=m, n=n, k=k, ldc=n, out_type=mg.DTYPE_BF16,
                        fusion=mg.gemm_fusion(epilogue=mg.GEMM_EPILOGUE_RESIDUAL_ADD))
    t = mg.gemm_tensors(act=act, weight=weight, out=out,
                        fusion=mg.gemm_fusion_tensors(residual=residual.ptr))
    mg.gemm(b, None, plan, t)
    nm = mg.numerics
    y = nm.bf16_to_f32(nm.bf16_from_f32((a @ w.T).astype(np.float32)))  # the GEMM's BF16 out
    want = nm.bf16_to_f32(nm.bf16_from_f32((y + r).astype(np.float32)))
    np.testing.assert_allclose(nm.bf16_to_f32(out.numpy()), want, rtol=1e-2, atol=1e-2)
    # the CPU runs the fusion in its reference provider; CUDA in its decode GEMV
    want_provider = "reference" if b.kind_name == "cpu" else "decode_gemv"
    assert mg.op_stats_get(b, mg.OP_GEMM_BF16)["provider"] == want_provider
    plain = mg.gemm_plan(kind=mg.GEMM_BF16, m=m, n=n, k=k, ldc=n, out_type=mg.DTYPE_BF16)
    with pytest.raises(mg.InvalidArgument, match="residual is given"):
        mg.gemm(b, None, plain, t)


def _fp8_operand(rng, rows, cols, quantizer):
    bits, _ = bf16_random(rng, (rows, cols), scale=3.0)
    codes, scales = quantizer(bits)
    return bits, codes, scales


def test_gemm_fp8_rowwise_and_tensorwise(b, put, rng):
    m = int(rng.integers(1, 40))
    n, k = 16 * int(rng.integers(1, 5)), 16 * int(rng.integers(1, 6))
    _, ac, as_ = _fp8_operand(rng, m, k, mg.fp8_quantize_rowwise)
    _, wc, ws = _fp8_operand(rng, n, k, mg.fp8_quantize_rowwise)
    out = poisoned(b, (m, n), "bf16")
    mg.gemm_fp8_rowwise(b, None, m, n, k, put(ac), put(as_), put(wc), put(ws), out, n)
    want = (E4M3(ac) @ E4M3(wc).T) * as_[:, None].astype(np.float64) * ws[None, :]
    assert_close_bf16(bf16_values(out), want, abs_=1e-4)
    _, ac, as_ = _fp8_operand(rng, m, k, mg.fp8_quantize_tensorwise)
    _, wc, ws = _fp8_operand(rng, n, k, mg.fp8_quantize_tensorwise)
    out.fill_bytes(0xFF)
    mg.gemm_fp8_tensorwise(b, None, m, n, k, put(ac), put(as_), put(wc), put(ws), out, n)
    want = (E4M3(ac) @ E4M3(wc).T) * float(as_[0]) * float(ws[0])
    assert_close_bf16(bf16_values(out), want, abs_=1e-4)


def test_gemm_fp8_blockscaled_with_device_quantizer(b, put, rng):
    m, n, k = 4 * int(rng.integers(1, 6)), 16 * int(rng.integers(1, 4)), 16 * int(rng.integers(5, 20))
    L = mg.fp8_k_blocks(k)
    a_bits, a = bf16_random(rng, (m, k), scale=2.0)
    d = mg.fp8_quant_desc(mode=mg.FP8_QUANT_1X128_GEMM_LAYOUT, rows=m, cols=k, rows_pad=m)
    codes = poisoned(b, (m, k), "u8")
    scales = poisoned(b, mg.fp8_quant_scale_count(d), "f32")
    mg.fp8_quantize(b, None, d, put(a_bits), codes, scales)
    ac, asc = codes.numpy(), scales.numpy().reshape(L, m)
    _, wc, wsc = _fp8_operand(rng, n, k, mg.fp8_quantize_1x128)
    wsc_gemm = np.ascontiguousarray(wsc.reshape(n, L).T)  # [L, n], the layout the GEMM reads
    out = poisoned(b, (m, n), "bf16")
    mg.gemm_fp8_blockscaled(b, None, m, n, k, codes, scales, mg.FP8_BLOCK_1X128, put(wc),
                            put(wsc_gemm), mg.FP8_BLOCK_1X128, out, n)
    want = np.zeros((m, n))
    for g in range(L):
        sl = slice(128 * g, min(k, 128 * (g + 1)))
        want += (E4M3(ac[:, sl]) @ E4M3(wc[:, sl]).T) * asc[g][:, None] * wsc_gemm[g][None, :]
    assert_close_bf16(bf16_values(out), want, abs_=1e-4)
    # the device quantizer's codes: each the nearest E4M3 value of x / scale
    for g in range(L):
        sl = slice(128 * g, min(k, 128 * (g + 1)))
        amax = np.abs(a[:, sl]).max(axis=1)
        np.testing.assert_array_equal(asc[g], np.where(amax > 0, (amax.astype(np.float32) /
                                                                   np.float32(448)), 1))
        _check_nearest(a[:, sl] / asc[g][:, None].astype(np.float64), E4M3(ac[:, sl]))


def _check_nearest(x, decoded):
    finite = np.sort(np.unique(mg.numerics.E4M3_VALUES[np.isfinite(mg.numerics.E4M3_VALUES)]))
    best = np.abs(finite[None, :] - x.reshape(-1, 1)).min(axis=1).reshape(x.shape)
    # x / scale is formed in FP32 by the op: allow that rounding
    assert (np.abs(decoded - x) <= best + 2e-7 * np.abs(x) + 1e-12).all()


def test_fp8_quantize_rows_on_the_device(b, put, rng):
    rows, cols = int(rng.integers(1, 30)), 8 * int(rng.integers(1, 40))
    bits, x = bf16_random(rng, (rows, cols), scale=10.0)
    d = mg.fp8_quant_desc(mode=mg.FP8_QUANT_ROW, rows=rows, cols=cols)
    codes, scales = poisoned(b, (rows, cols), "u8"), poisoned(b, rows, "f32")
    mg.fp8_quantize(b, None, d, put(bits), codes, scales)
    amax = np.abs(x).max(axis=1).astype(np.float32)
    np.testing.assert_array_equal(scales.numpy(), amax / np.float32(448))
    _check_nearest(x / scales.numpy()[:, None].astype(np.float64), E4M3(codes.numpy()))


# ------------------------------------------------------------------ elementwise
def test_rmsnorm_with_residual(b, put, rng):
    rows, cols = int(rng.integers(1, 20)), 8 * int(rng.integers(1, 40))
    x_bits, x = bf16_random(rng, (rows, cols))
    add_bits, add = bf16_random(rng, (rows, cols))
    w_bits, w = bf16_random(rng, cols)
    xb = b.asbuffer(x_bits, "bf16")
    out = poisoned(b, (rows, cols), "bf16")
    mg.rmsnorm_bf16(b, None, rows, cols, 1e-5, xb, put(add_bits), put(w_bits), out)
    summed = x + add
    assert_close_bf16(bf16_values(xb), summed)
    h = bf16_values(xb)
    want = h / np.sqrt((h * h).mean(axis=1, keepdims=True) + 1e-5) * w
    assert_close_bf16(bf16_values(out), want)


def test_silu_mul_gather_argmax(b, put, rng):
    rows, cols = int(rng.integers(1, 20)), 8 * int(rng.integers(1, 20))
    gu_bits, gu = bf16_random(rng, (rows, 2 * cols), scale=2.0)
    out = poisoned(b, (rows, cols), "bf16")
    mg.silu_mul_bf16(b, None, rows, cols, put(gu_bits), 2 * cols, out, cols)
    assert_close_bf16(bf16_values(out), silu(gu[:, :cols]) * gu[:, cols:])

    src_rows = int(rng.integers(2, 30))
    table_bits, table = bf16_random(rng, (src_rows, cols))
    ids = rng.integers(0, src_rows, rows).astype(np.int32)
    ids[0] = src_rows + 3  # outside: a row of zeros
    got = poisoned(b, (rows, cols), "bf16")
    mg.gather_rows_bf16(b, None, rows, cols, put(ids), src_rows, put(table_bits), None, got)
    want = np.where((ids < src_rows)[:, None], table[np.minimum(ids, src_rows - 1)], 0.0)
    np.testing.assert_array_equal(bf16_values(got), want)

    vocab = int(rng.integers(1, 500))
    logits = rng.standard_normal((rows, vocab)).astype(np.float32)
    logits[0, vocab // 2] = logits[0].max()  # a tie goes to the lowest column
    pitch = (vocab + 3) // 4 * 4
    padded = np.full((rows, pitch), np.nan, np.float32)
    padded[:, :vocab] = logits
    ids_out = poisoned(b, rows, "i32")
    mg.argmax_f32(b, None, rows, vocab, put(padded), pitch, ids_out)
    np.testing.assert_array_equal(ids_out.numpy(), logits.astype(np.float64).argmax(axis=1))


# ------------------------------------------------------------------ attention
def head_dim(b, rng, multiple=8):
    """Any multiple of `multiple` from 16 to 40 on the CPU; on CUDA one the attention kernels
    are built for (64 or 128: FlashInfer's and the split-KV decode kernels' head dims; others
    are refused)."""
    if b.kind_name == "cpu":
        return multiple * int(rng.integers(16 // multiple, 40 // multiple + 1))
    return int(rng.choice([64, 128]))


def attention_abs_bound(b, v):
    """The absolute part of the attention outputs' bound. The CPU reference sums in FP32 from
    the softmax weights as they are: 1e-3 covers its order of summation. A GPU kernel rounds
    the weights to BF16 before P.V (2^-9 relative each), which moves an output by up to 2^-9 of
    sum p |v| <= max |v| whatever the output's own size: 2^-8 max |v| is twice that."""
    return 1e-3 if b.kind_name == "cpu" else 2.0 ** -8 * float(np.abs(v).max())


def attention_ref(q, k, v, causal, sm_scale, window=-1):
    """q [Lq, Hq, D], k/v [Lk, Hkv, D] in float64; bottom-right aligned causal mask."""
    lq, hq, _ = q.shape
    lk, hkv, _ = k.shape
    group = hq // hkv
    o = np.zeros_like(q)
    for h in range(hq):
        s = sm_scale * q[:, h] @ k[:, h // group].T
        pos = lk - lq + np.arange(lq)[:, None]
        keys = np.arange(lk)[None, :]
        mask = np.ones((lq, lk), bool)
        if causal:
            mask &= keys <= pos
            if window >= 0:
                mask &= keys >= pos - window
        s = np.where(mask, s, -np.inf)
        p = np.exp(s - s.max(axis=1, keepdims=True))
        o[:, h] = (p / p.sum(axis=1, keepdims=True)) @ v[:, h // group]
    return o


def test_ragged_attention(b, rng):
    hkv, group, d = int(rng.integers(1, 3)), int(rng.integers(1, 4)), head_dim(b, rng)
    hq = hkv * group
    batch = int(rng.integers(1, 4))
    lk = rng.integers(1, 40, batch)
    lq = np.array([int(rng.integers(1, x + 1)) for x in lk])
    qo = np.concatenate([[0], np.cumsum(lq)]).astype(np.int32)
    kv = np.concatenate([[0], np.cumsum(lk)]).astype(np.int32)
    q_bits, q = bf16_random(rng, (qo[-1], hq, d))
    k_bits, k = bf16_random(rng, (kv[-1], hkv, d))
    v_bits, v = bf16_random(rng, (kv[-1], hkv, d))
    o = poisoned(b, (qo[-1], hq, d), "bf16")
    desc = mg.attention_desc(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d, causal=True,
                             window_left=-1, sm_scale=1 / np.sqrt(d))
    plan = mg.attention_plan_create(b, desc, qo, kv, batch)
    qb, kb, vb = (b.asbuffer(x, "bf16") for x in (q_bits, k_bits, v_bits))
    plan.run(mg.attention_tensors(q=qb, k=kb, v=vb, o=o, qo_rows=int(qo[-1]),
                                  kv_rows=int(kv[-1])))
    got = bf16_values(o)
    for i in range(batch):
        want = attention_ref(q[qo[i]:qo[i + 1]], k[kv[i]:kv[i + 1]], v[kv[i]:kv[i + 1]], True,
                             1 / np.sqrt(d))
        assert_close_bf16(got[qo[i]:qo[i + 1]], want, abs_=attention_abs_bound(b, v))
    plan.destroy()
    with pytest.raises(mg.InvalidArgument):
        mg.attention_plan_create(b, desc, np.array([0, 5], np.int32), np.array([0, 2], np.int32), 1)


def test_kv_append_then_paged_decode(b, rng):
    """Keys and values appended to pages, then one decode query per request over them; the
    reference attends over the same keys and values directly (the page layout is the op's)."""
    # the KV cache takes head dims in multiples of 16 (ops_kv_cache.h)
    hkv, group, d, page = 2, 2, head_dim(b, rng, 16), int(rng.integers(3, 9))
    hq = hkv * group
    batch = int(rng.integers(1, 4))
    lens = rng.integers(1, 30, batch)
    pages_per = (lens + page - 1) // page
    cache = mg.kv_cache_desc(num_kv_heads=hkv, head_dim=d, page_size=page,
                             num_pages=int(pages_per.sum()) + 2, kv_dtype=mg.KV_BF16)
    pool = b.alloc(mg.kv_cache_bytes(cache), "u8")
    k_pages, v_pages = mg.kv_cache_pools(cache, pool)
    alloc = mg.KVPageAllocator(cache.num_pages)
    indices = np.concatenate([alloc.alloc(int(p)) for p in pages_per]).astype(np.int32)
    kv_indptr = np.concatenate([[0], np.cumsum(pages_per)]).astype(np.int32)
    qo_indptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)
    last = (lens - (pages_per - 1) * page).astype(np.int32)
    tokens = int(qo_indptr[-1])
    k_bits, k = bf16_random(rng, (tokens, hkv, d))
    v_bits, v = bf16_random(rng, (tokens, hkv, d))
    dev = {n: b.asbuffer(a) for n, a in (("qo", qo_indptr), ("kv", kv_indptr),
                                          ("idx", indices), ("last", last))}
    args = mg.kv_append_args(batch_size=batch, num_tokens=tokens, num_kv_indices=len(indices),
                             k=b.asbuffer(k_bits, "bf16"), v=b.asbuffer(v_bits, "bf16"),
                             qo_indptr=dev["qo"], kv_indptr=dev["kv"], kv_indices=dev["idx"],
                             kv_last_page_len=dev["last"], k_pages=k_pages, v_pages=v_pages)
    mg.kv_append(b, None, cache, args)
    q_bits, q = bf16_random(rng, (batch, hq, d))
    decode = np.arange(batch + 1, dtype=np.int32)
    table = mg.PageTable(batch, decode, kv_indptr, indices, last)
    desc = mg.paged_attention_desc(num_qo_heads=hq, num_kv_heads=hkv, head_dim=d,
                                   page_size=page, window_left=-1, sm_scale=1 / np.sqrt(d),
                                   kv_dtype=mg.KV_BF16)
    # half the runs through a caller's workspace (the CPU reference carves its page table there;
    # a CUDA provider says what it needs, perhaps nothing)
    need = mg.paged_attention_workspace_bytes(b, desc, table)
    if b.kind_name == "cpu":
        assert need == (16 * (batch + 1) + 15) // 16 * 16
    if need and rng.integers(0, 2):
        ws = b.alloc(need, "u8")
        desc.workspace, desc.workspace_bytes = ws.ptr, need
    plan = mg.paged_attention_plan_create(b, desc, table)
    o = poisoned(b, (batch, hq, d), "bf16")
    plan.run(mg.paged_attention_tensors(q=b.asbuffer(q_bits, "bf16"), o=o, qo_rows=batch,
                                        k_pages=k_pages, v_pages=v_pages,
                                        num_pages=cache.num_pages, kv_indices=dev["idx"],
                                        num_kv_indices=len(indices)))
    got = bf16_values(o)
    for i in range(batch):
        sl = slice(qo_indptr[i], qo_indptr[i + 1])
        want = attention_ref(q[i:i + 1], k[sl], v[sl], True, 1 / np.sqrt(d))
        assert_close_bf16(got[i:i + 1], want, abs_=attention_abs_bound(b, v))
    assert alloc.free_count == 2


# ------------------------------------------------------------------ MoE
def test_moe_routing_and_grouped_gemm(b, put, rng):
    tokens, experts, k = int(rng.integers(1, 20)), int(rng.integers(2, 9)), 2
    hidden, n = 8 * int(rng.integers(1, 6)), 8 * int(rng.integers(1, 5))
    logits = rng.standard_normal((tokens, experts)).astype(np.float32)
    ids, weights = poisoned(b, (tokens, k), "i32"), poisoned(b, (tokens, k), "f32")
    mg.moe_topk(b, None, mg.moe_topk_desc(tokens=tokens, experts=experts, k=k,
                                          logits_dtype=mg.DTYPE_F32, renormalize=True),
                put(logits), ids, weights)
    l64 = logits.astype(np.float64)
    order = np.argsort(-l64, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(ids.numpy(), order)
    top = np.take_along_axis(l64, order, axis=1)
    w_ref = np.exp(top - top.max(axis=1, keepdims=True))
    np.testing.assert_allclose(weights.numpy(), w_ref / w_ref.sum(axis=1, keepdims=True),
                               rtol=1e-5)

    sd = mg.moe_sort_desc(tokens=tokens, experts=experts, k=k)
    ws = b.alloc(max(mg.moe_sort_workspace_bytes(sd), 1), "u8")
    offsets = poisoned(b, experts + 1, "i32")
    sorted_ids, positions = poisoned(b, tokens * k, "i32"), poisoned(b, tokens * k, "i32")
    mg.moe_sort(b, None, sd, ids, ws, ws.nbytes, offsets, sorted_ids, positions)
    flat = order.reshape(-1)
    pairs = np.argsort(flat, kind="stable")
    np.testing.assert_array_equal(offsets.numpy(), np.concatenate(
        [[0], np.cumsum(np.bincount(flat, minlength=experts))]))
    np.testing.assert_array_equal(sorted_ids.numpy(), pairs // k)
    pos_ref = np.empty_like(pairs)
    pos_ref[pairs] = np.arange(len(pairs))
    np.testing.assert_array_equal(positions.numpy(), pos_ref)

    act_bits, act = bf16_random(rng, (tokens, hidden))
    w_bits, w = bf16_random(rng, (experts, n, hidden))
    out = poisoned(b, (tokens * k, n), "bf16")
    desc = mg.moe_gemm_desc(kind=mg.MOE_GEMM_BF16, experts=experts, rows=tokens * k,
                            act_rows=tokens, n=n, k=hidden)
    ws2 = b.alloc(max(mg.moe_gemm_workspace_bytes(b, desc), 256), "u8")
    wbuf, abuf = b.asbuffer(w_bits, "bf16"), b.asbuffer(act_bits, "bf16")
    mg.moe_gemm(b, None, desc, mg.moe_gemm_tensors(
        act=abuf, sorted_token_ids=sorted_ids, expert_offsets=offsets, weight=wbuf, out=out,
        workspace=ws2, workspace_bytes=ws2.nbytes))
    expert_of_row = flat[pairs]
    want = np.stack([act[t] @ w[e].T for t, e in zip(pairs // k, expert_of_row)])
    got = bf16_values(out)
    assert_close_bf16(got, want, abs_=1e-4)

    combined = poisoned(b, (tokens, n), "bf16")
    mg.moe_combine(b, None, mg.moe_combine_desc(tokens=tokens, k=k, hidden=n), out, positions,
                   weights, None, combined)
    rows = got[pos_ref.reshape(tokens, k)]
    want_c = (rows * weights.numpy()[:, :, None].astype(np.float64)).sum(axis=1)
    assert_close_bf16(bf16_values(combined), want_c, abs_=1e-3)


# ------------------------------------------------------------------ NVFP4 and MLX formats
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6])


def nvfp4_ref(packed, scales, global_scale, n, k):
    """packed u8 [n, k/2] (low nibble first), E4M3 scales [n, k/16], FP32 global."""
    nib = np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(n, k)
    return E2M1[nib] * np.repeat(E4M3(scales), 16, axis=1) * float(global_scale)


def test_nvfp4_quantize_dequantize_gemm(b, put, rng):
    n, k = 2 * int(rng.integers(1, 20)), 16 * int(rng.integers(1, 6))
    w_bits, w = bf16_random(rng, (n, k))
    glob = np.array([mg.nvfp4_global_scale_from_amax(float(np.abs(w).max()))], np.float32)
    packed = poisoned(b, mg.nvfp4_packed_bytes(n, k), "u8")
    scales = poisoned(b, mg.nvfp4_scale_bytes(n, k), "u8")
    mg.nvfp4_quantize(b, None, n, k, k, put(w_bits), put(glob), packed, scales)
    ref = nvfp4_ref(packed.numpy().reshape(n, k // 2), scales.numpy().reshape(n, k // 16),
                    glob[0], n, k)
    # each value the nearest of its block's 16 levels, so the error is at most half a step
    step = np.repeat(E4M3(scales.numpy().reshape(n, k // 16)), 16, axis=1) * float(glob[0])
    assert (np.abs(ref - w) <= 2.0 * step + 1e-6).all()
    deq = poisoned(b, (n, k), "f32")
    mg.nvfp4_dequantize(b, None, n, k, packed, scales, put(glob), mg.DTYPE_F32, deq)
    np.testing.assert_allclose(deq.numpy(), ref, rtol=1e-6, atol=1e-7)

    m = int(rng.integers(1, 12))
    values = b.alloc(mg.nvfp4_prepared_value_bytes(n, k), "u8")
    pscales = b.alloc(mg.nvfp4_prepared_scale_bytes(n, k), "u8")
    mg.nvfp4_prepare(b, None, n, k, 1, packed, scales, values, pscales)
    gbuf = b.asbuffer(glob)
    a_bits, a = bf16_random(rng, (m, k))
    out = poisoned(b, (m, n), "bf16")
    weight = mg.nvfp4_weight(values=values, scales=pscales, global_scale=gbuf)
    mg.nvfp4_gemm(b, None, m, n, k, put(a_bits), k, weight, out, n)
    assert_close_bf16(bf16_values(out), a @ ref.T, abs_=1e-3)

    # fused: the RMSNorm prologue and the residual added in place (out is the residual stream)
    nm = mg.numerics
    x_bits, x = bf16_random(rng, (m, k), scale=3.0)
    g_bits, g = bf16_random(rng, (k,))
    r_bits, r = bf16_random(rng, (m, n))
    eps = 1e-5
    inv = 1.0 / np.sqrt((x.astype(np.float64) ** 2).mean(axis=1, keepdims=True) + eps)
    normed = nm.bf16_to_f32(nm.bf16_from_f32((x * inv * g).astype(np.float32)))
    y = nm.bf16_to_f32(nm.bf16_from_f32((normed @ ref.T).astype(np.float32)))
    stream, norm_weight = b.asbuffer(r_bits, "bf16"), b.asbuffer(g_bits, "bf16")
    fusion = mg.gemm_fusion(prologue=mg.GEMM_PROLOGUE_RMSNORM,
                            epilogue=mg.GEMM_EPILOGUE_RESIDUAL_ADD, eps=eps)
    mg.nvfp4_gemm_fusion_supported(b, m, n, k, False, fusion)
    mg.nvfp4_gemm_fused(b, None, m, n, k, put(x_bits), k, weight, None, stream, n, fusion,
                        mg.gemm_fusion_tensors(norm_weight=norm_weight.ptr, residual=stream.ptr))
    assert_close_bf16(bf16_values(stream), y + r, abs_=2e-2)
    with pytest.raises(mg.InvalidArgument, match="norm_weight"):
        mg.nvfp4_gemm_fused(b, None, m, n, k, put(x_bits), k, weight, None, stream, n, fusion,
                            mg.gemm_fusion_tensors(residual=stream.ptr))


def test_mlx_affine_dequant_and_gemv(b, put, rng):
    bits, group = 4, 32
    n, k = int(rng.integers(1, 20)), group * int(rng.integers(1, 5))
    q = rng.integers(0, 2**bits, (n, k)).astype(np.uint32)
    per = 32 // bits
    words = np.zeros((n, k // per), np.uint32)
    for j in range(per):  # element j of each word in bits [j * bits, (j + 1) * bits)
        words |= q[:, j::per] << np.uint32(j * bits)
    s_bits, s = bf16_random(rng, (n, k // group), scale=0.1)
    z_bits, z = bf16_random(rng, (n, k // group))
    wbuf, sbuf, zbuf = b.asbuffer(words), b.asbuffer(s_bits, "bf16"), b.asbuffer(z_bits, "bf16")
    lin = mg.mlx_linear(experts=1, n=n, k=k, bits=bits, group_size=group,
                        scale_type=mg.DTYPE_BF16, weight=wbuf, scales=sbuf, biases=zbuf)
    want_w = np.repeat(s, group, axis=1) * q + np.repeat(z, group, axis=1)
    # dequant rounds as mx.dequantize does: t = bf16(scale * q) (exact in FP32 first: an 8-bit
    # times a 4-bit significand), then bf16(t + bias)
    rb = lambda x: mg.numerics.bf16_to_f32(mg.numerics.bf16_from_f32(x.astype(np.float32)))
    t = rb(np.repeat(s, group, axis=1) * q)
    want_rounded = rb(t.astype(np.float32) + np.repeat(z, group, axis=1).astype(np.float32))
    deq = poisoned(b, (n, k), "bf16")
    mg.mlx_dequant(b, None, lin, 0, deq)
    np.testing.assert_array_equal(bf16_values(deq), want_rounded.astype(np.float64))
    m = int(rng.integers(1, 9))
    x_bits, x = bf16_random(rng, (m, k))
    y = poisoned(b, (m, n), "bf16")
    mg.mlx_gemv(b, None, lin, 0, m, put(x_bits), y)
    assert_close_bf16(bf16_values(y), x @ want_w.T, abs_=1e-2)
