"""ANS stack messages and craystack-style codec combinators over constriction.

A `Codec` is a pair of functions: ``push(m, x)`` encodes ``x`` onto the mutable stack ``m`` and
``pop(m)`` decodes it back (``pop`` is the exact inverse of ``push``). Big codecs are built from
small ones with `serial`, `chain`, `repeat` and `bits_back`, as in craystack (Townsend et al.),
except that our messages are mutable constriction coders rather than immutable tuples.

Initial bits for bits-back (DESIGN 2d): the encoder starts from ``Message(padding_words(N))``, a
deterministic pseudo-random stack, so that the first ``pop`` has bits to read. When encoding is
done, the bottom of the stack that no pop ever reached is still equal to a prefix of the padding;
``n = common_prefix_len(words, pad)`` words of it are dropped and only ``words[n:]`` is stored
(with ``n``). The decoder rebuilds ``concatenate([padding_words(n), words[n:]])``, which is the
encoder's final stack word for word. Every padding word is nonzero, so any prefix of the padding
is itself a valid ANS stack (constriction rejects data ending in a zero word), and
``padding_words(n)`` is a prefix of ``padding_words(N)`` for every ``n <= N``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import constriction
import numpy as np

_AnsCoder = constriction.stream.stack.AnsCoder


class Message:
    """A mutable ANS stack (constriction's AnsCoder): push encodes, pop decodes."""

    __slots__ = ("coder",)

    def __init__(self, words: np.ndarray | None = None) -> None:
        if words is None or len(words) == 0:
            self.coder = _AnsCoder()
        else:
            w = np.ascontiguousarray(words, dtype=np.uint32)
            if w.ndim != 1:
                raise ValueError("message words must be a 1-D uint32 array")
            if w[-1] == 0:
                # constriction refuses this too, but with a less helpful message.
                raise ValueError("ANS words never end in a zero word")
            self.coder = _AnsCoder(w)

    def num_bits(self) -> int:
        """Exact current size in bits (not rounded up to whole words)."""
        return int(self.coder.num_valid_bits())

    def num_words(self) -> int:
        return int(self.coder.num_words())

    def words(self) -> np.ndarray:
        """A copy of the stack as uint32 words, bottom first (what a file stores)."""
        return np.asarray(self.coder.get_compressed(), dtype=np.uint32)

    def clone(self) -> "Message":
        m = Message.__new__(Message)
        m.coder = self.coder.clone()
        return m

    def is_empty(self) -> bool:
        return bool(self.coder.is_empty())

    def __repr__(self) -> str:
        return f"Message({self.num_bits()} bits)"


@dataclass(frozen=True)
class Codec:
    """push(m, x) encodes x onto m (mutating it); pop(m) -> x is its exact inverse."""

    push: Callable[[Message, Any], None]
    pop: Callable[[Message], Any]


def serial(codecs: Sequence[Codec]) -> Codec:
    """x is a sequence with one item per codec; pop returns the items in order (a list)."""
    codecs = tuple(codecs)

    def push(m: Message, xs: Sequence[Any]) -> None:
        if len(xs) != len(codecs):
            raise ValueError(f"serial: expected {len(codecs)} items, got {len(xs)}")
        # A stack: push the last item first so that pop reads the first item first.
        for codec, x in zip(reversed(codecs), reversed(tuple(xs))):
            codec.push(m, x)

    def pop(m: Message) -> list[Any]:
        return [codec.pop(m) for codec in codecs]

    return Codec(push, pop)


def repeat(codec: Codec, n: int) -> Codec:
    """n items, each with the same codec (x a sequence of length n)."""
    return serial([codec] * n)


def chain(first: Codec, then: Callable[[Any], Codec]) -> Codec:
    """x = (x1, x2): x1 with `first`, then x2 with `then(x1)` (x2 coded given x1)."""

    def push(m: Message, x: tuple[Any, Any]) -> None:
        x1, x2 = x
        then(x1).push(m, x2)
        first.push(m, x1)

    def pop(m: Message) -> tuple[Any, Any]:
        x1 = first.pop(m)
        return x1, then(x1).pop(m)

    return Codec(push, pop)


def bits_back(
    posterior: Callable[[Any], Codec], likelihood: Callable[[Any], Codec], prior: Codec
) -> Codec:
    """Bits-back coding of x with latent z: net cost -log p(x|z) - log p(z) + log q(z|x).

    push: z ~ q(z|x) is *decoded* from the stack (taking bits off it), then x | z and z are
    encoded. pop undoes this in reverse and puts z's bits back, so the stack is restored exactly.
    """

    def push(m: Message, x: Any) -> None:
        z = posterior(x).pop(m)
        likelihood(z).push(m, x)
        prior.push(m, z)

    def pop(m: Message) -> Any:
        z = prior.pop(m)
        x = likelihood(z).pop(m)
        posterior(x).push(m, z)
        return x

    return Codec(push, pop)


# ---- initial bits -------------------------------------------------------------------------------

_M64 = (1 << 64) - 1


def _splitmix64(index: np.ndarray, seed: int) -> np.ndarray:
    """splitmix64 output number `index` (0-based) for `seed`: uint64, pure integer arithmetic.

    Written out here (not numpy's Generator) so that the padding, which the decoder must
    regenerate, never changes with the numpy version.
    """
    with np.errstate(over="ignore"):
        z = np.uint64(seed & _M64) + (index.astype(np.uint64) + np.uint64(1)) * np.uint64(
            0x9E3779B97F4A7C15
        )
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def padding_words(n: int, seed: int = 0) -> np.ndarray:
    """n deterministic pseudo-random nonzero uint32 words; padding_words(k) is a prefix of it."""
    z = _splitmix64(np.arange(n, dtype=np.uint64), seed)
    hi = (z >> np.uint64(32)).astype(np.uint32)
    lo = (z & np.uint64(0xFFFFFFFF)).astype(np.uint32) | np.uint32(1)
    # Nonzero words: any prefix must be a valid stack (ANS data never ends in a zero word).
    return np.where(hi != 0, hi, lo)


def common_prefix_len(words: np.ndarray, pad: np.ndarray) -> int:
    """How many leading words of `words` equal `pad` (the untouched bottom of the stack)."""
    n = min(len(words), len(pad))
    diff = np.flatnonzero(np.asarray(words[:n]) != np.asarray(pad[:n]))
    return int(diff[0]) if len(diff) else n
