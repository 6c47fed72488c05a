// cuDNN, opened when the first CUDA backend is made rather than linked (core/dynlib.h), so a
// CUDA build starts and trains on machines without cuDNN or a GPU. Every cuDNN function the
// backend calls is declared here, in namespace spotrain::cuda, under cuDNN's own name and
// signature: code in that namespace calls it exactly as cuDNN's documentation writes it.
// Internal to kernels/cuda/.
#pragma once
#include <cudnn.h>

#include "core/dynlib.h"

namespace spotrain::cuda {

// cuDNN 9: the path CMake found, then the soname.
DynLib& cudnn_library();

#define SPOTRAIN_CUDNN(fn) SPOTRAIN_DYN_FN(cudnn_library, fn)
SPOTRAIN_CUDNN(cudnnGetVersion);
SPOTRAIN_CUDNN(cudnnGetErrorString);
SPOTRAIN_CUDNN(cudnnGetLastErrorString);
SPOTRAIN_CUDNN(cudnnCreate);
SPOTRAIN_CUDNN(cudnnDestroy);
SPOTRAIN_CUDNN(cudnnSetStream);
SPOTRAIN_CUDNN(cudnnGetStream);
SPOTRAIN_CUDNN(cudnnCreateTensorDescriptor);
SPOTRAIN_CUDNN(cudnnSetTensor4dDescriptor);
SPOTRAIN_CUDNN(cudnnDestroyTensorDescriptor);
SPOTRAIN_CUDNN(cudnnCreateFilterDescriptor);
SPOTRAIN_CUDNN(cudnnSetFilter4dDescriptor);
SPOTRAIN_CUDNN(cudnnDestroyFilterDescriptor);
SPOTRAIN_CUDNN(cudnnCreateConvolutionDescriptor);
SPOTRAIN_CUDNN(cudnnSetConvolution2dDescriptor);
SPOTRAIN_CUDNN(cudnnSetConvolutionMathType);
SPOTRAIN_CUDNN(cudnnGetConvolution2dForwardOutputDim);
SPOTRAIN_CUDNN(cudnnDestroyConvolutionDescriptor);
SPOTRAIN_CUDNN(cudnnGetConvolutionForwardAlgorithm_v7);
SPOTRAIN_CUDNN(cudnnFindConvolutionForwardAlgorithmEx);
SPOTRAIN_CUDNN(cudnnGetConvolutionForwardWorkspaceSize);
SPOTRAIN_CUDNN(cudnnConvolutionForward);
SPOTRAIN_CUDNN(cudnnGetConvolutionBackwardDataAlgorithm_v7);
SPOTRAIN_CUDNN(cudnnFindConvolutionBackwardDataAlgorithmEx);
SPOTRAIN_CUDNN(cudnnGetConvolutionBackwardDataWorkspaceSize);
SPOTRAIN_CUDNN(cudnnConvolutionBackwardData);
SPOTRAIN_CUDNN(cudnnGetConvolutionBackwardFilterAlgorithm_v7);
SPOTRAIN_CUDNN(cudnnFindConvolutionBackwardFilterAlgorithmEx);
SPOTRAIN_CUDNN(cudnnGetConvolutionBackwardFilterWorkspaceSize);
SPOTRAIN_CUDNN(cudnnConvolutionBackwardFilter);
SPOTRAIN_CUDNN(cudnnDeriveBNTensorDescriptor);
SPOTRAIN_CUDNN(cudnnCreateActivationDescriptor);
SPOTRAIN_CUDNN(cudnnSetActivationDescriptor);
SPOTRAIN_CUDNN(cudnnDestroyActivationDescriptor);
SPOTRAIN_CUDNN(cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize);
SPOTRAIN_CUDNN(cudnnGetBatchNormalizationTrainingExReserveSpaceSize);
SPOTRAIN_CUDNN(cudnnBatchNormalizationForwardTrainingEx);
SPOTRAIN_CUDNN(cudnnGetBatchNormalizationBackwardExWorkspaceSize);
SPOTRAIN_CUDNN(cudnnBatchNormalizationBackwardEx);
// The graph (backend) API: kernels/cuda/cudnn_graph.h.
SPOTRAIN_CUDNN(cudnnBackendCreateDescriptor);
SPOTRAIN_CUDNN(cudnnBackendDestroyDescriptor);
SPOTRAIN_CUDNN(cudnnBackendSetAttribute);
SPOTRAIN_CUDNN(cudnnBackendGetAttribute);
SPOTRAIN_CUDNN(cudnnBackendFinalize);
SPOTRAIN_CUDNN(cudnnBackendExecute);
#undef SPOTRAIN_CUDNN

}  // namespace spotrain::cuda
