"""What a worker saves in a checkpoint besides the tables: its tick and random generator, as arrays.

An app registers ``client.checkpoint_state(provider)``; the provider returns plain numpy arrays
(written as ``.npy``, no pickle), and ``client.restored_state()`` gives them back when the job
resumes. These helpers turn the pieces every app has into such arrays and back.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from bosen.errors import BosenError

_MASK = (1 << 64) - 1


def rng_state(rng: np.random.Generator) -> np.ndarray:
    """A PCG64 generator's whole state as uint64 words (its 128-bit numbers split in two)."""
    st = rng.bit_generator.state
    if st["bit_generator"] != "PCG64":
        raise BosenError(f"cannot save a {st['bit_generator']} generator: use numpy.random.default_rng (PCG64)")
    s, inc = st["state"]["state"], st["state"]["inc"]
    return np.array([s & _MASK, s >> 64, inc & _MASK, inc >> 64, st["has_uint32"], st["uinteger"]],
                    dtype=np.uint64)


def set_rng_state(rng: np.random.Generator, words: np.ndarray) -> None:
    """Put ``rng`` back in the state ``rng_state`` saved."""
    w = [int(x) for x in words]
    rng.bit_generator.state = {"bit_generator": "PCG64",
                               "state": {"state": w[0] | (w[1] << 64), "inc": w[2] | (w[3] << 64)},
                               "has_uint32": w[4], "uinteger": w[5]}


def restored(saved: Mapping[str, np.ndarray] | None, names: tuple[str, ...]) -> dict[str, np.ndarray] | None:
    """The arrays ``names`` of a restored state, or None if there is none; a missing one is an error
    (a checkpoint written by another app or version)."""
    if saved is None:
        return None
    missing = [n for n in names if n not in saved]
    if missing:
        raise BosenError(f"the checkpoint this job resumes from has no worker state {missing[0]!r} "
                         f"(it holds: {', '.join(sorted(saved)) or 'nothing'})")
    return {n: saved[n] for n in names}
