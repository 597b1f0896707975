"""ctypes binding to libQnnSystem.so: read the metadata of a QNN context binary without loading it.

The struct layouts reproduce the public QNN SDK headers (QnnTypes.h, QnnDevice.h,
System/QnnSystemContext.h, System/QnnSystemInterface.h, HTP/QnnHtpDevice.h,
HTP/QnnHtpSystemContext.h as of SDK 2.43) and were checked against binaries made by
onnxruntime-qnn 2.7.0 (SDK 2.51). The library may crash on a corrupt file, so callers run this in a
child process: `python -m ctxbuild.qnn.system FILE|-` prints the info as JSON (`-` reads stdin).
"""
from __future__ import annotations

import ctypes as C
import io
import json
import math
import mmap
import os
import struct
import sys
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

from ctxbuild.qnn import socs
from ctxbuild.toolchain import installed as toolchain
from ctxbuild.errors import InspectError

# ---------------------------------------------------------------------------------------------
# Enums (values from QnnTypes.h / QnnCommon.h / QnnHtpDevice.h)

DTYPES = {
    0x0008: "INT_8", 0x0016: "INT_16", 0x0032: "INT_32", 0x0064: "INT_64",
    0x0108: "UINT_8", 0x0116: "UINT_16", 0x0132: "UINT_32", 0x0164: "UINT_64",
    0x0216: "FLOAT_16", 0x0226: "BFLOAT_16", 0x0232: "FLOAT_32", 0x0264: "FLOAT_64",
    0x0304: "SFIXED_POINT_4", 0x0308: "SFIXED_POINT_8", 0x0316: "SFIXED_POINT_16",
    0x0332: "SFIXED_POINT_32",
    0x0404: "UFIXED_POINT_4", 0x0408: "UFIXED_POINT_8", 0x0416: "UFIXED_POINT_16",
    0x0432: "UFIXED_POINT_32",
    0x0508: "BOOL_8", 0x0608: "STRING",
}
TENSOR_TYPES = [
    "APP_WRITE", "APP_READ", "APP_READWRITE", "NATIVE", "STATIC", "NULL", "UPDATEABLE_STATIC",
    "UPDATEABLE_NATIVE", "UPDATEABLE_APP_WRITE", "UPDATEABLE_APP_READ",
    "UPDATEABLE_APP_READWRITE", "OPTIONAL_APP_WRITE", "OPTIONAL_APP_READ",
    "OPTIONAL_APP_READWRITE",
]
ENCODINGS = [
    "SCALE_OFFSET", "AXIS_SCALE_OFFSET", "BW_SCALE_OFFSET", "BW_AXIS_SCALE_OFFSET", "BLOCK",
    "BLOCKWISE_EXPANSION", "VECTOR", "FLOAT_BLOCK", "BW_AXIS_SCALE_OFFSET_MAPPED",
    "BW_BLOCK_MAPPED", "BW_BLOCKWISE_EXPANSION_MAPPED", "BW_FLOAT_BLOCK",
]
MAPPINGS = ["STANDARD_SYMMETRIC", "ASYMMETRIC_PLUS_ONE", "LINEAR_SYMMETRIC_EXCLUDE_ZERO"]
BACKENDS = {1: "REFERENCE", 2: "SAVER", 3: "CPU", 4: "GPU", 5: "DSP", 6: "HTP"}
QNN_BACKEND_ID_HTP = 6
QNN_DEFINITION_UNDEFINED = 0x7FFFFFFF
QNN_SUCCESS = 0
ZIP_MAGIC = b"PK\x03\x04"


def _name(table: list[str] | dict[int, str], value: int) -> str:
    """Enum value -> name; unknown values stay visible as numbers rather than failing."""
    if isinstance(table, dict):
        return table.get(value, f"UNKNOWN_{value:#x}")
    return table[value] if 0 <= value < len(table) else f"UNKNOWN_{value:#x}"


# ---------------------------------------------------------------------------------------------
# QnnTypes.h


class Qnn_Version_t(C.Structure):
    _fields_ = [("major", C.c_uint32), ("minor", C.c_uint32), ("patch", C.c_uint32)]


class Qnn_ScaleOffset_t(C.Structure):
    _fields_ = [("scale", C.c_float), ("offset", C.c_int32)]


class Qnn_FloatScaleOffset_t(C.Structure):
    _fields_ = [("scale", C.c_float), ("offset", C.c_float)]


class Qnn_BwScaleOffset_t(C.Structure):
    _fields_ = [("bitwidth", C.c_uint32), ("scale", C.c_float), ("offset", C.c_int32)]


class Qnn_AxisScaleOffset_t(C.Structure):
    _fields_ = [
        ("axis", C.c_int32),
        ("numScaleOffsets", C.c_uint32),
        ("scaleOffset", C.POINTER(Qnn_ScaleOffset_t)),
    ]


class Qnn_BwAxisScaleOffset_t(C.Structure):
    _fields_ = [
        ("bitwidth", C.c_uint32),
        ("axis", C.c_int32),
        ("numElements", C.c_uint32),
        ("scales", C.POINTER(C.c_float)),
        ("offsets", C.POINTER(C.c_int32)),
    ]


class Qnn_BwAxisScaleOffsetMapped_t(C.Structure):
    _fields_ = [
        ("bitwidth", C.c_uint32),
        ("axis", C.c_int32),
        ("mapping", C.c_uint32),
        ("numElements", C.c_uint32),
        ("scales", C.POINTER(C.c_float)),
        ("offsets", C.POINTER(C.c_int32)),
    ]


class Qnn_BlockEncoding_t(C.Structure):
    _fields_ = [
        ("blockSize", C.POINTER(C.c_uint32)),
        ("scaleOffset", C.POINTER(Qnn_ScaleOffset_t)),
    ]


class Qnn_BwBlockMapped_t(C.Structure):
    _fields_ = [
        ("bitwidth", C.c_uint32),
        ("mapping", C.c_uint32),
        ("blockSize", C.POINTER(C.c_uint32)),
        ("scaleOffset", C.POINTER(Qnn_ScaleOffset_t)),
    ]


class _BlocksScale(C.Union):
    _fields_ = [("blocksScale8", C.POINTER(C.c_uint8)), ("blocksScale16", C.POINTER(C.c_uint16))]


class Qnn_BlockwiseExpansion_t(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [
        ("axis", C.c_int32),
        ("scaleOffsets", C.POINTER(Qnn_ScaleOffset_t)),
        ("numBlocksPerAxis", C.c_uint32),
        ("blockScaleBitwidth", C.c_uint32),
        ("blockScaleStorageType", C.c_uint32),
        ("u", _BlocksScale),
    ]


class Qnn_BwBlockwiseExpansionMapped_t(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [
        ("bitwidth", C.c_uint32),
        ("mapping", C.c_uint32),
        ("axis", C.c_int32),
        ("scaleOffsets", C.POINTER(Qnn_ScaleOffset_t)),
        ("numBlocksPerAxis", C.c_uint32),
        ("blockScaleBitwidth", C.c_uint32),
        ("blockScaleStorageType", C.c_uint32),
        ("u", _BlocksScale),
    ]


class Qnn_VectorEncoding_t(C.Structure):
    _fields_ = [
        ("bwAxisScaleOffset", Qnn_BwAxisScaleOffset_t),
        ("rowsPerBlock", C.c_uint32),
        ("columnsPerBlock", C.c_uint32),
        ("vectorDimension", C.c_uint8),
        ("vectorStride", C.c_uint8),
        ("indexBitwidth", C.c_uint8),
    ]


class Qnn_FloatBlockEncoding_t(C.Structure):
    _fields_ = [
        ("blockSize", C.POINTER(C.c_uint32)),
        ("floatScaleOffset", C.POINTER(Qnn_FloatScaleOffset_t)),
    ]


class Qnn_BwFloatBlockEncoding_t(C.Structure):
    _fields_ = [
        ("bitwidth", C.c_uint32),
        ("blockSize", C.POINTER(C.c_uint32)),
        ("floatScaleOffset", C.POINTER(Qnn_FloatScaleOffset_t)),
    ]


class _Encodings(C.Union):
    _fields_ = [
        ("scaleOffsetEncoding", Qnn_ScaleOffset_t),
        ("axisScaleOffsetEncoding", Qnn_AxisScaleOffset_t),
        ("bwScaleOffsetEncoding", Qnn_BwScaleOffset_t),
        ("bwAxisScaleOffsetEncoding", Qnn_BwAxisScaleOffset_t),
        ("blockEncoding", Qnn_BlockEncoding_t),
        ("blockwiseExpansion", C.POINTER(Qnn_BlockwiseExpansion_t)),
        ("vectorEncoding", C.POINTER(Qnn_VectorEncoding_t)),
        ("floatBlockEncoding", Qnn_FloatBlockEncoding_t),
        ("bwAxisScaleOffsetMappedEncoding", C.POINTER(Qnn_BwAxisScaleOffsetMapped_t)),
        ("bwBlockMappedEncoding", C.POINTER(Qnn_BwBlockMapped_t)),
        ("bwBlockwiseExpansionMappedEncoding", C.POINTER(Qnn_BwBlockwiseExpansionMapped_t)),
        ("bwFloatBlockEncoding", Qnn_BwFloatBlockEncoding_t),
    ]


class Qnn_QuantizeParams_t(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [
        ("encodingDefinition", C.c_uint32),
        ("quantizationEncoding", C.c_uint32),
        ("u", _Encodings),
    ]


class Qnn_ClientBuffer_t(C.Structure):
    _fields_ = [("data", C.c_void_p), ("dataSize", C.c_uint32)]


class _TensorMem(C.Union):
    # clientBuf / memHandle (void*) / retrieveRaw (pointer, V2 only); clientBuf is the widest.
    _fields_ = [("clientBuf", Qnn_ClientBuffer_t), ("memHandle", C.c_void_p)]


class Qnn_TensorV1_t(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [
        ("id", C.c_uint32),
        ("name", C.c_char_p),
        ("type", C.c_uint32),
        ("dataFormat", C.c_uint32),
        ("dataType", C.c_uint32),
        ("quantizeParams", Qnn_QuantizeParams_t),
        ("rank", C.c_uint32),
        ("dimensions", C.POINTER(C.c_uint32)),
        ("memType", C.c_uint32),
        ("u", _TensorMem),
    ]


class Qnn_SparseParams_t(C.Structure):
    # type + union { Qnn_SparseLayoutHybridCoo_t {uint32 numSpecifiedElements, numSparseDimensions} }
    _fields_ = [
        ("type", C.c_uint32),
        ("numSpecifiedElements", C.c_uint32),
        ("numSparseDimensions", C.c_uint32),
    ]


class Qnn_TensorV2_t(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = Qnn_TensorV1_t._fields_ + [
        ("isDynamicDimensions", C.POINTER(C.c_uint8)),
        ("sparseParams", Qnn_SparseParams_t),
        ("isProduced", C.c_uint8),
    ]


class _TensorVersions(C.Union):
    _fields_ = [("v1", Qnn_TensorV1_t), ("v2", Qnn_TensorV2_t)]


class Qnn_Tensor_t(C.Structure):
    _anonymous_ = ("u",)
    _fields_ = [("version", C.c_uint32), ("u", _TensorVersions)]


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


_Handle = C.c_void_p
_Error = C.c_uint64  # Qnn_ErrorHandle_t
_CreateFn = C.CFUNCTYPE(_Error, C.POINTER(_Handle))
_GetBinaryInfoFn = C.CFUNCTYPE(
    _Error, _Handle, C.c_void_p, C.c_uint64,
    C.POINTER(C.POINTER(QnnSystemContext_BinaryInfo_t)), C.POINTER(C.c_uint64),
)
_FreeFn = C.CFUNCTYPE(_Error, _Handle)


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


# ---------------------------------------------------------------------------------------------


def library_path() -> Path:
    """libQnnSystem.so as shipped next to the QNN EP in the onnxruntime-qnn wheel."""
    try:
        return toolchain.qnn_library_dir() / "libQnnSystem.so"
    except metadata.PackageNotFoundError as e:
        raise InspectError("onnxruntime-qnn is not installed", "pip install onnxruntime-qnn") from e


def _interface() -> QnnSystemInterface_t:
    try:
        lib = C.CDLL(str(library_path()))
    except OSError as e:
        raise InspectError(f"cannot load {library_path()}: {e}", "reinstall onnxruntime-qnn") from e
    get_providers = lib.QnnSystemInterface_getProviders
    get_providers.restype = _Error
    get_providers.argtypes = [
        C.POINTER(C.POINTER(C.POINTER(QnnSystemInterface_t))), C.POINTER(C.c_uint32),
    ]
    providers = C.POINTER(C.POINTER(QnnSystemInterface_t))()
    count = C.c_uint32()
    if get_providers(C.byref(providers), C.byref(count)) != QNN_SUCCESS or count.value == 0:
        raise InspectError(f"{library_path()}: QnnSystemInterface_getProviders failed")
    iface = providers[0].contents
    if iface.systemApiVersion.major != 1:
        raise InspectError(
            f"{library_path()}: QNN system API {iface.systemApiVersion.major}.x is not supported",
            "use onnxruntime-qnn 2.x",
        )
    return iface


def _version(v: Qnn_Version_t) -> str:
    return f"{v.major}.{v.minor}.{v.patch}"


def _str(p: bytes | None) -> str | None:
    return p.decode("utf-8", "replace") if p is not None else None


def _floats(ptr: Any, n: int) -> list[float]:
    return [float(ptr[i]) for i in range(n)] if ptr else []


def _ints(ptr: Any, n: int) -> list[int]:
    return [int(ptr[i]) for i in range(n)] if ptr else []


def _pairs(ptr: Any, n: int) -> dict[str, list[Any]]:
    """Arrays of Qnn_ScaleOffset_t / Qnn_FloatScaleOffset_t."""
    return {"scales": [float(ptr[i].scale) for i in range(n)] if ptr else [],
            "offsets": [ptr[i].offset for i in range(n)] if ptr else []}


def _arrays(e: Any) -> dict[str, list[Any]]:
    """Separate scale and offset arrays of the Bw*AxisScaleOffset* encodings."""
    return {"scales": _floats(e.scales, e.numElements), "offsets": _ints(e.offsets, e.numElements)}


def _block(dims: list[int], block_ptr: Any, pairs_ptr: Any) -> dict[str, list[Any]]:
    """Block encodings: the block shape (one entry per dim), one scale/offset per block."""
    block = _ints(block_ptr, len(dims))
    n = math.prod(math.ceil(d / b) for d, b in zip(dims, block) if b)
    return {"block_size": block, **_pairs(pairs_ptr, n)}


def _expansion(e: Any, dims: list[int]) -> dict[str, Any]:
    """Blockwise expansion: one scale/offset per channel along `axis`, refined by block scales."""
    channels = dims[e.axis] if -len(dims) <= e.axis < len(dims) else 0
    return {"axis": e.axis, **_pairs(e.scaleOffsets, channels), "blocks_per_axis": e.numBlocksPerAxis,
            "block_scale_bitwidth": e.blockScaleBitwidth}


def _quantization(q: Qnn_QuantizeParams_t, dims: list[int]) -> dict[str, Any] | None:
    """Plain-data view of a tensor's encoding. QNN: real = (q + offset) * scale.
    The encodings held by pointer (*_MAPPED, BLOCKWISE_EXPANSION, VECTOR) may be NULL."""
    if q.encodingDefinition == QNN_DEFINITION_UNDEFINED:
        return None
    enc = _name(ENCODINGS, q.quantizationEncoding)
    out: dict[str, Any] = {"encoding": enc}
    if enc == "SCALE_OFFSET":
        out.update(scale=float(q.scaleOffsetEncoding.scale), offset=q.scaleOffsetEncoding.offset)
    elif enc == "BW_SCALE_OFFSET":
        e = q.bwScaleOffsetEncoding
        out.update(bitwidth=e.bitwidth, scale=float(e.scale), offset=e.offset)
    elif enc == "AXIS_SCALE_OFFSET":
        e = q.axisScaleOffsetEncoding
        out.update(axis=e.axis, **_pairs(e.scaleOffset, e.numScaleOffsets))
    elif enc == "BW_AXIS_SCALE_OFFSET":
        e = q.bwAxisScaleOffsetEncoding
        out.update(bitwidth=e.bitwidth, axis=e.axis, **_arrays(e))
    elif enc == "BW_AXIS_SCALE_OFFSET_MAPPED" and q.bwAxisScaleOffsetMappedEncoding:
        e = q.bwAxisScaleOffsetMappedEncoding.contents
        out.update(bitwidth=e.bitwidth, mapping=_name(MAPPINGS, e.mapping), axis=e.axis, **_arrays(e))
    elif enc == "BLOCK":
        out.update(_block(dims, q.blockEncoding.blockSize, q.blockEncoding.scaleOffset))
    elif enc == "BW_BLOCK_MAPPED" and q.bwBlockMappedEncoding:
        e = q.bwBlockMappedEncoding.contents
        out.update(bitwidth=e.bitwidth, mapping=_name(MAPPINGS, e.mapping),
                   **_block(dims, e.blockSize, e.scaleOffset))
    elif enc == "FLOAT_BLOCK":
        out.update(_block(dims, q.floatBlockEncoding.blockSize, q.floatBlockEncoding.floatScaleOffset))
    elif enc == "BW_FLOAT_BLOCK":
        e = q.bwFloatBlockEncoding
        out.update(bitwidth=e.bitwidth, **_block(dims, e.blockSize, e.floatScaleOffset))
    elif enc == "BLOCKWISE_EXPANSION" and q.blockwiseExpansion:
        out.update(_expansion(q.blockwiseExpansion.contents, dims))
    elif enc == "BW_BLOCKWISE_EXPANSION_MAPPED" and q.bwBlockwiseExpansionMappedEncoding:
        e = q.bwBlockwiseExpansionMappedEncoding.contents
        out.update(bitwidth=e.bitwidth, mapping=_name(MAPPINGS, e.mapping), **_expansion(e, dims))
    elif enc == "VECTOR" and q.vectorEncoding:
        e = q.vectorEncoding.contents
        b = e.bwAxisScaleOffset
        out.update(bitwidth=b.bitwidth, axis=b.axis, **_arrays(b), rows_per_block=e.rowsPerBlock,
                   columns_per_block=e.columnsPerBlock, vector_dimension=e.vectorDimension,
                   vector_stride=e.vectorStride, index_bitwidth=e.indexBitwidth)
    return out


def _tensor(t: Qnn_Tensor_t) -> dict[str, Any]:
    if t.version not in (1, 2):
        raise InspectError(f"tensor struct version {t.version} is not supported by ctxbuild")
    # V2 extends V1 in place, so the V1 view reads the common fields of both.
    v = t.v1
    dims = _ints(v.dimensions, v.rank)
    out = {
        "name": _str(v.name),
        "id": v.id,
        "type": _name(TENSOR_TYPES, v.type),
        "dtype": _name(DTYPES, v.dataType),
        "dims": dims,
        "quantization": _quantization(v.quantizeParams, dims),
    }
    if t.version == 2 and t.v2.isDynamicDimensions:
        out["dynamic_dims"] = [bool(x) for x in _ints(t.v2.isDynamicDimensions, v.rank)]
    return out


def _tensors(ptr: Any, n: int) -> list[dict[str, Any]]:
    return [_tensor(ptr[i]) for i in range(n)] if ptr else []


def _graph_blob(backend_id: int, size: int, ptr: int | None) -> dict[str, Any] | None:
    """HTP per-graph blob; opaque for other backends. SDK 2.51 writes a V1 record (40 bytes)
    followed by a V2 record (72 bytes, it carries its own version field), 112 bytes in all."""
    if not ptr or backend_id != QNN_BACKEND_ID_HTP:
        return None
    out: dict[str, Any] = {}
    offset = 0
    while offset + 4 <= size:
        version = C.c_uint32.from_address(ptr + offset).value
        if version == 1 and offset + C.sizeof(QnnHtpSystemContext_GraphBlobInfo_t) <= size:
            b = QnnHtpSystemContext_GraphBlobInfo_t.from_address(ptr + offset).v1
            # vtcmSize is documented as MB but holds bytes (4194304 where QNN's own metadata
            # dump of the same binary says 4).
            out.update(spill_fill_buffer_size=b.spillFillBufferSize, vtcm_bytes=b.vtcmSize,
                       optimization_level=b.optimizationLevel, htp_dlbc=b.htpDlbc,
                       num_hvx_threads=b.numHvxThreads)
            offset += C.sizeof(QnnHtpSystemContext_GraphBlobInfo_t)
        elif version == 2 and offset + C.sizeof(QnnHtpSystemContext_GraphBlobInfoV2_t) <= size:
            b2 = QnnHtpSystemContext_GraphBlobInfoV2_t.from_address(ptr + offset)
            out.update(native_k_channel_size=b2.nativeKChannelSize,
                       native_v_channel_size=b2.nativeVChannelSize,
                       safe_share_io=bool(b2.isSafeShareIO), io_tensor_size=b2.ioTensorSize,
                       op_data_size=b2.opDataSize, const_size=b2.constSize,
                       ddr_tensor_size=b2.ddrTensorSize, shared_weights_size=b2.sharedWeightsSize)
            offset += C.sizeof(QnnHtpSystemContext_GraphBlobInfoV2_t)
        else:
            out["unparsed_bytes"] = size - offset
            break
    return out


def _graph(g: QnnSystemContext_GraphInfo_t, backend_id: int) -> dict[str, Any]:
    if g.version not in (1, 2, 3):
        raise InspectError(f"graph info version {g.version} is not supported by ctxbuild")
    v = (g.graphInfoV1, g.graphInfoV2, g.graphInfoV3)[g.version - 1]
    out: dict[str, Any] = {
        "name": _str(v.graphName),
        "info_version": g.version,
        "inputs": _tensors(v.graphInputs, v.numGraphInputs),
        "outputs": _tensors(v.graphOutputs, v.numGraphOutputs),
        "updateable_tensors": [],
        "graph_blob": None,
        "op_index_range": None,
    }
    if g.version >= 2:
        out["updateable_tensors"] = _tensors(v.updateableTensors, v.numUpdateableTensors)
    if g.version == 3:
        out["graph_blob"] = _graph_blob(backend_id, v.graphBlobInfoSize, v.graphBlobInfo)
        out["op_index_range"] = [v.startOpIndex, v.endOpIndex]
    return out


def _platform(p: Any) -> list[dict[str, Any]] | None:
    """Hardware devices recorded in the binary (HTP on-chip extension: SoC model, arch, VTCM)."""
    if not p or p.contents.version != 1:
        return None
    info = p.contents.v1
    devices = []
    for i in range(info.numHwDevices if info.hwDevices else 0):
        hw = info.hwDevices[i]
        if hw.version != 1:
            continue
        d = hw.v1
        dev: dict[str, Any] = {"device_id": d.deviceId, "device_type": d.deviceType,
                               "cores": [{"core_id": d.cores[c].v1.coreId,
                                          "core_type": d.cores[c].v1.coreType}
                                         for c in range(d.numCores if d.cores else 0)]}
        if d.deviceInfoExtension:
            ext = QnnHtpDevice_DeviceInfoExtension_t.from_address(d.deviceInfoExtension)
            if ext.devType == 0:  # QNN_HTP_DEVICE_TYPE_ON_CHIP
                oc = ext.onChipDevice
                dev.update(soc_model=oc.socModel, htp_arch=oc.arch, vtcm_mb=oc.vtcmSize,
                           signed_pd=bool(oc.signedPdSupport), dlbc=bool(oc.dlbcSupport))
        devices.append(dev)
    return devices


def _extract(info: QnnSystemContext_BinaryInfo_t) -> dict[str, Any]:
    """Flat dict of one context blob's metadata; `binary_info` splits it into common/target."""
    if info.version not in (1, 2, 3):
        raise InspectError(f"binary info version {info.version} is not supported by ctxbuild")
    v = (info.contextBinaryInfoV1, info.contextBinaryInfoV2, info.contextBinaryInfoV3)[info.version - 1]
    backend_id = v.backendId
    out: dict[str, Any] = {
        "backend_id": backend_id,
        "backend": _name(BACKENDS, backend_id),
        "build_id": _str(v.buildId),
        "core_api_version": _version(v.coreApiVersion),
        "backend_api_version": _version(v.backendApiVersion),
        "graphs": [_graph(v.graphs[i], backend_id) for i in range(v.numGraphs if v.graphs else 0)],
        # per-target part
        "binary_info_version": info.version,
        "soc_version": _str(v.socVersion) or None,
        "soc_model": None,
        "soc_name": None,
        "htp_arch": None,
        "context_blob_version": _version(v.contextBlobVersion),
        "context_blob_size": v.contextBlobSize,
        "num_context_tensors": v.numContextTensors,
        "platform": _platform(v.platformInfo) if info.version >= 2 else None,
        "spill_fill_buffer_size": None,
    }
    if info.version in (1, 2) and backend_id == QNN_BACKEND_ID_HTP and v.hwInfoBlob and (
        v.hwInfoBlobSize >= C.sizeof(QnnHtpSystemContext_HwBlobInfo_t)
    ):
        hw = QnnHtpSystemContext_HwBlobInfo_t.from_address(v.hwInfoBlob)
        if hw.version == 1:
            out["spill_fill_buffer_size"] = hw.v1.spillFillBufferSize
    if info.version == 3:
        out["soc_model"] = v.socModel or None
        # HTP context metadata = QnnHtpSystemContext_ContextBlobInfo_t {version, dspArch}.
        if backend_id == QNN_BACKEND_ID_HTP and v.contextMetadata and (
            v.contextMetadataSize >= C.sizeof(QnnHtpSystemContext_ContextBlobInfo_t)
        ):
            meta = QnnHtpSystemContext_ContextBlobInfo_t.from_address(v.contextMetadata)
            if meta.version == 1:
                out["htp_arch"] = meta.dspArch
    for dev in out["platform"] or []:  # older binaries may carry SoC/arch only here
        out["soc_model"] = out["soc_model"] or dev.get("soc_model")
        out["htp_arch"] = out["htp_arch"] or dev.get("htp_arch")
    out["soc_name"] = socs.name_of(out["soc_model"])
    return out


_COMMON_KEYS = ("backend_id", "backend", "build_id", "core_api_version", "backend_api_version", "graphs")


def _context_info(data: bytes | mmap.mmap, label: str) -> dict[str, Any]:
    """libQnnSystem's view of one plain context binary. May crash the process on corrupt input."""
    iface = _interface().v1
    handle = _Handle()
    if iface.systemContextCreate(C.byref(handle)) != QNN_SUCCESS:
        raise InspectError(f"{library_path()}: QnnSystemContext_create failed")
    try:
        # A private file mapping is writable, so ctypes can use it in place: no copy of a multi-GB binary.
        wrap = C.c_uint8 * len(data)
        buf = wrap.from_buffer(data) if isinstance(data, mmap.mmap) else wrap.from_buffer_copy(data)
        info = C.POINTER(QnnSystemContext_BinaryInfo_t)()
        info_size = C.c_uint64()
        err = iface.systemContextGetBinaryInfo(handle, buf, len(data), C.byref(info), C.byref(info_size))
        if err != QNN_SUCCESS or not info:
            raise InspectError(
                f"{label}: not a readable QNN context binary (libQnnSystem error {err})",
                "the file is corrupt, truncated or not a context binary; rebuild it",
            )
        return _extract(info.contents)
    finally:
        iface.systemContextFree(handle)
        buf = None  # release the mapping now, even when a traceback keeps this frame: mmap.close() needs that


def _zip_entries(data: bytes | mmap.mmap, label: str) -> list[tuple[str, bytes]]:
    """Entries of a multi-SoC container. QNN writes them stored with zero CRCs, so zipfile lists
    them but refuses to read them: take the bytes after each local header instead."""
    try:
        infos = zipfile.ZipFile(io.BytesIO(data) if isinstance(data, bytes) else data).infolist()
    except (zipfile.BadZipFile, OSError) as e:
        raise InspectError(f"{label}: damaged multi-SoC container ({e})", "rebuild it") from e
    entries = []
    for zi in infos:
        start = zi.header_offset + 30
        name_len, extra_len = struct.unpack_from("<HH", data, zi.header_offset + 26)
        body = data[start + name_len + extra_len:start + name_len + extra_len + zi.file_size]
        if zi.compress_type != zipfile.ZIP_STORED or len(body) != zi.file_size:
            raise InspectError(f"{label}: entry {zi.filename} of the multi-SoC container is unreadable",
                               "rebuild it")
        entries.append((zi.filename, body))
    return entries


def binary_info_from_bytes(data: bytes | mmap.mmap, label: str = "<bytes>") -> dict[str, Any]:
    """Metadata of a context binary given as bytes (see `binary_info`)."""
    if not data:
        raise InspectError(f"{label}: file is empty", "rebuild the context binary")
    if data[:4] != ZIP_MAGIC:
        flat = _context_info(data, label)
        common = {k: flat.pop(k) for k in _COMMON_KEYS}
        return {"format": "context_binary", "file_size": len(data), **common,
                "targets": [{"entry": None, **flat}], "entries": None}
    # Multi-SoC ("flexible") binary: a zip of one plain context per SoC (`<backend>.cache.<soc>.<n>`),
    # shared weights and a JSON index; libQnnSystem reads the per-SoC caches, not the container.
    entries = _zip_entries(data, label)
    caches = [(name, body) for name, body in entries if name.split(".")[1:2] == ["cache"]]
    if not caches:
        raise InspectError(f"{label}: zip file without QNN context caches", "pass a QNN context binary")
    targets, common = [], {}
    for name, body in caches:
        flat = _context_info(body, f"{label}:{name}")
        # Every cache holds the same graphs (one compile per SoC); keep the first's.
        common = common or {k: flat[k] for k in _COMMON_KEYS}
        targets.append({"entry": name, **{k: v for k, v in flat.items() if k not in _COMMON_KEYS}})
    return {"format": "multi_soc", "file_size": len(data), **common, "targets": targets,
            "entries": [{"name": name, "size": len(body)} for name, body in entries]}


def binary_info(path: Path) -> dict[str, Any]:
    """Metadata of the context binary at `path`, as plain JSON-able data:

    format ("context_binary" or "multi_soc"), file_size, backend_id/backend, build_id (SDK build),
    core_api_version, backend_api_version, graphs (name, inputs/outputs with dtype, dims and
    quantization, graph_blob with HTP spill-fill/VTCM/sizes), targets (one per compiled SoC:
    soc_model, soc_name, htp_arch, context_blob_version/size, platform, ...) and, for multi-SoC
    containers, entries (name and size of each member).
    """
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size == 0:
                return binary_info_from_bytes(b"", str(path))
            # Mapped, not read: only the pages libQnnSystem touches become resident.
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY) as data:
                return binary_info_from_bytes(data, str(path))
    except OSError as e:
        raise InspectError(f"{path}: cannot read: {e.strerror}", "check the path") from e


def main(argv: list[str]) -> int:
    """Child-process entry point. Prints one JSON object on stdout: the info, or
    {"error": message, "hint": hint} with exit code 3."""
    if len(argv) != 1:
        print("usage: python -m ctxbuild.qnn.system FILE|-", file=sys.stderr)
        return 2
    # libQnnSystem may print to stdout; keep the real stdout for the JSON only.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    code = 0
    try:
        if argv[0] == "-":
            result = binary_info_from_bytes(sys.stdin.buffer.read(), "<stdin>")
        else:
            result = binary_info(Path(argv[0]))
    except InspectError as e:
        result, code = {"error": e.message, "hint": e.hint}, 3
    json.dump(result, out)
    out.close()
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
