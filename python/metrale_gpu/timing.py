"""Timing spans and the Chrome trace export (metrale/timing.h)."""
import ctypes as C

from ._lib import check, lib, timing_counters, timing_options, timing_summary

TELEMETRY_OFF, TELEMETRY_BASIC, TELEMETRY_KERNEL = 0, 1, 2
TIMING_LANE, TIMING_KERNEL = 0, 1


def _s(stream):
    return None if stream is None else stream.handle


class Timing:
    """mg_timing: lanes and kernel spans recorded with device events, summarised per name and
    exported as a Chrome trace. `Timing(b, level=TELEMETRY_KERNEL, kernel_span_every=1)`."""

    def __init__(self, backend, level=TELEMETRY_BASIC, pool_pairs=0, kernel_span_every=0,
                 trace_capacity=0, epoch_interval_ms=0):
        opts = timing_options(level=level, pool_pairs=pool_pairs,
                              kernel_span_every=kernel_span_every, trace_capacity=trace_capacity,
                              epoch_interval_ms=epoch_interval_ms)
        h = C.c_void_p()
        check(lib.mg_timing_create(backend.handle, opts, C.byref(h)), "mg_timing_create")
        self.backend, self._h = backend, h.value

    def lane(self, name):
        out = C.c_uint32()
        check(lib.mg_timing_lane(self._h, name.encode(), C.byref(out)), "mg_timing_lane")
        return out.value

    def step_begin(self, step):
        check(lib.mg_timing_step_begin(self._h, step), "mg_timing_step_begin")

    def kernel_spans_armed(self):
        return bool(lib.mg_timing_kernel_spans_armed(self._h))

    def lane_begin(self, lane, stream=None):
        span = C.c_uint64()
        check(lib.mg_timing_lane_begin(self._h, lane, _s(stream), C.byref(span)),
              "mg_timing_lane_begin")
        return span.value

    def kernel_begin(self, name, stream=None):
        span = C.c_uint64()
        check(lib.mg_timing_kernel_begin(self._h, name.encode(), _s(stream), C.byref(span)),
              "mg_timing_kernel_begin")
        return span.value

    def span_end(self, span, stream=None):
        check(lib.mg_timing_span_end(self._h, span, _s(stream)), "mg_timing_span_end")

    def trace_launches(self, on):
        check(lib.mg_timing_trace_launches(self._h, bool(on)), "mg_timing_trace_launches")

    def harvest(self):
        n = C.c_size_t()
        check(lib.mg_timing_harvest(self._h, C.byref(n)), "mg_timing_harvest")
        return n.value

    def counters(self):
        c = timing_counters()
        check(lib.mg_timing_get_counters(self._h, C.byref(c)), "mg_timing_get_counters")
        return {f: getattr(c, f) for f, _ in timing_counters._fields_}

    def summaries(self):
        """Per name: dict(name, kind, count, total_us, min_us, max_us, p50_us, p99_us)."""
        out = []
        for i in range(lib.mg_timing_summary_count(self._h)):
            s = timing_summary()
            check(lib.mg_timing_summary_get(self._h, i, C.byref(s)), "mg_timing_summary_get")
            d = {f: getattr(s, f) for f, _ in timing_summary._fields_}
            d["name"] = s.name.decode()
            out.append(d)
        return out

    def export_chrome_trace(self, path):
        check(lib.mg_timing_export_chrome_trace(self._h, str(path).encode()),
              "mg_timing_export_chrome_trace")

    def destroy(self):
        h, self._h = self._h, None
        if h and self.backend._h:
            check(lib.mg_timing_destroy(h), "mg_timing_destroy")

    def __del__(self):
        if getattr(self, "_h", None) and self.backend._h:
            lib.mg_timing_destroy(self._h)


timing_create = Timing
