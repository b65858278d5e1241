"""Draws one at a time, exactly as NumPy's Generator makes them, at a fraction of the cost of calling it per draw.

The collation's randomness is keyed by step (`batching.Collator.rng`), and some objectives draw row by row, because
a row's draw depends on the draw before it (NSP: a coin, then a partner only when the coin says so). Each scalar
call into a Generator costs ~0.4-1.2 us, most of it call overhead; over a window of 4,096 rows that is several
milliseconds a window. `OneByOne` takes the 64-bit words of the generator's PCG64 in blocks and computes from them
the numbers `random()` and `integers(m)` return, in the same order, leaving the generator in the state those calls
would have left it in (`close`), so that every later draw of the batch is unchanged too.

What it follows (NumPy's C sources, unchanged since NumPy 1.17):
- `random()` is `(next_uint64 >> 11) * 2**-53`;
- `integers(m)` (int64, 0 <= result < m) is 0 without a draw for m = 1, and otherwise Lemire's bounded method on
  `next_uint32`, which takes the low half of a fresh 64-bit word and keeps its high half for the next call
  (`has_uint32`, `uinteger` in the generator's state);
- a generator other than PCG64 is drawn from directly (`of` returns None).
tests/test_input_path.py checks both numbers and the final state against the Generator's own calls. No Ray here.
"""
from __future__ import annotations

import numpy as np

_BLOCK = 1024
_MASK32 = 0xFFFFFFFF
_TO_UNIT = 1.0 / 9007199254740992.0  # 2**-53


class OneByOne:
    """`random()` and `integers(m)` of a PCG64 Generator, computed from its 64-bit words. Call `close()` when done:
    it moves the generator to exactly where the same calls on it would have left it."""

    def __init__(self, rng: np.random.Generator):
        self._bg = rng.bit_generator
        self._start = self._bg.state
        self._has32 = bool(self._start["has_uint32"])
        self._u32 = int(self._start["uinteger"])
        self._words: list[int] = []
        self._used = 0

    @classmethod
    def of(cls, rng: np.random.Generator) -> "OneByOne | None":
        return cls(rng) if type(rng.bit_generator) is np.random.PCG64 else None

    def _word(self) -> int:
        if self._used == len(self._words):
            self._words += self._bg.random_raw(_BLOCK).tolist()
        w = self._words[self._used]
        self._used += 1
        return w

    def random(self) -> float:
        return (self._word() >> 11) * _TO_UNIT

    def _uint32(self) -> int:
        if self._has32:
            self._has32 = False
            return self._u32
        w = self._word()
        self._has32, self._u32 = True, w >> 32
        return w & _MASK32

    def integers(self, m: int) -> int:
        if m < 1 or m > _MASK32:
            raise ValueError(f"OneByOne.integers draws from 1 to 2**32 - 1 values, got {m}")
        if m == 1:
            return 0
        prod = self._uint32() * m
        if (prod & _MASK32) < m:
            threshold = (_MASK32 - (m - 1)) % m
            while (prod & _MASK32) < threshold:
                prod = self._uint32() * m
        return prod >> 32

    def close(self) -> None:
        state = self._start
        self._bg.state = state
        self._bg.advance(self._used)
        moved = self._bg.state
        moved["has_uint32"], moved["uinteger"] = int(self._has32), self._u32  # a used half stays, as in NumPy
        self._bg.state = moved
