// CUDA backend: captured steps (--cuda-graph, the default). One training step is recorded by stream
// capture and replayed with one graph launch. Recording allocates from a pool of its own,
// and the values that change from step to step (scalars, labels, mixed targets) live in one
// device block that each replay refills from pinned memory before the launch.
#include <cstring>

#include "kernels/cuda/cuda_backend.h"
#include "kernels/cuda/cuda_util.h"

namespace spotrain::cuda {

void CudaBackend::begin_recording(int64_t batch, bool mixed) {
  SPOTRAIN_CHECK(!capturing_ && !graph_exec_, "internal: a step is already captured");
  SPOTRAIN_CHECK(batch > 0, "internal: begin_recording with an empty batch");
  // Nothing of the eager steps is in flight, and their cached activations go back to the
  // system: the pool takes their place instead of doubling the memory held.
  synchronize();
  pool_->release_cached();
  const int64_t words = kGraphScalars + (mixed ? 3 : 1) * batch;
  graph_in_ = Tensor({words}, DType::i32, *pool_);
  graph_in_host_ = Tensor({words}, DType::i32, pinned_host_allocator());
  if (!graph_in_copied_)
    CUDA_CHECK(cudaEventCreateWithFlags(&graph_in_copied_, cudaEventDisableTiming));
  graph_batch_ = batch;
  graph_mixed_ = mixed;
  graph_classes_ = 0;
  if (!graph_pool_)
    graph_pool_ = new_device_allocator();
  // No pool trim frees (or waits for the device) from here until the graph is made or the
  // recording aborted: held before the capture begins, so that no other thread's trim
  // synchronizes the device inside it.
  hold_device_frees(&held_frees_);
  // Relaxed: the pool may still call cudaMalloc while recording (the memory is then the
  // graph's for good), and loader threads keep allocating pinned memory meanwhile.
  const cudaError_t began = cudaStreamBeginCapture(compute_, cudaStreamCaptureModeRelaxed);
  if (began != cudaSuccess) {
    hold_device_frees(nullptr);
    free_held_blocks(held_frees_);  // nothing was recorded: no graph uses them
  }
  CUDA_CHECK(began);
  capturing_ = true;
}

void CudaBackend::end_recording() {
  // capturing_ (and the held frees) stay until the graph is made: where anything here fails,
  // abort_recording still has its work to do.
  SPOTRAIN_CHECK(capturing_, "internal: end_recording without begin_recording");
  cudaGraph_t g = nullptr;
  CUDA_CHECK(cudaStreamEndCapture(compute_, &g));
  const bool whole = loss_rows_ > 0 && graph_classes_ > 0;
  cudaGraphExec_t exec = nullptr;
  cudaError_t e = whole ? cudaGraphInstantiate(&exec, g, 0) : cudaSuccess;
  CUDA_WARN(cudaGraphDestroy(g));
  SPOTRAIN_CHECK(whole, "internal: the captured step computed no loss");
  CUDA_CHECK(e);
  graph_exec_ = exec;
  capturing_ = false;
  hold_device_frees(nullptr);  // what was held stays allocated for the graph, until drop()
  for (const Tensor* t : {&workspace_, &loss_host_, &overflow_flag_, &overflow_host_, &sgd_chunks_,
                          &lars_chunks_, &lars_partials_})
    if (t->defined()) graph_refs_.push_back(*t);
  graph_loss_host_ = loss_host_;
  graph_rows_ = loss_rows_;
  loss_rows_ = -1;  // recording ran nothing: no loss is queued until the first replay
}

void CudaBackend::abort_recording() {
  if (!capturing_) return;
  capturing_ = false;
  // The capture is ended unless end_recording ended it before failing (to instantiate, say).
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(compute_, &status) == cudaSuccess &&
      status != cudaStreamCaptureStatusNone) {
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(compute_, &g) == cudaSuccess && g) (void)cudaGraphDestroy(g);
  }
  (void)cudaGetLastError();
  hold_device_frees(nullptr);  // the capture has ended: frees may wait for the device again
  loss_rows_ = -1;
  graph_refs_.clear();
  free_held_blocks(held_frees_);  // no graph uses them now
}

void CudaBackend::replay(const StepInputs& in) {
  SPOTRAIN_CHECK(graph_exec_, "internal: replay without a captured step");
  SPOTRAIN_CHECK(in.n == graph_batch_ && (in.mix != nullptr) == graph_mixed_,
                 "internal: a replay of a batch of ", in.n, in.mix ? " with mixed targets" : "",
                 " where the captured step took ", graph_batch_,
                 graph_mixed_ ? " with mixed targets" : "",
                 " (the step runner runs such a batch as it comes)");
  const int64_t n = in.n, m = graph_classes_;
  for (int64_t i = 0; i < n; ++i) {
    SPOTRAIN_CHECK(in.labels[i] >= 0 && in.labels[i] < m, "softmax_xent: label ", in.labels[i],
                   " outside [0, ", m, ")");
    if (in.mix)
      SPOTRAIN_CHECK(in.mix->labels_b[i] >= 0 && in.mix->labels_b[i] < m, "softmax_xent: label ",
                     in.mix->labels_b[i], " outside [0, ", m, ")");
  }
  // The last refill's copy is done before its pinned source is written again.
  CUDA_CHECK(cudaEventSynchronize(graph_in_copied_));
  float* scal = static_cast<float*>(graph_in_host_.write_raw());
  scal[0] = in.lr;
  scal[1] = in.loss_scale / float(n);  // as softmax_xent_queue passes it to the kernel
  scal[2] = in.inv_scale;
  scal[3] = 0.f;
  int32_t* words = static_cast<int32_t*>(graph_in_host_.write_raw()) + kGraphScalars;
  std::memcpy(words, in.labels, size_t(n) * 4);
  if (in.mix) {
    std::memcpy(words + n, in.mix->labels_b, size_t(n) * 4);
    std::memcpy(words + 2 * n, in.mix->lam, size_t(n) * 4);
  }
  CUDA_CHECK(cudaMemcpyAsync(graph_in_.write_raw(), graph_in_host_.raw(), graph_in_.nbytes(),
                             cudaMemcpyHostToDevice, compute_));
  CUDA_CHECK(cudaEventRecord(graph_in_copied_, compute_));
  CUDA_CHECK(cudaGraphLaunch(graph_exec_, compute_));
  // The step's loss (and fp16 verdict) as an eager step leaves them, read after the launch.
  loss_host_ = graph_loss_host_;
  loss_rows_ = graph_rows_;
  CUDA_CHECK(cudaEventRecord(loss_ready_, compute_));
  if (overflow_ready_) CUDA_CHECK(cudaEventRecord(overflow_ready_, compute_));
}

void CudaBackend::drop() {
  abort_recording();
  if (graph_exec_) {
    CUDA_WARN(cudaStreamSynchronize(compute_));  // no replay still runs
    CUDA_WARN(cudaGraphExecDestroy(graph_exec_));
  }
  graph_exec_ = nullptr;
  graph_refs_.clear();
  free_held_blocks(held_frees_);
  graph_loss_host_ = Tensor();
  graph_in_ = Tensor();
  graph_in_host_ = Tensor();
  graph_batch_ = 0;
  graph_rows_ = -1;
  if (graph_pool_) graph_pool_->release_cached();
}

}  // namespace spotrain::cuda
