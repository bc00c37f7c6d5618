"""Byte-identical .ort files for identical models: the kernel type table rewritten in order.

onnxruntime (1.32) writes an ORT-format model's KernelTypeStrResolver by iterating abseil hash
maps, whose order is salted with heap addresses: two conversions of the same .onnx differ in
where that table's entries lie in the buffer (the decoded content is the same, and so is what
the model computes). The Model subtree is written before the resolver, so it is a
self-contained tail of the buffer: `canonical` keeps that tail byte for byte and rebuilds the
resolver, sorted, and the root table in front of it. A layout it does not expect is an error,
never a rewritten file.
"""

from __future__ import annotations

from typing import Any


def canonical(data: bytes) -> bytes:
    """The same ORT-format model with its kernel type table in sorted order."""
    import flatbuffers
    from flatbuffers import number_types
    from onnxruntime.tools.ort_format_model import ort_flatbuffers_py  # noqa: F401  (its path)
    from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs import (
        InferenceSession as Session,
    )

    if not Session.InferenceSession.InferenceSessionBufferHasIdentifier(data, 0):
        raise ValueError("not an ORT format model")
    root = Session.InferenceSession.GetRootAsInferenceSession(data, 0)
    version_pos, model_pos = _target(root._tab, 0), _target(root._tab, 1)
    if model_pos is None:
        raise ValueError("an ORT format model without a model")
    vtable_offset = flatbuffers.encode.Get(number_types.SOffsetTFlags.packer_type, data, model_pos)
    model_vtable = model_pos - number_types.SOffsetTFlags.py_type(vtable_offset)
    tail_start = min(p for p in (version_pos, model_pos, model_vtable) if p is not None)
    resolver_pos = _target(root._tab, 3)
    if resolver_pos is not None and resolver_pos >= tail_start:
        raise ValueError("unexpected ORT layout: the kernel type table inside the model")
    tail = data[tail_start:]
    builder = flatbuffers.Builder(len(data) + 4096)
    builder.head = len(builder.Bytes) - len(tail)
    builder.Bytes[builder.head :] = tail  # offsets count from the end, which the tail keeps
    builder.minalign = 8
    resolver = _write_resolver(builder, _entries(root.KernelTypeStrResolver()))
    Session.Start(builder)
    if version_pos is not None:
        Session.AddOrtVersion(builder, len(data) - version_pos)
    Session.AddModel(builder, len(data) - model_pos)
    Session.AddKernelTypeStrResolver(builder, resolver)
    builder.Finish(Session.End(builder), file_identifier=b"ORTM")
    return bytes(builder.Output())


def _target(table: Any, slot: int) -> int | None:
    """Where the object a table's offset field points to lies (None if the field is absent)."""
    offset = table.Offset(4 + 2 * slot)
    return table.Indirect(table.Pos + offset) if offset else None


Entries = list[tuple[bytes, list[tuple[bytes, list[tuple[int, int]]]]]]


def _entries(resolver: Any) -> Entries:
    """(op id, [(kernel type string, [(arg type, index)])]) sorted by op id and type string."""
    entries: Entries = []
    for i in range(resolver.OpKernelTypeStrArgsLength() if resolver else 0):
        entry = resolver.OpKernelTypeStrArgs(i)
        kinds = []
        for j in range(entry.KernelTypeStrArgsLength()):
            kind = entry.KernelTypeStrArgs(j)
            args = [
                (kind.Args(a).ArgType(), kind.Args(a).Index()) for a in range(kind.ArgsLength())
            ]
            kinds.append((kind.KernelTypeStr(), args))
        entries.append((entry.OpId(), sorted(kinds, key=lambda k: k[0])))
    return sorted(entries, key=lambda e: e[0])


def _write_resolver(builder: Any, entries: Entries) -> int:
    from onnxruntime.tools.ort_format_model.ort_flatbuffers_py.fbs import (
        ArgTypeAndIndex,
        KernelTypeStrArgsEntry,
        KernelTypeStrResolver,
        OpIdKernelTypeStrArgsEntry,
    )

    ops = []
    for op_id, kinds in entries:
        kind_offsets = []
        for type_str, args in kinds:
            arg_offsets = []
            for arg_type, index in args:
                ArgTypeAndIndex.Start(builder)
                ArgTypeAndIndex.AddArgType(builder, arg_type)
                ArgTypeAndIndex.AddIndex(builder, index)
                arg_offsets.append(ArgTypeAndIndex.End(builder))
            args_vector = _vector(builder, KernelTypeStrArgsEntry.StartArgsVector, arg_offsets)
            name = builder.CreateSharedString(type_str)
            KernelTypeStrArgsEntry.Start(builder)
            KernelTypeStrArgsEntry.AddKernelTypeStr(builder, name)
            KernelTypeStrArgsEntry.AddArgs(builder, args_vector)
            kind_offsets.append(KernelTypeStrArgsEntry.End(builder))
        start = OpIdKernelTypeStrArgsEntry.StartKernelTypeStrArgsVector
        kinds_vector = _vector(builder, start, kind_offsets)
        op_name = builder.CreateString(op_id)
        OpIdKernelTypeStrArgsEntry.Start(builder)
        OpIdKernelTypeStrArgsEntry.AddOpId(builder, op_name)
        OpIdKernelTypeStrArgsEntry.AddKernelTypeStrArgs(builder, kinds_vector)
        ops.append(OpIdKernelTypeStrArgsEntry.End(builder))
    start = KernelTypeStrResolver.StartOpKernelTypeStrArgsVector
    ops_vector = _vector(builder, start, ops)
    KernelTypeStrResolver.Start(builder)
    KernelTypeStrResolver.AddOpKernelTypeStrArgs(builder, ops_vector)
    return int(KernelTypeStrResolver.End(builder))


def _vector(builder: Any, start: Any, offsets: list[int]) -> int:
    start(builder, len(offsets))
    for offset in reversed(offsets):
        builder.PrependUOffsetTRelative(offset)
    return int(builder.EndVector())
