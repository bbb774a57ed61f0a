"""read_factory_payload: the one parser of the GraphExecutorFactory payload (loader and inspect)."""

from __future__ import annotations

import numpy as np
import pytest

from kiln.runtime.binary import Writer
from kiln.runtime.errors import FormatError
from kiln.runtime.executor_factory import (
    FactoryPayload,
    loadbinary_GraphExecutorFactory,
    read_factory_payload,
    write_factory_payload,
)
from kiln.runtime.params import save_param_dict

from tests.executor.executor_helpers import SHAPE, param_graph

W = np.arange(np.prod(SHAPE), dtype="float32").reshape(SHAPE)


def _payload(graph: bytes, name: bytes = b"default", params: bytes | None = None) -> bytes:
    w = Writer()
    w.sized_bytes(graph)
    w.sized_bytes(name)
    w.sized_bytes(save_param_dict({"w": W}) if params is None else params)
    return w.getvalue()


def test_round_trip_without_a_module():
    data = write_factory_payload(FactoryPayload(param_graph(), "net", {"w": W}))
    p = read_factory_payload(data)
    assert p.graph_json == param_graph() and p.mod_name == "net"
    assert list(p.params) == ["w"]
    np.testing.assert_array_equal(p.params["w"].numpy(), W)
    assert data == _payload(param_graph().encode(), b"net")


def test_loader_uses_the_same_parser():
    f = loadbinary_GraphExecutorFactory(_payload(param_graph().encode()))
    assert f.mod_name == "default"
    np.testing.assert_array_equal(f.params["w"].numpy(), W)


def test_graph_json_that_is_not_utf8_is_a_format_error():
    # Before the shared reader this escaped as a bare UnicodeDecodeError.
    with pytest.raises(FormatError, match=r"GraphExecutorFactory payload at offset 0: graph JSON is not valid UTF-8"):
        loadbinary_GraphExecutorFactory(_payload(b'{"nodes": "\xff"}'))


def test_trailing_bytes_are_rejected():
    # Before the shared reader they were silently ignored.
    data = _payload(param_graph().encode()) + b"\0\0"
    with pytest.raises(FormatError, match="2 unexpected trailing bytes after the params"):
        read_factory_payload(data, "m.so: factory")


def test_corrupt_params_name_the_payload_and_the_section():
    bad = bytearray(save_param_dict({"w": W}))
    bad[0] ^= 0xFF
    graph = param_graph().encode()
    with pytest.raises(FormatError, match=rf"m.so: factory, params section at offset {8 + len(graph) + 8 + 7 + 8}\) "
                                          r"at offset 0: bad magic"):
        read_factory_payload(_payload(graph, params=bytes(bad)), "m.so: factory")


@pytest.mark.parametrize("cut", [0, 4, 8, 20])
def test_every_truncation_names_the_field(cut):
    with pytest.raises(FormatError, match="GraphExecutorFactory payload at offset .*truncated"):
        read_factory_payload(_payload(param_graph().encode())[:cut])
