"""Analytic work counts of the decoder (paper §3.1.2, §4) for the benchmarks.

Notation as in docs/design.md §1.1: L annotation vectors of size D, word embedding m, LSTM size
n, additive-score width A, output vocabulary V, batch B, T decoder steps (the caption's
words and `<end>`). A matrix product of (r, k) by (k, c) costs 2 r k c FLOPs; every
elementwise operation (add, multiply, tanh, sigmoid, exp, log, compare) costs 1 FLOP per
element.
"""

import dataclasses

from sat_tf.model.fast.layout import HiddenLayout


@dataclasses.dataclass(frozen=True)
class Shape:
    """Sizes of one decoder configuration.

    Attributes:
      locations: L.
      feature_dim: D.
      embed_dim: m.
      hidden_dim: n.
      attention_dim: A (used by the additive score only).
      vocab_size: V, including the four special tokens.
      attention: "soft", "hard" or "none".
      score: "additive" or "dot".
      hard_gate: hard attention gated by beta as soft attention is (`--hard_gate`).
    """

    locations: int
    feature_dim: int
    embed_dim: int
    hidden_dim: int
    attention_dim: int
    vocab_size: int
    attention: str = "soft"
    score: str = "additive"
    hard_gate: bool = False

    def gated(self):
        """Whether the context is scaled by beta = sigmoid(w_beta h + b)."""
        return self.attention == "soft" or (self.attention == "hard" and self.hard_gate)

    def hidden_projection_width(self):
        """Columns W of the fused h_{t-1} kernel (`fast.layout.HiddenLayout`)."""
        score = self.attention_dim if self.attention != "none" and self.score == "additive" else 0
        return HiddenLayout(4 * self.hidden_dim, score, self.gated()).width

    def parameters(self):
        """Trainable parameters of the decoder."""
        L, D, m, n, A, V = self._sizes()
        count = V * m + 2 * (D * n + n)  # embedding, init_h, init_c
        count += (m * 4 * n + 4 * n) + n * 4 * n + D * 4 * n  # LSTM: embed, hidden, context
        count += (n * m + m) + D * m + (m * V + V)  # L_h, L_z, L_o
        if self.attention != "none":
            if self.score == "additive":
                count += (D * A + A) + n * A + A  # W_a, U_a, v
            else:
                count += D * n  # W_a
        if self.gated():
            count += n + 1  # beta
        return count

    def _sizes(self):
        return (
            self.locations,
            self.feature_dim,
            self.embed_dim,
            self.hidden_dim,
            self.attention_dim,
            self.vocab_size,
        )


def train_step_flops(shape: Shape, batch: int, steps: int, optimizer_flops_per_param=12):
    """FLOPs of one teacher-forced training step (`ShowAttendTell.train_step`).

    Forward, per caption, once (outside the recurrence):
      matmul: init_h, init_c                      2 * 2 D n
              W_a a (additive)                    2 L D A     (dot: 2 L D n)
              embedding half of the gates, all t  2 T m 4n
      elementwise: mean of a                      L D
              init tanh + bias                    4 n
              W_a bias (additive)                 L A
    Forward, per caption and step (x T):
      matmul: [U | U_a | w_beta] h_{t-1}          2 n W, W = hidden_projection_width()
              score v^T tanh(.) (additive)        2 L A       (dot: a^T W_a h: 2 L n)
              expected context sum_i alpha_i a_i  2 L D       (soft and hard)
              Z z_t (context half of the gates)   2 D 4n      (none too: z_t = mean_i a_i)
      elementwise: score add + tanh (additive)    2 L A
              log-softmax + exp of alpha          4 L
              beta gate sigmoid + scale (soft)    D + 1
              Gumbel add, argmax, select, entropy (hard)  2 L + D + 3 L
              gate sums                           2 * 4n
              LSTM cell: 3 sigmoid, 2 tanh, 3 mul, 1 add   9 n
    Forward, per caption and step, after the recurrence (deep output, eq. 7):
      matmul: L_h h_t, L_z z_t                    2 n m + 2 D m
              L_o                                 2 m V
      elementwise: sum of three + bias + tanh     4 m
              L_o bias                            V
              softmax cross-entropy (max, sub, exp, sum, log, pick)  4 V
    Loss per caption: masked sum over T (2 T), doubly stochastic penalty (soft):
      2 T L + 3 L.
    Backward: twice the forward FLOPs, matmuls and elementwise alike (each matmul
    has two gradient products of its own size; elementwise gradients take about two
    operations per element).
    Optimizer: `optimizer_flops_per_param` per parameter (Adam moments, bias correction,
    update, and the global-norm clip: about 12).

    Args:
      shape: the decoder sizes.
      batch: B.
      steps: T.
      optimizer_flops_per_param: FLOPs of the update per parameter.

    Returns:
      dict of FLOP counts: "forward_matmul", "forward_elementwise", "forward",
      "backward", "optimizer", "total".
    """
    L, _, m, n, _, _ = shape._sizes()
    T = steps
    once_mm, once_ew = _per_image(shape)
    once_mm += 2 * T * m * 4 * n
    step_mm, step_ew = _recurrent_step(shape)
    out_mm, out_ew = _deep_output(shape)
    loss_ew = 2 * T + (2 * T * L + 3 * L if shape.attention == "soft" else 0)

    forward_mm = batch * (once_mm + T * (step_mm + out_mm))
    forward_ew = batch * (once_ew + T * (step_ew + out_ew) + loss_ew)
    forward = forward_mm + forward_ew
    optimizer = optimizer_flops_per_param * shape.parameters()
    return {
        "forward_matmul": forward_mm,
        "forward_elementwise": forward_ew,
        "forward": forward,
        "backward": 2 * forward,
        "optimizer": optimizer,
        "total": 3 * forward + optimizer,
    }


def _per_image(shape: Shape):
    """(matmul, elementwise) FLOPs of a caption's start, once: init_h, init_c, the mean
    of a, and the score's W_a a (`train_step_flops` lists them)."""
    L, D, _, n, A, _ = shape._sizes()
    matmul, elementwise = 2 * 2 * D * n, L * D + 4 * n
    if shape.attention != "none":
        additive = shape.score == "additive"
        matmul += 2 * L * D * (A if additive else n)
        elementwise += L * A if additive else 0
    return matmul, elementwise


def _recurrent_step(shape: Shape):
    """(matmul, elementwise) FLOPs of a step's recurrence on one caption, from h_{t-1}
    and the word half of the gates to h_t (`train_step_flops` lists them)."""
    L, D, _, n, A, _ = shape._sizes()
    matmul = 2 * n * shape.hidden_projection_width() + 2 * D * 4 * n
    elementwise = 2 * 4 * n + 9 * n
    if shape.attention != "none":
        additive = shape.score == "additive"
        matmul += (2 * L * A if additive else 2 * L * n) + 2 * L * D
        elementwise += (2 * L * A if additive else 0) + 4 * L
        if shape.attention == "hard":
            elementwise += 2 * L + D + 3 * L
        if shape.gated():
            elementwise += D + 1
    return matmul, elementwise


def _deep_output(shape: Shape):
    """(matmul, elementwise) FLOPs of a step's deep output (eq. 7) and its normalisation
    over V on one caption (`train_step_flops` lists them)."""
    _, D, m, n, _, V = shape._sizes()
    return 2 * n * m + 2 * D * m + 2 * m * V, 4 * m + V + 4 * V


def decode_flops(shape: Shape):
    """FLOPs of captioning: `AttentionDecoder.initial_state` once per image, and
    `AttentionDecoder.step` once per hypothesis and step (greedy: a caption; beam
    search: each of the hypotheses it steps).

    Per image: the start of `train_step_flops` without the embedding half of the gates
    (init_h, init_c, mean of a, W_a a). Per hypothesis-step: the train step's forward
    recurrence and deep output, with the embedding half of the gates made at the step
    (teacher forcing makes it once for all t), 2 m 4n + 4n for its bias, and the
    log-softmax over V (max, subtract, exp, sum, log) counted as the cross-entropy's 4 V.
    Beam search's bookkeeping (the never-emitted penalty, blocking, top-k, gathers by
    parent) is not counted: O(V) comparisons and adds a hypothesis, under 1 % of a step
    at the shipped sizes.

    Returns:
      dict: "per_image_matmul", "per_image_elementwise", "per_image", "step_matmul",
      "step_elementwise", "step" (per hypothesis-step).
    """
    _, _, m, n, _, _ = shape._sizes()
    image_mm, image_ew = _per_image(shape)
    step_mm, step_ew = _recurrent_step(shape)
    out_mm, out_ew = _deep_output(shape)
    step_mm += out_mm + 2 * m * 4 * n
    step_ew += out_ew + 4 * n
    return {
        "per_image_matmul": image_mm,
        "per_image_elementwise": image_ew,
        "per_image": image_mm + image_ew,
        "step_matmul": step_mm,
        "step_elementwise": step_ew,
        "step": step_mm + step_ew,
    }


def encoder_flops(model):
    """FLOPs of a Keras convolutional network on one image, counted from its layers'
    shapes: a `Conv2D` 2 H W Cout k_h k_w Cin / groups, a `DepthwiseConv2D` 2 H W C M
    k_h k_w (M the depth multiplier), H x W the layer's output grid (strides and
    dilation change the grid, not the count per output). Elementwise layers (batch
    norm, activations, additions, biases) are not counted; nested models are walked.

    Args:
      model: a built functional `keras.Model` (e.g. `ImageEncoder.net`).

    Returns:
      dict: "conv_1x1", "conv_other", "depthwise", "total" FLOPs per image.

    Raises:
      ValueError: for a layer with weights that is not counted (Dense, separable or
        transposed convolutions), rather than leaving it out silently.
    """
    import keras

    counts = {"conv_1x1": 0, "conv_other": 0, "depthwise": 0}

    def walk(layers):
        for layer in layers:
            if isinstance(layer, keras.Model):
                walk(layer.layers)
                continue
            kind = type(layer)
            if kind not in (keras.layers.Conv2D, keras.layers.DepthwiseConv2D):
                if layer.weights and kind is not keras.layers.BatchNormalization:
                    raise ValueError(f"layer {layer.name} ({kind.__name__}) is not counted")
                continue
            height, width, channels = layer.output.shape[1:]
            taps = layer.kernel_size[0] * layer.kernel_size[1]
            if kind is keras.layers.DepthwiseConv2D:
                counts["depthwise"] += 2 * height * width * channels * taps
            else:
                inputs = layer.input.shape[-1] // layer.groups
                key = "conv_1x1" if taps == 1 else "conv_other"
                counts[key] += 2 * height * width * channels * taps * inputs

    walk(model.layers)
    return {**counts, "total": sum(counts.values())}


def train_step_products(shape: Shape, batch: int, steps: int):
    """The matrix products a teacher-forced train step cannot do without, at their shapes,
    in the fewest calls any schedule needs (`bench/run.py`'s `step_products` times them).

    Products whose input depends on the previous step run once a step on B rows: the
    hidden projection [U | U_a | w_beta] h_{t-1} and the context half of the gates Z z_t,
    forward, and the gradients of their inputs (dh, dz) backward. Everything else runs
    once on all rows: the start state and W_a a (B L rows; the annotations are inputs,
    so only the weights' gradients), the embedding half of the gates and the deep output
    (B T rows), and every weight's gradient, summed over the steps in one product.
    The attention's reads of a and W_a a (the score, the context and their gradients)
    are memory passes (`train_step_pass_bytes`), not listed here.

    Returns:
      list of (name, rows, inner, cols, transpose_a, transpose_b, calls): a
      (rows, inner) by (inner, cols) product, called `calls` times a step. A gradient
      product takes its operands transposed, as TensorFlow's gradient of a product does.
    """
    L, D, m, n, A, V = shape._sizes()
    B, T = batch, steps
    width = shape.hidden_projection_width()
    products = []

    def product(name, rows, inner, cols, calls=1, input_grad=True, recurrent=False):
        """A forward (rows, inner) x (inner, cols) product and its gradients."""
        weight_rows = B * T if recurrent else rows
        products.append((name, rows, inner, cols, False, False, calls))
        products.append((name + " dW", inner, weight_rows, cols, True, False, 1))
        if input_grad:
            products.append((name + " dX", rows, cols, inner, False, True, calls))

    product("init_h, init_c", B, D, 2 * n, input_grad=False)
    if shape.attention != "none":
        product("W_a a", B * L, D, A if shape.score == "additive" else n, input_grad=False)
    product("embedding gates", B * T, m, 4 * n)
    product("hidden projection", B, n, width, calls=T, recurrent=True)
    product("context gates", B, D, 4 * n, calls=T, recurrent=True)
    product("L_h", B * T, n, m)
    product("L_z", B * T, D, m)
    product("L_o", B * T, m, V)
    return products


def decode_step_bytes(shape: Shape, bytes_per_value=4):
    """Bytes one greedy step at batch 1 must read (`AttentionDecoder.step`).

    At batch 1 every product is a matrix-vector product, so a step streams each weight
    it uses once; activations are negligible except the per-image tensors the
    attention reads every step:
      weights: U, U_a, w_beta               n W
               embedding half of the gates  m 4n + 4n
               context half of the gates    D 4n
               L_h, L_z, L_o                n m + m + D m + m V + V
               v (additive)                 A
      per image: W_a a (additive: L A; dot: L n) and a itself (L D).

    Returns:
      dict: "weights", "per_image" and "total" bytes per step.
    """
    L, D, m, n, A, V = shape._sizes()
    width = shape.hidden_projection_width()
    weights = n * width + (m * 4 * n + 4 * n) + D * 4 * n + n * m + m + D * m + m * V + V
    per_image = 0
    if shape.attention != "none":
        per_image = L * D + (L * A if shape.score == "additive" else L * n)
        weights += A if shape.score == "additive" else 0
    return {
        "weights": bytes_per_value * weights,
        "per_image": bytes_per_value * per_image,
        "total": bytes_per_value * (weights + per_image),
    }


def train_step_pass_bytes(shape: Shape, batch: int, steps: int, bytes_per_value=4):
    """Bytes the fused recurrence streams at every step through the per-image tensors.

    The annotations a (L, D) and the score's projection `W_a a` are read at every word
    and cannot be batched over t (alpha_t depends on h_{t-1}), so these passes run at
    memory speed while the products of the step run at the matmul rate. Per caption and
    step, in values:

      annotations: context `sum_i alpha_i a_i` forward, `d alpha = a dz` backward   2 L D
      additive score, the fewest passes any schedule needs, which its compiled op
        (`model/fused_score.py`) makes: read W_a a (forward); read it again to
        recompute the tanh layer, read and write the accumulated gradient of W_a a
        (backward)                                                                  4 L A
      additive score as TensorFlow ops in `recurrence.py` (one op per pass): forward
        add (2), tanh (2), product with v (1); backward d_scores v (1), TanhGrad (3),
        accumulation (3), v's gradient (1), U_a h's gradient (1)                   14 L A
      dot score (both): the score forward and h's gradient backward, each a read of
        `a W_a`                                                                    2 L n

    Without attention nothing is read per word (the mean context is computed once).
    Hard attention's fused recurrence makes the same passes (it computes the expected
    context for every caption and keeps it for some, and its backward pass reads a for
    all of them), and reads the sampled rows besides (D values).

    Returns:
      dict: "minimal" (the compiled score's) and "fused_recurrence" (the TensorFlow
      ops') bytes per train step.
    """
    L, D, _, n, A, _ = shape._sizes()
    if shape.attention == "none":
        return {"minimal": 0, "fused_recurrence": 0}
    if shape.score == "additive":
        minimal, current = 2 * L * D + 4 * L * A, 2 * L * D + 14 * L * A
    else:
        minimal = current = 2 * L * D + 2 * L * n
    scale = bytes_per_value * batch * steps
    return {"minimal": scale * minimal, "fused_recurrence": scale * current}


def share_bound(step_flops, pass_bytes, matmul_gflops, read_gbps, product_seconds=None):
    """The highest share of the matmul rate a train step can reach when its FLOPs run at
    the matmul rate and its per-word passes stream at the read bandwidth, one after the
    other (within a word each waits for the last: scores, softmax, context, gates):
    t_flops / (t_flops + t_bytes). With `product_seconds` (the step's products timed
    alone at their own shapes, `train_step_products`) the step takes at least those
    seconds plus its passes, and the share is that of `step_flops` in that time."""
    t_flops = step_flops / (matmul_gflops * 1e9)
    if product_seconds is not None:
        return t_flops / (product_seconds + pass_bytes / (read_gbps * 1e9))
    t_bytes = pass_bytes / (read_gbps * 1e9)
    return t_flops / (t_flops + t_bytes)
