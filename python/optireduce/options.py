"""The communicator options (optiOptions_t) in Python: each one from the keyword arguments when
given, else from the OPTIREDUCE_* environment (the library's own parser, so a variable means the
same in C and in Python). Bad values raise ValueError naming the option."""

import ctypes
import os

from . import _library as L
from .errors import check

_MODES = {"exact": L.EXACT, "bounded": L.BOUNDED}
_GATHER_MODES = {"exact": L.EXACT, "bounded": L.BOUNDED, "started": L.UNTIL_STARTED}
_ERASURES = {"rescale": L.ERASURE_RESCALE, "zero": L.ERASURE_ZERO}
_INCAST_NAMES = {"max": L.INCAST_MAX, "auto": L.INCAST_AUTO}
_GATHER_FILLS = {"zero": L.GATHER_FILL_ZERO, "own": L.GATHER_FILL_OWN}

# keyword -> (field of optiOptions_t, environment variable the default comes from)
FIELDS = {
    "mode": ("mode", "OPTIREDUCE_ALLREDUCE_MODE"),
    "incast": ("incast", "OPTIREDUCE_INCAST"),
    "hadamard": ("hadamard", "OPTIREDUCE_HADAMARD"),
    "hadamard_block": ("hadamardBlock", "OPTIREDUCE_HADAMARD_BLOCK"),
    "erasure": ("erasure", None),
    "safeguard": ("safeguard", "OPTIREDUCE_SAFEGUARD"),
    "safeguard_redo": ("safeguardRedo", "OPTIREDUCE_SAFEGUARD_REDO"),
    "exact_below": ("exactBelowBytes", "OPTIREDUCE_EXACT_BELOW"),
    "nonfinite_agree": ("nonfiniteAgree", "OPTIREDUCE_NONFINITE_AGREE"),
    "allgather_mode": ("allgatherMode", "OPTIREDUCE_ALLGATHER_MODE"),
    "gather_fill": ("gatherFill", "OPTIREDUCE_GATHER_FILL"),
}


def _bad(name, value, want):
    return ValueError(f"optireduce: option {name}={value!r}: {want}")


def _bool(name, v):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int) and v in (0, 1):
        return v
    raise _bad(name, v, "must be True or False")


def _int(name, v, lo, hi=None):
    if isinstance(v, bool) or not isinstance(v, int):
        raise _bad(name, v, "must be an integer")
    if v < lo or (hi is not None and v > hi):
        raise _bad(name, v, f"must be in [{lo}, {hi if hi is not None else 'inf'}]")
    return v


def _convert(name, v):
    if name == "mode":
        if v not in _MODES:
            raise _bad(name, v, "must be 'exact' or 'bounded'")
        return _MODES[v]
    if name == "allgather_mode":
        if v not in _GATHER_MODES:
            raise _bad(name, v, "must be 'started', 'bounded' or 'exact'")
        return _GATHER_MODES[v]
    if name == "gather_fill":
        if v not in _GATHER_FILLS:
            raise _bad(name, v, "must be 'zero' or 'own'")
        return _GATHER_FILLS[v]
    if name == "erasure":
        if v not in _ERASURES:
            raise _bad(name, v, "must be 'rescale' or 'zero'")
        return _ERASURES[v]
    if name == "incast":
        if isinstance(v, str):
            if v not in _INCAST_NAMES:
                raise _bad(name, v, "must be an integer >= 1, 'max' or 'auto'")
            return _INCAST_NAMES[v]
        return _int(name, v, 1, 1 << 20)
    if name in ("hadamard", "safeguard_redo", "nonfinite_agree"):
        return _bool(name, v)
    if name == "hadamard_block":
        v = _int(name, v, 2, 1 << 24)
        if v & (v - 1):
            raise _bad(name, v, "must be a power of two")
        return v
    if name == "safeguard":
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v <= 1:
            raise _bad(name, v, "must be a number in [0, 1]")
        return float(v)
    if name == "exact_below":
        return _int(name, v, 0, 1 << 30)
    raise TypeError(f"optireduce: unknown option {name!r} (known: {', '.join(FIELDS)})")


def resync_steps(value=None):
    """The PyTorch hook's resync_steps: the argument, else OPTIREDUCE_RESYNC_STEPS (which the
    library validates too), else 20. An integer in [0, 1000000]; 0 turns the resync off."""
    if value is None:
        raw = os.environ.get("OPTIREDUCE_RESYNC_STEPS", "").strip()
        if not raw:
            return 20
        try:
            value = int(raw, 10)
        except ValueError:
            raise ValueError(f"optireduce: OPTIREDUCE_RESYNC_STEPS={raw!r}: must be an integer "
                             "in [0, 1000000]") from None
        if not 0 <= value <= 1_000_000:
            raise ValueError(f"optireduce: OPTIREDUCE_RESYNC_STEPS={raw!r}: must be an integer "
                             "in [0, 1000000]")
        return value
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 1_000_000:
        raise _bad("resync_steps", value, "must be an integer in [0, 1000000]")
    return value


def make_options(**kwargs):
    """optiOptions_t from the environment, overridden by the keyword arguments that are not None."""
    for name in kwargs:
        if name not in FIELDS:
            raise TypeError(f"optireduce: unknown option {name!r} (known: {', '.join(FIELDS)})")
    opts = L.Options()
    lib = L.load_library()
    # The library reads and validates OPTIREDUCE_*: a bad variable fails here, naming it.
    check(lib.optiOptionsDefault(ctypes.byref(opts)), "reading the OPTIREDUCE_* environment")
    for name, value in kwargs.items():
        if value is not None:
            setattr(opts, FIELDS[name][0], _convert(name, value))
    return opts


def describe(opts):
    """The options as a dict of the Python names and values (for logs and tests)."""
    modes = {v: k for k, v in _MODES.items()}
    erasures = {v: k for k, v in _ERASURES.items()}
    incasts = {v: k for k, v in _INCAST_NAMES.items()}
    gather_fills = {v: k for k, v in _GATHER_FILLS.items()}
    gather_modes = {v: k for k, v in _GATHER_MODES.items()}
    return {
        "mode": modes.get(opts.mode, opts.mode),
        "incast": incasts.get(opts.incast, opts.incast),
        "hadamard": bool(opts.hadamard),
        "hadamard_block": opts.hadamardBlock,
        "erasure": erasures.get(opts.erasure, opts.erasure),
        "safeguard": opts.safeguard,
        "safeguard_redo": bool(opts.safeguardRedo),
        "exact_below": opts.exactBelowBytes,
        "nonfinite_agree": bool(opts.nonfiniteAgree),
        "allgather_mode": gather_modes.get(opts.allgatherMode, opts.allgatherMode),
        "gather_fill": gather_fills.get(opts.gatherFill, opts.gatherFill),
    }
