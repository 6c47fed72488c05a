// CPU convolution with oneDNN: forward, backward-data and backward-weights primitives cached
// per shape, weights reordered from canonical OIHW into oneDNN's preferred blocked format
// once per optimizer step, activations in the blocked layout (blocked.h) or NHWC.
#include "kernels/cpu/cpu_entries.h"

namespace spotrain::cpu {

using namespace dnnl;


memory CpuBackend::as_desc(const Tensor& t, const memory::desc& md, Tensor& holder) {
  memory::desc have = md_of(t);
  if (have == md) return memory(md, ctx_.eng, t.raw());
  static const AllocScope::Name kLayoutCopies = AllocScope::name("layout copies for oneDNN");
  AllocScope scope(kLayoutCopies);
  holder = alloc_for(allocator(), md);
  memory dst(md, ctx_.eng, holder.raw());
  memory src(have, ctx_.eng, t.raw());
  DNNL_EXEC(reorder(src, dst).execute(ctx_.strm, src, dst));
  return dst;
}

// A copy is kept only from the third use of one version of the weights in one format: in
// training each version meets a format once or twice (forward, backward-data) and a kept
// copy would outlive its use for the whole step, so it lives in `holder` only for its op and
// the allocator hands its memory to the next layer; evaluation, gradient accumulation and
// checkpoint replays reuse a version and keep it.
memory CpuBackend::weights_as(const Tensor& w, const memory::desc& md, Tensor& holder) {
  static const AllocScope::Name kWeightCopies = AllocScope::name("weight copies in oneDNN's formats");
  AllocScope scope(kWeightCopies);
  auto& copies = weight_copies_[w.raw()];
  WeightCopy* wc = nullptr;
  for (auto& c : copies)
    if (c.md == md) wc = &c;
  if (!wc) {
    copies.push_back(WeightCopy{md, Tensor(), w.version(), 0});
    wc = &copies.back();
  }
  if (wc->version != w.version()) {
    wc->version = w.version();
    wc->uses = 0;
    wc->data = Tensor();
  }
  ++wc->uses;
  if (wc->data.defined()) return memory(md, ctx_.eng, wc->data.raw());
  Tensor& dst_t = wc->uses >= kKeepWeightCopyFromUse ? wc->data : holder;
  dst_t = alloc_for(allocator(), md);
  memory dst(md, ctx_.eng, dst_t.raw());
  memory src(md_of(w), ctx_.eng, w.raw());
  DNNL_EXEC(reorder(src, dst).execute(ctx_.strm, src, dst));
  return dst;
}

Tensor CpuBackend::alloc_like_desc(const Shape& shape, const memory::desc& md) {
  DType dt = dtype_of(md) == memory::data_type::bf16 ? DType::bf16 : DType::f32;
  memory::desc blocked(memory::dims(shape.begin(), shape.end()), dtype_of(md), blocked_tag());
  if (md == blocked) return alloc_blocked(allocator(), shape, dt);
  memory::desc nhwc(memory::dims(shape.begin(), shape.end()), dtype_of(md), tag::nhwc);
  if (md == nhwc) return Tensor(shape, dt, allocator(), Layout::nhwc);
  SPOTRAIN_THROW("internal: oneDNN chose an unexpected activation format");
}

CpuBackend::ConvEntry& CpuBackend::conv_entry(const Tensor& x, const Tensor& w,
                                              const ConvParams& p) {
  std::string key = key_of(x) + "|" + key_of(w) + "|" + std::to_string(p.stride) + "," +
                    std::to_string(p.pad);
  auto it = conv_cache_.find(key);
  if (it != conv_cache_.end()) return *it->second;
  auto e = std::make_unique<ConvEntry>();
  int64_t n = x.dim(0), oc = w.dim(0), h = x.dim(2), wd = x.dim(3);
  int64_t oh = (h + 2 * p.pad - p.kh) / p.stride + 1;
  int64_t ow = (wd + 2 * p.pad - p.kw) / p.stride + 1;
  auto dt = dnnl_dtype(x.dtype());
  // The first convolution takes the canonical NHWC image: with blocked activations oneDNN
  // picks its input format (a reorder at that one boundary); every later one, and every one
  // with NHWC activations, takes its input as it lies.
  e->src_any = x.layout() == act_ || act_ == Layout::nhwc
                   ? md_of(x)
                   : memory::desc(dims_of(x), dt, tag::any);
  e->w_any = memory::desc(dims_of(w), dt, tag::any);
  e->dw_any = memory::desc(dims_of(w), memory::data_type::f32, tag::any);
  e->dst_md = memory::desc({n, oc, oh, ow}, dt, act_tag());
  e->strides = {p.stride, p.stride};
  e->pad = {p.pad, p.pad};
  DNNL_CHECK({
    e->fwd_pd = conv_fwd_pd(ctx_.eng, e->src_any, e->w_any, e->dst_md, e->strides, e->pad);
    e->fwd = convolution_forward(e->fwd_pd);
  });
  auto& ref = *e;
  conv_cache_.emplace(key, std::move(e));
  return ref;
}

Tensor CpuBackend::conv2d_forward_impl(const Tensor& x, const Tensor& w, const ConvParams& p) {
  SPOTRAIN_CHECK(x.ndim() == 4 && w.ndim() == 4 && x.dim(1) == w.dim(1),
                 "conv2d: input ", x.describe(), " does not match weights ", w.describe());
  if (via_f32(x.dtype())) return cast(conv2d_forward(f32(x), w, p), x.dtype());
  auto& e = conv_entry(x, w, p);
  Tensor holder;
  memory src = as_desc(x, e.fwd_pd.src_desc(), holder);
  Tensor wholder;
  memory wm = weights_as(w, e.fwd_pd.weights_desc(), wholder);
  auto dd = dims_of(e.fwd_pd.dst_desc());
  Tensor y = alloc_act(Shape(dd.begin(), dd.end()), x.dtype());
  memory dst = mem_of(ctx_, y);
  DNNL_EXEC(e.fwd.execute(ctx_.strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wm},
                                       {DNNL_ARG_DST, dst}}));
  return y;
}

Tensor CpuBackend::conv2d_backward_data_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                             const ConvParams& p) {
  if (via_f32(x.dtype()))
    return cast(conv2d_backward_data(f32(dy), w, f32(x), p), x.dtype());
  auto& e = conv_entry(x, w, p);
  if (!e.have_bd) {
    DNNL_CHECK({
      e.bd_pd = conv_bwd_data_pd(ctx_.eng, e.src_any, e.w_any, e.dst_md, e.strides, e.pad, e.fwd_pd);
      e.bd = convolution_backward_data(e.bd_pd);
    });
    e.have_bd = true;
  }
  Tensor holder;
  memory ddst = as_desc(dy, e.bd_pd.diff_dst_desc(), holder);
  Tensor wholder;
  memory wm = weights_as(w, e.bd_pd.weights_desc(), wholder);
  Tensor dx = alloc_like_desc(x.shape(), e.bd_pd.diff_src_desc());
  memory dsrc(e.bd_pd.diff_src_desc(), ctx_.eng, dx.raw());
  DNNL_EXEC(e.bd.execute(ctx_.strm, {{DNNL_ARG_DIFF_DST, ddst}, {DNNL_ARG_WEIGHTS, wm},
                                      {DNNL_ARG_DIFF_SRC, dsrc}}));
  return dx;
}

// The input gradient added into the shortcut's in place, where both lie alike (else composed).
void CpuBackend::conv2d_backward_data_add_impl(const Tensor& dy, const Tensor& w, const Tensor& x,
                                               const ConvParams& p, Tensor& acc) {
  Tensor t = conv2d_backward_data_impl(dy, w, x, p);
  if (t.shape() != acc.shape() || t.layout() != acc.layout() || t.dtype() != acc.dtype() ||
      t.storage_elems() != acc.storage_elems()) {
    acc = add_forward(t, acc, false);
    return;
  }
  add_into(acc, t);
}

void CpuBackend::conv2d_backward_weights_impl(const Tensor& x, const Tensor& dy, const ConvParams& p,
                                              Tensor& dw) {
  SPOTRAIN_CHECK(dw.dtype() == DType::f32 && dw.ndim() == 4, "conv2d: weight gradient must be fp32 OIHW");
  if (via_f32(x.dtype())) return conv2d_backward_weights(f32(x), f32(dy), p, dw);
  auto& e = conv_entry(x, dw, p);
  if (!e.have_bw) {
    DNNL_CHECK({
      e.bw_pd = conv_bwd_weights_pd(ctx_.eng, e.src_any, e.dw_any, e.dst_md, e.strides, e.pad,
                                    e.fwd_pd);
      e.bw = convolution_backward_weights(e.bw_pd);
    });
    e.have_bw = true;
  }
  Tensor hx, hdy;
  memory src = as_desc(x, e.bw_pd.src_desc(), hx);
  memory ddst = as_desc(dy, e.bw_pd.diff_dst_desc(), hdy);
  memory plain = mem_of(ctx_, dw);
  memory::desc want = e.bw_pd.diff_weights_desc();
  if (want == plain.get_desc()) {
    DNNL_EXEC(e.bw.execute(ctx_.strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, ddst},
                                        {DNNL_ARG_DIFF_WEIGHTS, plain}}));
    return;
  }
  Tensor tmp = alloc_for(allocator(), want);
  memory dwm(want, ctx_.eng, tmp.raw());
  DNNL_EXEC(e.bw.execute(ctx_.strm, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, ddst},
                                      {DNNL_ARG_DIFF_WEIGHTS, dwm}}));
  DNNL_EXEC(reorder(dwm, plain).execute(ctx_.strm, dwm, plain));
}

}  // namespace spotrain::cpu
