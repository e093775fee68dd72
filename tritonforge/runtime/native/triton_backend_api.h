// The part of Triton's C API that our C++ backends call (replay_backend.cc, postprocessing_backend.cc,
// bls_backend.cc):
// declarations of functions exported by libtritonserver.so (the server process provides them when it loads the
// backend), with the enum values of tritonserver.h / tritonbackend.h (triton-inference-server/core, API 1.x,
// unchanged from Triton 2.51 on).
// Declared here so the backend compiles with a plain C++ compiler and no Triton headers installed.
#pragma once

#include <cstddef>
#include <cstdint>

extern "C" {

struct TRITONSERVER_Error;
struct TRITONSERVER_Message;
struct TRITONBACKEND_Backend;
struct TRITONBACKEND_Model;
struct TRITONBACKEND_ModelInstance;
struct TRITONBACKEND_Request;
struct TRITONBACKEND_Input;
struct TRITONBACKEND_Response;
struct TRITONBACKEND_ResponseFactory;
struct TRITONBACKEND_Output;
// The in-process inference API, with which a backend calls other models (BLS).
struct TRITONSERVER_Server;
struct TRITONSERVER_InferenceRequest;
struct TRITONSERVER_InferenceResponse;
struct TRITONSERVER_InferenceTrace;
struct TRITONSERVER_ResponseAllocator;

enum TRITONSERVER_DataType {
  TRITONSERVER_TYPE_INVALID, TRITONSERVER_TYPE_BOOL, TRITONSERVER_TYPE_UINT8, TRITONSERVER_TYPE_UINT16,
  TRITONSERVER_TYPE_UINT32, TRITONSERVER_TYPE_UINT64, TRITONSERVER_TYPE_INT8, TRITONSERVER_TYPE_INT16,
  TRITONSERVER_TYPE_INT32, TRITONSERVER_TYPE_INT64, TRITONSERVER_TYPE_FP16, TRITONSERVER_TYPE_FP32,
  TRITONSERVER_TYPE_FP64, TRITONSERVER_TYPE_BYTES, TRITONSERVER_TYPE_BF16
};
enum TRITONSERVER_MemoryType { TRITONSERVER_MEMORY_CPU, TRITONSERVER_MEMORY_CPU_PINNED, TRITONSERVER_MEMORY_GPU };
enum TRITONSERVER_Error_Code {
  TRITONSERVER_ERROR_UNKNOWN, TRITONSERVER_ERROR_INTERNAL, TRITONSERVER_ERROR_NOT_FOUND,
  TRITONSERVER_ERROR_INVALID_ARG, TRITONSERVER_ERROR_UNAVAILABLE, TRITONSERVER_ERROR_UNSUPPORTED,
  TRITONSERVER_ERROR_ALREADY_EXISTS, TRITONSERVER_ERROR_CANCELLED
};
enum TRITONBACKEND_ArtifactType { TRITONBACKEND_ARTIFACT_FILESYSTEM };
enum TRITONSERVER_LogLevel {
  TRITONSERVER_LOG_INFO, TRITONSERVER_LOG_WARN, TRITONSERVER_LOG_ERROR, TRITONSERVER_LOG_VERBOSE
};
constexpr uint32_t TRITONSERVER_REQUEST_RELEASE_ALL = 1;
constexpr uint32_t TRITONSERVER_RESPONSE_COMPLETE_FINAL = 1;

typedef TRITONSERVER_Error* (*TRITONSERVER_ResponseAllocatorAllocFn_t)(
    TRITONSERVER_ResponseAllocator* allocator, const char* tensor_name, size_t byte_size,
    TRITONSERVER_MemoryType memory_type, int64_t memory_type_id, void* userp, void** buffer, void** buffer_userp,
    TRITONSERVER_MemoryType* actual_memory_type, int64_t* actual_memory_type_id);
typedef TRITONSERVER_Error* (*TRITONSERVER_ResponseAllocatorReleaseFn_t)(
    TRITONSERVER_ResponseAllocator* allocator, void* buffer, void* buffer_userp, size_t byte_size,
    TRITONSERVER_MemoryType memory_type, int64_t memory_type_id);
typedef TRITONSERVER_Error* (*TRITONSERVER_ResponseAllocatorStartFn_t)(TRITONSERVER_ResponseAllocator* allocator,
                                                                        void* userp);
typedef void (*TRITONSERVER_InferenceRequestReleaseFn_t)(TRITONSERVER_InferenceRequest* request,
                                                         const uint32_t flags, void* userp);
typedef void (*TRITONSERVER_InferenceResponseCompleteFn_t)(TRITONSERVER_InferenceResponse* response,
                                                           const uint32_t flags, void* userp);

TRITONSERVER_Error* TRITONSERVER_ErrorNew(TRITONSERVER_Error_Code code, const char* msg);
void TRITONSERVER_ErrorDelete(TRITONSERVER_Error* error);
const char* TRITONSERVER_ErrorMessage(TRITONSERVER_Error* error);
TRITONSERVER_Error_Code TRITONSERVER_ErrorCode(TRITONSERVER_Error* error);
TRITONSERVER_Error* TRITONSERVER_LogMessage(TRITONSERVER_LogLevel level, const char* filename, const int line,
                                           const char* msg);
TRITONSERVER_Error* TRITONSERVER_MessageSerializeToJson(TRITONSERVER_Message* message, const char** base,
                                                        size_t* byte_size);
TRITONSERVER_Error* TRITONSERVER_MessageDelete(TRITONSERVER_Message* message);

// The TRITONBACKEND API the server implements (major, minor): what a backend checks as it loads.
TRITONSERVER_Error* TRITONBACKEND_ApiVersion(uint32_t* major, uint32_t* minor);
TRITONSERVER_Error* TRITONBACKEND_ModelConfig(TRITONBACKEND_Model* model, uint32_t config_version,
                                              TRITONSERVER_Message** model_config);
TRITONSERVER_Error* TRITONBACKEND_ModelRepository(TRITONBACKEND_Model* model,
                                                  TRITONBACKEND_ArtifactType* artifact_type, const char** location);
TRITONSERVER_Error* TRITONBACKEND_ModelName(TRITONBACKEND_Model* model, const char** name);
TRITONSERVER_Error* TRITONBACKEND_ModelState(TRITONBACKEND_Model* model, void** state);
TRITONSERVER_Error* TRITONBACKEND_ModelSetState(TRITONBACKEND_Model* model, void* state);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceModel(TRITONBACKEND_ModelInstance* instance,
                                                     TRITONBACKEND_Model** model);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceState(TRITONBACKEND_ModelInstance* instance, void** state);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceSetState(TRITONBACKEND_ModelInstance* instance, void* state);

TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportStatistics(TRITONBACKEND_ModelInstance* instance,
                                                              TRITONBACKEND_Request* request, bool success,
                                                              uint64_t exec_start_ns, uint64_t compute_start_ns,
                                                              uint64_t compute_end_ns, uint64_t exec_end_ns);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceReportBatchStatistics(TRITONBACKEND_ModelInstance* instance,
                                                                   uint64_t batch_size, uint64_t exec_start_ns,
                                                                   uint64_t compute_start_ns,
                                                                   uint64_t compute_end_ns, uint64_t exec_end_ns);

TRITONSERVER_Error* TRITONBACKEND_RequestId(TRITONBACKEND_Request* request, const char** id);
TRITONSERVER_Error* TRITONBACKEND_RequestInput(TRITONBACKEND_Request* request, const char* name,
                                               TRITONBACKEND_Input** input);
TRITONSERVER_Error* TRITONBACKEND_RequestOutputCount(TRITONBACKEND_Request* request, uint32_t* count);
TRITONSERVER_Error* TRITONBACKEND_RequestOutputName(TRITONBACKEND_Request* request, uint32_t index,
                                                    const char** output_name);
TRITONSERVER_Error* TRITONBACKEND_RequestRelease(TRITONBACKEND_Request* request, uint32_t release_flags);
TRITONSERVER_Error* TRITONBACKEND_InputProperties(TRITONBACKEND_Input* input, const char** name,
                                                  TRITONSERVER_DataType* datatype, const int64_t** shape,
                                                  uint32_t* dims_count, uint64_t* byte_size, uint32_t* buffer_count);
TRITONSERVER_Error* TRITONBACKEND_InputBuffer(TRITONBACKEND_Input* input, uint32_t index, const void** buffer,
                                              uint64_t* buffer_byte_size, TRITONSERVER_MemoryType* memory_type,
                                              int64_t* memory_type_id);

TRITONSERVER_Error* TRITONBACKEND_ResponseNew(TRITONBACKEND_Response** response, TRITONBACKEND_Request* request);
TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryNew(TRITONBACKEND_ResponseFactory** factory,
                                                     TRITONBACKEND_Request* request);
TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryDelete(TRITONBACKEND_ResponseFactory* factory);
TRITONSERVER_Error* TRITONBACKEND_ResponseFactorySendFlags(TRITONBACKEND_ResponseFactory* factory,
                                                           uint32_t send_flags);
TRITONSERVER_Error* TRITONBACKEND_ResponseFactoryIsCancelled(TRITONBACKEND_ResponseFactory* factory,
                                                             bool* is_cancelled);
TRITONSERVER_Error* TRITONBACKEND_ResponseNewFromFactory(TRITONBACKEND_Response** response,
                                                         TRITONBACKEND_ResponseFactory* factory);
TRITONSERVER_Error* TRITONBACKEND_ResponseOutput(TRITONBACKEND_Response* response, TRITONBACKEND_Output** output,
                                                 const char* name, TRITONSERVER_DataType datatype,
                                                 const int64_t* shape, uint32_t dims_count);
TRITONSERVER_Error* TRITONBACKEND_OutputBuffer(TRITONBACKEND_Output* output, void** buffer,
                                               uint64_t buffer_byte_size, TRITONSERVER_MemoryType* memory_type,
                                               int64_t* memory_type_id);
TRITONSERVER_Error* TRITONBACKEND_ResponseSend(TRITONBACKEND_Response* response, uint32_t send_flags,
                                               TRITONSERVER_Error* error);
TRITONSERVER_Error* TRITONBACKEND_ResponseDelete(TRITONBACKEND_Response* response);

TRITONSERVER_Error* TRITONBACKEND_ModelVersion(TRITONBACKEND_Model* model, uint64_t* version);
TRITONSERVER_Error* TRITONBACKEND_ModelInstanceName(TRITONBACKEND_ModelInstance* instance, const char** name);
TRITONSERVER_Error* TRITONBACKEND_ModelServer(TRITONBACKEND_Model* model, TRITONSERVER_Server** server);
TRITONSERVER_Error* TRITONBACKEND_RequestIsCancelled(TRITONBACKEND_Request* request, bool* is_cancelled);
TRITONSERVER_Error* TRITONBACKEND_RequestInputCount(TRITONBACKEND_Request* request, uint32_t* count);
TRITONSERVER_Error* TRITONBACKEND_RequestInputByIndex(TRITONBACKEND_Request* request, const uint32_t index,
                                                      TRITONBACKEND_Input** input);

// Calling a model of the same server: a request, its response allocator and callbacks (tritonserver.h).
TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorNew(TRITONSERVER_ResponseAllocator** allocator,
                                                      TRITONSERVER_ResponseAllocatorAllocFn_t alloc_fn,
                                                      TRITONSERVER_ResponseAllocatorReleaseFn_t release_fn,
                                                      TRITONSERVER_ResponseAllocatorStartFn_t start_fn);
TRITONSERVER_Error* TRITONSERVER_ResponseAllocatorDelete(TRITONSERVER_ResponseAllocator* allocator);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestNew(TRITONSERVER_InferenceRequest** inference_request,
                                                     TRITONSERVER_Server* server, const char* model_name,
                                                     const int64_t model_version);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestDelete(TRITONSERVER_InferenceRequest* inference_request);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetId(TRITONSERVER_InferenceRequest* inference_request,
                                                       const char* id);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestAddInput(TRITONSERVER_InferenceRequest* inference_request,
                                                          const char* name, const TRITONSERVER_DataType datatype,
                                                          const int64_t* shape, uint64_t dim_count);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestAppendInputData(TRITONSERVER_InferenceRequest* inference_request,
                                                                 const char* name, const void* base,
                                                                 size_t byte_size, TRITONSERVER_MemoryType memory_type,
                                                                 int64_t memory_type_id);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestAddRequestedOutput(TRITONSERVER_InferenceRequest* inference_request,
                                                                    const char* name);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetReleaseCallback(
    TRITONSERVER_InferenceRequest* inference_request, TRITONSERVER_InferenceRequestReleaseFn_t request_release_fn,
    void* request_release_userp);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestSetResponseCallback(
    TRITONSERVER_InferenceRequest* inference_request, TRITONSERVER_ResponseAllocator* response_allocator,
    void* response_allocator_userp, TRITONSERVER_InferenceResponseCompleteFn_t response_fn, void* response_userp);
TRITONSERVER_Error* TRITONSERVER_InferenceRequestCancel(TRITONSERVER_InferenceRequest* inference_request);
TRITONSERVER_Error* TRITONSERVER_ServerInferAsync(TRITONSERVER_Server* server,
                                                  TRITONSERVER_InferenceRequest* inference_request,
                                                  TRITONSERVER_InferenceTrace* trace);
TRITONSERVER_Error* TRITONSERVER_ServerModelIsReady(TRITONSERVER_Server* server, const char* model_name,
                                                    const int64_t model_version, bool* ready);
TRITONSERVER_Error* TRITONSERVER_InferenceResponseDelete(TRITONSERVER_InferenceResponse* inference_response);
TRITONSERVER_Error* TRITONSERVER_InferenceResponseError(TRITONSERVER_InferenceResponse* inference_response);
TRITONSERVER_Error* TRITONSERVER_InferenceResponseOutputCount(TRITONSERVER_InferenceResponse* inference_response,
                                                              uint32_t* count);
TRITONSERVER_Error* TRITONSERVER_InferenceResponseOutput(TRITONSERVER_InferenceResponse* inference_response,
                                                         const uint32_t index, const char** name,
                                                         TRITONSERVER_DataType* datatype, const int64_t** shape,
                                                         uint64_t* dim_count, const void** base, size_t* byte_size,
                                                         TRITONSERVER_MemoryType* memory_type,
                                                         int64_t* memory_type_id, void** userp);

}  // extern "C"
