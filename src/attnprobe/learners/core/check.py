"""Functional check: compare a recovered model with the oracle on fresh random sequences (one typed result)."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from attnprobe.errors import ConfigError

DEFAULT_LENGTHS = (1, 2, 4, 8, 16)


@dataclass(frozen=True)
class CheckResult:
    """The one check result every learner reports: ``passed`` is True only when ``error <= tolerance``.

    ``error`` is the relative error of the recovered model's answers on ``queries`` fresh sequences;
    ``tolerance`` is the largest error a correct model can show at the answers' precision and declared noise.
    ``extra`` holds what a particular check adds (``sign_agreement`` for yes/no answers); :meth:`to_dict` is its
    JSON form (the error under ``relative_error``).
    """

    passed: bool
    error: float
    tolerance: float
    queries: int
    lengths: tuple[int, ...] = ()
    per_length: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        """``passed``, ``failed`` or ``uncertified`` (the answers resolve ``f − c`` too coarsely to tell whether
        the error is within the tolerance: :func:`check_verdict`)."""
        if self.passed:
            return "passed"
        return "uncertified" if self.extra.get("verdict") == "uncertified" else "failed"

    def describe(self) -> str:
        """One clause saying why a check did not pass (for notes and the CLI's one line)."""
        if self.verdict == "uncertified":
            return (f"the answers cannot certify it: they resolve f − c only to {self.extra['resolution']:.1e} "
                    f"(their rounding at their size: a bias large against f − c, or noise), too coarse to show the "
                    f"check error {self.error:.3e} is within the tolerance {self.tolerance:.1e} a pass certifies "
                    f"at this precision (their rounding explains up to {self.extra['explained']:.1e}), on "
                    f"{self.queries} fresh queries")
        said = (f"functional check error {self.error:.3e}"
                + (" (largest relative error of a length)" if self.extra.get("norm") == "worst" else "")
                + f" > tolerance {self.tolerance:.1e} on {self.queries} fresh "
                "queries")
        explained = self.extra.get("explained")
        if explained is not None and explained > self.tolerance and self.error <= explained:
            said += (f" (rounding at the answers' size, a bias included, explains errors up to {explained:.1e} "
                     f"from the learner, but a pass certifies {self.tolerance:.1e} of f − c)")
        return said

    def to_dict(self) -> dict:
        out = {"passed": self.passed, "relative_error": self.error, "tolerance": self.tolerance,
               "queries": self.queries, "lengths": list(self.lengths), "per_length": dict(self.per_length)}
        out.update(self.extra)
        out["verdict"] = self.verdict
        return out


def check_queries(lengths=DEFAULT_LENGTHS, per_length: int = 8) -> int:
    return len(lengths) * per_length


#: a correct model's check error stays below CHECK_EPS_FACTOR roundings of the answers (eps·RMS |f|): the
#: learned parameters carry the answers' rounding, amplified by the sigmoid inversions and the division by v
#: (measured worst case ~2,600 roundings, exact at float32 on an ill-conditioned seed; python
#: benchmarks/check_calibration.py, docs/benchmarks/precision.md "The functional check: calibration of its tolerance")
CHECK_EPS_FACTOR = 1e4
#: ... plus this multiple of the declared additive noise τ + 3σ (measured worst case ~1,600: 4-decimal rounding)
CHECK_NOISE_FACTOR = 3e3
#: relative errors below this are never held against a model (float64 roundoff of the check itself)
CHECK_FLOOR = 1e-6
#: no model whose error exceeds this share of the input-dependent part f − c passes, at any precision or noise:
#: a model that wrong does not describe the oracle, whatever the answers' precision explains
CHECK_CAP = 0.1


#: the check's norms: ``rms`` (relative RMS over every answer) or ``worst`` (per length the largest |error| over the
#: largest |f − ĉ|, and the worst length's: what "within ε at every length" claims)
CHECK_NORMS = ("rms", "worst")


def functional_check(oracle, model, rng: np.random.Generator, lengths=DEFAULT_LENGTHS, per_length: int = 8,
                     *, scale: float = 1.0, input_fn=None, noise=None, norm: str = "rms") -> CheckResult:
    """Relative error ``‖f̂(X) − f(X)‖ / ‖f(X) − ĉ‖`` on fresh Gaussian sequences of each length.

    ``norm="worst"``: the error is the largest over lengths of ``max |f̂ − f| / max |f − ĉ|`` on that length's
    sequences (relative to each length's own spread: long sequences average their values and answer less, so an
    error that grows with the length hides in the RMS; measured on the float32 RoPE route at d = 32, RMS 2.4e-4 where
    the worst length was 2.2e-3 off), and ``passed`` bounds that.

    The error is measured against the part of the answers that depends on X (``ĉ``: the mean of the answers), so a
    large bias cannot hide a wrong W, and a wrong model cannot pick its own denominator. ``input_fn(N, count, rng)``
    may supply the sequences; the default draws rows with i.i.d. N(0, scale²) entries. Costs
    ``len(lengths) * per_length`` oracle queries. ``passed`` is False when the error exceeds what the answers'
    rounding and declared noise explain (:func:`check_tolerance`; ``noise`` replaces ``oracle.noise``, e.g. by
    a tolerance the caller declares), and always above ``CHECK_CAP``.
    """
    d = oracle.d
    before = oracle.queries
    answers = []
    for N in lengths:
        X = input_fn(N, per_length, rng) if input_fn else scale * rng.standard_normal((per_length, N, d))
        answers.append((N, oracle(X), np.asarray(model(X), dtype=np.float64)))
    # the constant part is taken from the answers (their mean, () or (K,)), never from the model: a wrong model
    # with a huge c (cancelled by its other terms) would otherwise make any error look small; for a right model
    # ‖y − ȳ‖ ≤ ‖y − c‖ (the mean minimises the sum of squares), so the check only gets stricter
    c_hat = np.mean(np.concatenate([y for _, y, _ in answers]), axis=0)
    per = {}
    num = den = mag = 0.0
    for N, y, yh in answers:
        e2, n2 = float(np.sum((yh - y) ** 2)), float(np.sum((y - c_hat) ** 2))
        per[int(N)] = float(np.sqrt(e2 / n2) if n2 > 0 else np.sqrt(e2))
        num += e2
        den += n2
        mag += float(np.sum(y**2))
    rel = float(np.sqrt(num / den) if den > 0 else np.sqrt(num))
    count = max(1, len(lengths) * per_length)
    rms_answer, rms_signal = np.sqrt(mag / count), np.sqrt(den / count)
    tolerance = check_tolerance(oracle, rms_signal, rms_signal, noise)
    resolution = answer_resolution(oracle, rms_answer, rms_signal, noise)
    explained = check_tolerance(oracle, rms_answer, rms_signal, noise)
    extra = {"per_length_count": per_length, "measured_on": "f - c"}
    if norm == "worst":
        rel, per, resolution, explained = _worst_length(oracle, answers, c_hat, noise)
        extra.update(norm="worst", rms_error=float(np.sqrt(num / den) if den > 0 else np.sqrt(num)))
    elif norm != "rms":
        raise ConfigError(f"the check's norm must be one of {', '.join(CHECK_NORMS)}; got {norm!r}", param="norm")
    verdict = check_verdict(rel, tolerance, resolution, explained)
    return CheckResult(passed=verdict == "passed", error=rel, tolerance=float(tolerance),
                       queries=oracle.queries - before, lengths=tuple(map(int, lengths)), per_length=per,
                       extra={**extra, "verdict": verdict, "resolution": resolution, "explained": explained})


def _worst_length(oracle, answers, c_hat, noise):
    """The ``worst`` norm of :func:`functional_check`: per length ``max |f̂ − f| / max |f − ĉ|``, the largest of
    them, and the largest per-length resolution and rounding-explained error (each length's answers' size against
    its own spread)."""
    per, worst, resolution, explained = {}, 0.0, 0.0, 0.0
    for N, y, yh in answers:
        y = np.asarray(y, dtype=np.float64)
        signal, size = float(np.max(np.abs(y - c_hat))), float(np.max(np.abs(y)))
        err = float(np.max(np.abs(yh - y)))
        per[int(N)] = err / signal if signal > 0 else err
        worst = max(worst, per[int(N)])
        resolution = max(resolution, answer_resolution(oracle, size, signal, noise))
        explained = max(explained, check_tolerance(oracle, size, signal, noise))
    return float(worst), per, float(resolution), float(explained)


def check_tolerance(oracle, rms_answer: float, rms_signal: float | None = None, noise=None) -> float:
    """Largest relative check error (on ``f − c``, RMS ``rms_signal``) a correct model can show: the answers'
    rounding ``CHECK_EPS_FACTOR·eps·rms_answer`` (``oracle.eps``: the answers' precision and declared relative
    rounding) plus ``CHECK_NOISE_FACTOR·(τ + 3σ)`` of declared noise, relative to ``rms_signal``;
    at least ``CHECK_FLOOR`` and at most ``CHECK_CAP``. ``noise``: the answers' noise if not ``oracle.noise``.

    The functional check passes models against ``rms_answer = rms_signal`` (the bound a pass certifies at this
    precision, whatever the bias); with the answers' own RMS it is what their rounding at that size *explains*
    (reported as ``explained``: a bias c rounds with the answers and the learned parameters carry it)."""
    noise = oracle.noise if noise is None else noise
    rms_signal = rms_answer if rms_signal is None else rms_signal
    absolute = (CHECK_EPS_FACTOR * oracle.eps * rms_answer
                + CHECK_NOISE_FACTOR * (noise.tolerance + 3 * noise.sigma))
    tol = absolute / rms_signal if rms_signal > 0 else CHECK_CAP
    return float(min(CHECK_CAP, max(CHECK_FLOOR, tol)))


def answer_resolution(oracle, rms_answer: float, rms_signal: float, noise=None) -> float:
    """How finely the answers resolve ``f − c``: the relative error a perfect model shows on them, their rounding
    ``eps·RMS|f|`` (a bias c included: it rounds with the answers) plus declared noise ``τ + 3σ``, over
    ``RMS|f − c|``. A check error is known only to within this."""
    noise = oracle.noise if noise is None else noise
    absolute = oracle.eps * rms_answer + noise.tolerance + 3 * noise.sigma
    return float(absolute / rms_signal) if rms_signal > 0 else float("inf")


def check_verdict(error: float, tolerance: float, resolution: float, explained: float | None = None) -> str:
    """``passed`` when the model's true error on ``f − c`` is certainly within ``tolerance`` (error + resolution ≤
    tolerance); ``uncertified`` when the answers cannot tell: the error is within ``resolution`` of the tolerance,
    or the answers resolve ``f − c`` more coarsely than the tolerance at all and the error is no larger than what
    their rounding ``explained`` (e.g. float64 answers of a head with c = 1e11 resolve f − c to ~1e-5, above the
    1e-6 a float64 pass certifies); else ``failed``."""
    if error + resolution <= tolerance:
        return "passed"
    if error - resolution <= tolerance:
        return "uncertified"
    coarse = resolution > tolerance and explained is not None and error <= explained
    return "uncertified" if coarse else "failed"
