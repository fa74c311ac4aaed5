"""The CUDA backend against PyTorch: tensors passed from PyTorch without a copy (checked by
pointer), our buffers taken by torch.from_dlpack, ops against PyTorch float64, and a graph
captured from Python replayed with new inputs. Skipped without PyTorch, a GPU or a CUDA
backend in this build (CI has none of them)."""
import numpy as np
import pytest

import metrale_gpu as mg

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no CUDA device for PyTorch", allow_module_level=True)
if not mg.backend_probe_kind("cuda")["usable"]:
    pytest.skip("CUDA backend not usable: " + mg.backend_probe_kind("cuda")["reason"],
                allow_module_level=True)


@pytest.fixture(scope="module")
def cb():
    backend = mg.Backend("cuda", torch.cuda.current_device())
    yield backend
    backend.close()


def test_torch_in_and_out_without_copy(cb):
    t = torch.randn(33, 17, device="cuda")
    x = mg.from_dlpack(t, backend=cb)
    assert x.ptr == t.data_ptr() and x.shape == (33, 17) and x.dtype == mg.DTYPE_F32
    bf = torch.randn(8, 16, device="cuda").to(torch.bfloat16)
    assert mg.from_dlpack(bf, backend=cb).dtype == mg.DTYPE_BF16
    buf = cb.alloc((5, 8), "bf16")
    back = torch.from_dlpack(buf)
    assert back.data_ptr() == buf.ptr and back.dtype == torch.bfloat16
    assert back.device.index == cb.device
    with pytest.raises(BufferError, match="not C-contiguous"):
        mg.from_dlpack(t.t(), backend=cb)
    with pytest.raises(BufferError, match="lives on cpu"):
        mg.from_dlpack(torch.ones(3), backend=cb)


def test_gemm_bf16_against_torch(cb):
    m, n, k = 37, 200, 136
    a = torch.randn(m, k, device="cuda").to(torch.bfloat16)
    w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    out = torch.full((m, n), float("nan"), device="cuda")
    mg.gemm_bf16(cb, None, m, n, k, a, w, out, mg.DTYPE_F32, n)
    cb.synchronize()
    want = a.double() @ w.double().T
    torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-3 * np.sqrt(k))


def test_rmsnorm_against_torch(cb):
    rows, cols = 19, 264
    x = torch.randn(rows, cols, device="cuda").to(torch.bfloat16)
    w = torch.randn(cols, device="cuda").to(torch.bfloat16)
    out = torch.empty_like(x).fill_(float("nan"))
    mg.rmsnorm_bf16(cb, None, rows, cols, 1e-5, x, None, w, out)
    cb.synchronize()
    xd = x.double()
    want = xd / torch.sqrt((xd * xd).mean(dim=1, keepdim=True) + 1e-5) * w.double()
    torch.testing.assert_close(out.double(), want, rtol=2 ** -7, atol=1e-3)


def test_graph_replay_with_new_inputs(cb):
    m, n, k = 4, 128, 64
    s = cb.stream_create()
    act = torch.empty(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda").to(torch.bfloat16)
    out = torch.empty(m, n, device="cuda")
    a_buf, w_buf, o_buf = (mg.from_dlpack(t, backend=cb) for t in (act, w, out))
    plan = mg.gemm_plan(kind=mg.GEMM_BF16, m=m, n=n, k=k, ldc=n, out_type=mg.DTYPE_F32)
    mg.gemm_prewarm(cb, s, [plan])
    tensors = mg.gemm_tensors(act=a_buf, weight=w_buf, out=o_buf)
    torch.cuda.synchronize()
    with s.capture() as c:
        mg.gemm(cb, s, plan, tensors)
    for _ in range(3):
        act.copy_(torch.randn(m, k, device="cuda").to(torch.bfloat16))
        out.fill_(float("nan"))
        torch.cuda.synchronize()
        c.graph.launch(s)
        s.synchronize()
        torch.testing.assert_close(out.double(), act.double() @ w.double().T, rtol=1e-4,
                                   atol=1e-2)
