"""The columns of the fused kernel `[U | S | w_beta]` that the fast schedules apply to
h_{t-1} in one product (the decoder's own step makes one product per kernel)."""

from typing import NamedTuple

import tensorflow as tf


class HiddenLayout(NamedTuple):
    """The columns of the fused kernel `[U | S | w_beta]` applied to h_{t-1}.

    Attributes:
      gates: 4n, the LSTM's U.
      score: width of the score's slice (the additive score's U_a: A; dot: 0).
      gated: whether the last column is the gate's w_beta.
    """

    gates: int
    score: int
    gated: bool

    @property
    def width(self) -> int:
        return self.gates + self.score + int(self.gated)

    def split(self, projected, gate_bias=None):
        """(B, W) `h [U | S | w_beta]` -> (gates (B, 4n), score input (B, S) or None,
        gate logit (B, 1) with `gate_bias` added, or None)."""
        gates = projected[:, : self.gates]
        score_in = projected[:, self.gates : self.gates + self.score] if self.score else None
        gate_logit = projected[:, self.gates + self.score :] + gate_bias if self.gated else None
        return gates, score_in, gate_logit

    def join(self, d_gates, d_score_in, d_gate_logit):
        """The inverse of `split` for gradients: (B, W) from the three parts."""
        parts = [d_gates]
        if self.score:
            parts.append(d_score_in)
        if self.gated:
            parts.append(d_gate_logit)
        return tf.concat(parts, -1)
