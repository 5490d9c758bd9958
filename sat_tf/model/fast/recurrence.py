"""The teacher-forced attention recurrence with a hand-written backward pass.

The forward pass runs the decoder's step (`step.attention_step`, paper §3.1.2, soft
attention §4.2, hard attention §4.1) for every t, with P_t = h_{t-1} [U | S | w_beta] as
one product.

Autodiff of a `tf.while_loop` computes the gradients of the kernels the loop reads one
step at a time: a product with inner dimension B per step, accumulated T times. Here a
reverse loop computes only what flows from step to step (dh, dc, and the gradients of
the hidden projection and of the gates), and the kernel gradients are one product each
over all B T rows after it: dK = H_prev^T dP and dZ = Z_s^T dG. The gradients of the
attention inputs `W_a a` (dot score) and a, rank T in each image, are likewise one
batched product over t each; those of the additive score's tanh layer are summed step
by step.

Hard attention (gated by beta) runs the same recurrence with the sampled locations drawn
in the loop from given Gumbel noise (or at argmax alpha): its context is
`w_t . a` with `w_t = alpha_t` for the captions that take the expected context and the
one-hot of s_t for the others, so a's gradient is again one batched product over t,
`sum_t w_t^T dcontext_t`, and alpha's gradient through the context exists only for the
expected-context captions (the sample is a discrete choice; the REINFORCE term reaches
alpha through the `alphas` output).

`AttentionDecoder.call` uses it for soft and gated hard attention in float32 and under the
`mixed_bfloat16` policy, also under `jit_compile` and `tf.distribute`. In bfloat16 the
attention weights stay float32 as in `step.attention_step` (the softmax and its
gradient run in float32), and so do the sums over B T that give the gate bias's and
v's gradients; every other product and element-wise pass runs in bfloat16, as the
autodiff loop of the same policy runs them. float16 keeps the autodiff loop.
"""

import tensorflow as tf

from sat_tf.model import attention as attention_lib
from sat_tf.model import step
from sat_tf.model.fast import fused_score
from sat_tf.model.fast.layout import HiddenLayout
from sat_tf.model.step import lstm_cell


def _zeros_if_none(grad, like):
    return tf.zeros_like(like) if grad is None else grad


def _lstm_backward(gates, c_prev, c, dh, dc):
    """Gradients of the gates and of c_{t-1}, from those of h_t and c_t (dc: the part
    that comes from step t + 1)."""
    _, _, (i, f, o, g) = lstm_cell(gates, c_prev)
    tanh_c = tf.tanh(c)
    dc = dc + tf.raw_ops.TanhGrad(y=tanh_c, dy=dh * o)
    d_gates = tf.concat(
        [
            tf.raw_ops.SigmoidGrad(y=i, dy=dc * g),
            tf.raw_ops.SigmoidGrad(y=f, dy=dc * c_prev),
            tf.raw_ops.SigmoidGrad(y=o, dy=dh * tanh_c),
            tf.raw_ops.TanhGrad(y=g, dy=dc * i),
        ],
        -1,
    )
    return d_gates, dc * f


def alpha_dtype(dtype):
    """The dtype of the attention weights for inputs of `dtype`: float32 for the 16-bit
    types, whose softmax `step.attention_step` runs in float32; else `dtype`."""
    return tf.float32 if dtype in (tf.bfloat16, tf.float16) else dtype


def attention_recurrence(
    gates_x,
    projected,
    features,
    h0,
    c0,
    hidden_kernel,
    context_kernel,
    beta_bias,
    score_kernel=None,
    hard=False,
    gumbel_noise=None,
    use_expected=None,
    compiled_score=False,
):
    """Runs the attention LSTM over all T steps (paper §3.1.2, §4.1, §4.2).

    Every input is a tensor of one float dtype (read variables before the call);
    gradients with respect to all of them come from a hand-written backward pass, which
    also takes the gradients of `alphas` (the doubly stochastic penalty, §4.2.1).
    `alphas` are float32 when the inputs are bfloat16 or float16 (`alpha_dtype`).

    Args:
      gates_x: (T, B, 4n) the word half of the LSTM gates, bias included.
      projected: (B, L, P) `W_a a`: the additive score's (P = A, bias included), or the
        dot score's (P = n).
      features: (B, L, D) annotation vectors a.
      h0: (B, n) initial hidden state.
      c0: (B, n) initial cell.
      hidden_kernel: (n, W) `[U | U_a | w_beta]` (additive, W = 4n + A + 1) or
        `[U | w_beta]` (dot, W = 4n + 1), as `layout.HiddenLayout` orders them.
      context_kernel: (D, 4n) Z.
      beta_bias: (1,) bias of the gating scalar beta.
      score_kernel: (A, 1) v of the additive score; None for the dot score.
      hard: hard attention (gated by beta) instead of soft.
      gumbel_noise: hard only: (T, B, L) float32 standard Gumbel noise that fixes the
        sampled locations; None attends at `argmax alpha`.
      use_expected: hard only: (B,) bool, captions that take the expected context.
      compiled_score: run the additive score and its gradient through the compiled op
        of `fused_score` (float32; the caller checks `fused_score.applies`): the same
        math as `AdditiveScore.step_scores` in four passes over `W_a a` a step (a read
        forward; a read and the running sum's read and write backward) instead of
        fourteen, and (B, A) kept per step instead of the (B, L, A) tanh layer.

    Returns:
      hs (T, B, n), zs (T, B, D) the gated contexts, alphas (T, B, L), and for hard
      attention wheres (T, B) int32, the attended locations.
    """
    alpha_type = alpha_dtype(gates_x.dtype)
    additive = score_kernel is not None
    n4 = context_kernel.shape[1]
    layout = HiddenLayout(n4, projected.shape[-1] if additive else 0, gated=True)
    kernels = (hidden_kernel, context_kernel, beta_bias)
    if additive:
        kernels += (score_kernel,)
    score_layer = attention_lib.AdditiveScore if additive else attention_lib.DotScore
    if compiled_score and (not additive or gates_x.dtype != tf.float32):
        raise ValueError("compiled_score runs the additive score in float32 only")
    if not hard and (gumbel_noise is not None or use_expected is not None):
        raise ValueError("gumbel_noise and use_expected are for hard attention only")
    # The share of each caption's context that is the expected one: 1 (soft), 0 (a
    # sample), or use_expected.
    if not hard:
        expected = None
    elif use_expected is None:
        expected = tf.zeros([tf.shape(features)[0], 1], alpha_type)
    else:
        expected = tf.cast(use_expected, alpha_type)[:, None]

    def attend_at(t):
        if not hard:
            return attention_lib.soft_attend
        noise = None if gumbel_noise is None else gumbel_noise[t]
        return attention_lib.hard_attend(noise, use_expected)

    @tf.custom_gradient
    def recurrence(gates_x, projected, features, h0, c0, *kernels):
        hidden_kernel, context_kernel, beta_bias = kernels[:3]
        steps = tf.shape(gates_x)[0]
        dtype = gates_x.dtype

        def score(projected, score_in, h):
            if compiled_score:  # keeps U_a h, from which the backward op recomputes
                return fused_score.scores(projected, score_in, kernels[3]), score_in
            return score_layer.step_scores(projected, score_in, h, *kernels[3:])

        def body(t, h, c, arrays, pres):
            out = step.attention_step(
                gates_x[t],
                h,
                c,
                layout.split(tf.matmul(h, hidden_kernel), beta_bias),
                features,
                projected,
                context_kernel,
                score,
                attend_at(t),
            )
            saved = (out.h, out.z, out.alpha, out.c, out.gates, out.context, out.beta)
            if hard:
                saved += (out.where,)
            arrays = tuple(a.write(t, x) for a, x in zip(arrays, saved, strict=True))
            return (
                t + 1,
                out.h,
                out.c,
                arrays,
                pres.write(t, out.score_hidden) if additive else pres,
            )

        # Saved per step: h, z, alpha, c, gates, context, beta (and where, if hard).
        types = (dtype, dtype, alpha_type, dtype, dtype, dtype, dtype)
        types += (tf.int32,) if hard else ()
        arrays = tuple(tf.TensorArray(t, size=steps) for t in types)
        # What the additive score keeps per step: its tanh layer, (B, L, A) and by far
        # the most memory kept (unstacked: stacking would copy it), or with the compiled
        # score U_a h (B, A).
        pres = tf.TensorArray(dtype, size=steps) if additive else ()
        _, _, _, arrays, pres = tf.while_loop(
            lambda t, *_: t < steps,
            body,
            (0, h0, c0, arrays, pres),
            maximum_iterations=steps,
        )
        hs, zs, alphas, cs, all_gates, contexts, betas, *wheres = (a.stack() for a in arrays)

        def grad(d_hs, d_zs, d_alphas, *_):
            d_hs = _zeros_if_none(d_hs, hs)
            d_zs = _zeros_if_none(d_zs, zs)
            d_alphas = _zeros_if_none(d_alphas, alphas)
            h_prev = tf.concat([h0[None], hs[:-1]], 0)  # (T, B, n)
            c_prev = tf.concat([c0[None], cs[:-1]], 0)  # (T, B, n)
            # Products of (B, .) rows with a transposed kernel run at half speed or less
            # on the CPU: the kernels are transposed once, outside the loop.
            hidden_kernel_t = tf.transpose(hidden_kernel)  # (W, n)
            context_kernel_t = tf.transpose(context_kernel)  # (4n, D)

            def back(t, dh, dc, d_projected, d_score_kernel, arrays):
                dh += d_hs[t]
                d_gates, dc = _lstm_backward(all_gates[t], c_prev[t], cs[t], dh, dc)
                d_z = d_zs[t] + tf.matmul(d_gates, context_kernel_t)
                context, beta, alpha = contexts[t], betas[t], alphas[t]
                d_beta = tf.reduce_sum(d_z * context, -1, keepdims=True)  # (B, 1)
                d_beta_logit = tf.raw_ops.SigmoidGrad(y=beta, dy=d_beta)
                d_context = d_z * beta
                d_alpha_context = tf.cast(tf.einsum("bld,bd->bl", features, d_context), alpha_type)
                if hard:
                    d_alpha_context *= expected
                d_alpha = d_alphas[t] + d_alpha_context
                d_scores = alpha * (d_alpha - tf.reduce_sum(alpha * d_alpha, -1, keepdims=True))
                d_scores = tf.cast(d_scores, dtype)
                if compiled_score:
                    d_projected, d_score_in, d_v = fused_score.scores_grad(
                        projected, pres.read(t), kernels[3], d_scores, d_projected
                    )
                    d_score_kernel += d_v[:, 0]
                elif additive:
                    pre = pres.read(t)
                    d_pre = tf.raw_ops.TanhGrad(
                        y=pre, dy=d_scores[:, :, None] * kernels[3][:, 0]
                    )  # (B, L, A)
                    d_projected += d_pre
                    d_score_kernel += tf.cast(tf.einsum("bl,bla->a", d_scores, pre), alpha_type)
                    d_score_in = tf.reduce_sum(d_pre, 1)
                if additive:
                    d_p = layout.join(d_gates, d_score_in, d_beta_logit)
                    dh = tf.matmul(d_p, hidden_kernel_t)
                else:
                    d_p = layout.join(d_gates, None, d_beta_logit)
                    dh = tf.matmul(d_p, hidden_kernel_t)
                    dh += tf.einsum("bl,blu->bu", d_scores, projected)
                saved = (d_p, d_context, d_scores)
                arrays = tuple(a.write(t, x) for a, x in zip(arrays, saved, strict=True))
                return t - 1, dh, dc, d_projected, d_score_kernel, arrays

            d_arrays = tuple(tf.TensorArray(dtype, size=steps) for _ in range(3))
            d_projected = tf.zeros_like(projected) if additive else tf.zeros([], dtype)
            d_score_kernel = (
                tf.zeros(kernels[3].shape[:1], alpha_type) if additive else tf.zeros([], dtype)
            )
            loop_vars = (steps - 1, tf.zeros_like(h0), tf.zeros_like(c0))
            loop_vars += (d_projected, d_score_kernel, d_arrays)
            _, d_h0, d_c0, d_projected, d_score_kernel, d_arrays = tf.while_loop(
                lambda t, *_: t >= 0, back, loop_vars, maximum_iterations=steps
            )
            d_p, d_contexts, d_scores = (a.stack() for a in d_arrays)
            width = hidden_kernel.shape[1]
            d_gates_x = d_p[:, :, :n4]
            d_hidden_kernel = tf.matmul(
                tf.reshape(h_prev, [-1, h_prev.shape[-1]]),  # (T B, n)
                tf.reshape(d_p, [-1, width]),  # (T B, W)
                transpose_a=True,
            )
            d_context_kernel = tf.matmul(
                tf.reshape(zs, [-1, zs.shape[-1]]),  # (T B, D)
                tf.reshape(d_gates_x, [-1, n4]),  # (T B, 4n)
                transpose_a=True,
            )
            d_beta_bias = tf.reduce_sum(tf.cast(d_p[:, :, -1], alpha_type))
            d_beta_bias = tf.cast(tf.reshape(d_beta_bias, [1]), dtype)
            weights = alphas
            if hard:
                sampled = tf.one_hot(wheres[0], tf.shape(alphas)[-1], dtype=alpha_type)
                weights = expected * alphas + (1 - expected) * sampled
            d_features = tf.einsum("tbl,tbd->bld", tf.cast(weights, dtype), d_contexts)
            d_kernels = [d_hidden_kernel, d_context_kernel, d_beta_bias]
            if additive:
                d_kernels.append(tf.cast(d_score_kernel[:, None], dtype))
            else:
                d_projected = tf.einsum("tbl,tbu->blu", d_scores, h_prev)
            return [d_gates_x, d_projected, d_features, d_h0, d_c0, *d_kernels]

        return (hs, zs, alphas, *wheres), grad

    return recurrence(gates_x, projected, features, h0, c0, *kernels)
