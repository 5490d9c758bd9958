"""The attention LSTM decoder (paper §3.1.2, §4).

One step, given the previous word y_{t-1}, state (h_{t-1}, c_{t-1}) and annotations a:
  e_t = f_att(a, h_{t-1});  alpha_t = softmax(e_t)
  z_t = beta_t * sum_i alpha_ti a_i                      (soft, beta_t = sigmoid(f_beta(h)))
  z_t = a_{s_t},  s_t ~ Multinoulli(alpha_t)              (hard; at inference `hard_decoding`)
  z_t = beta_t * a_{s_t}                                  (hard with `hard_gate`)
  z_t = mean_i a_i                                        (none: the no-attention ablation)
  i, f, o, g = split(W_e E y_{t-1} + U h_{t-1} + Z z_t [+ G abar] + b)
  c_t = sigmoid(f) c_{t-1} + sigmoid(i) tanh(g);  h_t = sigmoid(o) tanh(c_t)
  p(y_t) = softmax(L_o dropout(tanh(E y_{t-1} + L_h h_t + L_z z_t [+ L_g abar])))

The bracketed terms exist with `global_context` (not in the paper): the mean annotation
abar = mean_i a_i, which the no-attention ablation reads as its context, reaches every
step beside the attended one. Both are constant over a caption, so they join the word
half of the gates and the output's input once per caption, outside the recurrence. With
`start_state="learned"` (not in the paper) h_0, c_0 do not read abar either. With
`location_prior` (not in the paper) the score also learns one vector per cell
(`sat_tf.model.location_prior`), so it can prefer places as well as content.

The step itself is `step.attention_step`; this layer owns the weights and runs that
step one word at a time when decoding (`step`) and, under teacher forcing, in a
`tf.while_loop` that autodiff differentiates (`teacher_forced_loop`), where everything that
does not depend on t runs once outside the loop (`W_a a`, the word half of the gates, the
deep output over all steps). `call` takes the faster schedule of `fast/schedule.py` (a
fused recurrence with a hand-written backward pass, the additive score as a compiled op)
where it applies; `call(..., autodiff=True)` runs the reference loop.
"""

import inspect

import keras
import tensorflow as tf

from sat_tf import config as config_lib
from sat_tf.config import Config
from sat_tf.model import attention as attention_lib
from sat_tf.model import per_image, step
from sat_tf.model.fast import schedule


@keras.saving.register_keras_serializable(package="sat_tf")
class AttentionDecoder(keras.layers.Layer):
    """Attention LSTM with init MLPs and deep output.

    The arguments after `vocab_size` are the `Config` settings of their names, with
    their defaults (`build_model` passes the run's); `get_config` returns them all.

    Args:
      vocab_size: number of output words V.
      embed_dim: word embedding size m.
      hidden_dim: LSTM size n.
      attention_dim: hidden size of the additive score.
      attention: "soft", "hard" or "none".
      attention_score: "additive", "dot" or "scaled_dot" (`attention.SCORES`).
      dropout: dropout rate before L_o.
      hard_gate: hard attention only: scale the sampled annotation by the gate
        beta_t = sigmoid(f_beta(h_{t-1})) that soft attention has (paper §4.2.1), so the
        decoder can turn a glimpse down without moving where it looks.
      hard_decoding: hard attention only: the context when captioning (`step`):
        "argmax", the annotation at argmax_i alpha_ti, or "expected", sum_i alpha_ti a_i
        (docs/design.md §1.4). Teacher forcing without noise (the argmax baseline,
        validation loss) always attends at the argmax.
      global_context: soft or hard attention only: feed the mean annotation to the gates
        (G) and the output (L_g) at every step as well, so that attention adds a glimpse
        to what the no-attention ablation reads instead of replacing it.
      start_state: "mean", h_0 = tanh(f_init,h(abar)) and c_0 likewise (paper eq. 5), or
        "learned", the same layers applied to a zero vector: tanh of their trained biases,
        one start for every image, so the image reaches the decoder only through z_t.
      location_prior: soft or hard attention only: the score learns a vector p_i per
        cell added to W_a a_i (a learned location prior); the decoder must then be built
        with the number of cells L, (B, L, D).
    """

    def __init__(
        self,
        vocab_size,
        embed_dim=Config.embed_dim,
        hidden_dim=Config.hidden_dim,
        attention_dim=Config.attention_dim,
        attention=Config.attention,
        attention_score=Config.attention_score,
        dropout=Config.dropout,
        hard_gate=Config.hard_gate,
        hard_decoding=Config.hard_decoding,
        global_context=Config.global_context,
        start_state=Config.start_state,
        location_prior=Config.location_prior,
        **kwargs,
    ):
        super().__init__(**kwargs)
        for name, value in (
            ("attention", attention),
            ("attention_score", attention_score),
            ("hard_decoding", hard_decoding),
            ("start_state", start_state),
        ):
            config_lib.check_choice(name, value)
        for name, given in (("global_context", global_context), ("location_prior", location_prior)):
            if given and attention == "none":
                raise ValueError(f"{name}=True acts on attention; attention='none' has none")
        self.vocab_size = vocab_size
        self.embed_dim = embed_dim
        self.hidden_dim = hidden_dim
        self.attention_dim = attention_dim
        self.attention = attention
        self.attention_score = attention_score
        self.dropout = dropout
        self.hard_gate = bool(hard_gate) and attention == "hard"
        self.hard_decoding = hard_decoding
        self.global_context = bool(global_context)
        self.start_state = start_state
        self.location_prior = bool(location_prior)
        # Switches of the fast schedule (`fast/schedule.py`): gated hard attention through
        # the fused recurrence, and the additive score through its compiled op. False
        # selects the reference loop or TensorFlow's score ops (tests, the bench's
        # baselines, XLA, which cannot compile a custom op).
        self.fused_hard = True
        self.compiled_score = True

        self.embedding = keras.layers.Embedding(vocab_size, embed_dim, name="embedding")
        self.init_h = keras.layers.Dense(hidden_dim, activation="tanh", name="init_h")
        self.init_c = keras.layers.Dense(hidden_dim, activation="tanh", name="init_c")
        self.f_att = None
        if attention != "none":
            units = attention_dim if attention_score == "additive" else hidden_dim
            self.f_att = attention_lib.SCORES[attention_score](
                units, location=self.location_prior, name="f_att"
            )
        gated = attention == "soft" or self.hard_gate
        self.beta = keras.layers.Dense(1, name="beta") if gated else None
        self.lstm_embed = keras.layers.Dense(4 * hidden_dim, name="lstm_embed")
        self.lstm_hidden = keras.layers.Dense(4 * hidden_dim, use_bias=False, name="lstm_hidden")
        self.lstm_context = keras.layers.Dense(4 * hidden_dim, use_bias=False, name="lstm_context")
        self.out_h = keras.layers.Dense(embed_dim, name="L_h")
        self.out_z = keras.layers.Dense(embed_dim, use_bias=False, name="L_z")
        self.out_dropout = keras.layers.Dropout(dropout)
        self.lstm_global = self.out_global = None
        if self.global_context:
            self.lstm_global = keras.layers.Dense(4 * hidden_dim, use_bias=False, name="G")
            self.out_global = keras.layers.Dense(embed_dim, use_bias=False, name="L_g")
        self.deep_output = keras.layers.Dense(vocab_size, name="deep_output")

    def build(self, features_shape, captions_shape=None):
        feature_dim = features_shape[-1]
        n = self.hidden_dim
        self.embedding.build((None, None))
        self.init_h.build((None, feature_dim))
        self.init_c.build((None, feature_dim))
        if self.f_att is not None:
            self.f_att.build((None, features_shape[-2], feature_dim), (None, n))
        if self.beta is not None:
            self.beta.build((None, n))
        self.lstm_embed.build((None, None, self.embed_dim))
        self.lstm_hidden.build((None, n))
        self.lstm_context.build((None, feature_dim))
        self.out_h.build((None, None, n))
        self.out_z.build((None, None, feature_dim))
        if self.global_context:
            self.lstm_global.build((None, feature_dim))
            self.out_global.build((None, feature_dim))
        self.deep_output.build((None, None, self.embed_dim))

    def read(self, variable):
        """A weight in the compute dtype."""
        return tf.cast(variable, self.compute_dtype)

    def _project_hidden(self, h):
        """(U h, the score's U_a h or None, beta's logit w_beta h + b_beta or None)."""
        score_in = gate_logit = None
        if self.f_att is not None and self.f_att.hidden_kernels():
            (kernel,) = self.f_att.hidden_kernels()
            score_in = tf.matmul(h, self.read(kernel))
        if self.beta is not None:
            gate_logit = tf.matmul(h, self.read(self.beta.kernel)) + self.read(self.beta.bias)
        return tf.matmul(h, self.read(self.lstm_hidden.kernel)), score_in, gate_logit

    def _score_fn(self):
        """The score's per-step function on its own weights; None without attention."""
        if self.f_att is None:
            return None
        kernels = [self.read(k) for k in self.f_att.step_kernels()]
        return lambda projected, score_in, h: self.f_att.step_scores(
            projected, score_in, h, *kernels
        )

    def _attend_fn(self, gumbel_noise=None, use_expected=None):
        if self.attention == "hard":
            return attention_lib.hard_attend(gumbel_noise, use_expected)
        return attention_lib.soft_attend

    def _decoding_attend_fn(self, hard_decoding=None):
        if self.attention == "hard" and (hard_decoding or self.hard_decoding) == "argmax":
            return attention_lib.hard_attend()
        return attention_lib.soft_attend

    def initial_state(self, features):
        """State before the first word (paper eq. 5; the same for every image with
        `start_state="learned"`).

        Args:
          features: (B, L, D) annotation vectors.

        Returns:
          dict with h, c (B, n), the annotations and their projection `W_a a`; with
          `global_context` also G abar (B, 4n) and L_g abar (B, m).
        """
        features = tf.cast(features, self.compute_dtype)
        mean = tf.reduce_mean(features, axis=1)  # (B, D)
        start = mean if self.start_state == "mean" else tf.zeros_like(mean)
        state = {"h": self.init_h(start), "c": self.init_c(start), "features": features}
        if self.f_att is not None:
            state["projected"] = self.f_att.project(features)
        if self.global_context:
            state["global_gates"] = self.lstm_global(mean)
            state["global_output"] = self.out_global(mean)
        return state

    @staticmethod
    def _per_caption(term, embedded):
        """A (B, X) term of `global_context`, shaped to add to every step of `embedded`:
        (B, T, m) under teacher forcing, (B, m) when decoding."""
        return term[:, None, :] if embedded.shape.rank == 3 else term

    def _word_gates(self, embedded, state):
        """The part of the gates that does not depend on h: W_e E y + b [+ G abar]."""
        gates = self.lstm_embed(embedded)
        if self.global_context:
            gates += self._per_caption(state["global_gates"], embedded)
        return gates

    def _logits(self, embedded, h, z, state, training=False):
        pre = embedded + self.out_h(h) + self.out_z(z)
        if self.global_context:
            pre += self._per_caption(state["global_output"], embedded)
        return self.deep_output(self.out_dropout(tf.tanh(pre), training=training))

    def step(self, tokens, state, hard_decoding=None, images=None):
        """One decoding step; the `step_fn` that `search.py` drives.

        Hard attention attends as `hard_decoding` says (docs/design.md §1.4).

        Args:
          tokens: (N,) int32 previous words.
          state: dict from `initial_state` or a previous step, N rows.
          hard_decoding: hard attention's context, "argmax" or "expected"; None for the
            decoder's own (`hard_decoding` of its construction).
          images: None, when the state holds the annotations ("features", "projected");
            else those of B images, once each, for a state of N = B S hypotheses, S of
            each image in a row (b S + j): the score and the context then read each
            image's annotations for its S hypotheses at once (attention models only).

        Returns:
          (log_probs (N, V), new state, alpha (N, L)).
        """
        embedded = self.embedding(tokens)
        score, attend = self._score_fn(), self._decoding_attend_fn(hard_decoding)
        if images is not None:
            score, attend = per_image.grouped_attention(score, attend)
        out = step.attention_step(
            self._word_gates(embedded, state),
            state["h"],
            state["c"],
            self._project_hidden(state["h"]),
            (images or state)["features"],
            (images or state).get("projected"),
            self.read(self.lstm_context.kernel),
            score,
            attend,
        )
        logits = self._logits(embedded, out.h, out.z, state)
        log_probs = tf.nn.log_softmax(tf.cast(logits, tf.float32))
        return log_probs, {**state, "h": out.h, "c": out.c}, out.alpha

    def call(
        self,
        features,
        captions,
        training=False,
        gumbel_noise=None,
        use_expected=None,
        autodiff=False,
        state=None,
    ):
        """Teacher-forced pass over whole captions.

        Args:
          features: (B, L, D) annotation vectors.
          captions: (B, T) int32 input words y_0..y_{T-1} (starting with `<start>`).
          training: enables dropout.
          gumbel_noise: hard attention only: (B, T, L) standard Gumbel noise that fixes
            the sampled locations; without it the decoder attends at `argmax alpha`.
          use_expected: hard attention only: (B,) bool, sequences that use the expected
            context instead of a sample (paper §4.1).
          autodiff: run the reference loop (`teacher_forced_loop`, the score as
            TensorFlow ops) instead of the fast schedule (`fast/schedule.py`), which is
            checked against it.
          state: `initial_state(features)`, when the caller has it (hard attention's
            training computes it once for the sampled pass and the argmax baseline's);
            None computes it.

        Returns:
          dict with logits (B, T, V), alpha (B, T, L), and for hard attention
          log_p_s (B, T): log alpha at the sampled location, and entropy (B, T) of alpha.
        """
        embedded = self.embedding(captions)  # (B, T, m)
        if state is None:
            state = self.initial_state(features)
        word_gates = tf.transpose(self._word_gates(embedded, state), [1, 0, 2])  # (T, B, 4n)
        if gumbel_noise is not None:
            # Time-major (T, B, L), as both schedules read it one step at a time.
            gumbel_noise = tf.transpose(tf.cast(gumbel_noise, tf.float32), [1, 0, 2])
        if autodiff:
            return self.teacher_forced_loop(
                embedded, word_gates, state, training, gumbel_noise, use_expected
            )
        return schedule.teacher_forced(
            self, embedded, word_gates, state, training, gumbel_noise, use_expected
        )

    def teacher_forced_loop(
        self, embedded, word_gates, state, training, gumbel_noise, use_expected, score=None
    ):
        """`call` through a `tf.while_loop` that autodiff differentiates: the reference.

        `word_gates` (T, B, 4n) and `gumbel_noise` (T, B, L) are time-major; `score`
        replaces the score's per-step function (the fast schedule's compiled op)."""
        steps = tf.shape(word_gates)[0]
        features, projected = state["features"], state.get("projected")
        hard = self.attention == "hard"
        context_kernel = self.read(self.lstm_context.kernel)
        score = score or self._score_fn()

        def body(t, h, c, hs, zs, alphas, *hard_arrays):
            noise = gumbel_noise[t] if gumbel_noise is not None else None
            out = step.attention_step(
                word_gates[t],
                h,
                c,
                self._project_hidden(h),
                features,
                projected,
                context_kernel,
                score,
                self._attend_fn(noise, use_expected),
            )
            if hard:
                chosen = tf.gather(out.log_alpha, out.where, axis=1, batch_dims=1)
                entropy = -tf.reduce_sum(out.alpha * out.log_alpha, axis=-1)  # (B,)
                hard_arrays = (hard_arrays[0].write(t, chosen), hard_arrays[1].write(t, entropy))
            return (
                t + 1,
                out.h,
                out.c,
                hs.write(t, out.h),
                zs.write(t, out.z),
                alphas.write(t, out.alpha),
                *hard_arrays,
            )

        def array(dtype=tf.float32):
            return tf.TensorArray(dtype, size=steps)

        compute = self.compute_dtype
        hs, zs = array(compute), array(compute)
        # log alpha at the samples and the entropy exist for hard attention only: XLA
        # cannot differentiate a TensorArray that is never written.
        hard_arrays = (array(), array()) if hard else ()
        loop_vars = (0, state["h"], state["c"], hs, zs, array(), *hard_arrays)
        _, _, _, hs, zs, alphas, *hard_arrays = tf.while_loop(
            lambda t, *_: t < steps, body, loop_vars, maximum_iterations=steps
        )
        outputs = self.outputs(embedded, hs.stack(), zs.stack(), alphas.stack(), state, training)
        if hard:
            log_p_s, entropy = hard_arrays
            outputs["log_p_s"] = tf.transpose(log_p_s.stack())  # (B, T)
            outputs["entropy"] = tf.transpose(entropy.stack())  # (B, T)
        return outputs

    def outputs(self, embedded, hs, zs, alphas, state, training):
        """Logits and alpha from the time-major (T, B, .) states of a teacher-forced pass."""
        hs = tf.transpose(hs, [1, 0, 2])  # (B, T, n)
        zs = tf.transpose(zs, [1, 0, 2])  # (B, T, D)
        return {
            "logits": tf.cast(self._logits(embedded, hs, zs, state, training), tf.float32),
            "alpha": tf.transpose(alphas, [1, 0, 2]),  # (B, T, L)
        }

    def get_config(self):
        names = [n for n in inspect.signature(AttentionDecoder).parameters if n != "kwargs"]
        return {**super().get_config(), **{name: getattr(self, name) for name in names}}
