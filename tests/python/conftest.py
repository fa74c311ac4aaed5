"""Shared fixtures of the Python tests: a CPU backend per test, a seeded generator (the seed is
printed; METRALE_TEST_SEED=N repeats a run) and the NumPy float64 references' helpers."""
import os
import random

import numpy as np
import pytest

import metrale_gpu as mg

SEED = int(os.environ.get("METRALE_TEST_SEED", random.SystemRandom().randrange(2**32)))


def pytest_report_header(config):
    return "metrale_gpu seed %d (METRALE_TEST_SEED replays it), library %s" % (
        SEED, mg.library_path)


@pytest.fixture
def rng(request):
    return np.random.default_rng([SEED, abs(hash(request.node.name)) % 2**32])


# The backend the op and model tests run on: "cpu" (the default, CI), or "cuda" on a GPU
# machine (bench/gpu_python.sh), where the same tests compare CUDA with NumPy float64.
BACKEND = os.environ.get("METRALE_PY_BACKEND", "cpu")


@pytest.fixture
def b():
    # CPU device 0 is from_dlpack's default backend, so the tests take device 1
    backend = mg.Backend("cpu", 1) if BACKEND == "cpu" else mg.Backend(BACKEND, 0)
    yield backend
    backend.close()


@pytest.fixture
def put(b):
    """A host NumPy input as an op takes it on `b`: as it is on the CPU backend (DLPack, no
    copy), copied into a new buffer of the backend elsewhere (an op refuses host memory
    there)."""
    if b.kind_name == "cpu":
        return lambda x: x
    return b.asbuffer


def bf16_random(rng, shape, scale=1.0):
    """Random BF16 bits and their exact float64 values."""
    bits = mg.numerics.bf16_from_f32((rng.standard_normal(shape) * scale).astype(np.float32))
    return bits, mg.numerics.bf16_to_f32(bits).astype(np.float64)


def poisoned(b, shape, dtype):
    """An output buffer filled with 0xFF bytes (NaN in every float type) before the op."""
    buf = b.alloc(shape, dtype)
    buf.fill_bytes(0xFF)
    return buf


def bf16_values(buf):
    return mg.numerics.bf16_to_f32(buf.numpy()).astype(np.float64)


def assert_close_bf16(got, want, rel=2.0 ** -7, abs_=1e-6):
    """BF16 outputs: at most one rounding (half an ulp: 2^-9 relative) beyond the FP32 result;
    the bound allows a few ulps for FP32 accumulation order."""
    assert got.shape == want.shape
    assert np.isfinite(got).all(), "output left unwritten (NaN poison) or non-finite"
    err = np.abs(got - want)
    bound = rel * np.abs(want) + abs_ + rel * np.abs(want).max() * 0.05
    worst = np.argmax(err - bound)
    assert (err <= bound).all(), "worst at %s: got %r want %r" % (
        np.unravel_index(worst, got.shape), got.flat[worst], want.flat[worst])
