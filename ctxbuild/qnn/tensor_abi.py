"""QnnTypes.h in ctypes: the data types, tensor types and quantization encodings, and the structs of a tensor
and its quantization parameters, as libQnnSystem hands them back.

The layouts reproduce the public QNN SDK header (as of SDK 2.43) and were checked against binaries made by
onnxruntime-qnn 2.7.0 (SDK 2.51); binaryinfo.py reads them.
"""
from __future__ import annotations

import ctypes as C

# Enum values -> names (QnnTypes.h)
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
QNN_DEFINITION_UNDEFINED = 0x7FFFFFFF


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
