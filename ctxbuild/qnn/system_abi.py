"""libQnnSystem's context-binary ABI in ctypes: QnnDevice.h and HTP/QnnHtpDevice.h (the platform info),
System/QnnSystemContext.h (a binary's metadata: graphs, versions, SoC), HTP/QnnHtpSystemContext.h (the HTP's
blobs it points to) and System/QnnSystemInterface.h (the function table system.py calls).

The layouts reproduce the public QNN SDK headers (as of SDK 2.43) and were checked against binaries made by
onnxruntime-qnn 2.7.0 (SDK 2.51).
"""
from __future__ import annotations

import ctypes as C

from ctxbuild.qnn.tensor_abi import Qnn_Tensor_t, Qnn_Version_t

# QnnCommon.h
BACKENDS = {1: "REFERENCE", 2: "SAVER", 3: "CPU", 4: "GPU", 5: "DSP", 6: "HTP"}
QNN_BACKEND_ID_HTP = 6
QNN_SUCCESS = 0


# ---------------------------------------------------------------------------------------------
# QnnDevice.h + HTP/QnnHtpDevice.h (platform info of BinaryInfo V2/V3)


class QnnDevice_CoreInfoV1_t(C.Structure):
    _fields_ = [("coreId", C.c_uint32), ("coreType", C.c_uint32), ("coreInfoExtension", C.c_void_p)]


class QnnDevice_CoreInfo_t(C.Structure):
    _fields_ = [("version", C.c_uint32), ("v1", QnnDevice_CoreInfoV1_t)]


class QnnHtpDevice_OnChipDeviceInfoExtension_t(C.Structure):
    _fields_ = [
        ("vtcmSize", C.c_size_t),
        ("socModel", C.c_uint32),
        ("signedPdSupport", C.c_bool),
        ("dlbcSupport", C.c_bool),
        ("arch", C.c_uint32),
    ]


class QnnHtpDevice_DeviceInfoExtension_t(C.Structure):
    _fields_ = [("devType", C.c_uint32), ("onChipDevice", QnnHtpDevice_OnChipDeviceInfoExtension_t)]


class QnnDevice_HardwareDeviceInfoV1_t(C.Structure):
    _fields_ = [
        ("deviceId", C.c_uint32),
        ("deviceType", C.c_uint32),
        ("numCores", C.c_uint32),
        ("cores", C.POINTER(QnnDevice_CoreInfo_t)),
        ("deviceInfoExtension", C.c_void_p),
    ]


class QnnDevice_HardwareDeviceInfo_t(C.Structure):
    _fields_ = [("version", C.c_uint32), ("v1", QnnDevice_HardwareDeviceInfoV1_t)]


class QnnDevice_PlatformInfoV1_t(C.Structure):
    _fields_ = [
        ("numHwDevices", C.c_uint32),
        ("hwDevices", C.POINTER(QnnDevice_HardwareDeviceInfo_t)),
    ]


class QnnDevice_PlatformInfo_t(C.Structure):
    _fields_ = [("version", C.c_uint32), ("v1", QnnDevice_PlatformInfoV1_t)]


# ---------------------------------------------------------------------------------------------
# System/QnnSystemContext.h


class QnnSystemContext_GraphInfoV1_t(C.Structure):
    _fields_ = [
        ("graphName", C.c_char_p),
        ("numGraphInputs", C.c_uint32),
        ("graphInputs", C.POINTER(Qnn_Tensor_t)),
        ("numGraphOutputs", C.c_uint32),
        ("graphOutputs", C.POINTER(Qnn_Tensor_t)),
    ]


class QnnSystemContext_GraphInfoV2_t(C.Structure):
    _fields_ = QnnSystemContext_GraphInfoV1_t._fields_ + [
        ("numUpdateableTensors", C.c_uint32),
        ("updateableTensors", C.POINTER(Qnn_Tensor_t)),
    ]


class QnnSystemContext_GraphInfoV3_t(C.Structure):
    _fields_ = QnnSystemContext_GraphInfoV2_t._fields_ + [
        ("graphBlobInfoSize", C.c_uint32),
        ("graphBlobInfo", C.c_void_p),
        ("startOpIndex", C.c_uint32),
        ("endOpIndex", C.c_uint32),
    ]


class _GraphInfoVersions(C.Union):
    _fields_ = [
        ("graphInfoV1", QnnSystemContext_GraphInfoV1_t),
        ("graphInfoV2", QnnSystemContext_GraphInfoV2_t),
        ("graphInfoV3", QnnSystemContext_GraphInfoV3_t),
    ]


class QnnSystemContext_GraphInfo_t(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("version", C.c_uint32), ("u", _GraphInfoVersions)]


_BINARY_INFO_HEAD = [
    ("backendId", C.c_uint32),
    ("buildId", C.c_char_p),
    ("coreApiVersion", Qnn_Version_t),
    ("backendApiVersion", Qnn_Version_t),
    ("socVersion", C.c_char_p),
]
_BINARY_INFO_CONTENTS = [
    ("numContextTensors", C.c_uint32),
    ("contextTensors", C.POINTER(Qnn_Tensor_t)),
    ("numGraphs", C.c_uint32),
    ("graphs", C.POINTER(QnnSystemContext_GraphInfo_t)),
]


class QnnSystemContext_BinaryInfoV1_t(C.Structure):
    _fields_ = _BINARY_INFO_HEAD + [
        ("hwInfoBlobVersion", Qnn_Version_t),
        ("contextBlobVersion", Qnn_Version_t),
        ("hwInfoBlobSize", C.c_uint32),
        ("hwInfoBlob", C.c_void_p),
        ("contextBlobSize", C.c_uint64),
    ] + _BINARY_INFO_CONTENTS


class QnnSystemContext_BinaryInfoV2_t(C.Structure):
    _fields_ = QnnSystemContext_BinaryInfoV1_t._fields_ + [
        ("platformInfo", C.POINTER(QnnDevice_PlatformInfo_t)),
    ]


class QnnSystemContext_BinaryInfoV3_t(C.Structure):
    # V3 drops the hwInfoBlob fields of V1/V2 and adds context metadata and the SoC model.
    _fields_ = _BINARY_INFO_HEAD + [
        ("contextBlobVersion", Qnn_Version_t),
        ("contextBlobSize", C.c_uint64),
    ] + _BINARY_INFO_CONTENTS + [
        ("platformInfo", C.POINTER(QnnDevice_PlatformInfo_t)),
        ("contextMetadataSize", C.c_uint32),
        ("contextMetadata", C.c_void_p),
        ("socModel", C.c_uint32),
    ]


class _BinaryInfoVersions(C.Union):
    _fields_ = [
        ("contextBinaryInfoV1", QnnSystemContext_BinaryInfoV1_t),
        ("contextBinaryInfoV2", QnnSystemContext_BinaryInfoV2_t),
        ("contextBinaryInfoV3", QnnSystemContext_BinaryInfoV3_t),
    ]


class QnnSystemContext_BinaryInfo_t(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("version", C.c_uint32), ("u", _BinaryInfoVersions)]


# ---------------------------------------------------------------------------------------------
# HTP/QnnHtpSystemContext.h: backend-specific blobs pointed to by the generic metadata


class QnnHtpSystemContext_HwBlobInfoV1_t(C.Structure):
    _fields_ = [("graphListIndex", C.c_uint32), ("spillFillBufferSize", C.c_uint64)]


class QnnHtpSystemContext_HwBlobInfo_t(C.Structure):
    _fields_ = [("version", C.c_uint32), ("v1", QnnHtpSystemContext_HwBlobInfoV1_t)]


class QnnHtpSystemContext_GraphBlobInfoV1_t(C.Structure):
    _fields_ = [
        ("spillFillBufferSize", C.c_uint64),
        ("vtcmSize", C.c_uint32),
        ("optimizationLevel", C.c_uint32),
        ("htpDlbc", C.c_uint8),
        ("numHvxThreads", C.c_uint64),
    ]


class QnnHtpSystemContext_GraphBlobInfo_t(C.Structure):
    _fields_ = [("version", C.c_uint32), ("v1", QnnHtpSystemContext_GraphBlobInfoV1_t)]


class QnnHtpSystemContext_GraphBlobInfoV2_t(C.Structure):
    # Unlike V1 this one carries its own version field instead of sitting in the union.
    _fields_ = [
        ("version", C.c_uint32),
        ("nativeKChannelSize", C.c_uint64),
        ("nativeVChannelSize", C.c_uint64),
        ("isSafeShareIO", C.c_uint32),
        ("ioTensorSize", C.c_uint64),
        ("opDataSize", C.c_uint64),
        ("constSize", C.c_uint64),
        ("ddrTensorSize", C.c_uint64),
        ("sharedWeightsSize", C.c_uint64),
    ]


class QnnHtpSystemContext_ContextBlobInfo_t(C.Structure):
    _fields_ = [("version", C.c_uint32), ("dspArch", C.c_uint32)]


# ---------------------------------------------------------------------------------------------
# System/QnnSystemInterface.h


Handle = C.c_void_p
ErrorHandle = C.c_uint64  # Qnn_ErrorHandle_t
_CreateFn = C.CFUNCTYPE(ErrorHandle, C.POINTER(Handle))
_GetBinaryInfoFn = C.CFUNCTYPE(
    ErrorHandle, Handle, C.c_void_p, C.c_uint64,
    C.POINTER(C.POINTER(QnnSystemContext_BinaryInfo_t)), C.POINTER(C.c_uint64),
)
_FreeFn = C.CFUNCTYPE(ErrorHandle, Handle)


class QnnSystemInterface_ImplementationV1_t(C.Structure):
    # Only the leading entries are declared: the table grows at its end between SDK versions.
    _fields_ = [
        ("systemContextCreate", _CreateFn),
        ("systemContextGetBinaryInfo", _GetBinaryInfoFn),
        ("systemContextGetMetaData", C.c_void_p),
        ("systemContextFree", _FreeFn),
    ]


class QnnSystemInterface_t(C.Structure):
    _fields_ = [
        ("backendId", C.c_uint32),
        ("providerName", C.c_char_p),
        ("systemApiVersion", Qnn_Version_t),
        ("v1", QnnSystemInterface_ImplementationV1_t),
    ]
