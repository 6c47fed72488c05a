// The float64 reference (see reference_backend.h): convolution (forward, data and weight
// gradients), batch norm (statistics, normalization, its gradients, running statistics) as
// plain loops over double activations, and the fused ops composed of those same loops with no
// rounding between them.
#include <cmath>

#include "core/error.h"
#include "kernels/reference/reference_backend.h"

namespace spotrain::reference {

namespace {

// ---- convolution (groups 1, dilation 1, symmetric zero padding) --------------------------------

// The filter (K, C, kh, kw) of a convolution of x with parameters p.
std::vector<double> filter_of(const Tensor& w, const Act& x, const ConvParams& p, const char* op) {
  SPOTRAIN_CHECK(w.ndim() == 4 && w.dim(1) == x.c && w.dim(2) == p.kh && w.dim(3) == p.kw,
                 "reference ", op, ": filter ", w.describe(), " for an input of ", x.c, " channels and a ",
                 p.kh, "x", p.kw, " window");
  return doubles_of(w, op);
}

int64_t out_size(int64_t in, int k, const ConvParams& p) { return (in + 2 * p.pad - k) / p.stride + 1; }

// Calls f(n, k, oy, ox, c, iy, ix, weight index) for every product the convolution sums:
// output (n, k, oy, ox) reads input (n, c, oy * stride - pad + i, ox * stride - pad + j) with
// filter tap (k, c, i, j); taps that fall on the padding read zero and are left out.
template <class F>
void for_each_product(const Shape& xs, int64_t K, const ConvParams& p, F f) {
  const int64_t N = xs[0], C = xs[1], H = xs[2], W = xs[3];
  const int64_t OH = out_size(H, p.kh, p), OW = out_size(W, p.kw, p);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      for (int64_t oy = 0; oy < OH; ++oy)
        for (int64_t ox = 0; ox < OW; ++ox)
          for (int64_t c = 0; c < C; ++c)
            for (int i = 0; i < p.kh; ++i)
              for (int j = 0; j < p.kw; ++j) {
                const int64_t iy = oy * p.stride - p.pad + i, ix = ox * p.stride - p.pad + j;
                if (iy < 0 || iy >= H || ix < 0 || ix >= W) continue;
                f(n, k, oy, ox, c, iy, ix, size_t(((k * C + c) * p.kh + i) * p.kw + j));
              }
}

// y[n,k,oy,ox] = sum over c, i, j of x[n, c, oy*s - pad + i, ox*s - pad + j] * w[k,c,i,j]
Act conv_forward(const Act& x, const std::vector<double>& w, int64_t K, const ConvParams& p) {
  Act y(x.n, K, out_size(x.h, p.kh, p), out_size(x.w, p.kw, p));
  for_each_product(x.shape(), K, p, [&](int64_t n, int64_t k, int64_t oy, int64_t ox, int64_t c,
                                        int64_t iy, int64_t ix, size_t wi) {
    y.at(n, k, oy, ox) += x.at(n, c, iy, ix) * w[wi];
  });
  return y;
}

// dx[n,c,iy,ix] = the sum, over the products of the forward that read x[n,c,iy,ix], of
// dy[n,k,oy,ox] * w[k,c,i,j]
Act conv_backward_data(const Act& dy, const std::vector<double>& w, const Shape& xs, const ConvParams& p) {
  Act dx(xs[0], xs[1], xs[2], xs[3]);
  for_each_product(xs, dy.c, p, [&](int64_t n, int64_t k, int64_t oy, int64_t ox, int64_t c,
                                    int64_t iy, int64_t ix, size_t wi) {
    dx.at(n, c, iy, ix) += dy.at(n, k, oy, ox) * w[wi];
  });
  return dx;
}

// dw[k,c,i,j] = sum over n, oy, ox of dy[n,k,oy,ox] * x[n, c, oy*s - pad + i, ox*s - pad + j]
std::vector<double> conv_backward_weights(const Act& x, const Act& dy, const ConvParams& p) {
  std::vector<double> dw(size_t(dy.c * x.c * p.kh * p.kw), 0.);
  for_each_product(x.shape(), dy.c, p, [&](int64_t n, int64_t k, int64_t oy, int64_t ox, int64_t c,
                                           int64_t iy, int64_t ix, size_t wi) {
    dw[wi] += dy.at(n, k, oy, ox) * x.at(n, c, iy, ix);
  });
  return dw;
}

void check_shape(const Act& a, const Shape& want, const char* what, const char* op) {
  SPOTRAIN_CHECK(a.shape() == want, "reference ", op, ": ", what, " ", shape_str(a.shape()),
                 " where ", shape_str(want), " was wanted");
}

// ---- batch norm: statistics over N, H, W per channel ------------------------------------------

struct Stats {
  std::vector<double> mean, var;  // var: biased, (1/M) sum (x - mean)^2 over the M = N*H*W values
};

Stats batch_stats(const Act& x) {
  const double M = double(x.n * x.h * x.w);
  Stats s{std::vector<double>(size_t(x.c), 0.), std::vector<double>(size_t(x.c), 0.)};
  for (int64_t c = 0; c < x.c; ++c) {
    for (int64_t n = 0; n < x.n; ++n)
      for (int64_t i = 0; i < x.h * x.w; ++i) s.mean[size_t(c)] += x.v[size_t((n * x.c + c) * x.h * x.w + i)];
    s.mean[size_t(c)] /= M;
    for (int64_t n = 0; n < x.n; ++n)
      for (int64_t i = 0; i < x.h * x.w; ++i) {
        const double d = x.v[size_t((n * x.c + c) * x.h * x.w + i)] - s.mean[size_t(c)];
        s.var[size_t(c)] += d * d;
      }
    s.var[size_t(c)] /= M;
  }
  return s;
}

// Calls f(channel, element index) for every element of x.
template <class F>
void for_each_element(const Act& x, F f) {
  for (int64_t n = 0; n < x.n; ++n)
    for (int64_t c = 0; c < x.c; ++c)
      for (int64_t i = 0; i < x.h * x.w; ++i) f(size_t(c), size_t((n * x.c + c) * x.h * x.w + i));
}

// y = gamma (x - mean) / sqrt(var + eps) + beta, then max(y, 0) with relu.
Act bn_apply(const Act& x, const std::vector<double>& gamma, const std::vector<double>& beta,
             const std::vector<double>& mean, const std::vector<double>& var, double eps, bool relu) {
  Act y = x;
  for_each_element(x, [&](size_t c, size_t e) {
    const double v = gamma[c] * (x.v[e] - mean[c]) / std::sqrt(var[c] + eps) + beta[c];
    y.v[e] = relu && !(v > 0) ? 0 : v;
  });
  return y;
}

// g where mask > 0, else 0 (a ReLU's backward).
Act masked(Act g, const Act& mask) {
  for (size_t e = 0; e < g.v.size(); ++e)
    if (!(mask.v[e] > 0)) g.v[e] = 0;
  return g;
}

// Batch norm's backward from g = dL/dy, with xhat = (x - mean) / sqrt(var + eps):
//   dbeta = sum g;  dgamma = sum g xhat;  dx = gamma / sqrt(var + eps) (g - dbeta / M - xhat dgamma / M)
struct BnGrads {
  Act dx;
  std::vector<double> dgamma, dbeta;
};
BnGrads bn_backward(const Act& g, const Act& x, const std::vector<double>& gamma,
                    const std::vector<double>& mean, const std::vector<double>& var, double eps) {
  const double M = double(x.n * x.h * x.w);
  BnGrads r{x, std::vector<double>(size_t(x.c), 0.), std::vector<double>(size_t(x.c), 0.)};
  auto xhat = [&](size_t c, size_t e) { return (x.v[e] - mean[c]) / std::sqrt(var[c] + eps); };
  for_each_element(x, [&](size_t c, size_t e) {
    r.dbeta[c] += g.v[e];
    r.dgamma[c] += g.v[e] * xhat(c, e);
  });
  for_each_element(x, [&](size_t c, size_t e) {
    r.dx.v[e] = gamma[c] / std::sqrt(var[c] + eps) * (g.v[e] - r.dbeta[c] / M - xhat(c, e) * r.dgamma[c] / M);
  });
  return r;
}

std::vector<double> stat_of(const Tensor& t, int64_t channels, const char* what, const char* op) {
  SPOTRAIN_CHECK(t.defined() && t.numel() == channels, "reference ", op, ": ", what, " ",
                 t.defined() ? t.describe() : std::string("missing"), " for ", channels, " channels");
  return doubles_of(t, op);
}

// Records the batch statistics in `saved` (fp32, as the interface keeps them).
void save_stats(BnSaved& saved, const Stats& s) {
  const int64_t C = int64_t(s.mean.size());
  saved.mean = plain_of({C}, s.mean);
  saved.var = plain_of({C}, s.var);
  for (Tensor& t : saved.backend_state) t = Tensor();
}

}  // namespace

// ---- convolution ops ---------------------------------------------------------------------------

Tensor ReferenceBackend::conv2d_forward_impl(const Tensor& xt, const Tensor& wt, const ConvParams& p) {
  const Act x = act_of(xt, "conv2d_forward");
  return tensor_of(conv_forward(x, filter_of(wt, x, p, "conv2d_forward"), wt.dim(0), p));
}

Tensor ReferenceBackend::conv2d_backward_data_impl(const Tensor& dyt, const Tensor& wt, const Tensor& xt,
                                                   const ConvParams& p) {
  const Act x = act_of(xt, "conv2d_backward_data"), dy = act_of(dyt, "conv2d_backward_data");
  check_shape(dy, {x.n, wt.dim(0), out_size(x.h, p.kh, p), out_size(x.w, p.kw, p)}, "dy", "conv2d_backward_data");
  return tensor_of(conv_backward_data(dy, filter_of(wt, x, p, "conv2d_backward_data"), x.shape(), p));
}

void ReferenceBackend::conv2d_backward_weights_impl(const Tensor& xt, const Tensor& dyt, const ConvParams& p,
                                                    Tensor& dw) {
  const Act x = act_of(xt, "conv2d_backward_weights"), dy = act_of(dyt, "conv2d_backward_weights");
  SPOTRAIN_CHECK(dw.shape() == Shape({dy.c, x.c, p.kh, p.kw}), "reference conv2d_backward_weights: dw ",
                 dw.describe(), " for ", dy.c, " filters of ", x.c, " channels");
  store(dw, conv_backward_weights(x, dy, p));
}

// acc + the data gradient, summed in double and rounded once.
void ReferenceBackend::conv2d_backward_data_add_impl(const Tensor& dyt, const Tensor& wt, const Tensor& xt,
                                                     const ConvParams& p, Tensor& acc) {
  const Act x = act_of(xt, "conv2d_backward_data_add"), dy = act_of(dyt, "conv2d_backward_data_add");
  Act sum = act_of(acc, "conv2d_backward_data_add");
  check_shape(sum, x.shape(), "acc", "conv2d_backward_data_add");
  const Act dx = conv_backward_data(dy, filter_of(wt, x, p, "conv2d_backward_data_add"), x.shape(), p);
  for (size_t e = 0; e < sum.v.size(); ++e) sum.v[e] += dx.v[e];
  acc = tensor_of(sum);
}

// in = x, or relu(bn(x)) with the prologue's statistics; y = conv(in); with `stats`, the batch
// statistics of y. No rounding between the steps.
Tensor ReferenceBackend::conv2d_forward_bn_stats_impl(const Tensor& xt, const Tensor& wt, const ConvParams& p,
                                                      const BnApply* pro, float eps, BnSaved* stats) {
  const char* op = "conv2d_forward_bn_stats";
  Act in = act_of(xt, op);
  if (pro) {
    const int64_t C = in.c;
    in = bn_apply(in, stat_of(pro->gamma, C, "gamma", op), stat_of(pro->beta, C, "beta", op),
                  stat_of(pro->mean, C, "mean", op), stat_of(pro->var, C, "var", op), pro->eps, true);
  }
  const Act y = conv_forward(in, filter_of(wt, in, p, op), wt.dim(0), p);
  if (stats) save_stats(*stats, batch_stats(y));
  return tensor_of(y);
}

// Through conv, the ReLU and the prologue's batch norm at once: a = relu(bn(x)) made again,
// dw = the weight gradient of conv over a, g = the data gradient where a > 0, then batch norm's
// backward of g with the statistics the forward made (`saved`).
Tensor ReferenceBackend::conv2d_backward_bn_relu_impl(const Tensor& dyt, const Tensor& wt, const Tensor& xt,
                                                      const ConvParams& p, const BnApply& pro,
                                                      const BnSaved& saved, Tensor& dw, Tensor& dgamma,
                                                      Tensor& dbeta) {
  const char* op = "conv2d_backward_bn_relu";
  const Act x = act_of(xt, op), dy = act_of(dyt, op);
  const int64_t C = x.c;
  const std::vector<double> gamma = stat_of(pro.gamma, C, "gamma", op);
  const Act a = bn_apply(x, gamma, stat_of(pro.beta, C, "beta", op), stat_of(pro.mean, C, "mean", op),
                         stat_of(pro.var, C, "var", op), pro.eps, true);
  const std::vector<double> w = filter_of(wt, x, p, op);
  SPOTRAIN_CHECK(dw.shape() == wt.shape(), "reference ", op, ": dw ", dw.describe(), " for ", wt.describe());
  store(dw, conv_backward_weights(a, dy, p));
  const BnGrads g = bn_backward(masked(conv_backward_data(dy, w, x.shape(), p), a), x, gamma,
                                stat_of(saved.mean, C, "saved mean", op), stat_of(saved.var, C, "saved var", op),
                                pro.eps);
  store(dgamma, g.dgamma);
  store(dbeta, g.dbeta);
  return tensor_of(g.dx);
}

// ---- batch norm ops ----------------------------------------------------------------------------

Tensor ReferenceBackend::batchnorm_forward_train_impl(const Tensor& xt, const Tensor& gamma, const Tensor& beta,
                                                      float eps, bool relu, BnSaved& saved) {
  const char* op = "batchnorm_forward_train";
  const Act x = act_of(xt, op);
  const Stats s = batch_stats(x);
  save_stats(saved, s);
  return tensor_of(bn_apply(x, stat_of(gamma, x.c, "gamma", op), stat_of(beta, x.c, "beta", op), s.mean,
                            s.var, eps, relu));
}

Tensor ReferenceBackend::batchnorm_forward_infer_impl(const Tensor& xt, const Tensor& gamma, const Tensor& beta,
                                                      const Tensor& rm, const Tensor& rv, float eps, bool relu) {
  const char* op = "batchnorm_forward_infer";
  const Act x = act_of(xt, op);
  return tensor_of(bn_apply(x, stat_of(gamma, x.c, "gamma", op), stat_of(beta, x.c, "beta", op),
                            stat_of(rm, x.c, "running mean", op), stat_of(rv, x.c, "running var", op), eps,
                            relu));
}

// With relu, g = dy where the forward's output bn(x) > 0 (made again from x and the saved
// statistics), else 0.
Tensor ReferenceBackend::batchnorm_backward_impl(const Tensor& dyt, const Tensor& xt, const Tensor& gamma,
                                                 const Tensor& beta, const BnSaved& saved, float eps, bool relu,
                                                 Tensor& dgamma, Tensor& dbeta) {
  const char* op = "batchnorm_backward";
  const Act x = act_of(xt, op);
  Act g = act_of(dyt, op);
  check_shape(g, x.shape(), "dy", op);
  const std::vector<double> gm = stat_of(gamma, x.c, "gamma", op), mean = stat_of(saved.mean, x.c, "mean", op),
                            var = stat_of(saved.var, x.c, "var", op);
  if (relu) g = masked(std::move(g), bn_apply(x, gm, stat_of(beta, x.c, "beta", op), mean, var, eps, false));
  const BnGrads r = bn_backward(g, x, gm, mean, var, eps);
  store(dgamma, r.dgamma);
  store(dbeta, r.dbeta);
  return tensor_of(r.dx);
}

// relu(bn(x) + z), rounded once; the output is kept for the ReLU's mask in backward (z is not
// passed there).
Tensor ReferenceBackend::batchnorm_add_relu_forward_train_impl(const Tensor& xt, const Tensor& zt,
                                                               const Tensor& gamma, const Tensor& beta,
                                                               float eps, BnSaved& saved) {
  const char* op = "batchnorm_add_relu_forward_train";
  const Act x = act_of(xt, op), z = act_of(zt, op);
  check_shape(z, x.shape(), "z", op);
  const Stats s = batch_stats(x);
  save_stats(saved, s);
  Act y = bn_apply(x, stat_of(gamma, x.c, "gamma", op), stat_of(beta, x.c, "beta", op), s.mean, s.var, eps, false);
  for (size_t e = 0; e < y.v.size(); ++e) y.v[e] = y.v[e] + z.v[e] > 0 ? y.v[e] + z.v[e] : 0;
  saved.backend_state[BnSaved::kComposedOutput] = tensor_of(y);
  return saved.backend_state[BnSaved::kComposedOutput];
}

// dz = dy where the output > 0, else 0; dx, dgamma, dbeta: batch norm's backward of dz. The
// saved output is consumed.
Tensor ReferenceBackend::batchnorm_add_relu_backward_impl(const Tensor& dyt, const Tensor& xt, const Tensor& gamma,
                                                          const Tensor& beta, BnSaved& saved, float eps,
                                                          Tensor& dgamma, Tensor& dbeta, Tensor& dz) {
  const char* op = "batchnorm_add_relu_backward";
  const Tensor y = std::move(saved.backend_state[BnSaved::kComposedOutput]);
  saved.backend_state[BnSaved::kComposedOutput] = Tensor();
  SPOTRAIN_CHECK(y.defined(), "reference ", op, ": no output saved by its forward");
  const Act x = act_of(xt, op);
  const Act g = masked(act_of(dyt, op), act_of(y, op));
  check_shape(g, x.shape(), "dy", op);
  const BnGrads r = bn_backward(g, x, stat_of(gamma, x.c, "gamma", op), stat_of(saved.mean, x.c, "mean", op),
                                stat_of(saved.var, x.c, "var", op), eps);
  dz = tensor_of(g);
  store(dgamma, r.dgamma);
  store(dbeta, r.dbeta);
  return tensor_of(r.dx);
}

// running = (1 - momentum) running + momentum batch, the batch variance made unbiased (n / (n - 1)).
void ReferenceBackend::batchnorm_update_running_impl(Tensor& running_mean, Tensor& running_var,
                                                     const BnSaved& saved, float momentum, int64_t n) {
  const char* op = "batchnorm_update_running";
  const int64_t C = running_mean.numel();
  std::vector<double> rm = doubles_of(running_mean, op), rv = doubles_of(running_var, op);
  const std::vector<double> mean = stat_of(saved.mean, C, "mean", op), var = stat_of(saved.var, C, "var", op);
  const double m = momentum, unbias = n > 1 ? double(n) / double(n - 1) : 1.0;
  for (int64_t c = 0; c < C; ++c) {
    rm[size_t(c)] = (1 - m) * rm[size_t(c)] + m * mean[size_t(c)];
    rv[size_t(c)] = (1 - m) * rv[size_t(c)] + m * var[size_t(c)] * unbias;
  }
  store(running_mean, rm);
  store(running_var, rv);
}

}  // namespace spotrain::reference
