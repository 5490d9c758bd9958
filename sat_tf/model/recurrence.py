"""The teacher-forced soft-attention recurrence with a hand-written backward pass.

The forward pass is the decoder's step (paper §3.1.2, soft attention §4.2) for every t:
  P_t = h_{t-1} [U | U_a | w_beta]
  e_t = v^T tanh(W_a a + U_a h_{t-1})   or   a W_a h_{t-1};   alpha_t = softmax(e_t)
  z_t = sigmoid(w_beta h_{t-1} + b_beta) sum_i alpha_ti a_i
  c_t, h_t = LSTM(gates_x_t + U h_{t-1} + Z z_t, c_{t-1})

Autodiff of a `tf.while_loop` computes the gradients of the kernels the loop reads one
step at a time: a product with inner dimension B per step, accumulated T times. Here a
reverse loop computes only what flows from step to step (dh, dc, and the gradients of
the hidden projection and of the gates), and the kernel gradients are one product each
over all B T rows after it: dK = H_prev^T dP and dZ = Z_s^T dG. The gradients of the
attention inputs `W_a a` (dot score) and a, rank T in each image, are likewise one
batched product over t each; those of the additive score's tanh layer are summed step
by step.

`AttentionDecoder.call` uses it for soft attention in float32, also under `jit_compile`
and `tf.distribute`; under mixed precision it keeps the autodiff loop, whose casts
this function does not repeat.
"""

import tensorflow as tf

from sat_tf.model import attention as attention_lib


def _zeros_if_none(grad, like):
    return tf.zeros_like(like) if grad is None else grad


def lstm_cell(gates, c):
    """The LSTM cell (paper eq. 1-3); returns h, c and the activated gates (i, f, o, g)."""
    i, f, o, g = tf.split(gates, 4, axis=-1)
    i, f, o, g = tf.sigmoid(i), tf.sigmoid(f), tf.sigmoid(o), tf.tanh(g)
    c = f * c + i * g
    return o * tf.tanh(c), c, (i, f, o, g)


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


def soft_attention_recurrence(
    gates_x,
    projected,
    features,
    h0,
    c0,
    hidden_kernel,
    context_kernel,
    beta_bias,
    score_kernel=None,
):
    """Runs the soft-attention LSTM over all T steps (paper §3.1.2, §4.2).

    Every input is a tensor of one float dtype (read variables before the call);
    gradients with respect to all of them come from a hand-written backward pass, which
    also takes the gradients of `alphas` (the doubly stochastic penalty, §4.2.1).

    Args:
      gates_x: (T, B, 4n) the word half of the LSTM gates, bias included.
      projected: (B, L, P) `W_a a`: the additive score's (P = A, bias included), or the
        dot score's (P = n).
      features: (B, L, D) annotation vectors a.
      h0: (B, n) initial hidden state.
      c0: (B, n) initial cell.
      hidden_kernel: (n, W) `[U | U_a | w_beta]`, W = 4n + A + 1 (additive) or 4n + 1
        (dot).
      context_kernel: (D, 4n) Z.
      beta_bias: (1,) bias of the gating scalar beta.
      score_kernel: (A, 1) v of the additive score; None for the dot score.

    Returns:
      hs (T, B, n), zs (T, B, D) the gated contexts, alphas (T, B, L).
    """
    additive = score_kernel is not None
    n4 = context_kernel.shape[1]
    kernels = (hidden_kernel, context_kernel, beta_bias)
    if additive:
        kernels += (score_kernel,)

    @tf.custom_gradient
    def recurrence(gates_x, projected, features, h0, c0, *kernels):
        hidden_kernel, context_kernel, beta_bias = kernels[:3]
        steps = tf.shape(gates_x)[0]
        dtype = gates_x.dtype

        def scores_of(h, score_in):
            """(B, L) scores e_t, and for the additive score its tanh layer."""
            if additive:
                pre = tf.tanh(projected + score_in[:, None, :])  # (B, L, A)
                return tf.squeeze(tf.tensordot(pre, kernels[3], [[-1], [0]]), -1), pre  # (B, L)
            return tf.einsum("blu,bu->bl", projected, h), None

        def body(t, h, c, arrays, pres):
            projected_h = tf.matmul(h, hidden_kernel)
            beta = tf.sigmoid(projected_h[:, -1:] + beta_bias)
            scores, pre = scores_of(h, projected_h[:, n4:-1])
            alpha = tf.exp(tf.nn.log_softmax(scores))
            context = attention_lib.soft_context(alpha, features)
            z = beta * context
            gates = gates_x[t] + projected_h[:, :n4] + tf.matmul(z, context_kernel)
            h, c, _ = lstm_cell(gates, c)
            saved = (h, z, alpha, c, gates, context, beta)
            arrays = tuple(a.write(t, x) for a, x in zip(arrays, saved, strict=True))
            return t + 1, h, c, arrays, pres.write(t, pre) if additive else pres

        arrays = tuple(tf.TensorArray(dtype, size=steps) for _ in range(7))
        # The tanh layers of the additive score, (B, L, A) per step and by far the most
        # memory kept, stay unstacked: stacking would copy them.
        pres = tf.TensorArray(dtype, size=steps) if additive else ()
        _, _, _, arrays, pres = tf.while_loop(
            lambda t, *_: t < steps,
            body,
            (0, h0, c0, arrays, pres),
            maximum_iterations=steps,
        )
        hs, zs, alphas, cs, all_gates, contexts, betas = (a.stack() for a in arrays)

        def grad(d_hs, d_zs, d_alphas):
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
                d_alpha = d_alphas[t] + tf.einsum("bld,bd->bl", features, d_context)
                d_scores = alpha * (d_alpha - tf.reduce_sum(alpha * d_alpha, -1, keepdims=True))
                if additive:
                    pre = pres.read(t)
                    d_pre = tf.raw_ops.TanhGrad(
                        y=pre, dy=d_scores[:, :, None] * kernels[3][:, 0]
                    )  # (B, L, A)
                    d_projected += d_pre
                    d_score_kernel += tf.einsum("bl,bla->a", d_scores, pre)
                    d_p = tf.concat([d_gates, tf.reduce_sum(d_pre, 1), d_beta_logit], -1)
                    dh = tf.matmul(d_p, hidden_kernel_t)
                else:
                    d_p = tf.concat([d_gates, d_beta_logit], -1)
                    dh = tf.matmul(d_p, hidden_kernel_t)
                    dh += tf.einsum("bl,blu->bu", d_scores, projected)
                saved = (d_p, d_context, d_scores)
                arrays = tuple(a.write(t, x) for a, x in zip(arrays, saved, strict=True))
                return t - 1, dh, dc, d_projected, d_score_kernel, arrays

            d_arrays = tuple(tf.TensorArray(dtype, size=steps) for _ in range(3))
            d_projected = tf.zeros_like(projected) if additive else tf.zeros([], dtype)
            d_score_kernel = tf.zeros_like(kernels[3][:, 0]) if additive else tf.zeros([], dtype)
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
            d_beta_bias = tf.reshape(tf.reduce_sum(d_p[:, :, -1]), [1])
            d_features = tf.einsum("tbl,tbd->bld", alphas, d_contexts)
            d_kernels = [d_hidden_kernel, d_context_kernel, d_beta_bias]
            if additive:
                d_kernels.append(d_score_kernel[:, None])
            else:
                d_projected = tf.einsum("tbl,tbu->blu", d_scores, h_prev)
            return [d_gates_x, d_projected, d_features, d_h0, d_c0, *d_kernels]

        return (hs, zs, alphas), grad

    return recurrence(gates_x, projected, features, h0, c0, *kernels)
