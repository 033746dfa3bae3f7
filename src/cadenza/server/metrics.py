"""Prometheus metrics in the text exposition format (version 0.0.4), written by hand: no client library needed.

Counters: requests by endpoint and status, audio seconds produced, client disconnects. Histograms: first-chunk
latency (request received -> first audio ready to send) and real-time factor (synthesis wall time / audio
duration) per endpoint. Gauges read at scrape time: the scheduler's active and queued requests and the server's
admitted (in-flight) requests.
"""

from __future__ import annotations

import bisect
import threading
from collections import defaultdict

FIRST_CHUNK_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0)
RTF_BUCKETS = (0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 5.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: dict[str, str]) -> str:
    return "{" + ",".join(f'{k}="{_escape(str(v))}"' for k, v in pairs.items()) + "}" if pairs else ""


def _num(x: float) -> str:
    return repr(float(x)) if x != int(x) or abs(x) >= 1e15 else str(int(x))


class _Histogram:
    def __init__(self, buckets: tuple[float, ...]) -> None:
        self.buckets = buckets
        self.counts = [0] * (len(buckets) + 1)  # last: +Inf only
        self.total = 0.0
        self.n = 0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += 1
        self.total += value
        self.n += 1

    def lines(self, name: str, labels: dict[str, str]) -> list[str]:
        out, running = [], 0
        for bound, count in zip((*self.buckets, float("inf")), self.counts):
            running += count
            le = "+Inf" if bound == float("inf") else _num(bound)
            out.append(f"{name}_bucket{_labels({**labels, 'le': le})} {running}")
        out += [f"{name}_sum{_labels(labels)} {_num(self.total)}", f"{name}_count{_labels(labels)} {self.n}"]
        return out


class Metrics:
    """Thread-safe metric registry of one server."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[tuple[str, str], int] = defaultdict(int)
        self._first_chunk: dict[str, _Histogram] = {}
        self._rtf: dict[str, _Histogram] = {}
        self._audio_seconds = 0.0
        self._disconnects = 0

    def count_request(self, endpoint: str, status: int | str) -> None:
        with self._lock:
            self._requests[(endpoint, str(status))] += 1

    def observe_first_chunk(self, endpoint: str, seconds: float) -> None:
        with self._lock:
            self._first_chunk.setdefault(endpoint, _Histogram(FIRST_CHUNK_BUCKETS)).observe(seconds)

    def observe_synthesis(self, endpoint: str, wall_seconds: float, audio_seconds: float) -> None:
        with self._lock:
            self._audio_seconds += audio_seconds
            if audio_seconds > 0:
                self._rtf.setdefault(endpoint, _Histogram(RTF_BUCKETS)).observe(wall_seconds / audio_seconds)

    def count_disconnect(self) -> None:
        with self._lock:
            self._disconnects += 1

    def render(self, active: int, queued: int, inflight: int) -> str:
        """The exposition text; the gauges are passed in (read from the scheduler at scrape time)."""
        with self._lock:
            lines = ["# HELP cadenza_requests_total Requests by endpoint and HTTP status (WebSocket: close code).",
                     "# TYPE cadenza_requests_total counter"]
            for (endpoint, status), n in sorted(self._requests.items()):
                lines.append(f"cadenza_requests_total{_labels({'endpoint': endpoint, 'status': status})} {n}")
            lines += ["# HELP cadenza_first_chunk_seconds Time from request to the first audio chunk.",
                      "# TYPE cadenza_first_chunk_seconds histogram"]
            for endpoint, hist in sorted(self._first_chunk.items()):
                lines += hist.lines("cadenza_first_chunk_seconds", {"endpoint": endpoint})
            lines += ["# HELP cadenza_real_time_factor Synthesis wall time divided by audio duration.",
                      "# TYPE cadenza_real_time_factor histogram"]
            for endpoint, hist in sorted(self._rtf.items()):
                lines += hist.lines("cadenza_real_time_factor", {"endpoint": endpoint})
            lines += ["# HELP cadenza_audio_seconds_total Seconds of audio produced.",
                      "# TYPE cadenza_audio_seconds_total counter", f"cadenza_audio_seconds_total {_num(self._audio_seconds)}",
                      "# HELP cadenza_client_disconnects_total Requests cancelled because the client went away.",
                      "# TYPE cadenza_client_disconnects_total counter", f"cadenza_client_disconnects_total {self._disconnects}"]
        lines += ["# HELP cadenza_active_requests Requests the engine is generating now.",
                  "# TYPE cadenza_active_requests gauge", f"cadenza_active_requests {active}",
                  "# HELP cadenza_queue_depth Requests waiting for an engine slot.",
                  "# TYPE cadenza_queue_depth gauge", f"cadenza_queue_depth {queued}",
                  "# HELP cadenza_inflight_requests Synthesis requests the server has admitted.",
                  "# TYPE cadenza_inflight_requests gauge", f"cadenza_inflight_requests {inflight}"]
        return "\n".join(lines) + "\n"
