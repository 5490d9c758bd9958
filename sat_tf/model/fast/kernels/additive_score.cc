// The additive attention score of one decoder step, e_{b,l} = v . tanh(W_a a_{b,l} + U_a h_b),
// and its gradient, each as one pass over the (B, L, A) projection W_a a.
//
// Built and loaded by sat_tf/model/fused_score.py; the math it must equal is
// `AdditiveScore.step_scores` (sat_tf/model/attention.py), which tests/fused_score_test.py
// compares it with. The TensorFlow ops of that function pass over (B, L, A) about five
// times forward and nine times backward (bench/flops.py); here the forward reads the
// projection once and the backward reads it once more (the tanh layer is recomputed, not
// kept) and updates the running sum of its gradient over the steps in place.

#include <functional>
#include <string>
#include <vector>

#include "tensorflow/core/framework/op.h"
#include "tensorflow/core/framework/op_kernel.h"
#include "tensorflow/core/framework/shape_inference.h"
#include "tensorflow/core/util/work_sharder.h"

namespace sat_tf {
namespace {

using ::tensorflow::OpKernel;
using ::tensorflow::OpKernelConstruction;
using ::tensorflow::OpKernelContext;
using ::tensorflow::Tensor;
using ::tensorflow::TensorShape;
using ::tensorflow::shape_inference::InferenceContext;
using ::tensorflow::shape_inference::ShapeHandle;

using Row = Eigen::Map<Eigen::ArrayXf>;
using ConstRow = Eigen::Map<const Eigen::ArrayXf>;

// The ranks of the inputs both ops share: projected (B, L, A), score_in (B, A), v (A,).
absl::Status SharedInputRanks(InferenceContext* c, ShapeHandle* projected,
                              ShapeHandle* score_in, ShapeHandle* v) {
  TF_RETURN_IF_ERROR(c->WithRank(c->input(0), 3, projected));
  TF_RETURN_IF_ERROR(c->WithRank(c->input(1), 2, score_in));
  return c->WithRank(c->input(2), 1, v);
}

absl::Status ScoreShape(InferenceContext* c) {
  ShapeHandle projected, score_in, v;
  TF_RETURN_IF_ERROR(SharedInputRanks(c, &projected, &score_in, &v));
  c->set_output(0, c->Matrix(c->Dim(projected, 0), c->Dim(projected, 1)));
  return absl::OkStatus();
}

absl::Status ScoreGradShape(InferenceContext* c) {
  ShapeHandle projected, score_in, v;
  TF_RETURN_IF_ERROR(SharedInputRanks(c, &projected, &score_in, &v));
  c->set_output(0, projected);
  c->set_output(1, score_in);
  c->set_output(2, v);
  return absl::OkStatus();
}

// The inputs both ops share, their sizes and their data.
struct ScoreInputs {
  int64_t batch, cells, units;  // B, L, A
  const float* projected;       // (B, L, A)
  const float* score_in;        // (B, A)
  const float* v;               // (A,)
};

// Reads inputs 0-2 of `ctx` into `inputs`, after checking their shapes against each other.
absl::Status ReadScoreInputs(OpKernelContext* ctx, ScoreInputs* inputs) {
  const Tensor& projected = ctx->input(0);
  const Tensor& score_in = ctx->input(1);
  const Tensor& v = ctx->input(2);
  if (projected.dims() != 3) {
    return absl::InvalidArgumentError("projected must be (B, L, A); got shape " +
                                      projected.shape().DebugString());
  }
  const int64_t batch = projected.dim_size(0), units = projected.dim_size(2);
  if (score_in.dims() != 2 || score_in.dim_size(0) != batch ||
      score_in.dim_size(1) != units) {
    return absl::InvalidArgumentError(
        "score_in must be (B, A) = (" + std::to_string(batch) + ", " +
        std::to_string(units) + "); got shape " + score_in.shape().DebugString());
  }
  if (v.dims() != 1 || v.dim_size(0) != units) {
    return absl::InvalidArgumentError("v must be (A,) = (" + std::to_string(units) +
                                      ",); got shape " + v.shape().DebugString());
  }
  *inputs = {batch,
             projected.dim_size(1),
             units,
             projected.flat<float>().data(),
             score_in.flat<float>().data(),
             v.flat<float>().data()};
  return absl::OkStatus();
}

void ShardOver(OpKernelContext* ctx, int64_t total, int64_t cost,
               const std::function<void(int64_t, int64_t)>& work) {
  auto* workers = ctx->device()->tensorflow_cpu_worker_threads();
  ::tensorflow::Shard(workers->num_threads, workers->workers, total, cost, work);
}

class AdditiveScoreOp : public OpKernel {
 public:
  explicit AdditiveScoreOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    ScoreInputs inputs;
    OP_REQUIRES_OK(ctx, ReadScoreInputs(ctx, &inputs));
    const int64_t cells = inputs.cells, units = inputs.units;
    Tensor* scores = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(0, TensorShape({inputs.batch, cells}), &scores));
    const ConstRow v(inputs.v, units);
    float* out = scores->flat<float>().data();
    ShardOver(ctx, inputs.batch * cells, 30 * units, [&](int64_t begin, int64_t end) {
      for (int64_t r = begin; r < end; ++r) {
        const ConstRow row(inputs.projected + r * units, units);
        const ConstRow hidden(inputs.score_in + (r / cells) * units, units);
        out[r] = ((row + hidden).tanh() * v).sum();
      }
    });
  }
};

// Inputs: projected, score_in, v, d_scores (B, L), d_projected_sum (B, L, A).
// Outputs: d_projected_sum + dE/d projected (in place where the input's buffer can be
// reused), dE/d score_in (B, A), dE/d v (A,).
class AdditiveScoreGradOp : public OpKernel {
 public:
  explicit AdditiveScoreGradOp(OpKernelConstruction* ctx) : OpKernel(ctx) {}

  void Compute(OpKernelContext* ctx) override {
    ScoreInputs inputs;
    OP_REQUIRES_OK(ctx, ReadScoreInputs(ctx, &inputs));
    const int64_t batch = inputs.batch, cells = inputs.cells, units = inputs.units;
    const Tensor& d_scores = ctx->input(3);
    const Tensor& sum_in = ctx->input(4);
    OP_REQUIRES(ctx,
                d_scores.dims() == 2 && d_scores.dim_size(0) == batch &&
                    d_scores.dim_size(1) == cells,
                absl::InvalidArgumentError("d_scores must be (B, L); got shape " +
                                           d_scores.shape().DebugString()));
    OP_REQUIRES(ctx, sum_in.shape() == ctx->input(0).shape(),
                absl::InvalidArgumentError(
                    "d_projected_sum must have the shape of projected " +
                    ctx->input(0).shape().DebugString() + "; got " +
                    sum_in.shape().DebugString()));
    Tensor* sum_out = nullptr;
    OP_REQUIRES_OK(ctx, ctx->forward_input_or_allocate_output({4}, 0, sum_in.shape(),
                                                              &sum_out));
    Tensor* d_score_in = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(1, TensorShape({batch, units}), &d_score_in));
    Tensor* d_v = nullptr;
    OP_REQUIRES_OK(ctx, ctx->allocate_output(2, TensorShape({units}), &d_v));
    Tensor d_v_rows;  // one partial sum of dE/dv per image, summed after the pass
    OP_REQUIRES_OK(ctx, ctx->allocate_temp(::tensorflow::DT_FLOAT,
                                           TensorShape({batch, units}), &d_v_rows));

    const float* projected = inputs.projected;
    const float* score_in = inputs.score_in;
    const ConstRow v(inputs.v, units);
    const float* d_score = d_scores.flat<float>().data();
    const float* in = sum_in.flat<float>().data();
    float* out = sum_out->flat<float>().data();
    float* d_hidden_all = d_score_in->flat<float>().data();
    float* d_v_all = d_v_rows.flat<float>().data();
    ShardOver(ctx, batch, 45 * cells * units, [&](int64_t begin, int64_t end) {
      std::vector<float> buffer(units);
      Row layer(buffer.data(), units);
      for (int64_t b = begin; b < end; ++b) {
        const ConstRow hidden(score_in + b * units, units);
        Row d_hidden(d_hidden_all + b * units, units);
        Row d_v_row(d_v_all + b * units, units);
        d_hidden.setZero();
        d_v_row.setZero();
        for (int64_t l = 0; l < cells; ++l) {
          const int64_t r = b * cells + l;
          Row row_out(out + r * units, units);
          const ConstRow row_in(in + r * units, units);
          const float g = d_score[r];
          if (g == 0.0f) {  // nothing flows back from this cell (e.g. past a caption's end)
            if (out != in) row_out = row_in;
            continue;
          }
          layer = (ConstRow(projected + r * units, units) + hidden).tanh();
          d_v_row += g * layer;
          layer = (g * v) * (1.0f - layer.square());  // dE/d(W_a a + U_a h) at this cell
          d_hidden += layer;
          row_out = row_in + layer;
        }
      }
    });
    Row total(d_v->flat<float>().data(), units);
    total.setZero();
    for (int64_t b = 0; b < batch; ++b) total += ConstRow(d_v_all + b * units, units);
  }
};

}  // namespace

REGISTER_OP("SatAdditiveScore")
    .Input("projected: float")
    .Input("score_in: float")
    .Input("v: float")
    .Output("scores: float")
    .SetShapeFn(ScoreShape);

REGISTER_OP("SatAdditiveScoreGrad")
    .Input("projected: float")
    .Input("score_in: float")
    .Input("v: float")
    .Input("d_scores: float")
    .Input("d_projected_sum: float")
    .Output("d_projected_sum_out: float")
    .Output("d_score_in: float")
    .Output("d_v: float")
    .SetShapeFn(ScoreGradShape);

REGISTER_KERNEL_BUILDER(Name("SatAdditiveScore").Device(::tensorflow::DEVICE_CPU),
                        AdditiveScoreOp);
REGISTER_KERNEL_BUILDER(Name("SatAdditiveScoreGrad").Device(::tensorflow::DEVICE_CPU),
                        AdditiveScoreGradOp);

}  // namespace sat_tf
