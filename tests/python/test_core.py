"""Backends, buffers, streams, events, graphs and error translation."""
import numpy as np
import pytest

import metrale_gpu as mg


def test_probe_and_info(b):
    p = mg.backend_probe_kind("cpu")
    assert p["compiled_in"] and p["usable"] and p["device_count"] >= 1
    info = b.device_get_info()
    assert info["name"].startswith("CPU") and info["total_bytes"] > 0
    assert b.kind == mg.BACKEND_CPU and b.kind_name == "cpu"
    assert b.supports(mg.CAP_GRAPHS)


def test_errors_carry_status_and_message(b):
    with pytest.raises(mg.InvalidArgument) as e:
        mg.gemm_bf16(b, None, 4, 4, 4, 0, 0, 0, mg.DTYPE_BF16, 4)
    assert e.value.status == 1 and e.value.status_name == "MG_ERR_INVALID_ARGUMENT"
    assert "act" in e.value.message and e.value.message == mg.last_error()
    with pytest.raises(mg.Error) as e:
        mg.Backend("cpu", b.device)  # already open in this process
    assert e.value.status_name == "MG_ERR_BUSY" and "open" in e.value.message
    with pytest.raises(mg.InvalidArgument):
        mg.Backend("cpu", 12345)
    with pytest.raises(mg.InvalidArgument, match="unknown backend kind"):
        mg.Backend("tpu")
    with pytest.raises(mg.Error) as e:
        mg.Backend("metal")
    assert e.value.status_name == "MG_ERR_UNAVAILABLE"


def test_buffer_round_trip_and_ledger(b, rng):
    before = b.ledger_live()
    a = rng.standard_normal((37, 13)).astype(np.float32)
    buf = b.asbuffer(a)
    assert buf.shape == (37, 13) and buf.dtype_name == "f32" and buf.nbytes == a.nbytes
    assert np.array_equal(buf.numpy(), a)
    assert b.ledger_live()[1] == before[1] + 1
    buf.free()
    assert b.ledger_live() == before
    with pytest.raises(mg.InvalidArgument, match="bytes"):
        b.alloc((3,), "f32").copy_from_host(np.zeros(4, np.float32))


def test_views(b):
    buf = b.alloc((6, 8), "bf16")
    assert buf.view("u8").shape == (6, 16)
    assert buf.reshape(48).shape == (48,)
    with pytest.raises(mg.InvalidArgument, match="whole"):
        b.alloc((3,), "u8").view("f32")


def test_streams_events_async_copies(b, rng):
    s = b.stream_create()
    a = rng.integers(0, 255, 1001, dtype=np.uint8)
    buf = b.alloc(1001, "u8")
    buf.copy_from_host(a, stream=s)
    e0, e1 = b.event_create(), b.event_create()
    e0.record(s)
    out = b.alloc(1001, "u8")
    out.copy_from(buf, stream=s)
    e1.record(s)
    e1.synchronize()
    assert e1.query()
    assert e0.elapsed_ms(e1) >= 0
    b.default_stream.wait_event(e1)
    assert np.array_equal(out.numpy(), a)
    s.destroy()


def test_graph_capture_replays_with_new_inputs(b, rng):
    """A graph captured from Python reads its buffers at replay: new inputs, new outputs."""
    s = b.stream_create()
    m, n, k = 5, 24, 40
    act = b.alloc((m, k), "bf16")
    w_bits, w = _bf16(rng, (n, k))
    weight = b.asbuffer(w_bits, "bf16")
    out = b.alloc((m, n), "f32")
    with s.capture() as c:
        assert s.is_capturing()
        mg.gemm_bf16(b, s, m, n, k, act, weight, out, mg.DTYPE_F32, n)
        with pytest.raises(mg.Capturing):
            b.alloc(16)
    g = c.graph
    for _ in range(3):
        a_bits, a = _bf16(rng, (m, k))
        act.copy_from_host(a_bits)
        out.fill_bytes(0xFF)
        g.launch(s)
        s.synchronize()
        np.testing.assert_allclose(out.numpy(), a @ w.T, rtol=1e-5, atol=1e-5)
    g.destroy()
    with pytest.raises(mg.InvalidArgument):
        g.launch(s)
    # an exception inside the block aborts the capture; the stream is usable again
    with pytest.raises(RuntimeError):
        with s.capture():
            raise RuntimeError("stop")
    assert not s.is_capturing()


def _bf16(rng, shape):
    bits = mg.numerics.bf16_from_f32(rng.standard_normal(shape).astype(np.float32))
    return bits, mg.numerics.bf16_to_f32(bits).astype(np.float64)


def test_numerics_match_the_library():
    x = np.array([1.0, 1.00390625, 1.01171875, -3.3, 65504.0, 1e-40, np.inf], np.float32)
    bits = mg.numerics.bf16_from_f32(x)
    from metrale_gpu._lib import lib
    lib.mg_f32_to_bf16.restype = __import__("ctypes").c_uint16
    lib.mg_f32_to_bf16.argtypes = [__import__("ctypes").c_float]
    assert [int(v) for v in bits] == [lib.mg_f32_to_bf16(float(v)) for v in x]


def test_timing_and_trace(b, tmp_path):
    t = mg.Timing(b, level=mg.TELEMETRY_KERNEL, kernel_span_every=1)
    lane = t.lane("python")
    buf = b.alloc(4096, "u8")
    for step in range(3):
        t.step_begin(step)
        span = t.lane_begin(lane)
        k = t.kernel_begin("memset")
        buf.fill_bytes(step)
        t.span_end(k)
        t.span_end(span)
    b.synchronize()
    t.harvest()
    names = {s["name"]: s for s in t.summaries()}
    assert names["python"]["count"] == 3 and names["memset"]["count"] == 3
    assert t.counters()["recorded"] == 6
    path = tmp_path / "trace.json"
    t.export_chrome_trace(path)
    import json
    events = json.loads(path.read_text())
    text = json.dumps(events)
    assert "python" in text and "memset" in text
    with pytest.raises(mg.InvalidArgument):
        t.span_end(span)  # ended twice
    t.destroy()


def test_api_version_matches_the_headers():
    # the binding's declarations follow include/metrale/gpu.h: its MG_API_VERSION, the
    # library's mg_api_version() and the binding's API_VERSION are one number
    import pathlib
    import re
    from metrale_gpu import _lib
    header = pathlib.Path(__file__).resolve().parents[2] / "include" / "metrale" / "gpu.h"
    declared = int(re.search(r"#define MG_API_VERSION (\d+)", header.read_text()).group(1))
    assert _lib.lib.mg_api_version() == declared == _lib.API_VERSION
