"""A context binary's metadata as libQnnSystem returns it (the structs of tensor_abi.py and system_abi.py), turned
into plain JSON-able data: versions, graphs and their tensors with dtype, dims and quantization, the HTP's
per-graph blob (spill-fill, VTCM, sizes), the platform info and the SoC (named from the SoC table).
"""
from __future__ import annotations

import ctypes as C
import math
from typing import Any

from ctxbuild.errors import InspectError
from ctxbuild.qnn import socs
from ctxbuild.qnn.system_abi import (
    BACKENDS, QNN_BACKEND_ID_HTP, QnnHtpDevice_DeviceInfoExtension_t, QnnHtpSystemContext_ContextBlobInfo_t,
    QnnHtpSystemContext_GraphBlobInfo_t, QnnHtpSystemContext_GraphBlobInfoV2_t, QnnHtpSystemContext_HwBlobInfo_t,
    QnnSystemContext_BinaryInfo_t, QnnSystemContext_GraphInfo_t,
)
from ctxbuild.qnn.tensor_abi import (
    DTYPES, ENCODINGS, MAPPINGS, QNN_DEFINITION_UNDEFINED, TENSOR_TYPES, Qnn_QuantizeParams_t, Qnn_Tensor_t,
    Qnn_Version_t,
)


def _name(table: list[str] | dict[int, str], value: int) -> str:
    """Enum value -> name; unknown values stay visible as numbers rather than failing."""
    if isinstance(table, dict):
        return table.get(value, f"UNKNOWN_{value:#x}")
    return table[value] if 0 <= value < len(table) else f"UNKNOWN_{value:#x}"


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


def extract(info: QnnSystemContext_BinaryInfo_t) -> dict[str, Any]:
    """Flat dict of one context blob's metadata; system.binary_info splits it into common/target."""
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
