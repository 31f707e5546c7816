#include "models/cudnn_library.h"

#include <cudnn.h>

namespace ddp::models {

const base::RuntimeLibrary& cudnn_library() {
  static const base::RuntimeLibrary library(cudnn_library_names());
  return library;
}

std::vector<std::string> cudnn_library_names() {
  // The build's path serves a toolkit installed outside the loader's search (ld.so.conf).
  return {DDPTRAIN_CUDNN_SONAME, DDPTRAIN_CUDNN_BUILD_PATH};
}

namespace {

// What a stand-in returns when cuDNN is not there: an error a status check reports.
struct CudnnMissing {
  operator cudnnStatus_t() const { return CUDNN_STATUS_NOT_INITIALIZED; }
  operator std::size_t() const { return 0; }  // cudnnGetVersion
  operator const char*() const { return "cuDNN is not loaded (see check-env)"; }
};

}  // namespace

}  // namespace ddp::models

#define DDP_CUDNN_FORWARD(function, ...)    \
  return ddp::base::call_loaded<&function>( \
      ddp::models::cudnn_library(), #function, ddp::models::CudnnMissing {} __VA_OPT__(, ) __VA_ARGS__)

extern "C" {

cudnnStatus_t CUDNNWINAPI cudnnCreate(cudnnHandle_t* handle) {
  DDP_CUDNN_FORWARD(cudnnCreate, handle);
}

cudnnStatus_t CUDNNWINAPI cudnnCreateDropoutDescriptor(cudnnDropoutDescriptor_t* dropoutDesc) {
  DDP_CUDNN_FORWARD(cudnnCreateDropoutDescriptor, dropoutDesc);
}

cudnnStatus_t CUDNNWINAPI cudnnCreateRNNDataDescriptor(cudnnRNNDataDescriptor_t* rnnDataDesc) {
  DDP_CUDNN_FORWARD(cudnnCreateRNNDataDescriptor, rnnDataDesc);
}

cudnnStatus_t CUDNNWINAPI cudnnCreateRNNDescriptor(cudnnRNNDescriptor_t* rnnDesc) {
  DDP_CUDNN_FORWARD(cudnnCreateRNNDescriptor, rnnDesc);
}

cudnnStatus_t CUDNNWINAPI cudnnCreateTensorDescriptor(cudnnTensorDescriptor_t* tensorDesc) {
  DDP_CUDNN_FORWARD(cudnnCreateTensorDescriptor, tensorDesc);
}

cudnnStatus_t CUDNNWINAPI cudnnDestroy(cudnnHandle_t handle) {
  DDP_CUDNN_FORWARD(cudnnDestroy, handle);
}

cudnnStatus_t CUDNNWINAPI cudnnDestroyDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc) {
  DDP_CUDNN_FORWARD(cudnnDestroyDropoutDescriptor, dropoutDesc);
}

cudnnStatus_t CUDNNWINAPI cudnnDestroyRNNDataDescriptor(cudnnRNNDataDescriptor_t rnnDataDesc) {
  DDP_CUDNN_FORWARD(cudnnDestroyRNNDataDescriptor, rnnDataDesc);
}

cudnnStatus_t CUDNNWINAPI cudnnDestroyRNNDescriptor(cudnnRNNDescriptor_t rnnDesc) {
  DDP_CUDNN_FORWARD(cudnnDestroyRNNDescriptor, rnnDesc);
}

cudnnStatus_t CUDNNWINAPI cudnnDestroyTensorDescriptor(cudnnTensorDescriptor_t tensorDesc) {
  DDP_CUDNN_FORWARD(cudnnDestroyTensorDescriptor, tensorDesc);
}

cudnnStatus_t CUDNNWINAPI cudnnDropoutGetStatesSize(cudnnHandle_t handle, size_t* sizeInBytes) {
  DDP_CUDNN_FORWARD(cudnnDropoutGetStatesSize, handle, sizeInBytes);
}

const char* CUDNNWINAPI cudnnGetErrorString(cudnnStatus_t status) {
  DDP_CUDNN_FORWARD(cudnnGetErrorString, status);
}

cudnnStatus_t CUDNNWINAPI cudnnGetRNNTempSpaceSizes(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc,
                                                    cudnnForwardMode_t fwdMode,
                                                    cudnnRNNDataDescriptor_t xDesc, size_t* workSpaceSize,
                                                    size_t* reserveSpaceSize) {
  DDP_CUDNN_FORWARD(cudnnGetRNNTempSpaceSizes, handle, rnnDesc, fwdMode, xDesc, workSpaceSize,
                    reserveSpaceSize);
}

cudnnStatus_t CUDNNWINAPI cudnnGetRNNWeightParams(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc,
                                                  int32_t pseudoLayer, size_t weightSpaceSize,
                                                  const void* weightSpace, int32_t linLayerID,
                                                  cudnnTensorDescriptor_t mDesc, void** mAddr,
                                                  cudnnTensorDescriptor_t bDesc, void** bAddr) {
  DDP_CUDNN_FORWARD(cudnnGetRNNWeightParams, handle, rnnDesc, pseudoLayer, weightSpaceSize, weightSpace,
                    linLayerID, mDesc, mAddr, bDesc, bAddr);
}

cudnnStatus_t CUDNNWINAPI cudnnGetRNNWeightSpaceSize(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc,
                                                     size_t* weightSpaceSize) {
  DDP_CUDNN_FORWARD(cudnnGetRNNWeightSpaceSize, handle, rnnDesc, weightSpaceSize);
}

cudnnStatus_t CUDNNWINAPI cudnnGetTensorNdDescriptor(const cudnnTensorDescriptor_t tensorDesc,
                                                     int nbDimsRequested, cudnnDataType_t* dataType,
                                                     int* nbDims, int dimA[], int strideA[]) {
  DDP_CUDNN_FORWARD(cudnnGetTensorNdDescriptor, tensorDesc, nbDimsRequested, dataType, nbDims, dimA, strideA);
}

size_t CUDNNWINAPI cudnnGetVersion() {
  DDP_CUDNN_FORWARD(cudnnGetVersion);
}

cudnnStatus_t CUDNNWINAPI cudnnRNNBackwardData_v8(
    cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc, const int32_t devSeqLengths[],
    cudnnRNNDataDescriptor_t yDesc, const void* y, const void* dy, cudnnRNNDataDescriptor_t xDesc, void* dx,
    cudnnTensorDescriptor_t hDesc, const void* hx, const void* dhy, void* dhx, cudnnTensorDescriptor_t cDesc,
    const void* cx, const void* dcy, void* dcx, size_t weightSpaceSize, const void* weightSpace,
    size_t workSpaceSize, void* workSpace, size_t reserveSpaceSize, void* reserveSpace) {
  DDP_CUDNN_FORWARD(cudnnRNNBackwardData_v8, handle, rnnDesc, devSeqLengths, yDesc, y, dy, xDesc, dx, hDesc,
                    hx, dhy, dhx, cDesc, cx, dcy, dcx, weightSpaceSize, weightSpace, workSpaceSize, workSpace,
                    reserveSpaceSize, reserveSpace);
}

cudnnStatus_t CUDNNWINAPI cudnnRNNBackwardWeights_v8(cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc,
                                                     cudnnWgradMode_t addGrad, const int32_t devSeqLengths[],
                                                     cudnnRNNDataDescriptor_t xDesc, const void* x,
                                                     cudnnTensorDescriptor_t hDesc, const void* hx,
                                                     cudnnRNNDataDescriptor_t yDesc, const void* y,
                                                     size_t weightSpaceSize, void* dweightSpace,
                                                     size_t workSpaceSize, void* workSpace,
                                                     size_t reserveSpaceSize, void* reserveSpace) {
  DDP_CUDNN_FORWARD(cudnnRNNBackwardWeights_v8, handle, rnnDesc, addGrad, devSeqLengths, xDesc, x, hDesc, hx,
                    yDesc, y, weightSpaceSize, dweightSpace, workSpaceSize, workSpace, reserveSpaceSize,
                    reserveSpace);
}

cudnnStatus_t CUDNNWINAPI cudnnRNNForward(
    cudnnHandle_t handle, cudnnRNNDescriptor_t rnnDesc, cudnnForwardMode_t fwdMode,
    const int32_t devSeqLengths[], cudnnRNNDataDescriptor_t xDesc, const void* x,
    cudnnRNNDataDescriptor_t yDesc, void* y, cudnnTensorDescriptor_t hDesc, const void* hx, void* hy,
    cudnnTensorDescriptor_t cDesc, const void* cx, void* cy, size_t weightSpaceSize, const void* weightSpace,
    size_t workSpaceSize, void* workSpace, size_t reserveSpaceSize, void* reserveSpace) {
  DDP_CUDNN_FORWARD(cudnnRNNForward, handle, rnnDesc, fwdMode, devSeqLengths, xDesc, x, yDesc, y, hDesc, hx,
                    hy, cDesc, cx, cy, weightSpaceSize, weightSpace, workSpaceSize, workSpace,
                    reserveSpaceSize, reserveSpace);
}

cudnnStatus_t CUDNNWINAPI cudnnRestoreDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc,
                                                        cudnnHandle_t handle, float dropout, void* states,
                                                        size_t stateSizeInBytes, unsigned long long seed) {
  DDP_CUDNN_FORWARD(cudnnRestoreDropoutDescriptor, dropoutDesc, handle, dropout, states, stateSizeInBytes,
                    seed);
}

cudnnStatus_t CUDNNWINAPI cudnnSetDropoutDescriptor(cudnnDropoutDescriptor_t dropoutDesc,
                                                    cudnnHandle_t handle, float dropout, void* states,
                                                    size_t stateSizeInBytes, unsigned long long seed) {
  DDP_CUDNN_FORWARD(cudnnSetDropoutDescriptor, dropoutDesc, handle, dropout, states, stateSizeInBytes, seed);
}

cudnnStatus_t CUDNNWINAPI cudnnSetRNNDataDescriptor(cudnnRNNDataDescriptor_t rnnDataDesc,
                                                    cudnnDataType_t dataType, cudnnRNNDataLayout_t layout,
                                                    int maxSeqLength, int batchSize, int vectorSize,
                                                    const int seqLengthArray[], void* paddingFill) {
  DDP_CUDNN_FORWARD(cudnnSetRNNDataDescriptor, rnnDataDesc, dataType, layout, maxSeqLength, batchSize,
                    vectorSize, seqLengthArray, paddingFill);
}

cudnnStatus_t CUDNNWINAPI cudnnSetRNNDescriptor_v8(
    cudnnRNNDescriptor_t rnnDesc, cudnnRNNAlgo_t algo, cudnnRNNMode_t cellMode, cudnnRNNBiasMode_t biasMode,
    cudnnDirectionMode_t dirMode, cudnnRNNInputMode_t inputMode, cudnnDataType_t dataType,
    cudnnDataType_t mathPrec, cudnnMathType_t mathType, int32_t inputSize, int32_t hiddenSize,
    int32_t projSize, int32_t numLayers, cudnnDropoutDescriptor_t dropoutDesc, uint32_t auxFlags) {
  DDP_CUDNN_FORWARD(cudnnSetRNNDescriptor_v8, rnnDesc, algo, cellMode, biasMode, dirMode, inputMode, dataType,
                    mathPrec, mathType, inputSize, hiddenSize, projSize, numLayers, dropoutDesc, auxFlags);
}

cudnnStatus_t CUDNNWINAPI cudnnSetStream(cudnnHandle_t handle, cudaStream_t streamId) {
  DDP_CUDNN_FORWARD(cudnnSetStream, handle, streamId);
}

cudnnStatus_t CUDNNWINAPI cudnnSetTensorNdDescriptor(cudnnTensorDescriptor_t tensorDesc,
                                                     cudnnDataType_t dataType, int nbDims, const int dimA[],
                                                     const int strideA[]) {
  DDP_CUDNN_FORWARD(cudnnSetTensorNdDescriptor, tensorDesc, dataType, nbDims, dimA, strideA);
}

}  // extern "C"
