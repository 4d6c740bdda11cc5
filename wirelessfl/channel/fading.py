"""Small-scale fading: the power gain |h|^2 of each device's channel at a simulated time.

Models (``fading.model``), all of unit mean power E|h|^2 = 1:

* ``rayleigh``: h ~ CN(0, 1), |h|^2 ~ Exp(1) (seed 002, Sec. V);
* ``rician``: h = sqrt(K/(K+1)) + sqrt(1/(K+1)) s, s ~ CN(0, 1), K the LOS-to-scatter power ratio;
  2 (K+1) |h|^2 ~ noncentral chi^2 (2 dof, noncentrality 2K);
* ``nakagami``: |h|^2 ~ Gamma(m, 1/m), m >= 0.5 (m = 1 is Rayleigh);
* ``none``: |h|^2 = 1;
* a plugin (an entry point of group ``wirelessfl.fading`` or a ``module:attribute`` reference,
  docs/plugins.md): a class built with ``fading.options``, whose ``power(n, rng)`` gives [n]
  independent unit-mean |h|^2 draws from ``rng``, and optionally ``cdf(x)`` = P[|h|^2 <= x]
  (channel/analysis.py then computes link budgets exactly, else by Monte Carlo).

Time correlation (``fading.correlation``):

* ``iid``: a new draw for every packet (today's behaviour);
* ``block``: constant within blocks of ``coherence_time_s``, aligned to simulated time 0; a new
  draw when a packet's start time falls in a new block;
* ``gauss-markov``: the scattered part evolves as s_t = rho s_{t-dt} + sqrt(1 - rho^2) w,
  w ~ CN(0, 1), rho = J0(2 pi f_D dt) (Clarke/Jakes autocorrelation; Baddour and Beaulieu, IEEE
  Trans. Wireless Commun. 4(4), 2005, first-order AR model), f_D = v f_c / c. The lag-dt correlation
  is exact for each step; over several steps it is the product of the steps' rho (AR(1) limit).

Two ways to draw (``population.random_streams``):

* ``FadingProcess`` (shared streams): one generator, every call draws for all n devices, so the
  stream does not depend on who transmits (every run recorded before cross-device populations);
* ``KeyedFading`` (per-device streams, cross-device populations): a call draws for the devices
  it is given only, each device's values a pure function of (seed, stream, event, device)
  (``learning.seeds.counter_uniform``), so a phase costs what its transmitters cost and a device
  gets the same channel whichever other devices are drawn with it. Block fading is a draw per
  (block, device): no state. Gauss-Markov fading keeps each device's state (O(n) memory) and
  brings it forward lazily, when the device is next drawn, over the phases it sat out: the
  shared-streams engine steps every device at every phase's grid time (its start), so the lazy
  step over a gap uses the product of those steps' rho (prefix sums of log|rho| over the grid),
  and s' = rho s + sqrt(1 - rho^2) w with one innovation w is, given s, the same Gaussian as
  the step-by-step recursion (its noise variance telescopes to 1 - prod rho^2).
"""

from __future__ import annotations

import math
from typing import Any, Literal

import numpy as np
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    NonNegativeFloat,
    PositiveFloat,
    field_validator,
    model_serializer,
    model_validator,
)
from scipy import special

from wirelessfl.channel.pathloss import SPEED_OF_LIGHT_M_S
from wirelessfl.errors import UserError
from wirelessfl.learning.seeds import counter_uniform, keyed_rng
from wirelessfl.plugins import (
    FADING,
    as_value_error,
    drop_empty_options,
    name_validator,
    options_field,
)

# The built-in models (FadingConfig's own; plugins are found in plugins.FADING), one line each.
BUILTIN_FADING = {"rayleigh": "|h|^2 ~ Exp(1)", "rician": "LOS + scatter, K = fading.k_factor_db",
                  "nakagami": "|h|^2 ~ Gamma(m, 1/m)", "none": "|h|^2 = 1"}
# [D] a plugin's draws are checked for unit mean on this many draws of a private generator, to
# within PLUGIN_MEAN_TOLERANCE (relative): 12 standard errors for Exp(1) draws, so only a
# plugin that is not normalised (or whose draws have a very heavy tail) is refused.
PLUGIN_PROBE_DRAWS = 2**14
PLUGIN_MEAN_TOLERANCE = 0.1

_ONLY = {  # field -> (models, correlations) that read it; None = any
    "k_factor_db": (("rician",), None),
    "k_factor_applies_to": (("rician",), None),
    "m": (("nakagami",), None),
    "coherence_time_s": (None, ("block",)),
    "doppler_hz": (None, ("gauss-markov",)),
    "speed_mps": (None, ("gauss-markov",)),
}


class FadingConfig(BaseModel):
    """Which fading distribution, and how it evolves in simulated time."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model: str = Field(
        "rayleigh", description="distribution of |h|^2 (unit mean): rayleigh, rician, nakagami, "
                                "none, or a fading plugin's name or 'module:attribute' reference")
    correlation: Literal["iid", "block", "gauss-markov"] = Field(
        "iid", description="iid: new draw per packet; block: constant over coherence_time_s; "
                           "gauss-markov: AR(1) with rho = J0(2 pi f_D dt)")
    k_factor_db: float | None = Field(
        None, description="rician: K-factor [dB] (TR 38.901 Table 7.5-6: UMa/UMi LOS 9, InH 7)")
    k_factor_applies_to: Literal["all", "los"] | None = Field(
        None, description="rician: 'all' devices (default) or only devices in LOS (3GPP path "
                          "loss); NLOS devices then see Rayleigh fading (K = 0)")
    m: float | None = Field(None, ge=0.5, description="nakagami: shape m >= 0.5")
    coherence_time_s: PositiveFloat | None = Field(
        None, description="block: block length T_c [s] (e.g. 0.423 / f_D, Rappaport eq. 5.40c)")
    doppler_hz: NonNegativeFloat | None = Field(
        None, description="gauss-markov: maximum Doppler shift f_D [Hz]")
    speed_mps: NonNegativeFloat | None = Field(
        None, description="gauss-markov: device speed [m/s]; f_D = v f_c / c "
                          "(needs carrier_frequency_hz)")

    options: dict[str, Any] = options_field("fading")

    _dump = model_serializer(mode="wrap")(drop_empty_options)
    _known = field_validator("model")(name_validator(FADING, BUILTIN_FADING, "fading.model"))

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data):
        """``fading: rayleigh`` (the original form) means ``fading: {model: rayleigh}``."""
        return {"model": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _fields_match(self):
        for name, (models, corrs) in _ONLY.items():
            if getattr(self, name) is None:
                continue
            fix = (f"remove it (or set it to null where a profile sets it, e.g. --set "
                   f"channel.fading.{name}=null)")
            if models is not None and self.model not in models:
                raise ValueError(f"fading.{name} is only read by model {models[0]!r} but model "
                                 f"is {self.model!r}; {fix}, or set model: {models[0]}")
            if corrs is not None and self.correlation not in corrs:
                raise ValueError(f"fading.{name} is only read with correlation {corrs[0]!r} but "
                                 f"correlation is {self.correlation!r}; {fix}, or set "
                                 f"correlation: {corrs[0]}")
        if self.model == "rician":
            if self.k_factor_db is None:
                raise ValueError("fading model 'rician' needs 'k_factor_db' (the K-factor in dB, "
                                 "e.g. 9 for 3GPP UMa LOS, TR 38.901 Table 7.5-6); add it")
            if self.k_factor_applies_to is None:
                self.k_factor_applies_to = "all"
        if self.model == "nakagami":
            if self.m is None:
                raise ValueError("fading model 'nakagami' needs 'm' (shape, >= 0.5; m = 1 is "
                                 "Rayleigh); add it")
            if self.correlation == "gauss-markov":
                raise ValueError("fading correlation 'gauss-markov' evolves a complex Gaussian "
                                 "channel, which Nakagami-m fading is not; use correlation 'iid' "
                                 "or 'block' with nakagami, or model 'rayleigh'/'rician'")
        if self.model not in BUILTIN_FADING:
            if self.correlation == "gauss-markov":
                raise ValueError(f"fading correlation 'gauss-markov' evolves a complex Gaussian "
                                 f"channel, which the plugin '{self.model}' (|h|^2 draws) is "
                                 "not; use correlation 'iid' or 'block' with a plugin")
            as_value_error(lambda: check_plugin(self), "fading.model")
        elif self.options:
            raise ValueError(f"fading.options is read by fading plugins only, not by the "
                             f"built-in '{self.model}'; remove it")
        if self.correlation == "block" and self.coherence_time_s is None:
            raise ValueError("fading correlation 'block' needs 'coherence_time_s' (block length "
                             "[s], e.g. 0.423 / f_D); add it")
        if self.correlation == "gauss-markov" and \
                (self.doppler_hz is None) == (self.speed_mps is None):
            raise ValueError("fading correlation 'gauss-markov' needs exactly one of "
                             "'doppler_hz' (f_D [Hz]) or 'speed_mps' (with the channel's "
                             "carrier_frequency_hz); give one")
        return self

    def doppler(self, carrier_frequency_hz: float | None) -> float:
        """Maximum Doppler shift f_D [Hz]: doppler_hz, or v f_c / c."""
        if self.doppler_hz is not None:
            return float(self.doppler_hz)
        if self.speed_mps is None or carrier_frequency_hz is None:
            raise ValueError("fading.speed_mps needs the channel's carrier_frequency_hz")
        return float(self.speed_mps * carrier_frequency_hz / SPEED_OF_LIGHT_M_S)


def fading_plugin(config: FadingConfig) -> Any:
    """The plugin's instance, ``cls(**fading.options)`` (None for a built-in model); its
    constructor's failure is one ``UserError`` naming it."""
    if config.model in BUILTIN_FADING:
        return None
    cls = FADING.get(config.model, "fading.model")
    try:
        return cls(**config.options)
    except Exception as err:  # noqa: BLE001 - the plugin's own failure, reported as such
        raise UserError(f"fading.model: the fading plugin '{config.model}' failed to build with "
                        f"options {config.options}: {type(err).__name__}: {str(err)[:200]}") from None


def plugin_power(plugin: Any, name: str, n: int, rng: np.random.Generator) -> np.ndarray:
    """``plugin.power(n, rng)``, checked: [n] finite non-negative floats."""
    try:
        out = np.asarray(plugin.power(int(n), rng), dtype=float)
    except Exception as err:  # noqa: BLE001 - the plugin's own failure, reported as such
        raise UserError(f"fading.model: the fading plugin '{name}' failed in power({n}, rng): "
                        f"{type(err).__name__}: {str(err)[:200]}") from None
    if out.shape != (int(n),) or not np.isfinite(out).all() or (out < 0).any():
        raise UserError(f"fading.model: the fading plugin '{name}' must return {n} finite "
                        f"|h|^2 >= 0 from power({n}, rng); got shape {out.shape}")
    return out


def check_plugin(config: FadingConfig) -> None:
    """The plugin builds, draws and has unit mean on PLUGIN_PROBE_DRAWS draws of a private
    generator (the run's stream is not touched)."""
    plugin = fading_plugin(config)
    draws = plugin_power(plugin, config.model, PLUGIN_PROBE_DRAWS, np.random.default_rng(0))
    mean = float(draws.mean())
    if abs(mean - 1.0) > PLUGIN_MEAN_TOLERANCE:
        raise UserError(f"fading.model: the fading plugin '{config.model}' draws |h|^2 of mean "
                        f"{mean:.4g}, not 1 (path loss sets the mean SNR); divide its draws by "
                        "their mean")


def fading_power(n: int, kind: str, rng: np.random.Generator) -> np.ndarray:
    """Fading power gains |h|^2, shape [n]: Rayleigh -> Exp(1) (unit mean); none -> ones."""
    if kind == "rayleigh":
        return rng.standard_exponential(int(n))
    if kind == "none":
        return np.ones(int(n))
    raise ValueError(f"unknown fading {kind!r}; choose 'rayleigh' or 'none'")


def k_factor_linear(config: FadingConfig, n: int, los=None) -> np.ndarray:
    """Per-device K (linear) [n]: 10^(K_dB/10), 0 for NLOS devices when applies_to is 'los'."""
    if config.model != "rician":
        return np.zeros(n)
    k = np.full(n, 10.0 ** (config.k_factor_db / 10.0))
    if config.k_factor_applies_to == "los":
        mask = np.zeros(n, dtype=bool) if los is None else np.asarray(los, dtype=bool)
        k = np.where(mask, k, 0.0)
    return k


class FadingProcess:
    """Stateful fading of ``n`` devices, driven by one generator; ``power(t)`` is |h|^2 at time t.

    ``now_s`` is a float or a [n] array of simulated times [s] (each device's packet start).
    Every call draws for all n devices (the stream does not depend on who transmits). For the
    default rayleigh + iid, one call is exactly one ``rng.standard_exponential(n)``.
    """

    def __init__(self, n: int, config, rng: np.random.Generator, los=None):
        fading: FadingConfig = config.fading
        self.n, self.config, self.rng = int(n), fading, rng
        self._k = k_factor_linear(fading, self.n, los)
        self._plugin = fading_plugin(fading)
        self._f_d = (fading.doppler(config.carrier_frequency_hz)
                     if fading.correlation == "gauss-markov" else 0.0)
        self._block: np.ndarray | None = None  # block index per device (block correlation)
        self._gain: np.ndarray | None = None  # |h|^2 held over the block
        self._s: np.ndarray | None = None  # complex scattered part (gauss-markov)
        self._t: np.ndarray | None = None  # time of the last evaluation (gauss-markov)

    def _draw_power(self) -> np.ndarray:
        """Independent unit-mean |h|^2 for all devices (iid and block)."""
        model, n, rng = self.config.model, self.n, self.rng
        if model == "rayleigh":
            return rng.standard_exponential(n)
        if model == "none":
            return np.ones(n)
        if model == "nakagami":
            return rng.gamma(self.config.m, 1.0 / self.config.m, n)
        if self._plugin is not None:
            return plugin_power(self._plugin, model, n, rng)
        return np.abs(self._los_part() + self._scatter_scale() * self._cn(n)) ** 2  # rician

    def _cn(self, n: int) -> np.ndarray:
        """CN(0, 1) samples, shape [n]: (x + j y) / sqrt(2), x, y ~ N(0, 1)."""
        xy = self.rng.standard_normal((2, n))
        return (xy[0] + 1j * xy[1]) / np.sqrt(2.0)

    def _los_part(self) -> np.ndarray:
        return np.sqrt(self._k / (self._k + 1.0))

    def _scatter_scale(self) -> np.ndarray:
        return np.sqrt(1.0 / (self._k + 1.0))

    def coefficient(self, now_s) -> np.ndarray:
        """Complex h [n] at ``now_s`` (gauss-markov only: the state that power() squares)."""
        if self.config.correlation != "gauss-markov":
            raise ValueError("coefficient() is defined for correlation 'gauss-markov' only")
        t = np.broadcast_to(np.asarray(now_s, dtype=float), (self.n,)).copy()
        if self.config.model == "none":
            return np.ones(self.n, dtype=complex)
        if self._s is None:
            self._s = self._cn(self.n)
        else:
            rho = special.j0(2.0 * np.pi * self._f_d * np.abs(t - self._t))
            self._s = rho * self._s + np.sqrt(np.maximum(1.0 - rho**2, 0.0)) * self._cn(self.n)
        self._t = t
        return self._los_part() + self._scatter_scale() * self._s

    def power(self, now_s=0.0) -> np.ndarray:
        """|h|^2 [n] (unit mean) at simulated time ``now_s`` [s] (float or [n])."""
        corr = self.config.correlation
        if corr == "iid":
            return self._draw_power()
        if corr == "gauss-markov":
            return np.abs(self.coefficient(now_s)) ** 2
        t = np.broadcast_to(np.asarray(now_s, dtype=float), (self.n,))
        block = np.floor(t / self.config.coherence_time_s).astype(np.int64)
        if self._block is None:
            self._gain, self._block = self._draw_power(), block
        else:
            new = block != self._block
            if new.any():
                self._gain = np.where(new, self._draw_power(), self._gain)
                self._block = block
        return self._gain.copy()


def _cn_from_uniforms(u: np.ndarray) -> np.ndarray:
    """CN(0, 1) samples [n] from uniforms [n, 2] (Box-Muller: r = sqrt(-2 ln(1 - u0)),
    phase 2 pi u1, so x = r cos, y = r sin are independent N(0, 1)): (x + j y) / sqrt(2)."""
    r = np.sqrt(-2.0 * np.log1p(-u[:, 0]))
    phase = 2.0 * np.pi * u[:, 1]
    return (r * np.cos(phase) + 1j * r * np.sin(phase)) / np.sqrt(2.0)


class KeyedFading:
    """Fading of any subset of ``n`` devices, each device's draws keyed by (seed, stream, event,
    device): the per-device random streams of cross-device populations (module docstring).

    ``power(devices, now_s, event)`` gives |h|^2 [len(devices)] at times ``now_s`` [s] (a float
    or one per device); ``event`` (a tuple of ints, e.g. (phase, attempt)) keys iid draws and
    the Gauss-Markov innovations. Gauss-Markov needs the grid: ``mark(t)`` once at the start of
    every phase (the times at which the shared-streams engine steps the devices that sit out).
    Uniforms come from ``counter_uniform``, turned into each model's law by inverse transforms
    (Rayleigh -ln(1 - u); Nakagami by the inverse regularised incomplete gamma; CN(0, 1) by
    Box-Muller); a plugin draws one value per device from its own keyed generator.
    """

    def __init__(self, n: int, config, seed: int, stream: str, los=None):
        fading: FadingConfig = config.fading
        self.n, self.config, self.seed, self.stream = int(n), fading, int(seed), stream
        self._k = k_factor_linear(fading, self.n, los) if fading.model == "rician" else None
        self._plugin = fading_plugin(fading)
        self._f_d = (fading.doppler(config.carrier_frequency_hz)
                     if fading.correlation == "gauss-markov" else 0.0)
        if fading.correlation == "gauss-markov":
            self._s = np.zeros(self.n, dtype=complex)  # scattered part at each device's last draw
            self._t = np.zeros(self.n)  # time of each device's last draw [s]
            self._g = np.full(self.n, -1, dtype=np.int64)  # grid index of it; -1: never drawn
        # The grid (gauss-markov): phase start times and prefix sums over its steps of log|rho|,
        # of rho < 0 and of rho == 0; grown by doubling (they appear during the run).
        self._grid: np.ndarray | None = None  # [capacity, 4]: t, sum log|rho|, negatives, zeros
        self._grid_len = 0

    def _uniforms(self, devices: np.ndarray, event: tuple, count: int, stream: str = "") -> np.ndarray:
        return counter_uniform(self.seed, self.stream + stream, tuple(event), devices, count)

    def _independent(self, devices: np.ndarray, event: tuple, stream: str = "") -> np.ndarray:
        """Independent unit-mean |h|^2 of ``devices`` for ``event`` (iid and block)."""
        model, n = self.config.model, len(devices)
        if model == "none":
            return np.ones(n)
        if model == "rayleigh":
            return -np.log1p(-self._uniforms(devices, event, 1, stream)[:, 0])
        if model == "nakagami":
            m = self.config.m
            return special.gammaincinv(m, self._uniforms(devices, event, 1, stream)[:, 0]) / m
        if self._plugin is not None:
            return np.array([plugin_power(self._plugin, model, 1,
                                          keyed_rng(self.seed, self.stream + stream, *event,
                                                    int(i)))[0] for i in devices])
        cn = _cn_from_uniforms(self._uniforms(devices, event, 2, stream))  # rician
        return np.abs(self._los(devices) + self._scale(devices) * cn) ** 2

    def _los(self, devices):
        return np.sqrt(self._k[devices] / (self._k[devices] + 1.0))

    def _scale(self, devices):
        return np.sqrt(1.0 / (self._k[devices] + 1.0))

    def mark(self, t: float) -> None:
        """A phase starts at ``t`` [s]: a grid point of the lazy Gauss-Markov steps (a no-op for
        the other correlations)."""
        if self.config.correlation != "gauss-markov":
            return
        if self._grid is None or self._grid_len == len(self._grid):
            grown = np.zeros((max(64, 2 * self._grid_len), 4))
            if self._grid is not None:
                grown[:self._grid_len] = self._grid
            self._grid = grown
        row = np.zeros(4)
        row[0] = t
        if self._grid_len:
            last = self._grid[self._grid_len - 1]
            rho = float(special.j0(2.0 * np.pi * self._f_d * abs(t - last[0])))
            row[1:] = last[1:] + (math.log(abs(rho)) if rho else 0.0, rho < 0, rho == 0)
        self._grid[self._grid_len] = row
        self._grid_len += 1

    def _rho(self, dt) -> np.ndarray:
        return special.j0(2.0 * np.pi * self._f_d * np.abs(dt))

    def _correlation(self, g: np.ndarray, t_last: np.ndarray, t: np.ndarray) -> np.ndarray:
        """The product of the step-by-step recursion's rho from each device's last draw (grid
        index ``g``, time ``t_last``) to ``t`` in the current phase: directly when it was drawn
        in this phase or the one before; else over the grid starts of the phases it sat out."""
        c = self._grid_len - 1
        rho = self._rho(t - t_last)
        far = (g >= 0) & (g < c - 1)
        if far.any():
            grid = self._grid
            a, b = g[far] + 1, c - 1  # it sat out phases a..b: drawn at their starts
            first = self._rho(grid[a, 0] - t_last[far])
            last = self._rho(t[far] - grid[b, 0])
            middle = np.exp(grid[b, 1] - grid[a, 1]) * np.where(
                (grid[b, 2] - grid[a, 2]) % 2, -1.0, 1.0) * (grid[b, 3] == grid[a, 3])
            rho[far] = first * middle * last
        return rho

    def coefficient(self, devices: np.ndarray, now_s, event: tuple) -> np.ndarray:
        """Complex h of ``devices`` at ``now_s`` (gauss-markov only), each brought forward from
        its last draw (a device drawn for the first time gets a fresh CN(0, 1) scattered part:
        the recursion's marginal law)."""
        if self.config.correlation != "gauss-markov":
            raise ValueError("coefficient() is defined for correlation 'gauss-markov' only")
        if self._grid_len == 0:
            raise ValueError("mark(t) the phase's start before the first gauss-markov draw")
        devices = np.asarray(devices, dtype=np.int64)
        if self.config.model == "none":
            return np.ones(len(devices), dtype=complex)
        t = np.broadcast_to(np.asarray(now_s, dtype=float), devices.shape)
        g = self._g[devices]
        w = _cn_from_uniforms(self._uniforms(devices, event, 2))
        rho = self._correlation(g, self._t[devices], t)
        s = np.where(g < 0, w, rho * self._s[devices]
                     + np.sqrt(np.maximum(1.0 - rho**2, 0.0)) * w)
        self._s[devices], self._t[devices], self._g[devices] = s, t, self._grid_len - 1
        if self._k is None:
            return s
        return self._los(devices) + self._scale(devices) * s

    def power(self, devices, now_s, event: tuple) -> np.ndarray:
        """|h|^2 [len(devices)] (unit mean) of ``devices`` at ``now_s`` [s] for ``event``."""
        devices = np.asarray(devices, dtype=np.int64)
        corr = self.config.correlation
        if corr == "iid":
            return self._independent(devices, event)
        if corr == "gauss-markov":
            return np.abs(self.coefficient(devices, now_s, event)) ** 2
        t = np.broadcast_to(np.asarray(now_s, dtype=float), devices.shape)
        block = np.floor(t / self.config.coherence_time_s).astype(np.int64)
        out = np.empty(len(devices))
        for b in np.unique(block):  # one draw per (block, device): no state to keep
            here = block == b
            out[here] = self._independent(devices[here], (int(b),), "/block")
        return out
