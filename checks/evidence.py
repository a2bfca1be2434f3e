"""Blame from element-wise evidence: which leg is wrong where hand and autodiff disagree.

A tensor-wide comparison along random directions cannot blame a localised bug: the hand leg's
agreement with finite differences along a direction v allows its whole rounding budget
sum_i |v_i| tol_i, which on a large tensor is far above one wrong element's contribution.  So
when hand and autodiff disagree, the checker takes the elements that disagree most
(``WORST``), and a few random elements of the same slices (``RANDOM``: the same index along
every axis but the last), and differences the hand forward one coordinate at a time, each with
its own finite-difference tolerance eps_i.  Where the aggregate test finds a set outside its
band as well, that set's direction is examined beside them (``checks.aggregate.examine``): a
row scaled by 1.05 in half precision is a few tolerances at each element but many bands along
its row.  At element i, with tol_i the hand's rounding
tolerance there:

    FD sides with autodiff   |g_i - d_i| <= eps_i  and  |h_i - d_i| > DECISIVE (eps_i + tol_i)
    FD sides with the hand   |h_i - d_i| <= eps_i + tol_i  and  |g_i - d_i| > DECISIVE eps_i

and neither when the two legs are closer together than FD can resolve, or when FD sides with
the hand and the loss is not smooth within the step along e_i (a kink;
``FiniteDifferences._kinked``).  The kink test guards only that side.  When FD lands within
eps_i of autodiff, a kink cannot have made it agree: across a kink within the step, central
differences sit between the two one-sided slopes (at a fraction of the jump set by where the
kink lies), so a hand that took the other branch at x (a kink within rounding of x, where the
two branches meet) has FD halfway between it and autodiff, never decisively on one side; and a
kink farther away leaves hand and autodiff on the same branch at x.  Kinks within rounding of x
are already judged either way by the hand's tolerance (``RoundingModel.kinks``).  The kink test
itself is not asked there: its second differences of the loss carry the loss's rounding noise
divided by the step, which on a deep program (the whole model) reads as a kink at elements whose
gradient is small.  Blame follows that
evidence (``blame``): one element where FD sides with autodiff blames the hand.  "Oracle is
wrong" needs FD on the hand's side *and* a reason the oracle's autodiff can differ from its own
forward (``autodiff_caveats``: its forward disagrees with the kernel's, or its program holds
stop_gradient, a custom derivative rule, an integer or non-differentiable operation); without
one the verdict is unresolved and says why.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np
from jax.extend import core as jcore

from checks.verdict import Kind, Verdict

WORST = 4        # disagreeing elements examined, the worst by |h - g| / tol
RANDOM = 4       # random elements of the same slices (controls)
DECISIVE = 4.0   # the disagreeing leg must miss FD by this many of its allowances
# where central differences side with neither of two disagreeing legs (mostly: the legs lie
# closer together than their truncation bound FD_SAFETY u^(2/3) resolves, 2e-7 of the derivative
# in float64), the element is differenced again by Richardson's extrapolation, whose bound is
# FD_SAFETY u^(4/5) (3e-9): four more runs of the hand forward at each such element
FINER = {"central": "richardson"}
# primitives through which autodiff need not be the derivative of the forward
CUSTOM = {"custom_jvp_call": "a custom JVP rule (custom_jvp)",
          "custom_vjp_call": "a custom VJP rule (custom_vjp)",
          "custom_vjp_call_jaxpr": "a custom VJP rule (custom_vjp)",
          "stop_gradient": "stop_gradient"}
NON_DIFFERENTIABLE = {"floor", "ceil", "round", "sign", "argmax", "argmin", "nextafter",
                      "is_finite", "rem", "population_count"}


class Element(NamedTuple):
    """The three legs at one element of one tensor."""
    index: tuple
    hand: float
    autodiff: float
    fd: float
    fd_tol: float   # eps_i, absolute
    tol: float      # the hand's rounding tolerance tol_i at this element
    side: str       # "autodiff" or "hand" (whom FD sides with, decisively), or ""
    kinked: bool

    @property
    def disagrees(self) -> bool:
        return abs(self.hand - self.autodiff) > self.tol

    def __str__(self) -> str:  # an index, or a direction's description ("along ...")
        where = self.index if isinstance(self.index, str) else f"at {self.index}"
        return (f"{where}: hand {self.hand:.6g}, autodiff {self.autodiff:.6g}, "
                f"FD {self.fd:.6g} +- {self.fd_tol:.2g}")


def pick(ratio, rng, worst=WORST, random=RANDOM):
    """Flat indices: the `worst` largest of ratio (|h - g| / tol) above 1, then `random` random
    elements sharing all but the last index with one of them."""
    flat = ratio.reshape(-1)
    order = np.argsort(-flat, kind="stable")[:worst]
    chosen = [int(i) for i in order if flat[i] > 1]
    n = ratio.shape[-1] if ratio.ndim else 1
    for _ in range(random if chosen else 0):
        row = chosen[int(rng.integers(len(chosen)))] // n
        chosen.append(row * n + int(rng.integers(n)))
    return list(dict.fromkeys(chosen))


def examine(fd, key, x, h, g, tol, scale, indices):
    """[Element] for the flat indices: each a central difference along e_i, eps_i from FD's
    tolerance at the tensor's gradient scale (max |g|: the truncation term's size)."""
    scale = scale if scale > 0 else 1.0
    elements = []
    for i in indices:
        e = np.zeros(x.size)
        e[i] = 1.0
        e = e.reshape(x.shape)
        elements.append(along(fd, key, x, e, scale, float(h.flat[i]), float(g.flat[i]),
                              float(tol.flat[i]),
                              tuple(int(j) for j in np.unravel_index(i, x.shape))))
    return elements


def along(fd, key, x, v, scale, hand, autodiff, tol, index) -> Element:
    """The three legs along one direction v: the hand's and autodiff's derivatives along it
    (hand, autodiff), FD's with its tolerance eps at ``scale``, and tol the hand's own
    allowance along v; whom FD sides with, decisively (module docstring).  Where the legs
    disagree and central differences side with neither, Richardson's extrapolation is asked
    along the same direction (``FINER``)."""
    size = float(np.sqrt(np.mean(x * x))) if x.size else 1.0
    scheme = fd.scheme
    d, eps, side = _fd_side(fd, key, x, v, size, scale, hand, autodiff, tol, scheme)
    if not side and abs(hand - autodiff) > tol and scheme in FINER:
        scheme = FINER[scheme]
        d, eps, side = _fd_side(fd, key, x, v, size, scale, hand, autodiff, tol, scheme)
    # only FD's disagreement with autodiff needs FD to be smooth: see the module docstring
    kinked = side == "hand" and scheme != "complex" and fd._kinked(key, x, v, size, eps, scheme)
    return Element(index, hand, autodiff, float(d), eps, tol, "" if kinked else side, kinked)


def _fd_side(fd, key, x, v, size, scale, hand, autodiff, tol, scheme):
    """FD's derivative along v by scheme, its tolerance eps, and whom it sides with."""
    d, tol_of = fd.derivative(key, x, v, size, scheme)
    eps = float(tol_of(scale)) * scale
    side = ""
    if abs(autodiff - d) <= eps and abs(hand - d) > DECISIVE * (eps + tol):
        side = "autodiff"
    elif abs(hand - d) <= eps + tol and abs(autodiff - d) > DECISIVE * eps:
        side = "hand"
    return float(d), eps, side


def blame(elements, caveats, autodiff_fd_ok, kink, what="elements") -> Verdict:
    """The verdict on a tensor whose hand and autodiff gradients disagree (module docstring).
    caveats: reasons the oracle's autodiff may differ from its forward; autodiff_fd_ok: FD
    agrees with autodiff along every random direction; kink: why FD is unreliable along those
    directions, or ""; what: what the evidence was taken at (elements, or directions)."""
    disagreeing = [e for e in elements if e.disagrees]
    on_autodiff = [e for e in disagreeing if e.side == "autodiff"]
    on_hand = [e for e in disagreeing if e.side == "hand"]
    of = f"of {len(disagreeing)} disagreeing {what} examined"
    if on_autodiff:
        return Verdict(Kind.HAND_WRONG, f"FD sides with autodiff at {len(on_autodiff)} {of}, "
                                        f"{on_autodiff[0]}")
    if on_hand:
        where = f"FD sides with the hand at {len(on_hand)} {of}, {on_hand[0]}"
        if caveats:
            return Verdict(Kind.ORACLE_WRONG, f"{where}; the oracle has {', '.join(caveats)}")
        return Verdict(Kind.UNRESOLVED, f"{where}, but nothing lets the oracle's autodiff "
                                        f"differ from its forward (the forwards agree; no "
                                        f"stop_gradient, custom derivative rule or "
                                        f"non-differentiable operation)")
    kinked = [e for e in disagreeing if e.kinked]
    if kinked:
        return Verdict(Kind.UNRESOLVED, f"the loss is not smooth within FD's step at "
                                        f"{len(kinked)} {of} (a kink?), {kinked[0]}")
    if kink:
        return Verdict(Kind.UNRESOLVED, kink)
    if autodiff_fd_ok:
        # FD confirms autodiff tensor-wide; the difference is below FD's resolution at every
        # element: the hand differs from a confirmed oracle by more than rounding explains
        return Verdict(Kind.HAND_WRONG, f"below FD's resolution at the disagreeing {what}; "
                                        f"FD confirms autodiff along random directions")
    return Verdict(Kind.ALL_DISAGREE)


def autodiff_caveats(jaxpr) -> list:
    """What in a program lets its autodiff differ from the derivative of its forward: custom
    derivative rules, stop_gradient, integer or non-differentiable operations (names, sorted)."""
    found = set()

    def walk(jx):
        for eqn in jx.eqns:
            name = eqn.primitive.name
            if name in CUSTOM:
                found.add(CUSTOM[name])
            elif name in NON_DIFFERENTIABLE:
                found.add(f"a non-differentiable operation ({name})")
            elif name == "convert_element_type" and _float_to_int(eqn):
                found.add("a conversion of a float to an integer")
            for sub in _subs(eqn.params):
                walk(sub)
    walk(jaxpr)
    return sorted(found)


def _subs(params):
    for value in params.values():
        for v in value if isinstance(value, (tuple, list)) else (value,):
            if isinstance(v, jcore.ClosedJaxpr):
                yield v.jaxpr
            elif isinstance(v, jcore.Jaxpr):
                yield v


def _float_to_int(eqn):
    src = eqn.invars[0].aval.dtype
    dst = eqn.params.get("new_dtype")
    return np.issubdtype(src, np.floating) and dst is not None \
        and not np.issubdtype(np.dtype(dst), np.inexact) and np.dtype(dst) != np.bool_
