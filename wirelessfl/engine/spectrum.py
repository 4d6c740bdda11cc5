"""A shared pool of uplink sub-bands: devices that are ready to send queue for a free sub-band.

The pool has C equal sub-bands (TDMA when C = 1). Whenever a sub-band is free and devices wait,
the scheduler grants it to the waiting device with the best priority; the device holds it for its
whole upload (all ARQ attempts), then releases it. Two readings of the same rule, which the tests
check against each other:

* ``schedule_uploads``: list scheduling in one pass over a heap (the vectorized engine; it reads
  the arrays of the devices it is given, all N or, with per-device streams, the phase's own);
* ``SharedSpectrum``: a SimPy component the per-device processes request and release (the
  processes engine). Grants are decided in a zero-delay event after every request and release,
  so devices that become ready at the same instant all compete (none wins by arrival order).

Priorities (smaller first) come from ``scheduler_priorities``: round-robin rotates the order by
one device per upload phase, so over N phases every device is served first, second, ... once;
proportional-fair ranks by instantaneous rate over the device's average served rate (Jalali,
Padovani and Pankaj, "Data throughput of CDMA-HDR", IEEE VTC 2000), ties in round-robin order.
"""

from __future__ import annotations

import heapq

import numpy as np
import simpy

PF_TIME_CONSTANT_PHASES = 100.0  # t_c of the PF average (Jalali et al. 2000 use 1000 slots) [D]


def scheduler_priorities(scheduler: str, phase: int, rate_bps: np.ndarray,
                         average_bps: np.ndarray, devices: np.ndarray | None = None,
                         num_devices: int | None = None) -> np.ndarray:
    """Priority keys [N, 2] (lexicographic, smaller is served first) for one upload phase;
    with ``devices`` (int indices of ``num_devices``), the keys [n, 2] of those devices only
    (rates and averages aligned with them), the same rows the whole population's keys hold."""
    n = len(rate_bps)
    if devices is None:
        rotation = (np.arange(n) - phase) % n
    else:
        rotation = (np.asarray(devices, dtype=np.int64) - phase) % num_devices
    if scheduler == "round-robin":
        return np.stack([np.zeros(n), rotation.astype(float)], axis=1)
    if scheduler == "proportional-fair":
        metric = np.asarray(rate_bps, float) / np.maximum(np.asarray(average_bps, float), 1e-30)
        return np.stack([-metric, rotation.astype(float)], axis=1)
    raise ValueError(f"unknown scheduler {scheduler!r}; choose round-robin or proportional-fair")


def schedule_uploads(ready_s: np.ndarray, duration_s: np.ndarray, priority: np.ndarray,
                     channels: int, active: np.ndarray) -> np.ndarray:
    """Start time [s] of each active device's upload on a pool of ``channels`` sub-bands.

    ready_s [N]: when each device has its packet; duration_s [N]: how long it holds a sub-band;
    priority [N, 2]: lexicographic keys, smaller first. Inactive devices get start = ready.
    O(N log N): one heap of sub-band free times and one of waiting devices.
    """
    start = np.array(ready_s, dtype=float)
    order = [int(i) for i in np.flatnonzero(active)]
    order.sort(key=lambda i: ready_s[i])
    free = [float("-inf")] * channels
    waiting: list[tuple[float, float, int]] = []
    nxt, now = 0, float("-inf")
    while nxt < len(order) or waiting:
        t = max(heapq.heappop(free), now)  # decisions never go back in time
        if not waiting:  # nobody queued: the sub-band idles until the next device is ready
            t = max(t, float(ready_s[order[nxt]]))
        while nxt < len(order) and ready_s[order[nxt]] <= t:
            i = order[nxt]
            heapq.heappush(waiting, (float(priority[i, 0]), float(priority[i, 1]), i))
            nxt += 1
        _, _, i = heapq.heappop(waiting)
        start[i] = now = t
        heapq.heappush(free, t + float(duration_s[i]))
    return start


class SharedSpectrum:
    """The pool as a SimPy component: ``request(i, key)`` -> event fired at the grant,
    ``release()`` when the upload ends."""

    def __init__(self, env: simpy.Environment, channels: int):
        self.env = env
        self.free = channels
        self._waiting: list[tuple[float, float, int, simpy.Event]] = []
        self._decision_pending = False

    def request(self, device: int, key) -> simpy.Event:
        granted = self.env.event()
        heapq.heappush(self._waiting, (float(key[0]), float(key[1]), device, granted))
        self._schedule_decision()
        return granted

    def withdraw(self, granted: simpy.Event) -> None:
        """Take a request that was never granted out of the queue (its device gave up)."""
        self._waiting = [w for w in self._waiting if w[3] is not granted]
        heapq.heapify(self._waiting)

    def release(self) -> None:
        self.free += 1
        self._schedule_decision()

    def _schedule_decision(self) -> None:
        if not self._decision_pending:
            self._decision_pending = True
            self.env.timeout(0).callbacks.append(self._decide)

    def _decide(self, _event) -> None:
        self._decision_pending = False
        while self.free and self._waiting:
            *_, granted = heapq.heappop(self._waiting)
            self.free -= 1
            granted.succeed(self.env.now)
