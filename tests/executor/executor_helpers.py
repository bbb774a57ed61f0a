"""Graph builders shared by the executor tests (a uniquely named module, importable from tests)."""

from __future__ import annotations

import json
from typing import Any, Sequence

# ------------------------------------------------------------------------------------------
# graph builder


class GraphBuilder:
    """Builds graph JSON by hand: ``x = b.input("x", (2, 3)); y = b.op("add_one", [x])``."""

    def __init__(self) -> None:
        self.nodes: list[dict[str, Any]] = []
        self.row_ptr = [0]
        self.shapes: list[list[int]] = []
        self.dtypes: list[str] = []
        self.sids: list[int] = []
        self.arg_nodes: list[int] = []
        self.devs: list[int] = []

    def _add(self, node: dict[str, Any], outs: Sequence[tuple[Sequence[int], str, int, int]]) -> list[tuple[int, int]]:
        nid = len(self.nodes)
        self.nodes.append(node)
        for shape, dt, sid, dev in outs:
            self.shapes.append(list(shape))
            self.dtypes.append(dt)
            self.sids.append(sid)
            self.devs.append(dev)
        self.row_ptr.append(self.row_ptr[-1] + len(outs))
        return [(nid, i) for i in range(len(outs))]

    def _next_sid(self) -> int:
        return max(self.sids, default=-1) + 1

    def input(self, name: str, shape: Sequence[int], dtype: str = "float32", sid: int | None = None, dev: int = 1):
        sid = self._next_sid() if sid is None else sid
        self.arg_nodes.append(len(self.nodes))
        return self._add({"op": "null", "name": name, "inputs": []}, [(shape, dtype, sid, dev)])[0]

    def op(
        self,
        func: str,
        inputs: Sequence[tuple[int, int]],
        shapes: Sequence[Sequence[int]] | None = None,
        sids: Sequence[int] | None = None,
        name: str | None = None,
        flatten: bool = False,
        dtype: str = "float32",
        dev: int = 1,
    ):
        if shapes is None:
            shapes = [self.shapes[self.row_ptr[inputs[0][0]] + inputs[0][1]]]
        if sids is None:
            sids = [self._next_sid() + k for k in range(len(shapes))]
        name = name or f"{func}_{len(self.nodes)}"
        node = {
            "op": "tvm_op",
            "name": name,
            "inputs": [[n, i, 0] for n, i in inputs],
            "attrs": {
                "func_name": func,
                "num_inputs": str(len(inputs)),
                "num_outputs": str(len(shapes)),
                "flatten_data": "1" if flatten else "0",
            },
        }
        outs = self._add(node, [(s, dtype, sid, dev) for s, sid in zip(shapes, sids)])
        return outs[0] if len(outs) == 1 else outs

    def to_dict(self, heads: Sequence[tuple[int, int]], device_index: bool = False) -> dict[str, Any]:
        attrs: dict[str, Any] = {
            "dltype": ["list_str", list(self.dtypes)],
            "shape": ["list_shape", [list(s) for s in self.shapes]],
            "storage_id": ["list_int", list(self.sids)],
        }
        if device_index:
            attrs["device_index"] = ["list_int", list(self.devs)]
        return {
            "nodes": self.nodes,
            "arg_nodes": list(self.arg_nodes),
            "heads": [[n, i, 0] for n, i in heads],
            "node_row_ptr": list(self.row_ptr),
            "attrs": attrs,
        }

    def json(self, heads: Sequence[tuple[int, int]], device_index: bool = False) -> str:
        return json.dumps(self.to_dict(heads, device_index))


SHAPE = (2, 3)


def two_kernel_graph() -> str:
    """x -> add_one -> mul_two -> y, i.e. y = (x + 1) * 2."""
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    t = b.op("add_one", [x], name="t")
    y = b.op("mul_two", [t], name="y")
    return b.json([y])


def param_graph() -> str:
    """y = add_one(x) + w, with w meant to be a param."""
    b = GraphBuilder()
    x = b.input("x", SHAPE)
    w = b.input("w", SHAPE)
    t = b.op("add_one", [x], name="t")
    y = b.op("add", [t, w], name="y")
    return b.json([y])
