"""Neurons from a line's gradient jumps, oriented by the network's linear part v, and (coarse answers) settled on
the polished neurons: which side of its hyperplane each neuron is active on (:mod:`.orientation` solves the ±1
program), weak neurons flipped when the answers say so, and how well a neuron set explains every answer."""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from attnprobe.errors import UnidentifiableError
from attnprobe.learners.ffn.answers import Answers
from attnprobe.learners.ffn.fit import (POLISH_ROUNDS, Neurons, fit_output_bias, jump_neurons, linear_rest_neurons,
                                        polish, polish_answers, polish_rounds)
from attnprobe.learners.ffn.more_lines import needs_another_line
from attnprobe.learners.ffn.options import FFNOptions
from attnprobe.learners.ffn.orientation import Orientation, closest_signs, orientation_matrix, solve_signs
from attnprobe.learners.ffn.regions import hyperplane_normals

#: coarse answers: times the orientation is solved again on the polished neurons (and flipped ones polished)
SETTLE_ROUNDS = 3
#: coarse answers: the weakest neurons whose orientation is tried the other way when the answers are missed
FLIP_TRIES = 6


@dataclass(frozen=True)
class Oriented:
    """Neurons with their orientation: ``rest`` is the part of the linear part v they leave unexplained (carried by
    extra neuron pairs when the orientation is not exact), ``notes`` what a result built on them must say."""

    neurons: Neurons
    notes: tuple[str, ...]
    orientation: Orientation
    rest: np.ndarray


def orient_neurons(J, where, segs, v, opts: FFNOptions, eps: float, lifted: bool, *,
                   provisional: bool = False) -> Oriented:
    """Neurons from the jumps, oriented by the linear part v (K, d). When no ±1 orientation reproduces v
    (antiparallel neurons, or none found in time), pairs of extra neurons carry the linear rest ``½ρᵀx``;
    ``provisional`` (coarse answers, whose jumps are known to ~1e-3 only): the ±1 vector closest to v instead,
    to be settled on the polished neurons (:func:`settle`)."""
    K, d = v.shape
    dim = d + int(lifted)
    if J.shape[0] == 0 and lifted:
        raise UnidentifiableError("no kink on the search line: the answers are affine in the input, so no neuron is "
                                  "visible (all dead, or zero output weights)")
    if J.shape[0] == 0:  # bias-free: the odd part alone (extra neurons below); the check judges the result
        N, C = np.zeros((dim, 0)), np.zeros((0, K))
    else:
        N, C = jump_neurons(J, hyperplane_normals(J), np.array([segs[si].direction for si in where]).T)
    M = orientation_matrix(N, C, d)
    orient = _signs(M, v, opts, eps, closest=provisional)
    dirs, weights = N * orient.signs[None, :], C
    rest = v - (M @ orient.signs).reshape(K, d)
    neurons = Neurons(dirs, weights, np.zeros(K if lifted else 0))
    if not orient.exact and not provisional:
        return Oriented(*with_linear_rest(neurons, rest, v, orient, dim), orient, rest)
    return Oriented(neurons, (), orient, rest)


def with_linear_rest(neurons: Neurons, rest, v, orient, dim: int) -> tuple[Neurons, tuple[str, ...]]:
    """When no ±1 orientation reproduces v: pairs of extra neurons carry the linear rest ``½ρᵀx``, and a note says
    so. Returns the neurons and the note."""
    d = v.shape[1]
    extra_dirs, extra_w = linear_rest_neurons(rest, dim, d, tiny=0.0)
    neurons = Neurons(np.concatenate([neurons.dirs, extra_dirs], axis=1),
                      np.concatenate([neurons.weights, extra_w]), neurons.c)
    note = (f"neuron orientations not pinned down ({orient.how}): extra neuron pairs carry the linear part ½ρᵀx "
            f"with ‖ρ‖/‖v‖ = {np.linalg.norm(rest) / max(np.linalg.norm(v), 1e-300):.2e}; the network computes the "
            "same function but its neurons are not the target's")
    return neurons, (note,)


def _signs(M: np.ndarray, v: np.ndarray, opts: FFNOptions, eps: float, closest: bool = False):
    """Orientations ``ε`` with ``M ε ≈ vec(v)`` (:func:`solve_signs`; coarse answers accept the closest ±1 vector
    within a quarter of the weakest column). ``closest``: when none fits, the ±1 vector closest to v in L1 (not
    exact)."""
    col = np.linalg.norm(M, axis=0)
    scale_v = max(float(np.linalg.norm(v)), float(np.sum(col)), 1e-300)
    coarse = eps > 1e-12
    tol = max(1e-6 if coarse else 1e-8, 1e4 * eps) * scale_v
    loose = 0.25 * float(col.min()) if coarse and col.size else 0.0
    orient = solve_signs(M, v.reshape(-1), tol, opts.sign_time_limit, loose=loose)
    if orient.exact or not closest or M.shape[1] == 0:
        return orient
    near = closest_signs(M, v.reshape(-1), opts.sign_time_limit)
    return orient if near is None else Orientation(near, False, "closest ±1 vector (provisional)")


def settles_on_polish(ask: Answers, m: int) -> bool:
    """Whether m neurons' orientations are settled on the polished neurons (:func:`settle`): while their polish may
    run until settled (:func:`polish_rounds`); larger networks keep the jumps' orientation (each settling and flip
    is a whole polish: at d = 64, m = 16 the search took 53 s instead of 16 s)."""
    n_fit = polish_answers(ask.dim, m, ask.lifted)
    return polish_rounds(n_fit, ask.dim * m) >= POLISH_ROUNDS


def settle(neurons: Neurons, v, opts: FFNOptions, ask: Answers, fit_data) -> Oriented:
    """Coarse answers: orientations fixed on the polished neurons. The jumps of thin regions and weak neurons are
    off by up to ~0.1 rad on float32 answers, too far for the ±1 vector that reproduces v to stand out; the
    polished columns are ~1e-5 off, so the orientation is solved again on them, flipped neurons are polished once
    more (a flip changes the activation pattern), up to :data:`SETTLE_ROUNDS` times. When still no ±1 vector
    fits, extra neuron pairs carry the linear rest (as :func:`orient_neurons`). ``fit_data``: the polish answers (None:
    no polish, the orientation is solved once more on the neurons as they are)."""
    d = ask.d
    m = neurons.dirs.shape[1]
    for _ in range(SETTLE_ROUNDS):
        M = orientation_matrix(neurons.dirs, neurons.weights, d)
        orient = _signs(M, v, opts, ask.oracle.eps)
        near = closest_signs(M, v.reshape(-1), opts.sign_time_limit) if orient.exact else None
        if near is not None and np.linalg.norm(M @ near - v.reshape(-1)) < np.linalg.norm(M @ orient.signs
                                                                                          - v.reshape(-1)):
            orient = Orientation(near, True, "closest ±1 vector (0/1 program)")
        if not orient.exact or np.all(orient.signs > 0):
            break
        neurons = replace(neurons, dirs=neurons.dirs * orient.signs[None, :])
        if fit_data is not None:
            neurons = repolish(neurons, ask, fit_data)
    if orient.exact and fit_data is not None:
        neurons = flip_weak(neurons, ask, fit_data)
    rest = linear_rest(neurons, v, d)
    if orient.exact:
        return Oriented(neurons, (), Orientation(np.ones(m), True, orient.how + ", on the polished neurons"), rest)
    neurons, notes = with_linear_rest(neurons, rest, v, orient, ask.dim)
    if fit_data is not None:
        neurons, _ = polish(neurons, *fit_data, ask.lifted)
    return Oriented(neurons, notes, orient, rest)


def linear_rest(neurons: Neurons, v, d: int) -> np.ndarray:
    """The part of the linear part v (K, d) that the neurons, each oriented as it is, leave unexplained."""
    M = orientation_matrix(neurons.dirs, neurons.weights, d)
    return v - (M @ np.ones(neurons.dirs.shape[1])).reshape(v.shape)


def flip_weak(neurons: Neurons, ask: Answers, fit_data) -> Neurons:
    """A neuron whose linear part ``c·n`` is within v's rounding (the weakest ones) cannot be oriented from v; a
    wrong orientation shows as answers the polished network misses. While it misses some, each of the
    :data:`FLIP_TRIES` weakest neurons is flipped and polished in turn, and a flip kept when it halves the miss."""
    eps = ask.oracle.eps
    miss = consistency(neurons, ask)
    weak = np.argsort(np.linalg.norm(neurons.weights, axis=1) * np.linalg.norm(neurons.dirs[:ask.d], axis=0))
    for k in weak[:FLIP_TRIES]:
        if not needs_another_line(True, miss, eps):
            break
        dirs = neurons.dirs.copy()
        dirs[:, k] *= -1
        trial = repolish(replace(neurons, dirs=dirs), ask, fit_data)
        got = consistency(trial, ask)
        if got < 0.5 * miss:
            neurons, miss = trial, got
    return neurons


def repolish(neurons: Neurons, ask: Answers, fit_data) -> Neurons:
    """Neurons whose orientation changed, polished again on the polish answers ``fit_data`` (the output bias refitted
    first when lifted: a flip changes every activation pattern)."""
    if ask.lifted:
        neurons = replace(neurons, c=fit_output_bias(neurons, *fit_data))
    return polish(neurons, *fit_data, ask.lifted)[0]


def consistency(neurons: Neurons, ask: Answers) -> float:
    """Largest miss of the neurons' answers over every answer asked so far, relative to the largest answer."""
    Zs, Ys = ask.all()
    return float(np.max(np.abs(neurons.values(Zs) - Ys)) / max(ask.top, 1e-300))
