"""Device placement for :func:`kiln.build`: which device each fused group runs on.

A build has one target per device type::

    kiln.build(mod, target="llvm")                                  # everything on the CPU
    kiln.build(mod, target="opencl")                                # everything on OpenCL; host llvm
    kiln.build(mod, target={"cpu": "llvm", "opencl": "opencl"},     # heterogeneous
               placement={"add": "opencl", "log": "cpu"})

* ``target`` as a dict without a ``"kind"`` key maps device names (``"cpu"``, ``"opencl"``,
  ``"cuda"``, anything :func:`kiln.device` knows) to targets; the **first** entry is the
  default device of unplaced ops.
* ``placement`` maps a node name or an op name (node names win) to a device (name,
  :class:`~kiln.runtime.Device` or DLPack type code), or is a callable ``f(node) -> device
  or None``. Every device used must have a target; the CPU always has one (the host
  target), so ``target="opencl", placement={"log": "cpu"}`` works.
* Fusion runs first; a fused group whose ops are placed on different devices is split into
  one group per op (so no kernel spans two devices). A ``__nop`` alias stays on its input's
  device.
* An op whose kernel reports a data-dependent extent (NonZero, Unique, Compress,
  NonMaxSuppression, TopK with a runtime ``k``, Range with runtime bounds) runs on the CPU
  unless ``placement`` names it: device kernels cannot report a size back (the GPU code
  generators refuse them), and what follows may still run on the device, at the reported
  size. ONNX Runtime's execution providers fall back to the CPU the same way.
* The host target (kernels placed on the CPU, and the library that carries device modules)
  is the CPU entry of the dict, else ``Target.host`` of the device target, else
  ``llvm -mcpu=native`` (``c`` without llvmlite).

Boundaries between devices get ``__copy`` nodes in the graph JSON (see
:mod:`kiln.driver.graph_codegen`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping

from ..ir import Node, OpPattern, get_op
from ..runtime.errors import InputError
from ..runtime.sym import dims_symbols
from ..transform.fuse import FusedGraph, FusedGroup, is_alias_reshape
from .lower_graph import LoweredCall, LoweredModel, lower_fused_graph

__all__ = ["DeviceTargets", "resolve_targets", "place_groups", "lower_placed", "build_libraries",
           "Placement", "reports_extent"]

#: ``placement=``: a mapping node-or-op name -> device, or a callable node -> device or None.
Placement = Mapping[str, Any] | Callable[[Node], Any] | None

_CPU = 1


@dataclass
class DeviceTargets:
    """Targets of one build, by DLPack device type.

    Attributes
    ----------
    targets : dict of int to Target
        Device type -> target of the kernels placed there.
    default : int
        Device type of ops no placement names.
    host : Target
        Target of CPU kernels and of the host library.
    """

    targets: dict[int, Any]
    default: int
    host: Any

    @property
    def uses_accelerator(self) -> bool:
        """Whether any device other than the CPU has a target."""
        return any(d != _CPU for d in self.targets)

    @property
    def primary(self) -> Any:
        """The default device's target."""
        return self.targets[self.default]


def _device_type(dev: Any, what: str) -> int:
    from ..runtime.device import Device, device

    try:
        return (dev if isinstance(dev, Device) else device(dev)).device_type
    except Exception as err:  # noqa: BLE001 - reported with what was being resolved
        raise InputError(f"{what}: {dev!r} is not a device ({err})") from None


def resolve_targets(target: Any) -> DeviceTargets:
    """Normalize ``kiln.build``'s ``target`` argument (see the module docstring).

    Raises
    ------
    InputError
        For a device key whose target kind runs on another device type.
    """
    from ..target import Target

    if target is None:
        target = "llvm"
    if isinstance(target, Mapping) and "kind" not in target:
        if not target:
            raise InputError("kiln.build: the target dict is empty; give e.g. {'cpu': 'llvm', 'opencl': 'opencl'}")
        targets: dict[int, Any] = {}
        for key, val in target.items():
            dt = _device_type(key, "kiln.build target dict key")
            t = val if isinstance(val, Target) else Target(val)
            if t.kind.device_type != dt:
                raise InputError(f"kiln.build: target {t} (kind {t.kind.name}) runs on device type "
                                 f"{t.kind.device_type}, but it is given for device {key!r} (type {dt})")
            if dt in targets:
                raise InputError(f"kiln.build: device {key!r} has two targets in the target dict")
            targets[dt] = t
        default = next(iter(targets))
    else:
        t = target if isinstance(target, Target) else Target(target)
        targets = {t.kind.device_type: t}
        default = t.kind.device_type
    if _CPU in targets:
        host = targets[_CPU]
    else:
        dev_t = targets[default]
        host = dev_t.host
        if host is None:
            from ..codegen.opencl import default_host_target

            host = default_host_target()
    return DeviceTargets(targets, default, host)


def reports_extent(node: Node, data_dims: set[str]) -> bool:
    """Whether ``node``'s kernel reports a data-dependent extent: an output dim uses a
    data-dependent symbol (``Graph.data_dims``) that none of its inputs has."""
    if not data_dims:
        return False
    outs = frozenset().union(*(dims_symbols(getattr(v.type, "dims", ())) for v in node.outputs)) & data_dims
    if not outs:
        return False
    ins = frozenset().union(*(dims_symbols(getattr(v.type, "dims", ())) for v in node.inputs))
    return bool(outs - ins)


def _node_device(node: Node, placement: Placement, dts: DeviceTargets, data_dims: set[str]) -> int:
    dev: Any = None
    if placement is None:
        pass
    elif callable(placement) and not isinstance(placement, Mapping):
        dev = placement(node)
    elif node.name is not None and node.name in placement:
        dev = placement[node.name]
    elif node.op in placement:
        dev = placement[node.op]
    if dev is None:
        if dts.default == _CPU or not reports_extent(node, data_dims):
            return dts.default
        dev = _CPU  # see the module docstring: a device kernel cannot report the size
    dt = _device_type(dev, f"placement of {node.op} node {node.name!r}")
    if dt == _CPU and dt not in dts.targets:
        dts.targets[_CPU] = dts.host  # the host target always exists
    if dt not in dts.targets:
        from ..runtime.device import Device

        names = ", ".join(str(Device(d)) for d in dts.targets)
        raise InputError(f"placement puts {node.op} node {node.name!r} on {Device(dt)}, which has no target; "
                         f"targets exist for: {names} (pass target={{'<device>': '<target>', ...}})")
    return dt


def _single(node: Node) -> FusedGroup:
    ins: list[Any] = []
    for v in node.inputs:
        if v not in ins:
            ins.append(v)
    g = FusedGroup([node], ins, list(node.outputs), node, OpPattern(get_op(node.op).pattern),
                   is_alias_reshape(node))
    if g.is_nop:
        g.anchor = None
    return g


def place_groups(fused: FusedGraph, placement: Placement, dts: DeviceTargets
                 ) -> tuple[FusedGraph, dict[int, int]]:
    """Assign a device type to every group, splitting groups that span devices.

    Returns
    -------
    FusedGraph
        The (possibly) re-partitioned graph.
    dict
        ``id(group) -> device type``.
    """
    data_dims = set(fused.graph.data_dims)
    if placement is None and (dts.default == _CPU or not data_dims):
        return fused, {id(g): dts.default for g in fused.groups}
    groups: list[FusedGroup] = []
    gdev: dict[int, int] = {}
    for g in fused.groups:
        devs = [_node_device(n, placement, dts, data_dims) for n in g.nodes]
        if len(set(devs)) <= 1:
            groups.append(g)
            gdev[id(g)] = devs[0] if devs else dts.default
            continue
        for n, d in zip(g.nodes, devs):
            s = _single(n)
            groups.append(s)
            gdev[id(s)] = d
    return FusedGraph(fused.graph, groups), gdev


def lower_placed(fused: FusedGraph, gdev: dict[int, int], dts: DeviceTargets, mod_name: str,
                 on_kernel: Callable[[int, int, str], None] | None = None) -> tuple[LoweredModel, list[int]]:
    """Lower every group for its device's target.

    Returns the merged :class:`LoweredModel` (calls in execution order) and the device type of
    every call. Kernels of a non-default device get ``_<device>`` in their names so that names
    stay unique across devices.
    """
    devs = sorted({gdev[id(g)] for g in fused.groups}, key=lambda d: (d != dts.default, d))
    if devs in ([], [dts.default]):
        low = lower_fused_graph(fused, dts.primary, mod_name, on_kernel=on_kernel)
        return low, [dts.default] * len(low.calls)
    from ..runtime.device import Device

    by_group: dict[int, tuple[LoweredCall, int]] = {}
    funcs: list[Any] = []
    for d in devs:
        sub = FusedGraph(fused.graph, [g for g in fused.groups if gdev[id(g)] == d])
        name = mod_name if d == dts.default else f"{mod_name}_{Device(d).name}"
        low = lower_fused_graph(sub, dts.targets[d], name, on_kernel=on_kernel, whole_graph=False)
        for g, c in zip(sub.groups, low.calls):
            by_group[id(g)] = (c, d)
        for f in low.funcs:
            f.attrs["device_type"] = d
        funcs.extend(low.funcs)
    calls = [by_group[id(g)][0] for g in fused.groups]
    cdev = [by_group[id(g)][1] for g in fused.groups]
    return LoweredModel(fused, calls, funcs), cdev


def build_libraries(lowered: LoweredModel, cdev: list[int], dts: DeviceTargets,
                    empty_lib: Callable[[], Any]) -> Any:
    """Generate code: the host library, importing one device module per non-CPU device."""
    from .. import codegen

    fdev: dict[str, int] = {}
    for c, d in zip(lowered.calls, cdev):
        if c.func_name not in ("__nop", "__concat"):
            fdev[c.func_name] = d
    per: dict[int, list[Any]] = {}
    for f in lowered.funcs:
        per.setdefault(fdev.get(f.name, dts.default), []).append(f)
    host_funcs = per.pop(_CPU, [])
    lib = codegen.build_module(host_funcs, dts.host) if host_funcs else empty_lib()
    for d in sorted(per):
        lib.import_module(codegen.build_module(per[d], dts.targets[d]))
    return lib
