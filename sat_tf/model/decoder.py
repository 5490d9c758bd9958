"""The attention LSTM decoder (paper §3.1.2, §4).

One step, given the previous word y_{t-1}, state (h_{t-1}, c_{t-1}) and annotations a:
  e_t = f_att(a, h_{t-1});  alpha_t = softmax(e_t)
  z_t = beta_t * sum_i alpha_ti a_i                      (soft, beta_t = sigmoid(f_beta(h)))
  z_t = a_{s_t},  s_t ~ Multinoulli(alpha_t)              (hard; argmax at inference)
  z_t = beta_t * a_{s_t}                                  (hard with `hard_gate`)
  z_t = mean_i a_i                                        (none: the no-attention ablation)
  i, f, o, g = split(W_e E y_{t-1} + U h_{t-1} + Z z_t + b)
  c_t = sigmoid(f) c_{t-1} + sigmoid(i) tanh(g);  h_t = sigmoid(o) tanh(c_t)
  p(y_t) = softmax(L_o dropout(tanh(E y_{t-1} + L_h h_t + L_z z_t)))

Under teacher forcing everything that does not depend on t runs once outside the
recurrence: `W_a a`, the embedding half of the gates, and the deep output over all steps.
The h-dependent projections (LSTM gates, additive score, beta gate) share one matmul.
Soft attention in float32 runs the recurrence in `recurrence.py`, whose hand-written
backward pass computes the kernel gradients once over all steps.
"""

import keras
import tensorflow as tf

from sat_tf.model import attention as attention_lib
from sat_tf.model import recurrence

ATTENTION_TYPES = ("soft", "hard", "none")


def _uniform(features):
    """(B, L) float32 weights 1/L: the "attention" of the no-attention ablation."""
    return tf.ones(tf.shape(features)[:2]) / tf.cast(tf.shape(features)[1], tf.float32)


@keras.saving.register_keras_serializable(package="sat_tf")
class AttentionDecoder(keras.layers.Layer):
    """Attention LSTM with init MLPs and deep output.

    Args:
      vocab_size: number of output words V.
      embed_dim: word embedding size m.
      hidden_dim: LSTM size n.
      attention_dim: hidden size of the additive score.
      attention: "soft", "hard" or "none".
      attention_score: "additive" or "dot".
      dropout: dropout rate before L_o.
      hard_gate: hard attention only: scale the sampled annotation by the gate
        beta_t = sigmoid(f_beta(h_{t-1})) that soft attention has (paper §4.2.1), so the
        decoder can turn a glimpse down without moving where it looks.
    """

    def __init__(
        self,
        vocab_size,
        embed_dim=64,
        hidden_dim=256,
        attention_dim=64,
        attention="soft",
        attention_score="additive",
        dropout=0.2,
        hard_gate=False,
        **kwargs,
    ):
        super().__init__(**kwargs)
        if attention not in ATTENTION_TYPES:
            raise ValueError(f"attention={attention!r} is not one of {ATTENTION_TYPES}")
        if attention_score not in attention_lib.SCORES:
            raise ValueError(f"attention_score={attention_score!r} is not additive or dot")
        self.vocab_size = vocab_size
        self.embed_dim = embed_dim
        self.hidden_dim = hidden_dim
        self.attention_dim = attention_dim
        self.attention = attention
        self.attention_score = attention_score
        self.dropout = dropout
        self.hard_gate = bool(hard_gate) and attention == "hard"

        self.embedding = keras.layers.Embedding(vocab_size, embed_dim, name="embedding")
        self.init_h = keras.layers.Dense(hidden_dim, activation="tanh", name="init_h")
        self.init_c = keras.layers.Dense(hidden_dim, activation="tanh", name="init_c")
        self.f_att = None
        if attention != "none":
            units = attention_dim if attention_score == "additive" else hidden_dim
            self.f_att = attention_lib.SCORES[attention_score](units, name="f_att")
        gated = attention == "soft" or self.hard_gate
        self.beta = keras.layers.Dense(1, name="beta") if gated else None
        self.lstm_embed = keras.layers.Dense(4 * hidden_dim, name="lstm_embed")
        self.lstm_hidden = keras.layers.Dense(4 * hidden_dim, use_bias=False, name="lstm_hidden")
        self.lstm_context = keras.layers.Dense(4 * hidden_dim, use_bias=False, name="lstm_context")
        self.out_h = keras.layers.Dense(embed_dim, name="L_h")
        self.out_z = keras.layers.Dense(embed_dim, use_bias=False, name="L_z")
        self.out_dropout = keras.layers.Dropout(dropout)
        self.deep_output = keras.layers.Dense(vocab_size, name="deep_output")
        # True runs soft attention through the autodiff loop too: the reference for
        # `recurrence.soft_attention_recurrence` in tests and benchmarks.
        self._autodiff_recurrence = False

    def build(self, features_shape, captions_shape=None):
        feature_dim = features_shape[-1]
        n = self.hidden_dim
        self.embedding.build((None, None))
        self.init_h.build((None, feature_dim))
        self.init_c.build((None, feature_dim))
        if self.f_att is not None:
            self.f_att.build((None, None, feature_dim), (None, n))
        if self.beta is not None:
            self.beta.build((None, n))
        self.lstm_embed.build((None, None, self.embed_dim))
        self.lstm_hidden.build((None, n))
        self.lstm_context.build((None, feature_dim))
        self.out_h.build((None, None, n))
        self.out_z.build((None, None, feature_dim))
        self.deep_output.build((None, None, self.embed_dim))

    def _hidden_kernel(self):
        """[U | U_a | w_beta]: every projection of h_{t-1}, applied as one matmul."""
        kernels = [self.lstm_hidden.kernel]
        if self.attention_score == "additive" and self.f_att is not None:
            kernels.append(self.f_att.u_a.kernel)
        if self.beta is not None:
            kernels.append(self.beta.kernel)
        return tf.concat(kernels, axis=1)

    def _split_hidden(self, projected_h):
        """Splits the fused h projection into (gates, score input, beta logit)."""
        n4 = 4 * self.hidden_dim
        gates = projected_h[:, :n4]
        rest = projected_h[:, n4:]
        score_in = None
        if self.attention_score == "additive" and self.f_att is not None:
            score_in, rest = rest[:, : self.f_att.units], rest[:, self.f_att.units :]
        beta_logit = rest + tf.cast(self.beta.bias, rest.dtype) if self.beta is not None else None
        return gates, score_in, beta_logit

    def _scores(self, projected, score_in, h):
        """(B, L) attention scores e_t from the hoisted projection."""
        if self.attention_score == "additive":
            pre = tf.tanh(projected + score_in[:, None, :])  # (B, L, A)
            return tf.squeeze(self.f_att.v(pre), -1)  # (B, L)
        return self.f_att.score(projected, h)

    def _lstm(self, gates, c):
        h, c, _ = recurrence.lstm_cell(gates, c)
        return h, c

    def initial_state(self, features):
        """State before the first word (paper eq. 5).

        Args:
          features: (B, L, D) annotation vectors.

        Returns:
          dict with h, c (B, n), the annotations and their projection `W_a a`.
        """
        features = tf.cast(features, self.compute_dtype)
        mean = tf.reduce_mean(features, axis=1)  # (B, D)
        state = {"h": self.init_h(mean), "c": self.init_c(mean), "features": features}
        if self.f_att is not None:
            state["projected"] = self.f_att.project(features)
        return state

    def _logits(self, embedded, h, z, training=False):
        pre = tf.tanh(embedded + self.out_h(h) + self.out_z(z))
        return self.deep_output(self.out_dropout(pre, training=training))

    def _project_hidden(self, h):
        """(gates, score input, beta logit) of h, one matmul per kernel.

        The decoding step's version of `_split_hidden(h @ _hidden_kernel())`: at batch 1
        concatenating the kernels would copy 19 MB at paper scale on every call, as long
        as the matmuls themselves.
        """
        gates = self.lstm_hidden(h)
        score_in = None
        if self.attention_score == "additive" and self.f_att is not None:
            score_in = self.f_att.u_a(h)
        beta_logit = self.beta(h) if self.beta is not None else None
        return gates, score_in, beta_logit

    def step(self, tokens, state):
        """One decoding step; the `step_fn` that `decoding.py` drives.

        Hard attention attends at `argmax_i alpha_ti` (DESIGN §1).

        Args:
          tokens: (B,) int32 previous words.
          state: dict from `initial_state` or a previous step.

        Returns:
          (log_probs (B, V), new state, alpha (B, L)).
        """
        features, h = state["features"], state["h"]
        embedded = self.embedding(tokens)
        gates_h, score_in, beta_logit = self._project_hidden(h)
        if self.attention == "none":
            alpha = _uniform(features)
            z = tf.reduce_mean(features, axis=1)  # (B, D)
        else:
            scores = self._scores(state["projected"], score_in, h)
            alpha = tf.nn.softmax(tf.cast(scores, tf.float32))
            if self.attention == "soft":
                z = attention_lib.soft_context(tf.cast(alpha, features.dtype), features)
            else:
                where = tf.argmax(alpha, axis=-1, output_type=tf.int32)
                z = attention_lib.hard_context(where, features)
            if beta_logit is not None:
                z = tf.sigmoid(beta_logit) * z
        gates = self.lstm_embed(embedded) + gates_h + self.lstm_context(z)
        h, c = self._lstm(gates, state["c"])
        log_probs = tf.nn.log_softmax(tf.cast(self._logits(embedded, h, z), tf.float32))
        return log_probs, {**state, "h": h, "c": c}, alpha

    def call(self, features, captions, training=False, gumbel_noise=None, use_expected=None):
        """Teacher-forced pass over whole captions.

        Args:
          features: (B, L, D) annotation vectors.
          captions: (B, T) int32 input words y_0..y_{T-1} (starting with `<start>`).
          training: enables dropout.
          gumbel_noise: hard attention only: (B, T, L) standard Gumbel noise that fixes
            the sampled locations; without it the decoder attends at `argmax alpha`.
          use_expected: hard attention only: (B,) bool, sequences that use the expected
            context instead of a sample (paper §4.1).

        Returns:
          dict with logits (B, T, V), alpha (B, T, L), and for hard attention
          log_p_s (B, T): log alpha at the sampled location, and entropy (B, T) of alpha.
        """
        batch = tf.shape(captions)[0]
        steps = tf.shape(captions)[1]
        embedded = self.embedding(captions)  # (B, T, m)
        gates_x = tf.transpose(self.lstm_embed(embedded), [1, 0, 2])  # (T, B, 4n)
        state = self.initial_state(features)
        features = state["features"]
        hidden_kernel = tf.cast(self._hidden_kernel(), self.compute_dtype)
        if self._uses_recurrence():
            score_kernel = None
            if self.attention_score == "additive":
                score_kernel = tf.convert_to_tensor(self.f_att.v.kernel)
            hs, zs, alphas = recurrence.soft_attention_recurrence(
                gates_x,
                state["projected"],
                features,
                state["h"],
                state["c"],
                hidden_kernel,
                tf.convert_to_tensor(self.lstm_context.kernel),
                tf.convert_to_tensor(self.beta.bias),
                score_kernel,
            )
            return self._outputs(embedded, hs, zs, alphas, training)
        mean_context = tf.reduce_mean(features, axis=1)  # (B, D)
        if self.attention == "none":
            gates_z = self.lstm_context(mean_context)
            uniform = _uniform(features)
        if gumbel_noise is not None:
            gumbel_noise = tf.transpose(tf.cast(gumbel_noise, tf.float32), [1, 0, 2])  # (T, B, L)
        if use_expected is None:
            use_expected = tf.zeros([batch], tf.bool)

        def body(t, h, c, hs, zs, alphas, *hard_arrays):
            gates_h, score_in, beta_logit = self._split_hidden(tf.matmul(h, hidden_kernel))
            if self.attention == "none":
                z, gz, alpha = mean_context, gates_z, uniform
            else:
                scores = self._scores(state["projected"], score_in, h)
                log_alpha = tf.nn.log_softmax(tf.cast(scores, tf.float32))
                alpha = tf.exp(log_alpha)
                expected = attention_lib.soft_context(tf.cast(alpha, features.dtype), features)
                if self.attention == "soft":
                    z = expected
                else:
                    if gumbel_noise is not None:
                        where = attention_lib.gumbel_sample(log_alpha, gumbel_noise[t])
                    else:
                        where = tf.argmax(log_alpha, axis=-1, output_type=tf.int32)
                    sampled = attention_lib.hard_context(where, features)
                    z = tf.where(use_expected[:, None], expected, sampled)
                    chosen = tf.gather(log_alpha, where, axis=1, batch_dims=1)
                    entropy = -tf.reduce_sum(alpha * log_alpha, axis=-1)  # (B,)
                    hard_arrays = (
                        hard_arrays[0].write(t, chosen),
                        hard_arrays[1].write(t, entropy),
                    )
                if beta_logit is not None:
                    z = tf.sigmoid(beta_logit) * z
                gz = self.lstm_context(z)
            h, c = self._lstm(gates_x[t] + gates_h + gz, c)
            return (
                t + 1,
                h,
                c,
                hs.write(t, h),
                zs.write(t, z),
                alphas.write(t, alpha),
                *hard_arrays,
            )

        def array(dtype=tf.float32):
            return tf.TensorArray(dtype, size=steps)

        compute = self.compute_dtype
        hs, zs = array(compute), array(compute)
        # log alpha at the samples and the entropy exist for hard attention only: XLA
        # cannot differentiate a TensorArray that is never written.
        hard_arrays = (array(), array()) if self.attention == "hard" else ()
        loop_vars = (0, state["h"], state["c"], hs, zs, array(), *hard_arrays)
        _, _, _, hs, zs, alphas, *hard_arrays = tf.while_loop(
            lambda t, *_: t < steps, body, loop_vars, maximum_iterations=steps
        )
        outputs = self._outputs(embedded, hs.stack(), zs.stack(), alphas.stack(), training)
        if self.attention == "hard":
            log_p_s, entropy = hard_arrays
            outputs["log_p_s"] = tf.transpose(log_p_s.stack())  # (B, T)
            outputs["entropy"] = tf.transpose(entropy.stack())  # (B, T)
        return outputs

    def _uses_recurrence(self):
        """Whether `call` runs `recurrence.soft_attention_recurrence`: soft attention in
        float32. Mixed precision keeps the autodiff loop."""
        return (
            self.attention == "soft"
            and self.compute_dtype == "float32"
            and not self._autodiff_recurrence
        )

    def _outputs(self, embedded, hs, zs, alphas, training):
        """Logits and alpha from the time-major (T, B, .) states of the recurrence."""
        hs = tf.transpose(hs, [1, 0, 2])  # (B, T, n)
        zs = tf.transpose(zs, [1, 0, 2])  # (B, T, D)
        return {
            "logits": tf.cast(self._logits(embedded, hs, zs, training=training), tf.float32),
            "alpha": tf.transpose(alphas, [1, 0, 2]),  # (B, T, L)
        }

    def get_config(self):
        return {
            **super().get_config(),
            "vocab_size": self.vocab_size,
            "embed_dim": self.embed_dim,
            "hidden_dim": self.hidden_dim,
            "attention_dim": self.attention_dim,
            "attention": self.attention,
            "attention_score": self.attention_score,
            "dropout": self.dropout,
            "hard_gate": self.hard_gate,
        }
